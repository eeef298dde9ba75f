//! What the superproxy counts, for `/metrics` (Prometheus) and for the
//! control-api's fleet view (a snapshot published to Redis each probe round).
//!
//! Every series here has labels from small fixed sets (ingress, error token,
//! direction, limit): nothing per exit, per user or per account, so a
//! superproxy's series count is constant whatever the fleet size
//! (docs/observability.md). Per-exit health comes from the control-api,
//! which aggregates what every superproxy reports.

use metrics::{counter, gauge, histogram, Counter, Histogram};
use proxynet_store::SuperproxyStats;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::error::ErrorKind;
use crate::request::Ingress;

/// Running totals this instance publishes for the fleet view.
#[derive(Default)]
pub(crate) struct Stats {
    opened: AtomicU64,
    failed: [AtomicU64; ErrorKind::ALL.len()],
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

/// The series every tunnel touches, registered once per process: a
/// `counter!` call builds its key (and allocates it) each time, which was a
/// tenth of a tunnel's allocations. The recorder is installed before the
/// first tunnel, so the handles are the recorder's.
struct PerTunnel {
    opened: [Counter; Ingress::ALL.len()],
    setup: [Histogram; Ingress::ALL.len()],
    logins_ok: Counter,
}

fn per_tunnel() -> &'static PerTunnel {
    static SERIES: OnceLock<PerTunnel> = OnceLock::new();
    SERIES.get_or_init(|| PerTunnel {
        opened: Ingress::ALL.map(
            |ingress| counter!("proxynet_tunnels_opened_total", "ingress" => ingress.as_str()),
        ),
        setup: Ingress::ALL.map(
            |ingress| histogram!("proxynet_tunnel_setup_seconds", "ingress" => ingress.as_str()),
        ),
        logins_ok: counter!("proxynet_auth_total", "outcome" => "ok"),
    })
}

impl Stats {
    pub(crate) fn tunnel_opened(&self, ingress: Ingress, setup: Duration) {
        self.opened.fetch_add(1, Ordering::Relaxed);
        let series = per_tunnel();
        series.opened[ingress as usize].increment(1);
        series.setup[ingress as usize].record(setup.as_secs_f64());
    }

    pub(crate) fn tunnel_failed(&self, ingress: Ingress, kind: ErrorKind) {
        if let Some(i) = ErrorKind::ALL.iter().position(|k| *k == kind) {
            self.failed[i].fetch_add(1, Ordering::Relaxed);
        }
        counter!(
            "proxynet_tunnels_failed_total",
            "ingress" => ingress.as_str(),
            "error" => kind.proxy_status_error(),
            "status" => kind.status().as_str().to_owned()
        )
        .increment(1);
        let limit = match kind {
            ErrorKind::TooManyRequests => Some("rate_or_concurrency"),
            ErrorKind::QuotaExhausted => Some("quota"),
            ErrorKind::ConnectionLimit => Some("connections"),
            _ => None,
        };
        if let Some(limit) = limit {
            counter!("proxynet_limit_refusals_total", "limit" => limit).increment(1);
        }
    }

    pub(crate) fn bytes(&self, up: u64, down: u64) {
        self.bytes_up.fetch_add(up, Ordering::Relaxed);
        self.bytes_down.fetch_add(down, Ordering::Relaxed);
        counter!("proxynet_tunnel_bytes_total", "direction" => "up").increment(up);
        counter!("proxynet_tunnel_bytes_total", "direction" => "down").increment(down);
    }

    /// The snapshot the fleet view reads (totals since start).
    pub(crate) fn snapshot(&self) -> SuperproxyStats {
        SuperproxyStats {
            tunnels_opened: self.opened.load(Ordering::Relaxed),
            tunnels_failed: ErrorKind::ALL
                .iter()
                .zip(&self.failed)
                .filter_map(|(kind, n)| {
                    let n = n.load(Ordering::Relaxed);
                    (n > 0).then(|| {
                        (
                            format!("{}:{}", kind.status().as_u16(), kind.proxy_status_error()),
                            n,
                        )
                    })
                })
                .fold(std::collections::BTreeMap::new(), |mut m, (k, n)| {
                    *m.entry(k).or_insert(0) += n;
                    m
                }),
            bytes_up: self.bytes_up.load(Ordering::Relaxed),
            bytes_down: self.bytes_down.load(Ordering::Relaxed),
        }
    }
}

