//! The command line: one subcommand per REST resource of the control API
//! (`control-api/src/routes/mod.rs`), each calling only operations that table
//! lists. docs/cli.md is this file's `--help` output, checked by a test.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

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

/// How much of a paginated list to fetch (the API's pages: ?limit=&after=).
#[derive(Args, Debug, Clone, Copy)]
pub(crate) struct PageArgs {
    /// At most N rows in all, following pages as needed [default: the API's first page]
    #[arg(long, value_name = "N", conflicts_with = "all", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) limit: Option<u64>,
    /// Every row: follow each page's Link rel=next
    #[arg(long)]
    pub(crate) all: bool,
    /// Rows per request, 1 to 1000 [default: 1000 with --all or --limit, else the API's]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub(crate) page_size: Option<u64>,
}

// ---- accounts ---------------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Accounts {
    /// List accounts
    List(PageArgs),
    /// Read an account, with its plan, entitlements and policy
    Get {
        /// Account id
        id: String,
    },
    /// Create an account
    Create {
        /// The account's name (1 to 200 characters)
        name: String,
    },
    /// Delete an account: its users disabled and cut, its keys revoked, its ledger kept
    Delete {
        /// Account id
        id: String,
    },
    /// Replace the account's entitlements with a JSON document (docs/tenancy.md)
    SetEntitlements {
        /// Account id
        id: String,
        /// JSON file, or - for stdin
        #[arg(default_value = "-")]
        file: String,
    },
    /// Replace the account's traffic policy with a JSON document (docs/policy.md)
    SetPolicy {
        /// Account id
        id: String,
        /// JSON file, or - for stdin; {} clears the policy
        #[arg(default_value = "-")]
        file: String,
    },
    /// Set the account's plan
    SetPlan {
        /// Account id
        id: String,
        /// Plan id (see `plans list`)
        plan: String,
    },
}

// ---- users ------------------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Users {
    /// List an account's proxy users
    List {
        /// Account id
        account: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Read a proxy user
    Get {
        /// User id
        id: String,
    },
    /// Create a proxy user (its password read from stdin: --password-stdin)
    Create {
        /// Account id
        account: String,
        /// Username: letters, digits, `_` and `.`, at most 64
        username: String,
        /// Read the password from stdin, its first line (8 to 255 characters; required)
        #[arg(long)]
        password_stdin: bool,
        /// Limits as JSON, @FILE or - (stdin), e.g. '{"max_concurrent_tunnels": 50, "bandwidth_bytes": 10000000000}'
        #[arg(long, value_name = "JSON")]
        limits: Option<String>,
        /// A source network whose requests without credentials are this user (repeatable)
        #[arg(long = "allowed-source-cidr", value_name = "CIDR")]
        allowed_source_cidrs: Vec<String>,
        /// Username options for allow-listed traffic (e.g. country-de-type-dc)
        #[arg(long, value_name = "OPTIONS")]
        allowlist_options: Option<String>,
    },
    /// Change a proxy user: enable/disable, rotate its password, set limits or policy
    Update {
        /// User id
        id: String,
        /// Enable (true) or disable (false) the user
        #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
        enabled: Option<bool>,
        /// Read a new password from stdin (its first line)
        #[arg(long)]
        password_stdin: bool,
        /// Replace all limits: JSON, @FILE or - (stdin)
        #[arg(long, value_name = "JSON")]
        limits: Option<String>,
        /// Replace the user's traffic policy: JSON, @FILE or - (stdin); {} clears it
        #[arg(long, value_name = "JSON")]
        policy: Option<String>,
        /// Replace the allow-listed source networks (repeatable)
        #[arg(
            long = "allowed-source-cidr",
            value_name = "CIDR",
            conflicts_with = "no_allowed_source_cidrs"
        )]
        allowed_source_cidrs: Vec<String>,
        /// Remove every allow-listed source network
        #[arg(long)]
        no_allowed_source_cidrs: bool,
        /// Username options for allow-listed traffic
        #[arg(long, value_name = "OPTIONS")]
        allowlist_options: Option<String>,
    },
    /// Delete a proxy user
    Delete {
        /// User id
        id: String,
    },
    /// The user's current quota period: used, remaining, warning, exhausted
    Quota {
        /// User id
        id: String,
    },
}

