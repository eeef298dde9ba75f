//! superproxy configuration: flags, each with an environment variable.
//!
//! Timeouts follow the timeout chain: processing timeouts shrink inward
//! (client header read > connect budget > the agent's own target connect), so
//! the innermost hop fails first and the client gets a precise reason.

use clap::Parser;
use proxynet_common::egress::{Cidr, EgressArgs};
use proxynet_common::splice::TunnelLimits;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Parser)]
#[command(name = "superproxy", version, about = "proxynet data plane")]
pub struct Config {
    /// HTTP proxy listener (CONNECT).
    #[arg(long, env = "PROXYNET_PROXY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// SOCKS5 listener (the HTTP listener also accepts SOCKS5).
    #[arg(long, env = "PROXYNET_SOCKS_LISTEN", default_value = "127.0.0.1:1080")]
    pub socks_listen: SocketAddr,

    /// HTTPS proxy listener (TLS 1.2/1.3, ALPN http/1.1; the same CONNECT,
    /// absolute-form and errors as the plain listener). Off unless set, and
    /// needs `--tls-cert` and `--tls-key`.
    #[arg(long, env = "PROXYNET_TLS_LISTEN", requires_all = ["tls_cert", "tls_key"])]
    pub tls_listen: Option<SocketAddr>,

    /// PEM certificate chain for the HTTPS proxy listener; re-read on SIGHUP.
    #[arg(long, env = "PROXYNET_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for `tls_cert`; re-read on SIGHUP.
    #[arg(long, env = "PROXYNET_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// Networks whose connections must start with a PROXY protocol header
    /// (v1 or v2; comma-separated CIDRs: the TCP load balancers in front),
    /// on the HTTP, SOCKS5 and HTTPS listeners. The client address the
    /// header carries is the connection's everywhere; a connection from
    /// these networks without a valid header is closed, and no one else's is
    /// read for one. Empty (the default): off.
    #[arg(long, env = "PROXYNET_PROXY_PROTOCOL_FROM", value_delimiter = ',')]
    pub proxy_protocol_from: Vec<Cidr>,

    /// Address SOCKS5 UDP ASSOCIATE replies tell clients to send their
    /// datagrams to (the relay's port is added); defaults to the address the
    /// client's TCP connection reached. Set it behind a TCP load balancer,
    /// to this host's address the clients can reach over UDP.
    #[arg(long, env = "PROXYNET_UDP_ADVERTISE_ADDR")]
    pub udp_advertise_addr: Option<IpAddr>,

