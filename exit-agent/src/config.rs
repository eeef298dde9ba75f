//! exit-agent configuration: flags, each with an environment variable.

use clap::Parser;
use proxynet_common::egress::{Cidr, EgressArgs};
use proxynet_common::secret::Secret;
use proxynet_common::splice::TunnelLimits;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "exit-agent",
    version,
    about = "proxynet exit agent",
    subcommand_negates_reqs = true,
    group(
        clap::ArgGroup::new("egress_addresses")
            .args(["egress_ips", "egress_prefixes"])
            .required(true)
            .multiple(true)
    )
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
    /// An exit needs at least one egress IP or egress prefix.
    #[arg(long = "egress-ip", env = "PROXYNET_EGRESS_IPS", value_delimiter = ',')]
    pub egress_ips: Vec<IpAddr>,

    /// Prefixes this host serves tunnels from any address of (repeat or
    /// comma-separate; IPv6 /48 to /128, IPv4 /24 to /32): the superproxy
    /// picks an address per tunnel (a session keeps its pick). The host
    /// must route the prefix to itself, e.g. `ip -6 route add local
    /// 2001:db8:1:2::/64 dev lo`; the agent binds with IP_FREEBIND, so the
    /// addresses need not be configured on an interface.
    #[arg(
        long = "egress-prefix",
        env = "PROXYNET_EGRESS_PREFIXES",
        value_delimiter = ',',
        value_parser = proxynet_common::egress::parse_egress_prefix
    )]
    pub egress_prefixes: Vec<Cidr>,

    /// This host sits behind NAT (a residential line, a mobile network, an
    /// SDK host): the public address the reflector sees its traffic leave
    /// from may differ from its egress IPs. Said at enrollment and recorded;
    /// whether the difference is expected is the operator's word, on the
    /// enrollment token (`behind_nat`), else it flags the exit.
    #[arg(long, env = "PROXYNET_BEHIND_NAT")]
    pub behind_nat: bool,

    /// Egress reflectors to ask (`http://HOST:PORT/whoami`, repeat or
    /// comma-separate) instead of the ones the control-api names (every
    /// superproxy's `--reflector-listen`, its `--reflector-url`s). Only ever
    /// proxynet's own reflectors: the answer must carry their signature.
    #[arg(
        long = "reflector-url",
        env = "PROXYNET_REFLECTOR_URLS",
        value_delimiter = ','
    )]
    pub reflector_urls: Vec<String>,

    /// How often the public address of each egress IP and prefix is
    /// observed through a reflector and reported, s (also at start and
    /// after a link reconnects); 0: never.
    #[arg(
        long,
        env = "PROXYNET_EGRESS_OBSERVE_INTERVAL_SECS",
        default_value_t = 600
    )]
    pub egress_observe_interval_secs: u64,

    /// Link versions this agent offers its superproxies (the newest one both
    /// speak is used): 1 = HTTP/2, 2 = the lean mux. `1` alone makes the agent
    /// talk exactly like a v1 release (for staged upgrades).
    #[arg(long, env = "PROXYNET_LINK_VERSIONS", default_value = "1,2")]
    pub link_versions: proxynet_wire::link::LinkVersions,

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

    /// A UDP association with no datagram relayed either way for this long
    /// is closed, s (UDP has no close of its own; 0 is raised to 1).
    #[arg(
        long = "udp-idle-timeout",
        env = "PROXYNET_UDP_IDLE_TIMEOUT_SECS",
        default_value_t = 120
    )]
    pub udp_idle_timeout_secs: u64,

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
    pub log_format: proxynet_common::telemetry::LogFormat,

    #[command(flatten)]
    pub egress: EgressArgs,

    #[command(flatten)]
    pub upstream: UpstreamArgs,
}

