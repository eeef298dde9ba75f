//! `proxynetctl`: a command-line client for the proxynet control API.
//!
//! Every REST resource of the control API has a subcommand; answers print
//! as aligned tables by default and as the API's JSON with `--output json`.
//! An error answer prints one line on stderr (`error: 403 Forbidden: ...`).
//! Exit codes: 0 success, 1 API error, 2 usage error, 3 API unreachable.
//! docs/cli.md holds the full `--help` of every subcommand.

mod cli;
mod client;
mod commands;
mod config;
mod error;
mod output;

use std::time::Duration;

use clap::{CommandFactory, Parser};

use crate::cli::{Cli, Command};
use crate::error::{one_line, Failure};

fn main() {
    // Clap prints help and usage errors itself (usage errors exit 2).
    let cli = Cli::parse();
    if let Command::Completion { shell } = cli.command {
        let mut command = Cli::command();
        clap_complete::generate(shell, &mut command, "proxynetctl", &mut std::io::stdout());
        return;
    }
    let code = match run(cli) {
        Ok(()) => 0,
        Err(failure) => {
            eprintln!("error: {}", one_line(&failure.to_string()));
            failure.exit_code()
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<(), Failure> {
    let global = cli.global;
    if config::token_on_command_line(std::env::args_os()) {
        // Every local user reads a process's arguments in /proc/PID/cmdline,
        // and the shell's history keeps them.
        eprintln!(
            "warning: a token given with --token is visible to every local user (ps, /proc) and \
             kept in shell history; use --token-file, PROXYNET_ADMIN_TOKEN or the config file"
        );
    }
    let settings = config::resolve(config::Sources {
        api: global.api,
        token: global.token,
        token_file: global.token_file,
        config: global.config,
        allow_insecure_http: global.allow_insecure_http,
    })?;
    let client = client::Client::new(
        settings,
        global.verbose,
        Duration::from_secs(global.timeout.max(1)),
        global.cacert.as_deref(),
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Answer(format!("cannot start: {e}")))?;
    let ctx = commands::Ctx::new(client, global.output);
    runtime.block_on(commands::run(&ctx, cli.command))
}