    /// Most client connections served at once; beyond it new connections get
    /// a 503 (`connection_limit_reached`) and are closed.
    #[arg(long, env = "PROXYNET_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// Most connections one source address (IPv6: one /64) may hold before
    /// they have authenticated; beyond it new ones wait, accepted but not
    /// read, until one of these logs in or closes (or the unauthenticated
    /// timeout, counted from accept, closes them), so one address cannot sit
    /// on the connection slots with silent sockets and a burst from one NAT
    /// address is still served.
    #[arg(
        long,
        env = "PROXYNET_MAX_UNAUTHENTICATED_PER_SOURCE",
        default_value_t = 64
    )]
    pub max_unauthenticated_per_source: usize,

    /// Most connections one source address may have waiting for a place
    /// under `--max-unauthenticated-per-source`; beyond it new ones are
    /// closed at once. Half of `--max-connections` may wait from all
    /// addresses together.
    #[arg(
        long,
        env = "PROXYNET_MAX_UNAUTHENTICATED_WAITING_PER_SOURCE",
        default_value_t = 1_024
    )]
    pub max_unauthenticated_waiting_per_source: usize,

    /// An address one of whose connections logged in within
    /// `--known-source-secs` may hold this many times
    /// `--max-unauthenticated-per-source` before authentication: a
    /// customer's bursts are read sooner, a stranger's silent sockets hold
    /// no more than the plain bound.
    #[arg(long, env = "PROXYNET_KNOWN_SOURCE_FACTOR", default_value_t = 4)]
    pub known_source_factor: usize,

    /// How long after a successful login its source address counts as
    /// known (see `--known-source-factor`), s.
    #[arg(long, env = "PROXYNET_KNOWN_SOURCE_SECS", default_value_t = 300)]
    pub known_source_secs: u64,

    /// A connection that has not authenticated this long after it was
    /// accepted (TLS handshake and first head included) is closed, ms.
    /// Shorter than the header read timeout: an unknown client gets less
    /// patience than a known one.
    #[arg(
        long,
        env = "PROXYNET_UNAUTHENTICATED_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    pub unauthenticated_timeout_ms: u64,

    /// Tunnels one user may hold open on this instance when its record sets
    /// no concurrency limit of its own (counted here, no Redis round trip):
    /// one customer cannot take every connection slot.
    #[arg(
        long,
        env = "PROXYNET_DEFAULT_USER_MAX_TUNNELS",
        default_value_t = 2_000
    )]
    pub default_user_max_tunnels: usize,

    /// What the tunnel streams of every agent link may hold between them for
    /// clients that stopped reading, MiB. Each stream starts with a 64 KiB
    /// window (agents that support it) and grows to 512 KiB as its client
    /// reads while less than half of this is queued; above, refills shrink
    /// towards 32 KiB. A stream whose client never reads holds at most its
    /// first window.
    #[arg(long, env = "PROXYNET_LINK_RECEIVE_BUDGET_MB", default_value_t = 64)]
    pub link_receive_budget_mb: usize,

    /// Live sticky sessions one user may hold; a new session beyond it is
    /// refused with 429 (existing ones keep working).
    #[arg(long, env = "PROXYNET_MAX_SESSIONS_PER_USER", default_value_t = 10_000)]
    pub max_sessions_per_user: usize,

    /// Worker threads of the runtime; default: one per core this process
    /// may run on.
    #[arg(long, env = "PROXYNET_WORKER_THREADS")]
    pub worker_threads: Option<usize>,

    /// Admin listener: /healthz, /readyz, /v1/pool.
    #[arg(long, env = "PROXYNET_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    pub admin_listen: SocketAddr,

    /// Listener agents dial for their links (TLS 1.3, then the link mux or HTTP/2).
    #[arg(long, env = "PROXYNET_LINK_LISTEN", default_value = "127.0.0.1:7443")]
    pub link_listen: SocketAddr,

    /// Link versions accepted from agents (the newest one both speak is
    /// used): 1 = HTTP/2, 2 = the lean mux. `1` alone makes this superproxy
    /// talk exactly like a v1 release (for staged upgrades).
    #[arg(long, env = "PROXYNET_LINK_VERSIONS", default_value = "1,2")]
    pub link_versions: proxynet_wire::link::LinkVersions,

    /// Address announced to agents for the link; defaults to the bound link address.
    #[arg(long, env = "PROXYNET_LINK_ADVERTISE")]
    pub link_advertise: Option<SocketAddr>,

    /// Egress reflector listener (`GET /whoami` answers the caller's address,
    /// signed): agents learn the public address their traffic leaves from
    /// here. Off unless set; it must face the exits directly (no proxy or
    /// load balancer rewriting the source address in between).
    #[arg(long, env = "PROXYNET_REFLECTOR_LISTEN")]
    pub reflector_listen: Option<SocketAddr>,

    /// Address announced to agents for the reflector; defaults to the bound
    /// reflector address (an unspecified bind is then not announced).
    #[arg(
        long,
        env = "PROXYNET_REFLECTOR_ADVERTISE",
        requires = "reflector_listen"
    )]
    pub reflector_advertise: Option<SocketAddr>,

    /// PEM certificate chain for the link listener. Without one, a self-signed
    /// certificate is generated at start; agents pin whichever is announced.
    #[arg(long, env = "PROXYNET_LINK_CERT", requires = "link_key")]
    pub link_cert: Option<PathBuf>,

    /// PEM private key for `link_cert`.
    #[arg(long, env = "PROXYNET_LINK_KEY", requires = "link_cert")]
    pub link_key: Option<PathBuf>,

    #[command(flatten)]
    pub redis: proxynet_store::redis_target::RedisArgs,

    /// Time a client has to send a complete request head (slowloris bound), ms.
    #[arg(
        long,
        env = "PROXYNET_HEADER_READ_TIMEOUT_MS",
        default_value_t = 15_000
    )]
    pub header_read_timeout_ms: u64,

    /// Total time to get a tunnel open, retries included; its remainder is sent
    /// to the agent, whose own target connect timeout is shorter. ms.
    #[arg(long, env = "PROXYNET_CONNECT_BUDGET_MS", default_value_t = 10_000)]
    pub connect_budget_ms: u64,

    /// A tunnel with no bytes moving either way for this long is closed, s.
    /// Idle timeouts grow inward: the agent's is longer, so we close first.
    #[arg(long, env = "PROXYNET_TUNNEL_IDLE_TIMEOUT_SECS", default_value_t = 300)]
    pub tunnel_idle_timeout_secs: u64,

    /// Longest a tunnel may live, however busy, s.
    #[arg(
        long,
        env = "PROXYNET_TUNNEL_MAX_LIFETIME_SECS",
        default_value_t = 86_400
    )]
    pub tunnel_max_lifetime_secs: u64,

    /// Active health probe period per linked exit, ms.
    #[arg(long, env = "PROXYNET_PROBE_INTERVAL_MS", default_value_t = 2_000)]
    pub probe_interval_ms: u64,

    /// A probe not answered within this is a failure, ms.
    #[arg(long, env = "PROXYNET_PROBE_TIMEOUT_MS", default_value_t = 1_000)]
    pub probe_timeout_ms: u64,

    /// Consecutive probe successes that bring a down exit back.
    #[arg(long, env = "PROXYNET_HEALTHY_THRESHOLD", default_value_t = 2)]
    pub healthy_threshold: u32,

    /// Consecutive probe failures that mark an exit down.
    #[arg(long, env = "PROXYNET_UNHEALTHY_THRESHOLD", default_value_t = 3)]
    pub unhealthy_threshold: u32,

    /// Consecutive exit faults on real tunnels that eject an exit.
    #[arg(long, env = "PROXYNET_EJECT_AFTER", default_value_t = 5)]
    pub eject_after: u32,

    /// First ejection length, ms; doubles with each further ejection.
    #[arg(long, env = "PROXYNET_EJECT_BASE_MS", default_value_t = 5_000)]
    pub eject_base_ms: u64,

    /// Longest ejection, ms.
    #[arg(long, env = "PROXYNET_EJECT_MAX_MS", default_value_t = 300_000)]
    pub eject_max_ms: u64,

    /// Passive ejection never takes out more than this share of linked exits, %.
    #[arg(long, env = "PROXYNET_MAX_EJECTED_PERCENT", default_value_t = 50)]
    pub max_ejected_percent: u32,

    /// Below this share of available exits, health is ignored (panic mode), %.
    #[arg(long, env = "PROXYNET_PANIC_THRESHOLD_PERCENT", default_value_t = 30)]
    pub panic_threshold_percent: u32,

    /// Most tunnels this superproxy keeps open through one exit (the agent's
    /// own `max_tunnels` defaults to the same).
    #[arg(long, env = "PROXYNET_EXIT_CAPACITY", default_value_t = 16_384)]
    pub exit_capacity: u32,

    /// Failures in a row through one exit for one target site (connects it
    /// refused, tunnels it closed within the handshake, ban answers) that
    /// cool the exit for that site; after a cooldown, one failure cools it
    /// again while its level is remembered.
    #[arg(long, env = "PROXYNET_SITE_COOL_AFTER", default_value_t = 3)]
    pub site_cool_after: u32,

    /// Distinct accounts whose failures must make up a streak before it
    /// cools the exit for the whole fleet; with fewer, the exit is cooled
    /// for the failing accounts' own routing only.
    #[arg(long, env = "PROXYNET_SITE_COOL_ACCOUNTS", default_value_t = 2)]
    pub site_cool_accounts: u32,

    /// First cooldown of an exit for a site, s; doubles with each repeat
    /// (±20 % jitter).
    #[arg(long, env = "PROXYNET_SITE_COOL_BASE_SECS", default_value_t = 60)]
    pub site_cool_base_secs: u64,

    /// Longest cooldown of an exit for a site, s; also how long its level
    /// is remembered after it ends.
    #[arg(long, env = "PROXYNET_SITE_COOL_MAX_SECS", default_value_t = 21_600)]
    pub site_cool_max_secs: u64,

    /// While at least this share of the eligible exits is cooled for a site,
    /// its cooling is ignored (panic), %.
    #[arg(long, env = "PROXYNET_SITE_PANIC_PERCENT", default_value_t = 95)]
    pub site_panic_percent: u32,

    /// Most sites one exit is cooled for at once across the fleet; beyond
    /// it the soonest to end are lifted.
    #[arg(long, env = "PROXYNET_SITE_COOLDOWNS_PER_EXIT", default_value_t = 64)]
    pub site_cooldowns_per_exit: usize,

    /// Failed authentications one address (IPv4, or IPv6 /64) may make per
    /// minute before it is answered 429 without a password check.
    #[arg(long, env = "PROXYNET_AUTH_FAILURES_PER_MINUTE", default_value_t = 30)]
    pub auth_failures_per_minute: u32,

    /// Lifetime of a concurrency lease, ms; renewed every third of it while
    /// the tunnel lives. A dead superproxy's leases free themselves within it.
    #[arg(long, env = "PROXYNET_LEASE_TTL_MS", default_value_t = 30_000)]
    pub lease_ttl_ms: u64,

    /// How often byte counts are flushed to the usage stream, ms (also the
    /// most a `kill -9` can lose).
    #[arg(long, env = "PROXYNET_USAGE_FLUSH_MS", default_value_t = 1_000)]
    pub usage_flush_ms: u64,

    /// While the control plane is silent (no control-api takes heartbeats),
    /// exits that were live when it fell silent stay eligible this long
    /// after their heartbeat liveness lapses if this superproxy holds a live
    /// link to them that passes its probes, s. An exit whose liveness had
    /// lapsed before stays out.
    #[arg(long, env = "PROXYNET_CONTROL_PLANE_GRACE_SECS", default_value_t = 600)]
    pub control_plane_grace_secs: u64,

    /// How often the pool of live exits is re-read from Redis, ms.
    #[arg(long, env = "PROXYNET_POOL_REFRESH_MS", default_value_t = 1_000)]
    pub pool_refresh_ms: u64,

    /// How often this superproxy re-announces its link address, ms; the
    /// announcement lives three intervals.
    #[arg(long, env = "PROXYNET_ANNOUNCE_INTERVAL_MS", default_value_t = 2_000)]
    pub announce_interval_ms: u64,

    /// How long a user record read from Redis is trusted before re-reading, ms.
    /// Bounds how late a revocation takes effect if its invalidation event is lost.
    #[arg(long, env = "PROXYNET_USER_CACHE_TTL_MS", default_value_t = 2_000)]
    pub user_cache_ttl_ms: u64,

    /// How long a successful password verification is reused, s (argon2 runs at
    /// most once per credential per this lifetime).
    #[arg(long, env = "PROXYNET_AUTH_CACHE_TTL_SECS", default_value_t = 300)]
    pub auth_cache_ttl_secs: u64,

    /// After SIGTERM: how long readiness reports `draining` while this
    /// instance still serves, so load balancers move new connections away
    /// before the listeners close, ms.
    #[arg(long, env = "PROXYNET_DRAIN_DELAY_MS", default_value_t = 5_000)]
    pub drain_delay_ms: u64,

    /// After the listeners close: how long open tunnels may take to finish
    /// before they are cut, ms.
    #[arg(long, env = "PROXYNET_DRAIN_TIMEOUT_MS", default_value_t = 30_000)]
    pub drain_timeout_ms: u64,

    /// Retries on another exit may add at most this share of tunnel opens, %
    /// (plus a burst of ten), so retries cannot amplify an outage.
    #[arg(long, env = "PROXYNET_RETRY_BUDGET_PERCENT", default_value_t = 20)]
    pub retry_budget_percent: u32,

    /// How often the IP allow-list is re-read (it is also re-read at once on
    /// its change event), ms.
    #[arg(long, env = "PROXYNET_ALLOWLIST_REFRESH_MS", default_value_t = 2_000)]
    pub allowlist_refresh_ms: u64,

    /// How often every user with a tunnel open here is re-checked, so a
    /// revocation whose change event was lost still cuts within it, ms.
    #[arg(long, env = "PROXYNET_REVOCATION_SWEEP_MS", default_value_t = 2_000)]
    pub revocation_sweep_ms: u64,

    /// Directory where usage batches are spilled when Redis is unreachable
    /// for longer than memory holds them, and replayed from when it returns
    /// (also at start). Without it, batches beyond the in-memory bound are
    /// dropped with an error in the log.
    #[arg(long, env = "PROXYNET_USAGE_SPILL_DIR")]
    pub usage_spill_dir: Option<PathBuf>,

    /// Most unsent usage batches (one per flush) kept in memory while Redis
    /// is away; older ones go to the spill directory.
    #[arg(long, env = "PROXYNET_USAGE_MEMORY_BATCHES", default_value_t = 300)]
    pub usage_memory_batches: usize,

    /// Log line format: `text` for people, `json` (one object per line,
    /// the access log included) for log pipelines.
    #[arg(long, env = "PROXYNET_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: proxynet_common::telemetry::LogFormat,

    #[command(flatten)]
    pub egress: EgressArgs,
}

