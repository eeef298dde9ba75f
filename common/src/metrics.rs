//! Prometheus metrics, shared set-up: each binary installs one recorder
//! (`metrics` + `metrics-exporter-prometheus`) and serves its rendering at
//! `/metrics` on its admin listener. docs/observability.md is the catalogue.
//!
//! Labels never carry a credential, a password or a username's password
//! part; per-exit series are exported by the control-api only (see its
//! `observe` module), so a superproxy's series count does not grow with the
//! fleet.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;
use std::time::Duration;

/// Histogram buckets for latencies, in seconds (setup, probe RTT).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Installs the process-wide recorder; `None` if one is already installed
/// (tests that run several components in one process).
pub fn install() -> Option<PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .ok()?
        // Gauges of things that went away (an exit, a superproxy) disappear
        // instead of freezing at their last value.
        .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(120)))
        .install_recorder()
        .ok()
}

/// The text exposition, after dropping idle series.
pub fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}
