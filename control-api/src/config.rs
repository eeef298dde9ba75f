//! control-api configuration: flags, each with an environment variable.

use clap::Parser;
use proxynet_common::secret::Secret;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone, Parser)]
#[command(name = "control-api", version, about = "proxynet control plane")]
pub struct Config {
    /// Address the REST API (and `/dashboard`) listens on (port 0 picks a free port).
    #[arg(long, env = "PROXYNET_API_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,

    /// Admin listener: `/metrics` (Prometheus, with the per-exit fleet view)
    /// and `/healthz`. Keep it off the public network.
    #[arg(
        long,
        env = "PROXYNET_API_ADMIN_LISTEN",
        default_value = "127.0.0.1:9092"
    )]
    pub admin_listen: SocketAddr,

    /// How often the fleet (every exit's state and health, every
    /// superproxy's totals) is sampled for metrics and the dashboard, seconds.
    #[arg(long, env = "PROXYNET_OBSERVE_INTERVAL_SECS", default_value_t = 10)]
    pub observe_interval_secs: u64,

    /// Most exits exported as per-exit Prometheus series (about 16 series
    /// each); fleet aggregates always cover every exit.
    #[arg(long, env = "PROXYNET_METRICS_EXIT_LIMIT", default_value_t = 10_000)]
    pub metrics_exit_limit: usize,

    /// Mark the dashboard's session cookie `Secure`: set it when users reach
    /// the dashboard over TLS (a terminating proxy that sends
    /// `X-Forwarded-Proto: https` turns it on per request anyway).
    #[arg(long, env = "PROXYNET_DASHBOARD_SECURE_COOKIE")]
    pub dashboard_secure_cookie: bool,

    /// Postgres URL (durable truth). Migrations are applied at start. A
    /// primary and its standbys may be named together in libpq's multi-host
    /// form (`postgres://u:p@db1:5432,db2:5432/proxynet`): the pool stays on
    /// the host that takes writes, reads from a standby while none does, and
    /// follows a promotion.
    #[arg(long, env = "PROXYNET_DATABASE_URL", hide_env_values = true)]
    pub database_url: Secret,

    #[command(flatten)]
    pub redis: proxynet_store::redis_target::RedisArgs,

    /// Operator token for the admin REST routes (`Authorization: Bearer ...`).
    /// Required: generate one with `openssl rand -hex 32`.
    #[arg(long, env = "PROXYNET_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<Secret>,

    /// How often agents are asked to heartbeat, in milliseconds.
    #[arg(long, env = "PROXYNET_HEARTBEAT_INTERVAL_MS", default_value_t = 5_000)]
    pub heartbeat_interval_ms: u64,

    /// How long an exit stays live after its last heartbeat, in milliseconds.
    /// Must exceed the interval; three intervals tolerates two lost beats.
    #[arg(long, env = "PROXYNET_HEARTBEAT_TTL_MS", default_value_t = 15_000)]
    pub heartbeat_ttl_ms: u64,

    /// How often heartbeats are written to Postgres, in one batch, in
    /// milliseconds. Liveness itself lives in Redis and never waits for it.
    #[arg(long, env = "PROXYNET_HEARTBEAT_PERSIST_MS", default_value_t = 5_000)]
    pub heartbeat_persist_ms: u64,

    /// A live exit's `last_heartbeat_at` in Postgres is refreshed at least
    /// this often, seconds; beats in between are written only if they change
    /// the drain flag or the tunnel count (liveness itself is in Redis).
    #[arg(long, env = "PROXYNET_HEARTBEAT_RECORD_SECS", default_value_t = 60)]
    pub heartbeat_record_secs: u64,

    /// Period of the full Postgres → Redis re-projection, in seconds. It repairs
    /// Redis after an outage or a lost write.
    #[arg(long, env = "PROXYNET_RESYNC_SECS", default_value_t = 30)]
    pub resync_secs: u64,

    /// This instance's name in the usage stream's consumer group. Keep it
    /// stable across restarts: a restarted instance re-reads the batches it
    /// had taken but not yet recorded.
    #[arg(long, env = "PROXYNET_INSTANCE_NAME", default_value = "control-api-1")]
    pub instance_name: String,

    /// How long the abuse-lookup record (who used which egress IP for which
    /// target, per minute) is kept, in days; egress observations older than
    /// it go too, except each egress's latest.
    #[arg(long, env = "PROXYNET_ABUSE_RETENTION_DAYS", default_value_t = 30)]
    pub abuse_retention_days: u64,

    /// How often expired abuse-lookup records are deleted, in seconds.
    #[arg(
        long,
        env = "PROXYNET_ABUSE_PRUNE_INTERVAL_SECS",
        default_value_t = 3_600
    )]
    pub abuse_prune_interval_secs: u64,

    /// Egress reflectors agents should ask besides the superproxies' own
    /// (`--reflector-listen` there, announced automatically): `http://HOST:PORT/whoami`
    /// of a superproxy on another address, repeat or comma-separate. Handed
    /// to agents in heartbeat replies; never a third party's service.
    #[arg(
        long = "reflector-url",
        env = "PROXYNET_REFLECTOR_URLS",
        value_delimiter = ',',
        value_parser = parse_reflector_url
    )]
    pub reflector_urls: Vec<String>,

    /// Keep exits out of routing whose declared egress IP is not what the
    /// reflector sees their traffic leave from (and that declared no NAT):
    /// they are projected blocked (`egress_unverified`) until an
    /// observation agrees. Off: such exits are flagged only.
    #[arg(long, env = "PROXYNET_STRICT_EGRESS_VERIFICATION")]
    pub strict_egress_verification: bool,

    /// Log line format: `text` for people, `json` (one object per line,
    /// the access log included) for log pipelines.
    #[arg(long, env = "PROXYNET_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: proxynet_common::telemetry::LogFormat,

    /// Lifetime of a new enrollment token unless the request says otherwise, in seconds.
    #[arg(long, env = "PROXYNET_ENROLLMENT_TTL_SECS", default_value_t = 3_600)]
    pub enrollment_ttl_secs: u64,

    /// Let webhook URLs point at internal and special-purpose addresses
    /// (loopback, private, link-local, CGNAT, ...), refused by default like
    /// tunnel targets. For tests and single-host demos; this control plane's
    /// own services and the SMTP ports stay refused.
    #[arg(long, env = "PROXYNET_WEBHOOK_ALLOW_INTERNAL")]
    pub webhook_allow_internal: bool,

    /// Attempts of one webhook delivery before it is given up (`failed`);
    /// retries back off from 5 s doubling to an hour, within a day.
    #[arg(long, env = "PROXYNET_WEBHOOK_MAX_ATTEMPTS", default_value_t = 15,
          value_parser = clap::value_parser!(i32).range(1..=30))]
    pub webhook_max_attempts: i32,

    /// Disable a webhook once this many of its deliveries in a row have
    /// failed (every attempt spent) and the first of those is at least
    /// `--webhook-disable-after-secs` old; 0: never.
    #[arg(
        long,
        env = "PROXYNET_WEBHOOK_DISABLE_AFTER_FAILURES",
        default_value_t = crate::webhooks::disable::DISABLE_AFTER_FAILURES
    )]
    pub webhook_disable_after_failures: u32,

    /// How old a webhook's run of failed deliveries must be before it
    /// disables the webhook, in seconds (3 days: an outage of a day or two
    /// does not).
    #[arg(long, env = "PROXYNET_WEBHOOK_DISABLE_AFTER_SECS",
          default_value_t = crate::webhooks::disable::DISABLE_AFTER_SECS)]
    pub webhook_disable_after_secs: u64,

    /// Most pending deliveries one account's webhooks may hold together;
    /// past it, new events are not queued for them (counted in
    /// `proxynet_webhook_deliveries_dropped_total`) until some are sent or
    /// given up. Operator webhooks are not capped; 0: no cap.
    #[arg(long, env = "PROXYNET_WEBHOOK_MAX_PENDING_PER_ACCOUNT",
          default_value_t = crate::webhooks::MAX_PENDING_PER_ACCOUNT)]
    pub webhook_max_pending_per_account: u64,

    /// Requests a second each account API key may make to this control-api,
    /// sustained; past it and its burst, `429` with `Retry-After`. Counted
    /// per instance; 0: no limit.
    #[arg(long, env = "PROXYNET_API_KEY_RATE", default_value_t = 20)]
    pub api_key_rate: u32,

    /// Requests an account API key may make at once after a quiet spell
    /// (then `--api-key-rate` a second).
    #[arg(long, env = "PROXYNET_API_KEY_BURST", default_value_t = 100)]
    pub api_key_burst: u32,

    /// Requests a second each operator API key may make to this
    /// control-api, sustained (the admin token has no limit); 0: no limit.
    #[arg(long, env = "PROXYNET_OPERATOR_KEY_RATE", default_value_t = 100)]
    pub operator_key_rate: u32,

    /// Requests an operator API key may make at once after a quiet spell
    /// (then `--operator-key-rate` a second).
    #[arg(long, env = "PROXYNET_OPERATOR_KEY_BURST", default_value_t = 500)]
    pub operator_key_burst: u32,
}