/// No site cooldown is configured longer than a week.
const SITE_COOL_LONGEST_SECS: u64 = 7 * 24 * 3600;

impl Config {
    pub fn unauthenticated_timeout(&self) -> Duration {
        Duration::from_millis(self.unauthenticated_timeout_ms.max(100))
    }
    pub fn pre_auth_limits(&self) -> crate::accept::PreAuthLimits {
        let per_source = self.max_unauthenticated_per_source.max(1);
        let waiting_per_source = self.max_unauthenticated_waiting_per_source;
        crate::accept::PreAuthLimits {
            per_source,
            per_known_source: per_source.saturating_mul(self.known_source_factor.max(1)),
            waiting_per_source,
            // Half the connection slots, but never below one address's share.
            total: (self.max_connections / 2).max(per_source),
            waiting_total: (self.max_connections / 2).max(waiting_per_source),
            known_for: Duration::from_secs(self.known_source_secs),
            timeout: self.unauthenticated_timeout(),
        }
    }
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    /// Who must open with a PROXY protocol header; they have the header
    /// read timeout for it, within the unauthenticated timeout (both count
    /// from accept).
    pub fn proxy_protocol(&self) -> crate::accept::ProxyProtocol {
        crate::accept::ProxyProtocol {
            from: self.proxy_protocol_from.clone(),
            timeout: self
                .header_read_timeout()
                .min(Duration::from_millis(self.unauthenticated_timeout_ms)),
        }
    }
    pub fn connect_budget(&self) -> Duration {
        Duration::from_millis(self.connect_budget_ms)
    }
    pub fn tunnel_limits(&self) -> TunnelLimits {
        TunnelLimits {
            idle_timeout: Duration::from_secs(self.tunnel_idle_timeout_secs.max(1)),
            max_lifetime: Duration::from_secs(self.tunnel_max_lifetime_secs.max(1)),
        }
    }
    pub fn health(&self) -> crate::health::HealthConfig {
        crate::health::HealthConfig {
            probe_interval: Duration::from_millis(self.probe_interval_ms.max(50)),
            probe_timeout: Duration::from_millis(self.probe_timeout_ms.max(10)),
            healthy_threshold: self.healthy_threshold.max(1),
            unhealthy_threshold: self.unhealthy_threshold.max(1),
            eject_after: self.eject_after.max(1),
            eject_base: Duration::from_millis(self.eject_base_ms),
            eject_max: Duration::from_millis(self.eject_max_ms.max(self.eject_base_ms)),
            max_ejected_percent: self.max_ejected_percent.min(100),
            panic_threshold_percent: self.panic_threshold_percent.min(100),
            capacity: self.exit_capacity.max(1),
        }
    }
    pub fn sites(&self) -> crate::sites::SiteSettings {
        let base = Duration::from_secs(self.site_cool_base_secs.clamp(1, SITE_COOL_LONGEST_SECS));
        let max =
            Duration::from_secs(self.site_cool_max_secs.min(SITE_COOL_LONGEST_SECS)).max(base);
        crate::sites::SiteSettings {
            cool_after: self.site_cool_after.max(1),
            base,
            max,
            panic_percent: self.site_panic_percent.min(100),
            per_exit: self.site_cooldowns_per_exit.max(1),
            cool_accounts: self.site_cool_accounts.max(1),
        }
    }
    pub fn usage_flush(&self) -> Duration {
        Duration::from_millis(self.usage_flush_ms.max(50))
    }
    pub fn control_plane_grace(&self) -> Duration {
        Duration::from_secs(self.control_plane_grace_secs)
    }
    pub fn pool_refresh(&self) -> Duration {
        Duration::from_millis(self.pool_refresh_ms.max(50))
    }
    pub fn drain_delay(&self) -> Duration {
        Duration::from_millis(self.drain_delay_ms)
    }
    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }
    pub fn allowlist_refresh(&self) -> Duration {
        Duration::from_millis(self.allowlist_refresh_ms.max(100))
    }
    pub fn revocation_sweep(&self) -> Duration {
        Duration::from_millis(self.revocation_sweep_ms.max(100))
    }
    pub fn announce_interval(&self) -> Duration {
        Duration::from_millis(self.announce_interval_ms.max(50))
    }
}
