//! The control-api: its processes (one, or several behind a balancer), the
//! breakable link to Postgres a test may ask for, starting it again after a
//! kill, and its built-in dashboard.

use serde::Deserialize;
use std::net::SocketAddr;

use super::{Stack, StackOptions, ADMIN_TOKEN, LOOPBACK};
use crate::process::Proc;
use crate::stores::TestStores;

/// What [`Stack::start_with`] starts of the control-api.
pub(super) struct ControlApis {
    /// The first instance.
    pub(super) first: Proc,
    /// Where the stack reaches the control API: the first instance, or the
    /// balancer in front of all of them.
    pub(super) url: String,
    /// The first instance's admin listener.
    pub(super) admin: SocketAddr,
    /// Instances beyond the first.
    pub(super) more: Vec<Proc>,
    pub(super) balancer: Option<crate::faults::Balancer>,
    pub(super) postgres_link: Option<crate::faults::FaultyLink>,
}

impl ControlApis {
    /// `options.control_apis` instances on `stores` (through a breakable
    /// link to Postgres when `options.postgres_fault`).
    pub(super) async fn start(stores: &TestStores, options: &StackOptions) -> Self {
        let mut postgres_link = None;
        let mut api_stores = stores.clone();
        if options.postgres_fault {
            let (upstream, rewrite) = postgres_address(&stores.database_url);
            let link = crate::faults::FaultyLink::start(upstream).await;
            api_stores.database_url = rewrite(link.addr);
            postgres_link = Some(link);
        }
        let (first, api_addr, admin) = spawn_control_api(&api_stores, options).await;
        let mut more = Vec::new();
        let mut balancer = None;
        let url = if options.control_apis > 1 {
            let mut addrs = vec![api_addr];
            for i in 1..options.control_apis {
                let mut more_options = options.clone();
                more_options.api_env.push((
                    "PROXYNET_INSTANCE_NAME".into(),
                    format!("control-api-{}", i + 1),
                ));
                let (proc, addr, _) = spawn_control_api(&api_stores, &more_options).await;
                more.push(proc);
                addrs.push(addr);
            }
            let b = crate::faults::Balancer::start(addrs).await;
            let url = format!("http://{}", b.addr);
            balancer = Some(b);
            url
        } else {
            format!("http://{api_addr}")
        };
        Self {
            first,
            url,
            admin,
            more,
            balancer,
            postgres_link,
        }
    }
}

impl Stack {
    /// Kills the control-api with SIGKILL and starts it again on the same address.
    pub async fn restart_api_after_kill(&mut self) {
        self.api.kill().await;
        self.start_api_again().await;
    }

    /// Starts the control-api again on its old address (after a kill).
    pub async fn start_api_again(&mut self) {
        let addr: SocketAddr = self.api_url.trim_start_matches("http://").parse().unwrap();
        let (api, _, admin) = spawn_control_api_at(&self.stores, &self.options, addr).await;
        self.api = api;
        self.api_admin = admin;
    }

    /// Logs in to the built-in dashboard with `key`: the session cookie
    /// (`name=value`, for a `cookie` header).
    pub async fn dashboard_session(&self, key: &str) -> String {
        let r = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .post(self.api("/dashboard/login"))
            .form(&[("key", key)])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303, "dashboard login");
        let cookie = r.headers()["set-cookie"].to_str().unwrap();
        cookie.split(';').next().unwrap().to_owned()
    }

    /// A dashboard page's HTML, read with the session `cookie`.
    pub async fn dashboard_page(&self, cookie: &str, path: &str) -> String {
        self.http
            .get(self.api(path))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// A control-api on a free port of [`StackOptions::service_ip`] (default
/// loopback): the process, its API address and its admin address.
pub async fn spawn_control_api(
    stores: &TestStores,
    options: &StackOptions,
) -> (Proc, SocketAddr, SocketAddr) {
    let listen = SocketAddr::new(options.service_ip.unwrap_or(LOOPBACK), 0);
    spawn_control_api_at(stores, options, listen).await
}

/// [`spawn_control_api`] with its API listening on `listen`.
pub async fn spawn_control_api_at(
    stores: &TestStores,
    options: &StackOptions,
    listen: SocketAddr,
) -> (Proc, SocketAddr, SocketAddr) {
    #[derive(Deserialize)]
    struct Ready {
        api: SocketAddr,
        admin: SocketAddr,
    }
    let envs = [
        ("PROXYNET_DATABASE_URL", stores.database_url.clone()),
        ("PROXYNET_ADMIN_TOKEN", ADMIN_TOKEN.to_owned()),
        ("PROXYNET_API_LISTEN", listen.to_string()),
        (
            "PROXYNET_HEARTBEAT_INTERVAL_MS",
            options.heartbeat_interval_ms.to_string(),
        ),
        (
            "PROXYNET_HEARTBEAT_TTL_MS",
            options.heartbeat_ttl_ms.to_string(),
        ),
        ("PROXYNET_API_ADMIN_LISTEN", "127.0.0.1:0".to_owned()),
        ("PROXYNET_OBSERVE_INTERVAL_SECS", "1".to_owned()),
        // Webhook receivers in tests listen on 127.0.0.1.
        ("PROXYNET_WEBHOOK_ALLOW_INTERNAL", "true".to_owned()),
    ];
    let mut envs = envs.to_vec();
    envs.extend(stores.redis_env());
    envs.extend(options.api_env.iter().map(|(k, v)| (k.as_str(), v.clone())));
    let log = options.log_dir.as_ref().map(|d| d.join("control-api.log"));
    let (proc, ready) =
        crate::process::spawn_ready_logged::<Ready>("control-api", &[], &envs, log.as_deref())
            .await;
    (proc, ready.api, ready.admin)
}

/// The Postgres server address in `url`, and how to point the URL elsewhere.
fn postgres_address(url: &str) -> (SocketAddr, impl Fn(SocketAddr) -> String) {
    let after_at = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
    let hostport = after_at.split('/').next().unwrap();
    let upstream: SocketAddr = hostport.parse().unwrap();
    let (url, hostport) = (url.to_owned(), hostport.to_owned());
    (upstream, move |addr: SocketAddr| {
        url.replacen(&hostport, &addr.to_string(), 1)
    })
}
