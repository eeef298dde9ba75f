//! Serving one tunnel stream: check, resolve, vet, bind, connect, splice.
//!
//! Both link versions end up here: a v1 stream is an HTTP/2 `CONNECT`
//! (`link/v1_http2.rs`), a v2 stream a mux OPEN (`link/v2_mux.rs`); each is
//! parsed into the same [`TunnelRequest`] and served by the same code.
//!
//! The agent resolves the target itself, applies the egress policy to every
//! resolved address and dials only an address it vetted, bound to the egress
//! IP the superproxy asked for. Its connect timeout is the smaller of its own
//! limit and the superproxy's remaining budget minus a margin, so it gives up
//! first and answers with a precise [`Outcome`].

use proxynet_common::egress::parse_ip_literal;
use proxynet_wire::link::Outcome;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use crate::config::Config;
use crate::dns::{Dns, DnsFailure};
use crate::policy::LivePolicy;
use crate::state::AgentState;

/// Left for the superproxy to relay our answer before its own budget ends.
const BUDGET_MARGIN: Duration = Duration::from_millis(200);

pub(crate) struct TunnelContext {
    pub config: Config,
    pub identity: AgentState,
    pub policy: LivePolicy,
    pub dns: Dns,
    pub active: AtomicUsize,
    pub links_up: AtomicUsize,
    /// Announced to the control plane: superproxies stop choosing us.
    pub draining: AtomicBool,
    /// New streams are refused (after the drain announcement had time to spread).
    pub refusing: AtomicBool,
    /// The owner withdrew this exit: it carries nothing from now on.
    pub withdrawn: AtomicBool,
    /// Cancelled at a withdrawal: every open tunnel ends at once. Replaced
    /// by a fresh token when the owner undoes the withdrawal.
    pub cut_all: std::sync::Mutex<tokio_util::sync::CancellationToken>,
    /// What each heartbeat says about this agent (its admin listener).
    pub beat_info: crate::control::BeatInfo,
    /// The admin listener's secret for state-changing routes.
    pub admin_token: proxynet_common::secret::Secret,
    /// The withdrawal, as persisted in the state file.
    pub opt_out: std::sync::Mutex<Option<crate::state::OptOutState>>,
    /// `/metrics` on the admin listener.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Reflectors learned and link reconnects, for the public-egress observer.
    pub egress_watch: crate::public_egress::watch::EgressWatch,
    /// Wakes the heartbeat loop at once: a withdrawal or its undoing is
    /// announced now, not at the next interval.
    pub beat_now: tokio::sync::Notify,
    /// An upstream exit's partner gateway: every tunnel goes through it.
    pub(crate) upstream: Option<crate::upstream::Upstream>,
}

impl TunnelContext {
    /// The token a tunnel opened now is cut by at a withdrawal.
    pub(crate) fn cut_token(&self) -> tokio_util::sync::CancellationToken {
        self.cut_all
            .lock()
            .map(|t| t.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    /// Draining or withdrawn: what the heartbeat announces.
    pub(crate) fn announces_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed) || self.withdrawn.load(Ordering::Relaxed)
    }
}