/// Outcome of a login attempt (`ok`, `denied`, `limited`, `bad_username`).
pub(crate) fn auth(outcome: &'static str) {
    if outcome == "ok" {
        per_tunnel().logins_ok.increment(1);
    } else {
        counter!("proxynet_auth_total", "outcome" => outcome).increment(1);
    }
}

/// An HTTP/2 client connection we closed for its behaviour (`rapid_reset`).
pub(crate) fn h2_connection_closed(reason: &'static str) {
    counter!("proxynet_h2_connections_closed_total", "reason" => reason).increment(1);
}

/// A PROXY protocol header read from a trusted balancer's connection, or
/// why none was: `proxied`, `local` (the peer's address kept), `malformed`,
/// `timeout`, `closed` (the last three close the connection).
pub(crate) fn proxy_protocol(outcome: &'static str) {
    counter!("proxynet_proxy_protocol_headers_total", "outcome" => outcome).increment(1);
}

/// One datagram of a UDP association, `up` (client to exit) or `down`, and
/// what became of it (`relayed`, or why it was dropped).
pub(crate) fn udp_datagram(direction: &'static str, outcome: &'static str) {
    counter!("proxynet_udp_datagrams_total", "direction" => direction, "outcome" => outcome)
        .increment(1);
}

/// One destination of a UDP association to be written to the target log at
/// its first sight in a minute: `recorded`, or `rate_limited` (the
/// association's record rate was spent; its next datagram tries again).
pub(crate) fn udp_target_record(outcome: &'static str) {
    counter!("proxynet_udp_target_records_total", "outcome" => outcome).increment(1);
}

/// Open tunnels and connections: atomics moved per tunnel, published as
/// gauges when `/metrics` is read ([`publish_levels`]). Set at every
/// scrape, they never idle out of the exporter, and a tunnel costs no
/// registry lookup.
static TUNNELS_ACTIVE: AtomicI64 = AtomicI64::new(0);
static CONNECTIONS_OPEN: AtomicI64 = AtomicI64::new(0);

pub(crate) fn tunnels_active(delta: i64) {
    TUNNELS_ACTIVE.fetch_add(delta, Ordering::Relaxed);
}

pub(crate) fn connections_open(delta: i64) {
    CONNECTIONS_OPEN.fetch_add(delta, Ordering::Relaxed);
}

/// Sets the level gauges from their atomics, just before a rendering.
pub(crate) fn publish_levels() {
    gauge!("proxynet_tunnels_active").set(TUNNELS_ACTIVE.load(Ordering::Relaxed) as f64);
    gauge!("proxynet_connections_open").set(CONNECTIONS_OPEN.load(Ordering::Relaxed) as f64);
}

/// Connections not logged in yet: holding a pre-auth slot of their address,
/// and waiting (unread) for one.
pub(crate) fn unauthenticated(held: usize, waiting: usize) {
    gauge!("proxynet_unauthenticated_connections", "state" => "held").set(held as f64);
    gauge!("proxynet_unauthenticated_connections", "state" => "waiting").set(waiting as f64);
}

pub(crate) fn link_event(event: &'static str) {
    counter!("proxynet_link_events_total", "event" => event).increment(1);
}

pub(crate) fn pool(eligible: usize, blocked: usize, live: usize, degraded: bool) {
    gauge!("proxynet_pool_exits", "state" => "eligible").set(eligible as f64);
    gauge!("proxynet_pool_exits", "state" => "blocked_by_provenance").set(blocked as f64);
    gauge!("proxynet_pool_exits", "state" => "live").set(live as f64);
    gauge!("proxynet_degraded").set(if degraded { 1.0 } else { 0.0 });
}

/// Whether the control plane is silent (and for how long), and how many
/// exits only their probed links keep eligible meanwhile.
pub(crate) fn control_plane(silent_since: Option<std::time::Instant>, held_by_links: usize) {
    gauge!("proxynet_control_plane_silent").set(if silent_since.is_some() { 1.0 } else { 0.0 });
    gauge!("proxynet_control_plane_silent_seconds")
        .set(silent_since.map_or(0.0, |s| s.elapsed().as_secs_f64()));
    gauge!("proxynet_pool_exits", "state" => "held_by_links").set(held_by_links as f64);
}