/// An upstream exit: a partner's backconnect gateway that this agent opens
/// every tunnel through, instead of dialling targets itself
/// (docs/provenance.md, "Upstream exits"). The agent still dials the
/// partner from its `--egress-ip`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpstreamArgs {
    /// The partner's gateway: `http://USER@HOST:PORT` or
    /// `socks5h://USER@HOST:PORT` (the user is the partner account's; its
    /// password comes from `--upstream-password-file`, never the URL).
    #[arg(long, env = "PROXYNET_UPSTREAM")]
    pub upstream: Option<String>,

    /// The partner's username grammar, with `{user}`, `{session}`,
    /// `{country}` and `{city}` placeholders, e.g.
    /// `{user}-country-{country}-session-{session}`. Which placeholders it
    /// has is what the exit promises: targeting the partner cannot honour is
    /// never offered.
    #[arg(long, env = "PROXYNET_UPSTREAM_TEMPLATE", default_value = "{user}")]
    pub upstream_template: String,

    /// Countries the partner serves through this exit (ISO 3166-1 alpha-2,
    /// comma-separated). More than the enrollment token's own country needs
    /// `{country}` in the template.
    #[arg(long, env = "PROXYNET_UPSTREAM_COUNTRIES", value_delimiter = ',')]
    pub upstream_countries: Vec<String>,

    /// Most tunnels open through the partner at once (its concurrency
    /// limit); beyond it new tunnels are refused as `capacity`.
    #[arg(long, env = "PROXYNET_UPSTREAM_MAX_TUNNELS")]
    pub upstream_max_tunnels: Option<usize>,

    /// A file holding the partner account's password (one line; keep it
    /// 0600). It stays on this host: never in the control plane's stores,
    /// a log line or a metric.
    #[arg(long, env = "PROXYNET_UPSTREAM_PASSWORD_FILE")]
    pub upstream_password_file: Option<PathBuf>,
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
    /// Most tunnels at once: `--max-tunnels`, or the partner's limit when it
    /// is lower.
    pub fn tunnel_capacity(&self) -> usize {
        self.upstream
            .upstream_max_tunnels
            .map_or(self.max_tunnels, |partner| partner.min(self.max_tunnels))
    }

    /// Whether this exit may send from `ip`: one of its `--egress-ip`s, or
    /// an address inside one of its `--egress-prefix`es. The one check every
    /// tunnel and association makes before it binds a requested address.
    pub fn owns_egress(&self, ip: IpAddr) -> bool {
        self.egress_ips.contains(&ip) || self.egress_prefixes.iter().any(|p| p.contains(ip))
    }

    /// Whether binding `ip` needs IP_FREEBIND: a prefix address the host
    /// routes to itself but has not configured on an interface. A listed
    /// `--egress-ip` is bound plainly, so one missing from the host fails
    /// the bind (`egress_unavailable`) instead of sending unanswerable packets.
    pub fn egress_needs_freebind(&self, ip: IpAddr) -> bool {
        !self.egress_ips.contains(&ip) && self.egress_prefixes.iter().any(|p| p.contains(ip))
    }

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
    /// `None`: egress observation is off.
    pub fn egress_observe_interval(&self) -> Option<Duration> {
        (self.egress_observe_interval_secs > 0)
            .then(|| Duration::from_secs(self.egress_observe_interval_secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUIRED: [&str; 5] = [
        "exit-agent",
        "--control-api",
        "https://control.example",
        "--egress-ip",
        "192.0.2.1",
    ];

    fn parse(extra: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(REQUIRED.iter().chain(extra).copied())
    }

    #[test]
    fn egress_ips_may_be_repeated_or_comma_separated() {
        let config = parse(&["--egress-ip", "2001:db8::1,192.0.2.2"]).unwrap();
        let expected: Vec<IpAddr> = ["192.0.2.1", "2001:db8::1", "192.0.2.2"]
            .iter()
            .map(|ip| ip.parse().unwrap())
            .collect();
        assert_eq!(config.egress_ips, expected);
        assert!(config.command.is_none());
    }

    #[test]
    fn an_egress_ip_must_be_an_address() {
        assert!(parse(&["--egress-ip", "exit.example"]).is_err());
    }

    #[test]
    fn egress_prefixes_may_stand_alone_and_are_checked() {
        let only_prefixes = Config::try_parse_from([
            "exit-agent",
            "--control-api",
            "https://control.example",
            "--egress-prefix",
            "2001:db8:1:2::/64,192.0.2.0/28",
            "--egress-prefix",
            "2001:db8:9::5/48",
        ])
        .unwrap();
        assert!(only_prefixes.egress_ips.is_empty());
        let prefixes: Vec<String> = only_prefixes
            .egress_prefixes
            .iter()
            .map(ToString::to_string)
            .collect();
        // Host bits are dropped: the prefix is the network.
        assert_eq!(
            prefixes,
            ["2001:db8:1:2::/64", "192.0.2.0/28", "2001:db8:9::/48"]
        );
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert!(only_prefixes.owns_egress(ip("2001:db8:1:2:dead:beef:1:2")));
        assert!(only_prefixes.owns_egress(ip("192.0.2.15")));
        assert!(!only_prefixes.owns_egress(ip("192.0.2.16")));
        assert!(!only_prefixes.owns_egress(ip("2001:db8:1:3::1")));
        assert!(only_prefixes.egress_needs_freebind(ip("2001:db8:1:2::7")));

        let both = parse(&["--egress-prefix", "192.0.2.0/24"]).unwrap();
        assert!(both.owns_egress(ip("192.0.2.1")));
        // A listed egress IP is bound as configured, even inside a prefix.
        assert!(!both.egress_needs_freebind(ip("192.0.2.1")));
        assert!(both.egress_needs_freebind(ip("192.0.2.2")));

        for bad in ["2001:db8::/32", "192.0.2.0/16", "2001:db8::1", "fd00::/129"] {
            let e = parse(&["--egress-prefix", bad]).unwrap_err().to_string();
            assert!(
                e.contains("egress prefix") || e.contains("prefix length"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn an_exit_needs_an_egress_ip_or_prefix() {
        let none =
            Config::try_parse_from(["exit-agent", "--control-api", "https://control.example"]);
        assert!(none.is_err());
        // Subcommands talk to the running agent and need neither.
        assert!(Config::try_parse_from([
            "exit-agent",
            "--control-api",
            "https://control.example",
            "opt-out"
        ])
        .is_ok());
    }

    #[test]
    fn the_admin_token_lives_beside_the_state_file_unless_named() {
        let config = parse(&["--state-file", "/srv/agent/state.json"]).unwrap();
        assert_eq!(
            config.admin_token_path(),
            PathBuf::from("/srv/agent/state.admin-token")
        );
        let config = parse(&[
            "--state-file",
            "/srv/agent/state.json",
            "--admin-token-file",
            "/run/agent/token",
        ])
        .unwrap();
        assert_eq!(config.admin_token_path(), PathBuf::from("/run/agent/token"));
    }

    #[test]
    fn zero_tunnel_timeouts_are_raised_to_one_second() {
        let config = parse(&[
            "--tunnel-idle-timeout-secs",
            "0",
            "--tunnel-max-lifetime-secs",
            "0",
        ])
        .unwrap();
        let limits = config.tunnel_limits();
        assert_eq!(limits.idle_timeout, Duration::from_secs(1));
        assert_eq!(limits.max_lifetime, Duration::from_secs(1));
    }

    #[test]
    fn connect_and_dns_timeouts_are_read_in_milliseconds() {
        let config = parse(&[
            "--target-connect-timeout-ms",
            "1500",
            "--dns-timeout-ms",
            "250",
        ])
        .unwrap();
        assert_eq!(
            config.target_connect_timeout(),
            Duration::from_millis(1_500)
        );
        assert_eq!(config.dns_timeout(), Duration::from_millis(250));
    }

    #[test]
    fn only_link_versions_this_build_speaks_are_accepted() {
        assert!(parse(&["--link-versions", "1"])
            .unwrap()
            .link_versions
            .is_v1_only());
        assert!(parse(&["--link-versions", "3"]).is_err());
        assert!(parse(&["--link-versions", ""]).is_err());
    }

    #[test]
    fn opt_out_and_opt_in_are_subcommands() {
        let config = parse(&["opt-out"]).unwrap();
        assert!(matches!(config.command, Some(Command::OptOut)));
        let config = parse(&["opt-in"]).unwrap();
        assert!(matches!(config.command, Some(Command::OptIn)));
    }
}
