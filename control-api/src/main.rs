use clap::Parser;
use control_api::{Config, ControlApi};
use proxynet_common::{ready, telemetry};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::parse();
    telemetry::init(telemetry::DEFAULT_FILTER, config.log_format);
    let api = match ControlApi::bind(config).await {
        Ok(api) => api,
        Err(e) => {
            eprintln!("control-api: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let addr = match api.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("control-api: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let admin = match api.admin_addr() {
        Ok(admin) => admin,
        Err(e) => {
            eprintln!("control-api: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    tracing::info!(%addr, %admin, "control-api listening");
    if let Err(e) = ready::announce(&serde_json::json!({ "api": addr, "admin": admin })) {
        eprintln!("control-api: cannot write ready line: {e}");
    }
    match api.serve(proxynet_common::shutdown::signal()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("control-api: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
