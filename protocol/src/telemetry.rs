//! Logging set-up shared by the binaries.
//!
//! Logs go to standard error (standard output carries only the ready line).
//! `fast_socks5` logs SOCKS passwords at debug level, so it is capped at `warn`
//! whatever `RUST_LOG` says: no filter a user writes can turn that leak back on.

use tracing_subscriber::EnvFilter;

/// Quiet defaults for the libraries under us; `RUST_LOG` replaces them.
pub const DEFAULT_FILTER: &str = "info,h2=warn,hyper=warn,rustls=warn,sqlx=warn";

pub fn init(default_filter: &str) {
    let base = std::env::var("RUST_LOG").unwrap_or_else(|_| default_filter.to_owned());
    let mut filter = EnvFilter::try_new(&base).unwrap_or_else(|_| EnvFilter::new("info"));
    if let Ok(directive) = "fast_socks5=warn".parse() {
        filter = filter.add_directive(directive);
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .compact()
        .try_init();
}
