//! Logging set-up shared by the binaries.
//!
//! Logs go to standard error (standard output carries only the ready line).
//! `fast_socks5` logs SOCKS passwords at debug level, so everything it logs
//! below `warn` is dropped by a filter fixed in code, which no `RUST_LOG`
//! directive (however specific: `fast_socks5::server=trace`) can override.

use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::filter::EnvFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// Whether an event from `target` at `level` may be logged at all.
pub fn never_secret(target: &str, level: &Level) -> bool {
    !(target.starts_with("fast_socks5") && *level > Level::WARN)
}

/// A global filter for what must never be logged. Global, not per-layer, and
/// with a static answer per callsite: callsites it refuses are disabled once,
/// and every other callsite keeps the cheap static interest the `EnvFilter`
/// gives it (a per-layer closure filter made every h2 and hyper span a
/// run-time decision, which showed in the data path's profile).
struct NeverSecret;

impl<S: Subscriber> Layer<S> for NeverSecret {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        if never_secret(meta.target(), meta.level()) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        // Log records bridged from the `log` crate share callsites; their
        // real target is checked here, per record.
        never_secret(meta.target(), meta.level())
    }
}

/// Quiet defaults for the libraries under us; `RUST_LOG` replaces them.
pub const DEFAULT_FILTER: &str = "info,h2=warn,hyper=warn,rustls=warn,sqlx=warn";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (fields flattened), for log pipelines.
    Json,
}

pub fn init(default_filter: &str, format: LogFormat) {
    let base = std::env::var("RUST_LOG").unwrap_or_else(|_| default_filter.to_owned());
    let filter = EnvFilter::try_new(&base).unwrap_or_else(|_| EnvFilter::new("info"));
    let output = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_target(true)
            .compact()
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_target(true)
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(NeverSecret)
        .with(filter)
        .with(output)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socks_library_debug_is_never_logged() {
        assert!(!never_secret("fast_socks5::server", &Level::DEBUG));
        assert!(!never_secret("fast_socks5", &Level::TRACE));
        assert!(never_secret("fast_socks5::server", &Level::WARN));
        assert!(never_secret("superproxy::ingress", &Level::DEBUG));
    }
}
