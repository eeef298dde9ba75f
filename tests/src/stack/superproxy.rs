//! The superproxy: its flags, typed after `superproxy/src/config.rs`
//! ([`SuperproxyArgs`]), its process (ready line: [`::superproxy::Addresses`]),
//! the HTTPS listener's certificate, and what tests ask of a running one
//! (its pool of eligible exits, the client URLs).

use clap::ValueEnum as _;
use proxynet_common::egress::Cidr;
use proxynet_common::telemetry::LogFormat;
use std::fmt::Display;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ::superproxy::Addresses;

use super::{redis_service_addr, Stack, StackOptions, LOOPBACK, PASSWORD, USERNAME};
use crate::process::{eventually, Proc};
use crate::stores::TestStores;

/// Superproxy flags in the order given, rendered as the argument vector
/// (`--flag value …`) the binary starts with: `Vec::from(args)`,
/// [`Self::into_vec`] or [`Self::as_slice`]. Each method is a flag of
/// `superproxy::Config`, taking the type the flag parses to. A flag given
/// twice is passed twice (clap refuses a single-valued flag given twice).
#[must_use]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SuperproxyArgs(Vec<String>);

/// `$method($type) => "--flag"`: a method passing `--flag VALUE`.
macro_rules! flags {
    ($($(#[$doc:meta])* $method:ident($ty:ty) => $flag:literal;)*) => {
        $(
            $(#[$doc])*
            pub fn $method(self, value: $ty) -> Self {
                self.flag($flag, value)
            }
        )*
    };
}

impl SuperproxyArgs {
    pub fn new() -> Self {
        Self::default()
    }

    /// `--FLAG VALUE` for a flag with no method here.
    pub fn flag(mut self, flag: &str, value: impl Display) -> Self {
        self.0.extend([flag.to_owned(), value.to_string()]);
        self
    }

    /// Arguments already rendered (e.g. [`StackOptions::superproxy_args`]),
    /// appended as they are.
    pub fn raw<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.0.extend(args.into_iter().map(Into::into));
        self
    }

    /// Whether `flag` (e.g. `"--reflector-listen"`) is among the arguments.
    pub fn has(&self, flag: &str) -> bool {
        self.0.iter().any(|a| a == flag)
    }

    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    pub fn into_vec(self) -> Vec<String> {
        self.0
    }

    flags! {
        /// `--listen`: the HTTP proxy listener.
        listen(SocketAddr) => "--listen";
        /// `--socks-listen`: the SOCKS5 listener.
        socks_listen(SocketAddr) => "--socks-listen";
        /// `--admin-listen`: health, pool and metrics.
        admin_listen(SocketAddr) => "--admin-listen";
        /// `--link-listen`: where agents dial in.
        link_listen(SocketAddr) => "--link-listen";
        /// `--reflector-listen`: the egress reflector.
        reflector_listen(SocketAddr) => "--reflector-listen";
        /// `--egress-allow`: a network let through the egress policy's
        /// built-in denials (repeatable).
        egress_allow(Cidr) => "--egress-allow";
        /// `--egress-protected`: a service address always denied (repeatable).
        egress_protected(SocketAddr) => "--egress-protected";
        /// `--proxy-protocol-from`: peers that must open with a PROXY
        /// protocol header (repeatable).
        proxy_protocol_from(Cidr) => "--proxy-protocol-from";
        /// `--max-connections`.
        max_connections(usize) => "--max-connections";
        /// `--max-unauthenticated-waiting-per-source`.
        max_unauthenticated_waiting_per_source(usize) => "--max-unauthenticated-waiting-per-source";
        /// `--unauthenticated-timeout-ms`.
        unauthenticated_timeout_ms(u64) => "--unauthenticated-timeout-ms";
        /// `--default-user-max-tunnels`.
        default_user_max_tunnels(usize) => "--default-user-max-tunnels";
        /// `--max-sessions-per-user`.
        max_sessions_per_user(usize) => "--max-sessions-per-user";
        /// `--link-receive-budget-mb`.
        link_receive_budget_mb(usize) => "--link-receive-budget-mb";
        /// `--header-read-timeout-ms`.
        header_read_timeout_ms(u64) => "--header-read-timeout-ms";
        /// `--connect-budget-ms`.
        connect_budget_ms(u64) => "--connect-budget-ms";
        /// `--tunnel-idle-timeout-secs`.
        tunnel_idle_timeout_secs(u64) => "--tunnel-idle-timeout-secs";
        /// `--probe-interval-ms`.
        probe_interval_ms(u64) => "--probe-interval-ms";
        /// `--probe-timeout-ms`.
        probe_timeout_ms(u64) => "--probe-timeout-ms";
        /// `--healthy-threshold`: successes that readmit an exit.
        healthy_threshold(u32) => "--healthy-threshold";
        /// `--unhealthy-threshold`: failures that take an exit out.
        unhealthy_threshold(u32) => "--unhealthy-threshold";
        /// `--auth-failures-per-minute`: per source address.
        auth_failures_per_minute(u32) => "--auth-failures-per-minute";
        /// `--lease-ttl-ms`: tunnel leases in Redis.
        lease_ttl_ms(u64) => "--lease-ttl-ms";
        /// `--usage-flush-ms`.
        usage_flush_ms(u64) => "--usage-flush-ms";
        /// `--usage-memory-batches`: refused usage batches held in memory
        /// before spilling.
        usage_memory_batches(usize) => "--usage-memory-batches";
        /// `--pool-refresh-ms`.
        pool_refresh_ms(u64) => "--pool-refresh-ms";
        /// `--announce-interval-ms`.
        announce_interval_ms(u64) => "--announce-interval-ms";
    }

    /// `--tls-listen`, `--tls-cert`, `--tls-key`: the HTTPS proxy listener
    /// and its certificate files (re-read on SIGHUP).
    pub fn tls(self, listen: SocketAddr, cert: &Path, key: &Path) -> Self {
        self.flag("--tls-listen", listen)
            .flag("--tls-cert", cert.display())
            .flag("--tls-key", key.display())
    }

    /// `--usage-spill-dir`: where usage Redis refused waits on disk.
    pub fn usage_spill_dir(self, dir: &Path) -> Self {
        self.flag("--usage-spill-dir", dir.display())
    }

    /// `--link-versions`: the link protocol versions spoken (e.g. `&[1]`).
    pub fn link_versions(self, versions: &[u16]) -> Self {
        let list: Vec<String> = versions.iter().map(u16::to_string).collect();
        self.flag("--link-versions", list.join(","))
    }

    /// `--log-format`.
    pub fn log_format(self, format: LogFormat) -> Self {
        let value = format
            .to_possible_value()
            .expect("every log format has a name");
        self.flag("--log-format", value.get_name())
    }
}

impl From<SuperproxyArgs> for Vec<String> {
    fn from(args: SuperproxyArgs) -> Self {
        args.0
    }
}

impl IntoIterator for SuperproxyArgs {
    type Item = String;
    type IntoIter = std::vec::IntoIter<String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// The HTTPS proxy's certificate: a local CA and the files the superproxy
/// reads (re-read on SIGHUP).
pub struct TlsFiles {
    pub ca: crate::certs::LocalCa,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    /// A local CA in `dir` and a certificate it issued for the proxy.
    pub(super) fn create(dir: &Path) -> Self {
        let ca = crate::certs::LocalCa::create(dir);
        let files = TlsFiles {
            cert: dir.join("proxy-cert.pem"),
            key: dir.join("proxy-key.pem"),
            ca,
        };
        files.ca.issue("proxynet proxy 1", &files.cert, &files.key);
        files
    }
}

/// The stack's superproxy: the flags `options` asks for (protected
/// addresses, its own extra flags, the loopback reflector unless placed
/// already, the HTTPS listener when `tls`), after those every test
/// superproxy has ([`spawn_superproxy_on`]).
pub(super) async fn spawn_for_stack(
    stores: &TestStores,
    options: &StackOptions,
    tls: Option<&TlsFiles>,
) -> (Proc, Addresses) {
    let mut args = SuperproxyArgs::new();
    for addr in &options.protected {
        args = args.egress_protected(
            addr.parse()
                .unwrap_or_else(|_| panic!("StackOptions::protected: {addr:?} is not ip:port")),
        );
    }
    args = args.raw(options.superproxy_args.iter().cloned());
    if options.reflector && options.service_ip.is_none() && !args.has("--reflector-listen") {
        args = args.reflector_listen(SocketAddr::new(LOOPBACK, 0));
    }
    if let Some(files) = tls {
        args = args.tls(SocketAddr::new(LOOPBACK, 0), &files.cert, &files.key);
    }
    let log = options
        .superproxy_log
        .clone()
        .or_else(|| options.log_dir.as_ref().map(|d| d.join("superproxy.log")));
    spawn_superproxy_on(
        stores,
        options.service_ip.unwrap_or(LOOPBACK),
        args.as_slice(),
        options.superproxy_protects_redis,
        &options.superproxy_env,
        log.as_deref(),
    )
    .await
}

/// A superproxy on `stores`, every listener on a free loopback port, with
/// `extra_args` (e.g. `SuperproxyArgs::new().lease_ttl_ms(1_500).as_slice()`).
pub async fn spawn_superproxy(stores: &TestStores, extra_args: &[String]) -> (Proc, Addresses) {
    spawn_superproxy_with(stores, extra_args, true, &[], None).await
}

/// [`spawn_superproxy`], the test Redis protected or not, with extra
/// environment, its log written to `log` when given.
pub async fn spawn_superproxy_with(
    stores: &TestStores,
    extra_args: &[String],
    protect_redis: bool,
    env: &[(String, String)],
    log: Option<&Path>,
) -> (Proc, Addresses) {
    spawn_superproxy_on(stores, LOOPBACK, extra_args, protect_redis, env, log).await
}

/// [`spawn_superproxy_with`], its link listener on `link_ip` (the client
/// listeners stay on loopback).
pub async fn spawn_superproxy_on(
    stores: &TestStores,
    link_ip: IpAddr,
    extra_args: &[String],
    protect_redis: bool,
    env: &[(String, String)],
    log: Option<&Path>,
) -> (Proc, Addresses) {
    let any_port = SocketAddr::new(LOOPBACK, 0);
    let mut args = SuperproxyArgs::new()
        .listen(any_port)
        .socks_listen(any_port)
        .admin_listen(any_port)
        .link_listen(SocketAddr::new(link_ip, 0))
        .egress_allow(Cidr::v4(127, 0, 0, 0, 8))
        .pool_refresh_ms(200)
        .announce_interval_ms(300);
    if let Some(redis) = redis_service_addr().filter(|_| protect_redis) {
        args = args.egress_protected(
            redis
                .parse()
                .unwrap_or_else(|_| panic!("the test Redis {redis:?} is not ip:port")),
        );
    }
    let args = args.raw(extra_args.iter().cloned()).into_vec();
    let mut envs = stores.redis_env();
    envs.extend([
        ("PROXYNET_DRAIN_DELAY_MS", "0".to_owned()),
        ("PROXYNET_DRAIN_TIMEOUT_MS", "10000".to_owned()),
    ]);
    envs.extend(env.iter().map(|(k, v)| (k.as_str(), v.clone())));
    crate::process::spawn_ready_logged::<Addresses>("superproxy", &args, &envs, log).await
}

impl Stack {
    /// The superproxy's view of eligible exits.
    pub async fn pool(&self) -> serde_json::Value {
        self.http
            .get(format!("http://{}/v1/pool", self.proxy_addrs.admin))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn eligible_count(&self) -> usize {
        self.pool().await["eligible"].as_array().map_or(0, Vec::len)
    }

    pub async fn wait_eligible(&self, n: usize) {
        self.wait_eligible_at(self.proxy_addrs.admin, n).await;
    }

    /// Waits until the superproxy with admin address `admin` has `n` eligible exits.
    pub async fn wait_eligible_at(&self, admin: SocketAddr, n: usize) {
        eventually(
            &format!("{n} eligible exits at {admin}"),
            Duration::from_secs(30),
            || async {
                let pool: serde_json::Value = self
                    .http
                    .get(format!("http://{admin}/v1/pool"))
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                (pool["eligible"].as_array().map_or(0, Vec::len) == n).then_some(())
            },
        )
        .await;
    }

    /// `http://alice:...@proxy` for curl's `-x`.
    pub fn proxy_url(&self) -> String {
        crate::client::proxy_as(USERNAME, self.proxy_addrs.proxy)
    }

    /// `https://alice:...@127.0.0.1:PORT`: the HTTPS proxy listener.
    pub fn tls_proxy_url(&self) -> String {
        format!(
            "https://{USERNAME}:{}@127.0.0.1:{}",
            PASSWORD.replace(' ', "%20"),
            self.proxy_addrs
                .tls
                .expect("a stack started with proxy_tls")
                .port()
        )
    }

    /// `socks5h://alice:...@proxy` for curl's `-x` (names resolved at the exit).
    pub fn socks_url(&self) -> String {
        format!(
            "socks5h://{USERNAME}:{}@{}",
            PASSWORD.replace(' ', "%20"),
            self.proxy_addrs.socks
        )
    }
}
