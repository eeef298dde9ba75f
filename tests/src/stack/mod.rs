//! The whole stack for one test: control-api, superproxy, exit agents, a
//! whoami target, a demo account and proxy user — all real processes.
//!
//! [`Stack::start_with`] puts them together; a file per thing it starts or
//! speaks to: [`control_api`] (the control-api processes, their link to
//! Postgres, the dashboard), [`superproxy`] (the superproxy process and its
//! typed flags, [`SuperproxyArgs`]), [`agent`] (exit agents, and speaking as
//! one), [`admin_api`] (the operator's REST calls, [`AdminApi`]).

pub mod admin_api;
pub mod agent;
pub mod control_api;
pub mod superproxy;

use std::net::{IpAddr, SocketAddr};
use tempfile::TempDir;
use tokio::net::TcpListener;
use uuid::Uuid;

use crate::process::Proc;
use crate::stores::TestStores;

pub use self::admin_api::{created_id, AdminApi};
pub use self::agent::{Agent, AgentAddrs};
pub use self::control_api::{spawn_control_api, spawn_control_api_at};
pub use self::superproxy::{
    spawn_superproxy, spawn_superproxy_on, spawn_superproxy_with, SuperproxyArgs, TlsFiles,
};

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";
pub const USERNAME: &str = "alice";
pub const PASSWORD: &str = "correct horse battery";

/// Knobs a test may turn; defaults are fast but realistic.
#[derive(Clone)]
pub struct StackOptions {
    pub egress_ips: Vec<IpAddr>,
    pub heartbeat_interval_ms: u64,
    pub heartbeat_ttl_ms: u64,
    /// Extra service addresses (ip:port) the egress policy must always deny.
    pub protected: Vec<String>,
    /// Extra superproxy flags (e.g. fast probes), after the stack's own:
    /// `SuperproxyArgs::new().probe_interval_ms(200).into()` ([`SuperproxyArgs`]).
    pub superproxy_args: Vec<String>,
    /// Use this database instead of a fresh one on the shared test Postgres
    /// (e.g. a [`crate::postgres_pair::PostgresPair`]'s multi-host URL).
    pub database_url: Option<String>,
    /// Use this Redis instead of the shared test Redis.
    pub redis_url: Option<String>,
    /// `redis_url` lists sentinels watching the master of this name
    /// ([`crate::sentinel::SentinelGroup`]).
    pub redis_sentinel_master: Option<String>,
    /// Put a breakable link between the control-api and Postgres
    /// ([`Stack::postgres_link`]).
    pub postgres_fault: bool,
    /// Whether the superproxy itself lists the test Redis as protected (the
    /// agents always learn it from the control-api). Off, only the exit's
    /// check stands between a tunnel and Redis.
    pub superproxy_protects_redis: bool,
    /// Environment for the superproxy (e.g. `RUST_LOG`).
    pub superproxy_env: Vec<(String, String)>,
    /// Write the superproxy's log here instead of the test's stderr.
    pub superproxy_log: Option<std::path::PathBuf>,
    /// Extra environment for the control-api.
    pub api_env: Vec<(String, String)>,
    /// Write every binary's log to a file here (`NAME.log`) instead of the
    /// test's stderr.
    pub log_dir: Option<std::path::PathBuf>,
    /// Serve the HTTPS proxy listener with a certificate from a local CA
    /// ([`Stack::tls`]).
    pub proxy_tls: bool,
    /// Extra arguments for every agent.
    pub agent_args: Vec<String>,
    /// Control-api instances behind one address (a round-robin balancer
    /// when more than one).
    pub control_apis: usize,
    /// Where the control-api and the superproxy's link listener listen
    /// (default 127.0.0.1): agents in a network namespace reach them on an
    /// exit host's root-side address ([`crate::netns::ExitHost::stack_options`]).
    pub service_ip: Option<IpAddr>,
    /// Run the superproxy's egress reflector on loopback (on unless the
    /// test places one itself or the stack serves a network namespace), as
    /// the demo does: the agents' loopback egress is then verified, which is
    /// what lets their admin listeners into the fleet's protected set.
    pub reflector: bool,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            egress_ips: vec!["127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap()],
            heartbeat_interval_ms: 300,
            heartbeat_ttl_ms: 1_500,
            protected: Vec::new(),
            superproxy_args: Vec::new(),
            database_url: None,
            redis_url: None,
            redis_sentinel_master: None,
            postgres_fault: false,
            superproxy_protects_redis: true,
            superproxy_env: Vec::new(),
            superproxy_log: None,
            api_env: Vec::new(),
            log_dir: None,
            proxy_tls: false,
            agent_args: Vec::new(),
            control_apis: 1,
            service_ip: None,
            reflector: true,
        }
    }
}