// ---- keys -------------------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Keys {
    /// List an account's keys: who minted each, last use, revocation; never secrets
    List {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Create a key for an account, or an operator key; the key is shown once
    #[command(group(ArgGroup::new("owner").required(true).args(["account", "operator"])))]
    Create {
        /// An account key for this account
        #[arg(long, value_name = "ID")]
        account: Option<String>,
        /// An operator key (operators only)
        #[arg(long)]
        operator: bool,
        /// A name to recognise it by
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Revoke a key and every key it minted
    Revoke {
        /// Key id
        id: String,
    },
}

// ---- plans ------------------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Plans {
    /// List plans with their prices
    List(PageArgs),
    /// Create a plan
    Create {
        /// The plan's name
        name: String,
        /// A price in cents per GB for a source type, e.g. dc=100 (repeatable)
        #[arg(long = "price", value_name = "TYPE=CENTS", required = true)]
        prices: Vec<String>,
    },
}

// ---- entitlements -----------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Entitlements {
    /// Print an account's entitlements (from the account)
    Get {
        /// Account id
        account: String,
    },
    /// Replace an account's entitlements with a JSON document
    Set {
        /// Account id
        account: String,
        /// JSON file, or - for stdin
        #[arg(default_value = "-")]
        file: String,
    },
}

// ---- policy -----------------------------------------------------------------

