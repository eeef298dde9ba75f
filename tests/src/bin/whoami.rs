//! Standalone whoami target for the local demo (`scripts/up`).

use clap::Parser;
use std::net::SocketAddr;

#[derive(Parser)]
#[command(about = "HTTP target that answers with the address it saw the request from")]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("whoami: cannot listen on {}: {e}", args.listen);
            return std::process::ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("whoami: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if proxynet_common::ready::announce(&serde_json::json!({ "whoami": addr })).is_err() {
        return std::process::ExitCode::FAILURE;
    }
    tokio::select! {
        () = proxynet_tests::whoami::serve(listener) => {}
        () = proxynet_common::shutdown::signal() => {}
    }
    std::process::ExitCode::SUCCESS
}