/// One pool read: `full` or `delta`, and how many exits it carried.
pub(crate) fn pool_read(kind: &'static str, exits: usize) {
    counter!("proxynet_pool_reads_total", "kind" => kind).increment(1);
    counter!("proxynet_pool_read_exits_total", "kind" => kind).increment(exits as u64);
}

pub(crate) fn health(linked: usize, available: usize, ejected: usize, panic: bool) {
    gauge!("proxynet_exits_health", "state" => "linked").set(linked as f64);
    gauge!("proxynet_exits_health", "state" => "available").set(available as f64);
    gauge!("proxynet_exits_health", "state" => "ejected").set(ejected as f64);
    gauge!("proxynet_health_panic").set(if panic { 1.0 } else { 0.0 });
}

pub(crate) fn probe(rtt: Option<Duration>) {
    match rtt {
        Some(rtt) => histogram!("proxynet_probe_rtt_seconds").record(rtt.as_secs_f64()),
        None => counter!("proxynet_probe_failures_total").increment(1),
    }
}

pub(crate) fn store_error(store: &'static str, op: &'static str) {
    counter!("proxynet_store_errors_total", "store" => store, "op" => op).increment(1);
}

pub(crate) fn usage_batches(pending: usize) {
    gauge!("proxynet_usage_batches_pending").set(pending as f64);
}

pub(crate) fn usage_batch(outcome: &'static str) {
    counter!("proxynet_usage_batches_total", "outcome" => outcome).increment(1);
}

pub(crate) fn revoked(tunnels: usize, why: &'static str) {
    counter!("proxynet_tunnels_cut_total", "reason" => why).increment(tunnels as u64);
}

/// One outcome of a tunnel or request as its target site saw it
/// (`ok`, `refused`, `handshake_closed`, `banned`: `sites::Verdict`).
pub(crate) fn site_outcome(verdict: &'static str) {
    counter!("proxynet_site_outcomes_total", "verdict" => verdict).increment(1);
}

/// An exit this instance cooled for a site (announced to the fleet).
pub(crate) fn site_cooled() {
    counter!("proxynet_site_cooldowns_total").increment(1);
}

/// Site cooling ignored: `threshold` (a site entered panic: nearly every
/// eligible exit is cooled for it) or `fallback` (a pick found only exits
/// cooled for the tunnel's site).
pub(crate) fn site_panic(reason: &'static str) {
    counter!("proxynet_site_panic_total", "reason" => reason).increment(1);
}

/// (exit, site) cooldowns in force now, as this instance holds them.
pub(crate) fn site_cooldowns_active(n: usize) {
    gauge!("proxynet_site_cooldowns_active").set(n as f64);
}

/// What became of a ban a retry rule could retry on the forwarding paths:
/// `retried` (the request went to another exit), `exhausted` (its last
/// allowed attempt was banned too), `budget` (the retry budget was spent),
/// `unanswered` (no other exit answered the retry: the ban is relayed).
pub(crate) fn ban_retry(outcome: &'static str) {
    counter!("proxynet_ban_retries_total", "outcome" => outcome).increment(1);
}

/// An exit cooled for a site in one account's routing only (a customer's
/// report, or one account's failures not yet corroborated by another's).
pub(crate) fn site_account_cooled() {
    counter!("proxynet_site_account_cooldowns_total").increment(1);
}

/// Account-scoped (exit, site) cooldowns this instance holds now: exits
/// cooled for a site in one account's routing only.
pub(crate) fn site_account_cooldowns_active(n: usize) {
    gauge!("proxynet_site_account_cooldowns_active").set(n as f64);
}

/// A `Proxynet-Report` request header: what it said (`blocked`,
/// `unrecognized`) and what became of it (`cooled`, `rate_limited`,
/// `no_session`, `no_pin`, `ignored`). `source="header"` tells
/// these from the control-api's reports to `POST /v1/feedback`, which count
/// under the same name.
pub(crate) fn site_report(verdict: &'static str, result: &'static str) {
    counter!(
        "proxynet_site_reports_total",
        "source" => "header",
        "verdict" => verdict,
        "result" => result
    )
    .increment(1);
}

/// The share of one site's recent outcomes that were successes, for the
/// busiest sites only (at most `sites::TOP_SITES` series at once;
/// a site that leaves them stops being set, and its series goes with the
/// exporter's idle timeout).
pub(crate) fn site_success_ratio(site: &str, ratio: f64) {
    gauge!("proxynet_site_success_ratio", "site" => site.to_owned()).set(ratio);
}