pub struct Stack {
    pub stores: TestStores,
    pub dir: TempDir,
    pub api: Proc,
    pub api_url: String,
    /// The control-api's admin listener (`/metrics`).
    pub api_admin: SocketAddr,
    pub proxy: Proc,
    /// What the superproxy bound, as its ready line reports it.
    pub proxy_addrs: ::superproxy::Addresses,
    pub agents: Vec<Agent>,
    pub whoami: SocketAddr,
    pub http: reqwest::Client,
    pub options: StackOptions,
    /// The id of the demo proxy user `alice`.
    pub user_id: Uuid,
    /// The link between the control-api and Postgres, when asked for.
    pub postgres_link: Option<crate::faults::FaultyLink>,
    /// The HTTPS proxy's CA and certificate files, when asked for.
    pub tls: Option<TlsFiles>,
    /// Control-api instances beyond the first (`control_apis`), and the
    /// balancer `api_url` then points at.
    pub more_apis: Vec<Proc>,
    pub balancer: Option<crate::faults::Balancer>,
    /// The complete datacenter source ([`Stack::complete_dc_source`]),
    /// once made.
    dc_source: std::sync::Mutex<Option<Uuid>>,
}

impl Stack {
    pub async fn start() -> Self {
        Self::start_with(StackOptions::default()).await
    }

    pub async fn start_with(options: StackOptions) -> Self {
        let mut stores = TestStores::create().await;
        if let Some(url) = &options.database_url {
            stores.database_url = url.clone();
        }
        if let Some(url) = &options.redis_url {
            stores.redis_url = url.clone();
            stores.redis_cluster = false;
            stores.redis_sentinel_master = options.redis_sentinel_master.clone();
        }
        let dir = tempfile::tempdir().unwrap();
        let http = reqwest::Client::new();

        let apis = self::control_api::ControlApis::start(&stores, &options).await;

        let whoami_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let whoami = whoami_listener.local_addr().unwrap();
        tokio::spawn(crate::whoami::serve(whoami_listener));

        let tls = options.proxy_tls.then(|| TlsFiles::create(dir.path()));
        let (proxy, proxy_addrs) =
            self::superproxy::spawn_for_stack(&stores, &options, tls.as_ref()).await;
        let mut stack = Self {
            stores,
            dir,
            api: apis.first,
            api_url: apis.url,
            api_admin: apis.admin,
            proxy,
            proxy_addrs,
            agents: Vec::new(),
            whoami,
            http,
            options: options.clone(),
            user_id: Uuid::nil(),
            postgres_link: apis.postgres_link,
            tls,
            more_apis: apis.more,
            balancer: apis.balancer,
            dc_source: std::sync::Mutex::new(None),
        };
        let account = stack.create_account("acme").await;
        stack.user_id = stack.create_user(account, USERNAME, PASSWORD).await;
        for ip in options.egress_ips {
            stack.add_agent(ip).await;
        }
        stack.wait_eligible(stack.agents.len()).await;
        stack
    }

    /// The control API's URL for `path`.
    pub fn api(&self, path: &str) -> String {
        format!("{}{path}", self.api_url)
    }

    pub fn whoami_url(&self) -> String {
        format!("http://{}/", self.whoami)
    }
}

/// Where the stack's services listen unless [`StackOptions::service_ip`] says otherwise.
const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// The test Redis as `127.0.0.1:PORT`: one of "the stack's own services" that
/// the egress policy must always deny.
pub fn redis_service_addr() -> Option<String> {
    std::env::var("PROXYNET_TEST_REDIS_PORT")
        .ok()
        .map(|p| format!("127.0.0.1:{p}"))
}
