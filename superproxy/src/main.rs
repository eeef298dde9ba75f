/// The data path allocates and frees 64-256 KiB buffers at a high rate;
/// glibc's allocator trims and refaults those pages (a few percent of a core
/// in bulk profiles), mimalloc keeps them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use proxynet_common::{ready, shutdown, telemetry};
use superproxy::{Config, Superproxy};

fn main() -> std::process::ExitCode {
    let config = Config::parse();
    match proxynet_common::runtime::run(config.worker_threads, run(config)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("superproxy: runtime: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> std::process::ExitCode {
    telemetry::init(telemetry::DEFAULT_FILTER, config.log_format);
    let proxy = match Superproxy::bind(config).await {
        Ok(proxy) => proxy,
        Err(e) => {
            eprintln!("superproxy: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let addresses = proxy.addresses();
    tracing::info!(proxy = %addresses.proxy, admin = %addresses.admin, link = %addresses.link, "superproxy listening");
    if let Err(e) = ready::announce(&addresses) {
        eprintln!("superproxy: cannot write ready line: {e}");
    }
    proxy.serve(shutdown::signal()).await;
    std::process::ExitCode::SUCCESS
}
