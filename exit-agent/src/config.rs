//! exit-agent configuration: flags, each with an environment variable.

use clap::Parser;
use proxynet_protocol::egress::EgressArgs;
use proxynet_protocol::secret::Secret;
use proxynet_protocol::splice::TunnelLimits;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "exit-agent",
    version,
    about = "proxynet exit agent",
    subcommand_negates_reqs = true
)]
pub struct Config {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Base URL of the control-api, e.g. https://control.example.net
    #[arg(long, env = "PROXYNET_CONTROL_API")]
    pub control_api: String,

    /// One-time enrollment token; needed only on the first start, when no state file exists.
    #[arg(long, env = "PROXYNET_ENROLL_TOKEN", hide_env_values = true)]
    pub enroll_token: Option<Secret>,

    /// Where the agent keeps its exit id and credential (created with mode 0600).
    #[arg(
        long,
        env = "PROXYNET_STATE_FILE",
        default_value = "/var/lib/proxynet/exit-agent.json"
    )]
    pub state_file: PathBuf,

    /// Egress IPs this host serves tunnels from (repeat or comma-separate).
    #[arg(
        long = "egress-ip",
        env = "PROXYNET_EGRESS_IPS",
        value_delimiter = ',',
        required = true
    )]
    pub egress_ips: Vec<IpAddr>,

    /// Link versions this agent offers its superproxies (the newest one both
    /// speak is used): 1 = HTTP/2, 2 = the lean mux. `1` alone makes the agent
    /// talk exactly like a v1 release (for staged upgrades).
    #[arg(long, env = "PROXYNET_LINK_VERSIONS", default_value = "1,2")]
    pub link_versions: proxynet_protocol::link::LinkVersions,

    /// Worker threads of the runtime; default: one per core this process
    /// may run on.
    #[arg(long, env = "PROXYNET_WORKER_THREADS")]
    pub worker_threads: Option<usize>,

    /// Admin listener: /healthz, /readyz, /metrics, /opt-out.
    #[arg(
        long,
        env = "PROXYNET_AGENT_ADMIN_LISTEN",
        default_value = "127.0.0.1:9091"
    )]
    pub admin_listen: SocketAddr,

    /// The secret that state-changing admin routes (`POST /opt-out`) require
    /// as `Authorization: Bearer`; created (mode 0600) at the first start.
    /// Default: next to the state file, with the extension `.admin-token`.
    #[arg(long, env = "PROXYNET_AGENT_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// Upper bound on one target connect, ms. The superproxy's remaining budget
    /// lowers it further, so the exit always gives up before the superproxy does.
    #[arg(
        long,
        env = "PROXYNET_TARGET_CONNECT_TIMEOUT_MS",
        default_value_t = 8_000
    )]
    pub target_connect_timeout_ms: u64,

    /// Upper bound on resolving a target name, ms.
    #[arg(long, env = "PROXYNET_DNS_TIMEOUT_MS", default_value_t = 3_000)]
    pub dns_timeout_ms: u64,

    /// Name servers to resolve targets with (ip:port, repeat or
    /// comma-separate), instead of the host's `/etc/resolv.conf`: a local
    /// caching resolver, or a test's own DNS server.
    #[arg(
        long = "dns-server",
        env = "PROXYNET_DNS_SERVERS",
        value_delimiter = ','
    )]
    pub dns_servers: Vec<SocketAddr>,

    /// Most name lookups in flight at once; more wait (within their timeout).
    #[arg(long, env = "PROXYNET_DNS_MAX_IN_FLIGHT", default_value_t = 256)]
    pub dns_max_in_flight: usize,

    /// Accept a plain-http control-api URL (the agent's credential then
    /// crosses the network in clear text): for a local test stack only.
    #[arg(long, env = "PROXYNET_ALLOW_INSECURE_CONTROL_API")]
    pub allow_insecure_control_api: bool,

    /// Most tunnels served at once; beyond it new tunnels are refused as
    /// `capacity` (the superproxy retries them elsewhere).
    #[arg(long, env = "PROXYNET_MAX_TUNNELS", default_value_t = 16_384)]
    pub max_tunnels: usize,

    /// A tunnel with no bytes moving for this long is closed, s. Longer than the
    /// superproxy's (idle timeouts grow inward), so the superproxy closes first.
    #[arg(long, env = "PROXYNET_TUNNEL_IDLE_TIMEOUT_SECS", default_value_t = 330)]
    pub tunnel_idle_timeout_secs: u64,

    /// Longest a tunnel may live, s (a little above the superproxy's).
    #[arg(
        long,
        env = "PROXYNET_TUNNEL_MAX_LIFETIME_SECS",
        default_value_t = 86_460
    )]
    pub tunnel_max_lifetime_secs: u64,

    /// After SIGTERM: how long to keep serving while superproxies learn we are
    /// draining, ms.
    #[arg(long, env = "PROXYNET_DRAIN_ANNOUNCE_MS", default_value_t = 3_000)]
    pub drain_announce_ms: u64,

    /// After SIGTERM: how long in-flight tunnels may take to finish, ms.
    #[arg(long, env = "PROXYNET_DRAIN_TIMEOUT_MS", default_value_t = 30_000)]
    pub drain_timeout_ms: u64,

    /// Log line format: `text` for people, `json` (one object per line,
    /// the access log included) for log pipelines.
    #[arg(long, env = "PROXYNET_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: proxynet_protocol::telemetry::LogFormat,

    #[command(flatten)]
    pub egress: EgressArgs,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Withdraw this exit from the network (its owner's right): the running
    /// agent (found at --admin-listen) stops taking tunnels and ends the open
    /// ones; the control plane revokes its consent. Works with the control
    /// plane unreachable: the agent refuses tunnels and retries until it is
    /// acknowledged.
    OptOut,
    /// Undo this host's own withdrawal (the person behind the exit agreed
    /// again): the running agent takes tunnels again once the operator has
    /// also reinstated the exit with a fresh consent record.
    OptIn,
}

impl Config {
    /// Where the admin token lives (see `admin_token.rs`).
    pub fn admin_token_path(&self) -> PathBuf {
        self.admin_token_file
            .clone()
            .unwrap_or_else(|| crate::admin_token::default_path(&self.state_file))
    }
    pub fn target_connect_timeout(&self) -> Duration {
        Duration::from_millis(self.target_connect_timeout_ms)
    }
    pub fn tunnel_limits(&self) -> TunnelLimits {
        TunnelLimits {
            idle_timeout: Duration::from_secs(self.tunnel_idle_timeout_secs.max(1)),
            max_lifetime: Duration::from_secs(self.tunnel_max_lifetime_secs.max(1)),
        }
    }
    pub fn dns_timeout(&self) -> Duration {
        Duration::from_millis(self.dns_timeout_ms)
    }
}