/// Whose policy: the operator's (neither flag), an account's or a user's.
#[derive(Args, Debug)]
#[group(multiple = false)]
pub(crate) struct PolicyOwner {
    /// An account's policy
    #[arg(long, value_name = "ID")]
    pub(crate) account: Option<String>,
    /// A proxy user's policy
    #[arg(long, value_name = "ID")]
    pub(crate) user: Option<String>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Policy {
    /// Print a traffic policy as JSON (the operator's without --account/--user)
    Get {
        #[command(flatten)]
        owner: PolicyOwner,
    },
    /// Replace a traffic policy with a JSON document (`policy get` output is accepted: its version and updated_at are dropped)
    Set {
        #[command(flatten)]
        owner: PolicyOwner,
        /// JSON file, or - for stdin
        #[arg(default_value = "-")]
        file: String,
    },
}

// ---- sources ----------------------------------------------------------------

#[derive(Args, Debug)]
pub(crate) struct SourceArgs {
    /// The source's name
    #[arg(long)]
    pub(crate) name: String,
    /// What kind of addresses
    #[arg(long, value_parser = ["dc", "isp", "res", "mobile"])]
    pub(crate) source_type: String,
    /// How they were acquired
    #[arg(long, value_parser = ["owned", "leased", "isp", "sdk", "extension", "sharing", "reseller"])]
    pub(crate) channel: String,
    /// Who supplies them
    #[arg(long, default_value = "")]
    pub(crate) supplier: String,
    /// The agreement they come under
    #[arg(long, default_value = "")]
    pub(crate) agreement_ref: String,
    /// How the people behind them are informed
    #[arg(long, default_value = "")]
    pub(crate) notice_description: String,
    /// How they opt out
    #[arg(long, default_value = "")]
    pub(crate) opt_out: String,
    /// Who answers for them
    #[arg(long, default_value = "")]
    pub(crate) liable_party: String,
    /// Where abuse reports go
    #[arg(long, default_value = "")]
    pub(crate) abuse_contact: String,
    /// Countries (ISO 3166-1 alpha-2, comma-separated or repeated)
    #[arg(long = "country", value_name = "CC", value_delimiter = ',')]
    pub(crate) countries: Vec<String>,
    /// Whether each exit needs a consent record [default: by type and channel]
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub(crate) consent_required: Option<bool>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Sources {
    /// List sources with their completeness
    List,
    /// Read a source
    Get {
        /// Source id
        id: String,
    },
    /// Create a source
    Create(SourceArgs),
    /// Replace a source's answers (its exits follow at once)
    Replace {
        /// Source id
        id: String,
        #[command(flatten)]
        source: SourceArgs,
    },
}

// ---- consent ----------------------------------------------------------------

/// A consent grant (also what reinstating an exit records).
#[derive(Args, Debug)]
pub(crate) struct GrantArgs {
    /// How the person agreed
    #[arg(long, value_parser = ["in_app_opt_in", "click_through_terms", "signed_contract"])]
    pub(crate) method: String,
    /// The notice version they saw (`consent notice create`)
    #[arg(long, value_name = "VERSION")]
    pub(crate) notice_version: String,
    /// The SHA-256 of the notice text the device showed (checked)
    #[arg(long, value_name = "HEX")]
    pub(crate) notice_sha256: Option<String>,
    /// Where the evidence is kept
    #[arg(long, value_name = "REF")]
    pub(crate) evidence_ref: String,
    /// How this person opts out (URL or instruction)
    #[arg(long, value_name = "HOW")]
    pub(crate) opt_out: String,
    /// When they agreed (RFC 3339) [default: now]
    #[arg(long, value_name = "TIME")]
    pub(crate) granted_at: Option<String>,
    /// When the consent ends (RFC 3339)
    #[arg(long, value_name = "TIME")]
    pub(crate) expires_at: Option<String>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Consent {
    /// An exit's consent history (append-only)
    History {
        /// Exit id
        exit: String,
    },
    /// Record granted consent for an exit (a new version)
    Grant {
        /// Exit id
        exit: String,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// Revoke an exit's consent (a new version)
    Revoke {
        /// Exit id
        exit: String,
        /// Why
        #[arg(long)]
        reason: String,
    },
    /// Consent notices: the texts people saw, by version
    #[command(subcommand)]
    Notice(Notice),
}

#[derive(Subcommand, Debug)]
pub(crate) enum Notice {
    /// Store a notice text under a version
    Create {
        /// Version: letters, digits, `.`, `_` and `-`
        version: String,
        /// Text file, or - for stdin
        #[arg(default_value = "-")]
        file: String,
    },
    /// Print a notice text (public; its SHA-256 goes to stderr)
    Get {
        /// Version
        version: String,
    },
}

// ---- exits ------------------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Exits {
    /// List exits: state, egress and fleet score
    List(PageArgs),
    /// One exit, with its declared, bound and observed egress
    Get {
        /// Exit id
        id: String,
    },
    /// No new tunnels; open ones finish
    Drain {
        /// Exit id
        id: String,
    },
    /// Back into rotation after a drain
    Undrain {
        /// Exit id
        id: String,
    },
    /// Out of rotation
    Disable {
        /// Exit id
        id: String,
    },
    /// Back into rotation after a disable
    Enable {
        /// Exit id
        id: String,
    },
    /// Bring back an exit its owner withdrew, with a fresh consent record (the owner must also run exit-agent opt-in)
    Reinstate {
        /// Exit id
        id: String,
        #[command(flatten)]
        grant: GrantArgs,
    },
    /// The exit's provenance: its source's answers and consent state
    Provenance {
        /// Exit id
        id: String,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum EnrollmentTokens {
    /// Create a one-time enrollment token; the token is shown once
    Create {
        /// The exit's name
        #[arg(long)]
        name: String,
        /// The source its addresses belong to
        #[arg(long = "source", value_name = "ID")]
        source_id: String,
        /// Its country (ISO 3166-1 alpha-2)
        #[arg(long, value_name = "CC")]
        country: String,
        /// ISO 3166-2 subdivision (e.g. DE-BY)
        #[arg(long)]
        region: Option<String>,
        /// Lower-case city
        #[arg(long)]
        city: Option<String>,
        /// Autonomous system number of its egress IPs
        #[arg(long)]
        asn: Option<u32>,
        /// Token lifetime [default: the server's]
        #[arg(long, value_name = "SECS")]
        ttl_seconds: Option<u64>,
        /// The exit sits behind NAT (the world sees another address than it binds)
        #[arg(long)]
        behind_nat: bool,
    },
}

// ---- dedicated IPs ----------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Dedicated {
    /// An account's dedicated addresses, and its replacements this month
    List {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
    },
    /// Allocate addresses to an account: N free ones that match, or (operators) the ones named
    #[command(group(ArgGroup::new("which").required(true).args(["count", "ips"])))]
    Allocate {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
        /// How many free addresses
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        /// With --count: on exits in this country (ISO 3166-1 alpha-2)
        #[arg(long, value_name = "CC", conflicts_with = "ips")]
        country: Option<String>,
        /// With --count: on exits in this city
        #[arg(long, conflicts_with = "ips")]
        city: Option<String>,
        /// With --count: on exits of this source type
        #[arg(
            long = "type",
            value_name = "TYPE",
            value_parser = ["dc", "isp", "res", "mobile"],
            conflicts_with = "ips"
        )]
        source_type: Option<String>,
        /// Or these: egress addresses, or /64s of an exit's egress prefix (operators; comma-separated or repeated)
        #[arg(long = "ip", value_name = "ADDR", value_delimiter = ',')]
        ips: Vec<String>,
        /// Only these proxy users may leave from them (comma-separated or repeated) [default: every user of the account]
        #[arg(long = "user", value_name = "UUID", value_delimiter = ',')]
        users: Vec<String>,
    },
    /// Release a dedicated address back to the shared pool
    Release {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
        /// The address, or the prefix (its /64 may be left out)
        ip: String,
    },
    /// Swap a dedicated address for a free one of the same country, city and type (a monthly allowance)
    Replace {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
        /// The address, or the prefix (its /64 may be left out)
        ip: String,
    },
    /// Set which of the account's proxy users may leave from an address (no --user: all of them)
    Assign {
        /// Account id
        #[arg(long, value_name = "ID")]
        account: String,
        /// The address, or the prefix (its /64 may be left out)
        ip: String,
        /// A proxy user id (comma-separated or repeated)
        #[arg(long = "user", value_name = "UUID", value_delimiter = ',')]
        users: Vec<String>,
    },
    /// Every dedicated address held, of every account (operator)
    Map {
        /// Only this account's
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// Move a dedicated address to another account (operator)
    Move {
        /// The address, or the prefix (its /64 may be left out)
        ip: String,
        /// The account it goes to
        #[arg(long, value_name = "ID")]
        to: String,
    },
}

// ---- sessions ---------------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Sessions {
    /// List a user's sticky sessions
    List {
        /// User id
        user: String,
    },
    /// Read one sticky session
    Get {
        /// User id
        user: String,
        /// Session id
        session: String,
    },
    /// End a sticky session: its next tunnel picks an exit afresh
    End {
        /// User id
        user: String,
        /// Session id
        session: String,
    },
    /// Set a session's remaining life to N minutes from now (extend or shorten)
    #[command(visible_alias = "extend")]
    SetTime {
        /// User id
        user: String,
        /// Session id
        session: String,
        /// Minutes from now (1 to 1440)
        #[arg(long, value_name = "N")]
        minutes: u32,
    },
}

// ---- sites ------------------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Sites {
    /// Exits cooled per site, worst first (an account key: the sites it used or reported)
    List {
        /// Only this site (a host name, address or block)
        #[arg(long)]
        site: Option<String>,
    },
    /// Lift an exit's cooldown for a site on every superproxy (operator; audited)
    Lift {
        /// The site, as `sites list` shows it
        site: String,
        /// Exit id
        exit_id: String,
    },
}

// ---- usage, invoices --------------------------------------------------------

#[derive(Args, Debug)]
pub(crate) struct UsageArgs {
    /// Account id
    pub(crate) account: String,
    /// Start (RFC 3339) [default: 24 hours before --to]
    #[arg(long, value_name = "TIME")]
    pub(crate) from: Option<String>,
    /// End, exclusive (RFC 3339) [default: now]
    #[arg(long, value_name = "TIME")]
    pub(crate) to: Option<String>,
    /// Up to three of user, exit, source_type, minute, day, domain, country (comma-separated); or account
    #[arg(long, value_name = "DIMS")]
    pub(crate) group_by: Option<String>,
}

#[derive(Args, Debug)]
pub(crate) struct InvoiceArgs {
    /// Account id
    pub(crate) account: String,
    /// The month (YYYY-MM) [default: this month]
    #[arg(long, value_name = "YYYY-MM")]
    pub(crate) month: Option<String>,
    /// Print the API's CSV rendering instead
    #[arg(long)]
    pub(crate) csv: bool,
}

// ---- abuse ------------------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Abuse {
    /// Who used an egress address (bound, or the public one observed) around a time
    Lookup {
        /// The address, or a network (e.g. an exit's /64)
        #[arg(long, value_name = "IP|CIDR")]
        egress_ip: String,
        /// When the complaint says the traffic arrived (RFC 3339)
        #[arg(long, value_name = "TIME")]
        at: String,
        /// host or host:port the complaint names
        #[arg(long)]
        target: Option<String>,
        /// Minutes either side of --at (0 to 60) [default: 2]
        #[arg(long, value_name = "N")]
        window_minutes: Option<u32>,
    },
    /// The abuse record of a time range (at most 31 days)
    Export {
        /// Start, inclusive (RFC 3339)
        #[arg(long, value_name = "TIME")]
        from: String,
        /// End, exclusive (RFC 3339)
        #[arg(long, value_name = "TIME")]
        to: String,
        /// Only rows of this address or network
        #[arg(long, value_name = "IP|CIDR")]
        egress_ip: Option<String>,
        /// Only rows to host or host:port
        #[arg(long)]
        target: Option<String>,
        /// Print the API's CSV rendering instead
        #[arg(long)]
        csv: bool,
    },
}

