/// The data path allocates and frees 64-256 KiB buffers at a high rate;
/// glibc's allocator trims and refaults those pages (a few percent of a core
/// in bulk profiles), mimalloc keeps them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use exit_agent::{Config, ExitAgent};
use proxynet_common::{ready, shutdown, telemetry};

fn main() -> std::process::ExitCode {
    let config = Config::parse();
    match proxynet_common::runtime::run(config.worker_threads, run(config)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("exit-agent: runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> std::process::ExitCode {
    telemetry::init(telemetry::DEFAULT_FILTER, config.log_format);
    if let Some(command) = &config.command {
        let (name, result) = match command {
            exit_agent::Command::OptOut => ("opt-out", exit_agent::opt_out(&config).await),
            exit_agent::Command::OptIn => ("opt-in", exit_agent::opt_in(&config).await),
        };
        return match result {
            Ok(message) => {
                println!("{message}");
                std::process::ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("exit-agent {name}: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let agent = match ExitAgent::bind(config).await {
        Ok(agent) => agent,
        Err(e) => {
            eprintln!("exit-agent: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let addresses = agent.addresses();
    tracing::info!(admin = %addresses.admin, exit = %addresses.exit_id, "exit-agent running");
    if let Err(e) = ready::announce(&addresses) {
        eprintln!("exit-agent: cannot write ready line: {e}");
    }
    agent.serve(shutdown::signal()).await;
    std::process::ExitCode::SUCCESS
}