/// A reflector URL: plain `http://` (the answer is signed, and TLS in
/// front of it would be a proxy hiding the caller's address), a host and
/// an explicit port.
fn parse_reflector_url(s: &str) -> Result<String, String> {
    let rest = s
        .strip_prefix("http://")
        .ok_or_else(|| format!("{s:?}: a reflector URL is http://HOST:PORT/whoami"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    let port = authority
        .rsplit_once(':')
        .and_then(|(host, port)| (!host.is_empty()).then_some(port));
    match port.map(str::parse::<u16>) {
        Some(Ok(p)) if p > 0 => Ok(s.to_owned()),
        _ => Err(format!("{s:?}: a reflector URL names its host and port")),
    }
}

impl Config {
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }
    pub fn heartbeat_ttl(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ttl_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQUIRED: [&str; 5] = [
        "control-api",
        "--database-url",
        "postgres://proxynet@localhost/proxynet",
        "--redis-url",
        "redis://127.0.0.1/",
    ];

    fn parse(extra: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from(REQUIRED.iter().chain(extra).copied())
    }

    #[test]
    fn heartbeat_durations_are_read_in_milliseconds() {
        let config = parse(&[
            "--heartbeat-interval-ms",
            "250",
            "--heartbeat-ttl-ms",
            "900",
        ])
        .unwrap();
        assert_eq!(config.heartbeat_interval(), Duration::from_millis(250));
        assert_eq!(config.heartbeat_ttl(), Duration::from_millis(900));
        assert_eq!(
            config.database_url.expose(),
            "postgres://proxynet@localhost/proxynet"
        );
    }

    #[test]
    fn the_defaults_listen_on_loopback_with_three_beats_of_liveness() {
        let config = parse(&[]).unwrap();
        assert_eq!(
            config.listen,
            "127.0.0.1:7070".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            config.admin_listen,
            "127.0.0.1:9092".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(config.heartbeat_ttl(), 3 * config.heartbeat_interval());
        assert_eq!(config.instance_name, "control-api-1");
        assert_eq!((config.api_key_rate, config.api_key_burst), (20, 100));
        assert_eq!(
            (config.operator_key_rate, config.operator_key_burst),
            (100, 500)
        );
        assert_eq!(config.webhook_max_pending_per_account, 1000);
        assert_eq!(
            config.log_format,
            proxynet_common::telemetry::LogFormat::Text
        );
    }

    #[test]
    fn reflector_urls_are_plain_http_with_a_port() {
        let config = parse(&[
            "--reflector-url",
            "http://203.0.113.5:8099/whoami,http://[2001:db8::5]:8099/whoami",
        ])
        .unwrap();
        assert_eq!(config.reflector_urls.len(), 2);
        assert!(!config.strict_egress_verification);
        for bad in [
            "https://r.example:443/whoami",
            "http://r.example/whoami",
            "r.example:80",
        ] {
            assert!(parse(&["--reflector-url", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_redis_prefix_with_hash_tag_braces_is_refused() {
        assert!(parse(&["--redis-prefix", "pn{1}:"]).is_err());
        let config = parse(&["--redis-prefix", "tenant-a:"]).unwrap();
        assert_eq!(config.redis.redis_prefix, "tenant-a:");
    }

    #[test]
    fn malformed_addresses_and_log_formats_are_refused() {
        assert!(parse(&["--listen", "localhost"]).is_err());
        assert!(parse(&["--log-format", "xml"]).is_err());
        let config = parse(&["--listen", "0.0.0.0:0", "--log-format", "json"]).unwrap();
        assert_eq!(config.listen.port(), 0);
        assert_eq!(
            config.log_format,
            proxynet_common::telemetry::LogFormat::Json
        );
    }
}