/// Decrements the active-tunnel count however the tunnel ends.
pub(crate) struct ActiveGuard(Arc<TunnelContext>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What a stream asks for, whichever link version carried it.
pub(crate) struct TunnelRequest {
    host: String,
    port: u16,
    egress_ip: IpAddr,
    budget: Duration,
    /// For an upstream exit: what the partner's username is built from.
    upstream: proxynet_wire::link::UpstreamAsk,
}

impl TunnelRequest {
    /// A v2 stream's `tunnel` request.
    pub(crate) fn from_target(
        target: &str,
        egress_ip: IpAddr,
        budget_ms: u64,
    ) -> Result<Self, Outcome> {
        let authority: http::uri::Authority = target.parse().map_err(|_| Outcome::BadRequest)?;
        Self::new(&authority, egress_ip, budget_ms)
    }

    pub(crate) fn new(
        authority: &http::uri::Authority,
        egress_ip: IpAddr,
        budget_ms: u64,
    ) -> Result<Self, Outcome> {
        let port = authority
            .port_u16()
            .filter(|p| *p != 0)
            .ok_or(Outcome::BadRequest)?;
        Ok(Self {
            host: authority.host().to_owned(),
            port,
            egress_ip,
            budget: Duration::from_millis(budget_ms),
            upstream: Default::default(),
        })
    }

    /// With what the superproxy sent for an upstream exit.
    pub(crate) fn with_upstream(mut self, ask: Option<proxynet_wire::link::UpstreamAsk>) -> Self {
        self.upstream = ask.unwrap_or_default();
        self
    }
}

/// Draining agents fail probes too: superproxies stop choosing them.
pub(crate) fn probe_outcome(ctx: &TunnelContext) -> Outcome {
    if ctx.announces_draining() {
        Outcome::Draining
    } else {
        Outcome::Connected
    }
}

/// Counts the tunnel against `max_tunnels`; `None` when at capacity.
pub(crate) fn admit(ctx: &Arc<TunnelContext>) -> Option<ActiveGuard> {
    let previous = ctx.active.fetch_add(1, Ordering::Relaxed);
    let guard = ActiveGuard(ctx.clone());
    (previous < ctx.config.tunnel_capacity()).then_some(guard)
}

pub(crate) fn count(outcome: Outcome) {
    metrics::counter!("proxynet_agent_tunnels_total", "outcome" => outcome.as_str()).increment(1);
}

pub(crate) async fn open(
    ctx: &TunnelContext,
    request: &TunnelRequest,
) -> Result<TcpStream, Outcome> {
    if ctx.refusing.load(Ordering::Relaxed) || ctx.withdrawn.load(Ordering::Relaxed) {
        return Err(Outcome::Draining);
    }
    let TunnelRequest {
        host,
        port,
        egress_ip,
        budget,
        upstream: ask,
    } = request;
    let (host, port, egress_ip, budget) = (host.as_str(), *port, *egress_ip, *budget);
    if !ctx.config.owns_egress(egress_ip) {
        return Err(Outcome::EgressUnavailable);
    }
    let freebind = ctx.config.egress_needs_freebind(egress_ip);
    let deadline = Instant::now()
        + budget
            .saturating_sub(BUDGET_MARGIN)
            .min(ctx.config.target_connect_timeout());
    if let Some(upstream) = &ctx.upstream {
        return through_partner(ctx, upstream, request, ask, freebind, deadline).await;
    }

    let candidates = resolve(ctx, host, port, deadline).await?;
    // Policy first, on every resolved address: a denied target is denied,
    // whatever family it has (`[64:ff9b::7f00:1]` is loopback to us too).
    let policy = ctx.policy.current();
    let mut denied = None;
    let vetted: Vec<SocketAddr> = candidates
        .into_iter()
        .filter(|addr| match policy.check(*addr) {
            Ok(()) => true,
            Err(d) => {
                denied = Some(d);
                false
            }
        })
        .collect();
    if vetted.is_empty() {
        if let Some(d) = denied {
            tracing::info!(target = %host, port, reason = %d, "egress policy denied target");
        }
        return Err(Outcome::PolicyDenied);
    }
    // Same address family as the egress IP: an IPv4 source cannot reach an IPv6 target.
    let vetted: Vec<SocketAddr> = vetted
        .into_iter()
        .filter(|a| a.is_ipv4() == egress_ip.is_ipv4())
        .collect();
    if vetted.is_empty() {
        return Err(Outcome::Unreachable);
    }
    let mut last = Outcome::Unreachable;
    for addr in vetted.into_iter().take(2) {
        match connect_from(egress_ip, freebind, addr, deadline).await {
            Ok(tcp) => return Ok(tcp),
            Err(Outcome::EgressUnavailable) => return Err(Outcome::EgressUnavailable),
            Err(outcome) => last = outcome,
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    Err(last)
}

/// An upstream exit's tunnel: the egress policy on the target as given
/// (names stay unresolved: the partner resolves them), then the partner's
/// gateway dialled from the egress IP and asked for the target under the
/// templated username. Failing to reach the partner is the partner's fault
/// (`upstream_refused`), never the target's.
async fn through_partner(
    ctx: &TunnelContext,
    upstream: &crate::upstream::Upstream,
    request: &TunnelRequest,
    ask: &proxynet_wire::link::UpstreamAsk,
    freebind: bool,
    deadline: Instant,
) -> Result<TcpStream, Outcome> {
    let policy = ctx.policy.current();
    crate::upstream::vet_target(&policy, &request.host, request.port)?;
    let partner = resolve(ctx, upstream.host(), upstream.port(), deadline)
        .await
        .map_err(|_| Outcome::UpstreamRefused)?;
    let mut last = Outcome::UpstreamRefused;
    for addr in partner
        .into_iter()
        .filter(|a| a.is_ipv4() == request.egress_ip.is_ipv4())
        .take(2)
    {
        match connect_from(request.egress_ip, freebind, addr, deadline).await {
            Ok(tcp) => {
                let ask = crate::upstream::UpstreamAsk {
                    session: ask.session.clone(),
                    country: ask.country.clone(),
                    city: ask.city.clone(),
                };
                return crate::upstream::connect_through(
                    upstream,
                    tcp,
                    &request.host,
                    request.port,
                    &ask,
                    deadline,
                )
                .await;
            }
            Err(Outcome::EgressUnavailable) => return Err(Outcome::EgressUnavailable),
            Err(_) => last = Outcome::UpstreamRefused,
        }
    }
    Err(last)
}

async fn resolve(
    ctx: &TunnelContext,
    host: &str,
    port: u16,
    deadline: Instant,
) -> Result<Vec<SocketAddr>, Outcome> {
    if let Some(ip) = parse_ip_literal(host) {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let resolved = ctx.dns.resolve(host, port, deadline).await;
    metrics::counter!("proxynet_agent_dns_lookups_total", "result" => match &resolved {
        Ok(_) => "ok",
        Err(DnsFailure::TimedOut) => "timed_out",
        Err(DnsFailure::NoAddress) => "no_address",
    })
    .increment(1);
    resolved.map_err(|failure| match failure {
        DnsFailure::TimedOut => Outcome::TimedOut,
        DnsFailure::NoAddress => Outcome::DnsError,
    })
}

/// Binds the egress IP, then connects: the source address is ours to choose.
/// `freebind`: `egress_ip` is a prefix address no interface carries
/// (`egress.rs`).
async fn connect_from(
    egress_ip: IpAddr,
    freebind: bool,
    target: SocketAddr,
    deadline: Instant,
) -> Result<TcpStream, Outcome> {
    let socket = if egress_ip.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|_| Outcome::Capacity)?;
    defer_port_choice(&socket);
    if freebind {
        crate::egress::allow_nonlocal_bind(&socket, egress_ip).map_err(|e| {
            tracing::warn!(%egress_ip, error = %e, "cannot bind a prefix address (IP_FREEBIND)");
            Outcome::EgressUnavailable
        })?;
    }
    socket
        .bind(SocketAddr::new(egress_ip, 0))
        .map_err(|_| Outcome::EgressUnavailable)?;
    let _ = socket.set_nodelay(true);
    proxynet_common::sockets::bound_unsent(&socket);
    match tokio::time::timeout_at(deadline, socket.connect(target)).await {
        Err(_) => Err(Outcome::TimedOut),
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(match e.kind() {
            // A target that resets the connection as it completes (a site
            // refusing this address right after accept) is a refusal too.
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset => {
                Outcome::Refused
            }
            std::io::ErrorKind::TimedOut => Outcome::TimedOut,
            std::io::ErrorKind::AddrNotAvailable => Outcome::EgressUnavailable,
            _ => Outcome::Unreachable,
        }),
    }
}

/// Sets `IP_BIND_ADDRESS_NO_PORT`: `bind(egress_ip:0)` then leaves the source
/// port to `connect`, which can reuse a port towards different destinations.
/// Without it every bind reserves a port for any destination, and an exit that
/// opens many tunnels from one egress IP runs out of ports (and spends its time
/// searching for free ones) long before the 4-tuple space is used up.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn defer_port_choice(socket: &TcpSocket) {
    use std::os::fd::AsRawFd;
    let one: libc::c_int = 1;
    // SAFETY: the fd belongs to `socket`, which outlives the call; the option
    // value points at a live c_int and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "IP_BIND_ADDRESS_NO_PORT not set");
    }
}

#[cfg(not(target_os = "linux"))]
fn defer_port_choice(_socket: &TcpSocket) {}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    /// An agent serving from 192.0.2.1 (one tunnel at most), its state file
    /// under `dir`.
    pub(crate) fn context(dir: &std::path::Path) -> Arc<TunnelContext> {
        let state_file = dir.join("exit-agent.json");
        let config = Config::try_parse_from([
            "exit-agent",
            "--control-api",
            "https://control.example",
            "--egress-ip",
            "192.0.2.1",
            "--max-tunnels",
            "1",
            "--state-file",
            state_file.to_str().unwrap(),
        ])
        .unwrap();
        let policy = LivePolicy::new(config.egress.policy(&[]));
        let resolver: SocketAddr = "127.0.0.1:53".parse().unwrap();
        let dns = Dns::new(1, Duration::from_secs(1), &[resolver]);
        Arc::new(TunnelContext {
            config,
            identity: AgentState {
                exit_id: uuid::Uuid::new_v4(),
                credential: proxynet_common::secret::Secret::new("exit-credential"),
                opted_out: None,
            },
            policy,
            dns,
            active: AtomicUsize::new(0),
            links_up: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            withdrawn: AtomicBool::new(false),
            cut_all: std::sync::Mutex::new(tokio_util::sync::CancellationToken::new()),
            beat_info: crate::control::BeatInfo::default(),
            admin_token: proxynet_common::secret::Secret::new("admin-token"),
            opt_out: std::sync::Mutex::new(None),
            metrics: None,
            egress_watch: Default::default(),
            beat_now: Default::default(),
            upstream: None,
        })
    }

    fn ours() -> IpAddr {
        "192.0.2.1".parse().unwrap()
    }

    #[test]
    fn a_target_names_its_host_and_a_nonzero_port() {
        let request = TunnelRequest::from_target("example.com:443", ours(), 1_500).unwrap();
        assert_eq!(request.host, "example.com");
        assert_eq!(request.port, 443);
        assert_eq!(request.egress_ip, ours());
        assert_eq!(request.budget, Duration::from_millis(1_500));
    }

    #[test]
    fn a_target_without_a_usable_port_is_a_bad_request() {
        for target in [
            "example.com",
            "example.com:0",
            "example.com:99999",
            "",
            "exa mple.com:80",
        ] {
            assert_eq!(
                TunnelRequest::from_target(target, ours(), 1_000).err(),
                Some(Outcome::BadRequest),
                "{target:?}"
            );
        }
    }

    #[tokio::test]
    async fn probes_fail_while_draining_or_withdrawn() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        assert_eq!(probe_outcome(&ctx), Outcome::Connected);
        ctx.draining.store(true, Ordering::Relaxed);
        assert_eq!(probe_outcome(&ctx), Outcome::Draining);
        ctx.draining.store(false, Ordering::Relaxed);
        ctx.withdrawn.store(true, Ordering::Relaxed);
        assert!(ctx.announces_draining());
        assert_eq!(probe_outcome(&ctx), Outcome::Draining);
    }

    #[tokio::test]
    async fn tunnels_beyond_the_limit_are_refused_and_a_freed_slot_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let first = admit(&ctx);
        assert!(first.is_some());
        assert!(admit(&ctx).is_none());
        // The refused attempt gave its count back at once.
        assert_eq!(ctx.active.load(Ordering::Relaxed), 1);
        drop(first);
        assert_eq!(ctx.active.load(Ordering::Relaxed), 0);
        assert!(admit(&ctx).is_some());
    }

    #[tokio::test]
    async fn open_refuses_what_it_must_not_dial_before_dialling() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let tunnel = |target: &str, egress_ip: IpAddr| {
            TunnelRequest::from_target(target, egress_ip, 5_000).unwrap()
        };
        let loopback = tunnel("127.0.0.1:6379", ours());
        assert_eq!(
            open(&ctx, &loopback).await.err(),
            Some(Outcome::PolicyDenied)
        );
        let smtp = tunnel("93.184.215.14:25", ours());
        assert_eq!(open(&ctx, &smtp).await.err(), Some(Outcome::PolicyDenied));
        let not_ours = tunnel("93.184.215.14:443", "192.0.2.9".parse().unwrap());
        assert_eq!(
            open(&ctx, &not_ours).await.err(),
            Some(Outcome::EgressUnavailable)
        );
        // Outside every prefix is not ours either (the context has none).
        let not_ours = tunnel("93.184.215.14:443", "2001:db8::9".parse().unwrap());
        assert_eq!(
            open(&ctx, &not_ours).await.err(),
            Some(Outcome::EgressUnavailable)
        );
        // An IPv4 egress address cannot reach an IPv6 target.
        let v6 = tunnel("[2606:4700::1111]:443", ours());
        assert_eq!(open(&ctx, &v6).await.err(), Some(Outcome::Unreachable));
        ctx.withdrawn.store(true, Ordering::Relaxed);
        let public = tunnel("93.184.215.14:443", ours());
        assert_eq!(open(&ctx, &public).await.err(), Some(Outcome::Draining));
    }
}
