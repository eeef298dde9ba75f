//! The command line: one subcommand per REST resource of the control API
//! (`control-api/src/routes/mod.rs`), each calling only operations that table
//! lists. This root holds the global options and the list of subcommands; each
//! resource's subcommands and arguments are in its own file beside it.
//! docs/cli.md is their `--help` output, checked by a test.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

mod abuse;
mod accounts;
mod api;
mod audit;
mod common;
mod consent;
mod dedicated;
mod enrollment_tokens;
mod entitlements;
mod exits;
mod invoices;
mod keys;
mod plans;
mod policy;
mod sessions;
mod sites;
mod sources;
mod usage;
mod users;
mod webhooks;

pub(crate) use self::abuse::Abuse;
pub(crate) use self::accounts::Accounts;
pub(crate) use self::api::ApiArgs;
pub(crate) use self::audit::AuditArgs;
pub(crate) use self::common::PageArgs;
pub(crate) use self::consent::{Consent, GrantArgs, Notice};
pub(crate) use self::dedicated::Dedicated;
pub(crate) use self::enrollment_tokens::EnrollmentTokens;
pub(crate) use self::entitlements::Entitlements;
pub(crate) use self::exits::Exits;
pub(crate) use self::invoices::InvoiceArgs;
pub(crate) use self::keys::Keys;
pub(crate) use self::plans::Plans;
pub(crate) use self::policy::Policy;
pub(crate) use self::sessions::Sessions;
pub(crate) use self::sites::Sites;
pub(crate) use self::sources::{SourceArgs, Sources};
pub(crate) use self::usage::UsageArgs;
pub(crate) use self::users::Users;
pub(crate) use self::webhooks::Webhooks;

const AFTER_HELP: &str = "\
Configuration: --api/--token, else PROXYNET_API/PROXYNET_ADMIN_TOKEN, else the config file
(--config, default $XDG_CONFIG_HOME/proxynet/ctl.toml or ~/.config/proxynet/ctl.toml) with
api = \"...\" and token = \"...\". The token is never printed.

Exit codes: 0 success; 1 the API answered with an error (one line on stderr: status, reason,
detail); 2 usage error (arguments, input files, config); 3 the API could not be reached.";

#[derive(Parser, Debug)]
#[command(
    name = "proxynetctl",
    version,
    about = "Command-line client for the proxynet control API: tables for people, --output json for scripts",
    after_help = AFTER_HELP
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Args, Debug)]
#[command(next_help_heading = "Global options")]
pub(crate) struct Global {
    /// Control API base URL (e.g. http://127.0.0.1:8081)
    #[arg(
        long,
        global = true,
        env = "PROXYNET_API",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) api: Option<String>,
    /// Bearer token: the admin token, an operator key or an account key
    #[arg(
        long,
        global = true,
        env = "PROXYNET_ADMIN_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub(crate) token: Option<String>,
    /// Read the bearer token from this file (keeps it out of the process list and shell history)
    #[arg(
        long,
        global = true,
        env = "PROXYNET_ADMIN_TOKEN_FILE",
        value_name = "PATH",
        conflicts_with = "token"
    )]
    pub(crate) token_file: Option<PathBuf>,
    /// Allow an http:// API on a host other than loopback (the token would cross the network in clear)
    #[arg(long, global = true)]
    pub(crate) allow_insecure_http: bool,
    /// Config file [default: $XDG_CONFIG_HOME/proxynet/ctl.toml or ~/.config/proxynet/ctl.toml]
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,
    /// Output format: aligned tables, or the API's JSON as is (pretty)
    #[arg(short, long, global = true, value_enum, default_value_t = Output::Table)]
    pub(crate) output: Output,
    /// Log each request (method, URL, status, time) to stderr; never the token
    #[arg(short, long, global = true)]
    pub(crate) verbose: bool,
    /// Seconds to wait for each answer
    #[arg(long, global = true, value_name = "SECS", default_value_t = 30)]
    pub(crate) timeout: u64,
    /// Also trust this CA certificate (PEM) for an https:// API
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) cacert: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Accounts: the customers that own proxy users (operator)
    #[command(subcommand)]
    Accounts(Accounts),
    /// Proxy users: the credentials customers put in `curl -x`
    #[command(subcommand)]
    Users(Users),
    /// API keys (operator keys, or an account's own)
    #[command(subcommand)]
    Keys(Keys),
    /// Plans and their prices per GB (operator)
    #[command(subcommand)]
    Plans(Plans),
    /// What an account is granted: totals, restrictions, allow-list bounds
    #[command(subcommand)]
    Entitlements(Entitlements),
    /// Traffic policy by target domain: the operator's, an account's or a user's
    #[command(subcommand)]
    Policy(Policy),
    /// Provenance sources: the four questions for the exits that belong to them (operator)
    #[command(subcommand)]
    Sources(Sources),
    /// Consent records of exits, and the notices people saw (operator)
    #[command(subcommand)]
    Consent(Consent),
    /// Exits: provenance, egress, liveness and fleet health; drain, disable (operator)
    #[command(subcommand)]
    Exits(Exits),
    /// One-time exit enrollment tokens (operator)
    #[command(subcommand, name = "enrollment-tokens")]
    EnrollmentTokens(EnrollmentTokens),
    /// Dedicated IPs: egress addresses (or IPv6 /64s) held by one account (docs/dedicated.md)
    #[command(subcommand)]
    Dedicated(Dedicated),
    /// A proxy user's sticky sessions
    #[command(subcommand)]
    Sessions(Sessions),
    /// Target sites: the exits cooled for each, worst first; lift a cooldown
    #[command(subcommand)]
    Sites(Sites),
    /// Report an exit blocked, slow or ok for a site (blocked cools it for your account at once)
    #[command(group(ArgGroup::new("which").required(true).args(["exit", "session"])))]
    Feedback {
        /// The exit's id (e.g. from a Proxynet-Exit answer header)
        #[arg(long, value_name = "ID")]
        exit: Option<String>,
        /// Or a sticky session id: the exit it is pinned to
        #[arg(long)]
        session: Option<String>,
        /// With --session: its proxy user (needed with an operator token) [default: the account's users are searched]
        #[arg(long, value_name = "ID", requires = "session", conflicts_with = "exit")]
        user: Option<String>,
        /// A host name, URL or address: counted as its registrable domain, IPv4 /24 or IPv6 /64
        #[arg(long)]
        site: String,
        /// What the site did
        #[arg(long, value_parser = ["blocked", "slow", "ok"])]
        verdict: String,
    },
    /// Bytes up/down of an account, from the exactly-once ledger
    Usage(UsageArgs),
    /// An account's invoice for a month
    Invoices(InvoiceArgs),
    /// The abuse desk: who used an egress address (operator; audited)
    #[command(subcommand)]
    Abuse(Abuse),
    /// Signed webhooks: an account's, or the operator's (without --account)
    #[command(subcommand)]
    Webhooks(Webhooks),
    /// The audit log, newest first (operator)
    Audit(AuditArgs),
    /// Whether the control API is ready (Postgres and Redis answer)
    Health,
    /// Any request: `proxynetctl api GET /v1/exits`, the raw answer printed
    Api(ApiArgs),
    /// Print a shell completion script (e.g. `proxynetctl completion bash > /etc/bash_completion.d/proxynetctl`)
    Completion {
        /// The shell
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[cfg(test)]
mod tests;