// ---- webhooks ---------------------------------------------------------------

#[derive(Subcommand, Debug)]
pub(crate) enum Webhooks {
    /// List webhooks (never their secrets)
    List {
        /// The account's webhooks [default: the operator's]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// Create a signed webhook; its secret is shown once (docs/webhooks.md)
    Create {
        /// For this account's events [default: an operator webhook]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
        /// Where to deliver (http or https)
        #[arg(long)]
        url: String,
        /// Events: quota.warning, quota.exhausted, key.revoked, webhook.disabled, dedicated_ip.allocated, dedicated_ip.released, dedicated_ip.replaced, dedicated_ip.moved, exit.withdrawn (operator only); comma-separated or repeated
        #[arg(
            long = "event",
            value_name = "EVENT",
            value_delimiter = ',',
            required = true
        )]
        events: Vec<String>,
    },
    /// Enable a webhook its failures disabled (or that was paused)
    Enable {
        /// Webhook id
        id: String,
        /// The account it belongs to [default: an operator webhook]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// Pause a webhook: its pending deliveries are given up, no events queue
    Disable {
        /// Webhook id
        id: String,
        /// The account it belongs to [default: an operator webhook]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// Delete a webhook (its pending deliveries go with it)
    Delete {
        /// Webhook id
        id: String,
        /// The account it belongs to [default: an operator webhook]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
    },
    /// A webhook's delivery history, newest first
    Deliveries {
        /// Webhook id
        id: String,
        /// The account it belongs to [default: an operator webhook]
        #[arg(long, value_name = "ID")]
        account: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

// ---- audit, api -------------------------------------------------------------

#[derive(Args, Debug)]
pub(crate) struct AuditArgs {
    /// Only this action (e.g. exit.drain)
    #[arg(long)]
    pub(crate) action: Option<String>,
    /// Only this subject (e.g. an exit id)
    #[arg(long)]
    pub(crate) subject: Option<String>,
    /// Only this actor (e.g. operator)
    #[arg(long)]
    pub(crate) actor: Option<String>,
    /// From (RFC 3339)
    #[arg(long, value_name = "TIME")]
    pub(crate) from: Option<String>,
    /// To, exclusive (RFC 3339)
    #[arg(long, value_name = "TIME")]
    pub(crate) to: Option<String>,
    #[command(flatten)]
    pub(crate) page: PageArgs,
}

#[derive(Args, Debug)]
pub(crate) struct ApiArgs {
    /// HTTP method (GET, POST, PUT, PATCH, DELETE)
    pub(crate) method: String,
    /// Path under the API, with any query (e.g. '/v1/audit?action=exit.drain')
    pub(crate) path: String,
    /// Request body: JSON, @FILE or - (stdin)
    #[arg(long, short = 'd', value_name = "JSON")]
    pub(crate) data: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli =
            Cli::try_parse_from(["proxynetctl", "exits", "list", "-o", "json", "--all"]).unwrap();
        assert_eq!(cli.global.output, Output::Json);
        assert!(matches!(
            cli.command,
            Command::Exits(Exits::List(PageArgs { all: true, .. }))
        ));
        assert!(
            Cli::try_parse_from(["proxynetctl", "exits", "list", "--all", "--limit", "3"]).is_err()
        );
        assert!(Cli::try_parse_from(["proxynetctl", "keys", "create"]).is_err());
        // A report names its exit one way, exactly.
        let report = [
            "proxynetctl",
            "feedback",
            "--site",
            "example.com",
            "--verdict",
        ];
        assert!(Cli::try_parse_from(report.iter().chain(&["blocked"])).is_err());
        assert!(Cli::try_parse_from(report.iter().chain(&["blocked", "--exit", "e"])).is_ok());
        assert!(Cli::try_parse_from(report.iter().chain(&[
            "blocked",
            "--exit",
            "e",
            "--session",
            "s"
        ]))
        .is_err());
        assert!(Cli::try_parse_from(report.iter().chain(&["banned", "--exit", "e"])).is_err());
        assert!(
            Cli::try_parse_from(report.iter().chain(&["ok", "--exit", "e", "--user", "u"]))
                .is_err()
        );
        assert!(Cli::try_parse_from([
            "proxynetctl",
            "policy",
            "get",
            "--account",
            "a",
            "--user",
            "b"
        ])
        .is_err());
    }

    #[test]
    fn dedicated_addresses_are_asked_for_by_count_or_by_name() {
        let parse = |line: &str| {
            let args = ["proxynetctl", "dedicated"].into_iter();
            Cli::try_parse_from(args.chain(line.split_whitespace())).map(|c| c.command)
        };
        let Ok(Command::Dedicated(Dedicated::Allocate {
            count,
            country,
            source_type,
            ips,
            users,
            ..
        })) = parse("allocate --account a --count 2 --country DE --type dc --user u1,u2 --user u3")
        else {
            panic!("allocate by count");
        };
        assert_eq!(count, Some(2));
        assert_eq!(country.as_deref(), Some("DE"));
        assert_eq!(source_type.as_deref(), Some("dc"));
        assert!(ips.is_empty());
        assert_eq!(users, ["u1", "u2", "u3"]);
        let Ok(Command::Dedicated(Dedicated::Allocate { count, ips, .. })) =
            parse("allocate --account a --ip 127.0.0.2,2001:db8:0:1::/64 --ip 127.0.0.3")
        else {
            panic!("allocate by name");
        };
        assert_eq!(count, None);
        assert_eq!(ips, ["127.0.0.2", "2001:db8:0:1::/64", "127.0.0.3"]);
        // One way or the other, exactly; targeting only with a count.
        for refused in [
            "allocate --account a",
            "allocate --account a --count 1 --ip 127.0.0.2",
            "allocate --account a --ip 127.0.0.2 --country DE",
            "allocate --account a --count 0",
            "allocate --account a --count 1 --type cable",
            "allocate --count 1",
            "release 127.0.0.2",
            "move 127.0.0.2",
        ] {
            assert!(parse(refused).is_err(), "{refused}");
        }
        // No --user: the address serves every user.
        let Ok(Command::Dedicated(Dedicated::Assign { ip, users, .. })) =
            parse("assign --account a 127.0.0.2")
        else {
            panic!("assign");
        };
        assert_eq!(ip, "127.0.0.2");
        assert!(users.is_empty());
        assert!(parse("move 127.0.0.2 --to b").is_ok());
        assert!(parse("map").is_ok());
        assert!(parse("list --account a -o json").is_ok());
    }
}
