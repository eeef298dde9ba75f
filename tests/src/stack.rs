//! The whole stack for one test: control-api, superproxy, exit agents, a
//! whoami target, a demo account and proxy user — all real processes.

use serde::Deserialize;
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tempfile::TempDir;
use tokio::net::TcpListener;
use uuid::Uuid;

use crate::process::{eventually, Proc};
use crate::stores::TestStores;

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";
pub const USERNAME: &str = "alice";
pub const PASSWORD: &str = "correct horse battery";

/// The HTTPS proxy's certificate: a local CA and the files the superproxy
/// reads (re-read on SIGHUP).
pub struct TlsFiles {
    pub ca: crate::certs::LocalCa,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

/// Knobs a test may turn; defaults are fast but realistic.
#[derive(Clone)]
pub struct StackOptions {
    pub egress_ips: Vec<IpAddr>,
    pub heartbeat_interval_ms: u64,
    pub heartbeat_ttl_ms: u64,
    /// Extra service addresses (ip:port) the egress policy must always deny.
    pub protected: Vec<String>,
    /// Extra superproxy flags (e.g. fast probes).
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

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct ProxyAddrs {
    pub proxy: SocketAddr,
    #[serde(default)]
    pub tls: Option<SocketAddr>,
    pub socks: SocketAddr,
    pub admin: SocketAddr,
    pub link: SocketAddr,
    /// The egress reflector (`--reflector-listen`), when started with one.
    #[serde(default)]
    pub reflector: Option<SocketAddr>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
pub struct AgentAddrs {
    pub admin: SocketAddr,
    pub exit_id: Uuid,
}

pub struct Agent {
    pub proc: Proc,
    pub addrs: AgentAddrs,
    /// Its first egress IP, or its first prefix's network when it has none.
    pub egress_ip: IpAddr,
    /// How an agent not started from [`Stack::agent_args`] starts again.
    relaunch: Option<Relaunch>,
}

/// An agent's own start: its wrapper (e.g. `ip netns exec NAME`) and its
/// arguments without the enrollment token.
struct Relaunch {
    wrapper: Vec<String>,
    args: Vec<String>,
}

pub struct Stack {
    pub stores: TestStores,
    pub dir: TempDir,
    pub api: Proc,
    pub api_url: String,
    /// The control-api's admin listener (`/metrics`).
    pub api_admin: SocketAddr,
    pub proxy: Proc,
    pub proxy_addrs: ProxyAddrs,
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

        let mut postgres_link = None;
        let mut api_stores = stores.clone();
        if options.postgres_fault {
            let (upstream, rewrite) = postgres_address(&stores.database_url);
            let link = crate::faults::FaultyLink::start(upstream).await;
            api_stores.database_url = rewrite(link.addr);
            postgres_link = Some(link);
        }
        let (api, api_addr, api_admin) = spawn_control_api(&api_stores, &options).await;
        let mut more_apis = Vec::new();
        let mut balancer = None;
        let api_url = if options.control_apis > 1 {
            let mut addrs = vec![api_addr];
            for i in 1..options.control_apis {
                let mut more = options.clone();
                more.api_env.push((
                    "PROXYNET_INSTANCE_NAME".into(),
                    format!("control-api-{}", i + 1),
                ));
                let (proc, addr, _) = spawn_control_api(&api_stores, &more).await;
                more_apis.push(proc);
                addrs.push(addr);
            }
            let b = crate::faults::Balancer::start(addrs).await;
            let url = format!("http://{}", b.addr);
            balancer = Some(b);
            url
        } else {
            format!("http://{api_addr}")
        };

        let whoami_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let whoami = whoami_listener.local_addr().unwrap();
        tokio::spawn(crate::whoami::serve(whoami_listener));

        let tls = options.proxy_tls.then(|| {
            let ca = crate::certs::LocalCa::create(dir.path());
            let files = TlsFiles {
                cert: dir.path().join("proxy-cert.pem"),
                key: dir.path().join("proxy-key.pem"),
                ca,
            };
            files.ca.issue("proxynet proxy 1", &files.cert, &files.key);
            files
        });
        let mut protect_args: Vec<String> = options
            .protected
            .iter()
            .flat_map(|addr| ["--egress-protected".to_owned(), addr.clone()])
            .collect();
        protect_args.extend(options.superproxy_args.iter().cloned());
        if options.reflector
            && options.service_ip.is_none()
            && !protect_args.iter().any(|a| a == "--reflector-listen")
        {
            protect_args.extend(["--reflector-listen".into(), "127.0.0.1:0".into()]);
        }
        if let Some(files) = &tls {
            protect_args.extend([
                "--tls-listen".into(),
                "127.0.0.1:0".into(),
                "--tls-cert".into(),
                files.cert.display().to_string(),
                "--tls-key".into(),
                files.key.display().to_string(),
            ]);
        }
        let (proxy, proxy_addrs) = spawn_superproxy_on(
            &stores,
            options.service_ip.unwrap_or(LOOPBACK),
            &protect_args,
            options.superproxy_protects_redis,
            &options.superproxy_env,
            options
                .superproxy_log
                .clone()
                .or_else(|| options.log_dir.as_ref().map(|d| d.join("superproxy.log")))
                .as_deref(),
        )
        .await;
        let mut stack = Self {
            stores,
            dir,
            api,
            api_url,
            api_admin,
            proxy,
            proxy_addrs,
            agents: Vec::new(),
            whoami,
            http,
            options: options.clone(),
            user_id: Uuid::nil(),
            postgres_link,
            tls,
            more_apis,
            balancer,
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

    pub fn api(&self, path: &str) -> String {
        format!("{}{path}", self.api_url)
    }

    /// `GET path` on the control API with the admin token, as JSON.
    pub async fn admin_get_json(&self, path: &str) -> serde_json::Value {
        self.get_json_as(ADMIN_TOKEN, path).await
    }

    /// `GET path` on the control API with the bearer `key`, as JSON.
    pub async fn get_json_as(&self, key: &str, path: &str) -> serde_json::Value {
        self.http
            .get(self.api(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
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

    pub async fn create_account(&self, name: &str) -> Uuid {
        let r = self
            .http
            .post(self.api("/v1/accounts"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "name": name }))
            .send()
            .await
            .unwrap();
        created_id(r, "create account").await
    }

    /// An API key for `account`, minted by the operator: (key, key id).
    pub async fn account_key(&self, account: Uuid) -> (String, Uuid) {
        let r = self
            .http
            .post(self.api(&format!("/v1/accounts/{account}/api-keys")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "name": "customer" }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "mint an account key");
        let body: serde_json::Value = r.json().await.unwrap();
        (
            body["key"].as_str().unwrap().to_owned(),
            body["id"].as_str().unwrap().parse().unwrap(),
        )
    }

    /// Replaces an account's entitlements (operator), asserting success.
    pub async fn set_entitlements(&self, account: Uuid, entitlements: serde_json::Value) {
        let r = self
            .http
            .put(self.api(&format!("/v1/accounts/{account}/entitlements")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&entitlements)
            .send()
            .await
            .unwrap();
        let status = r.status();
        assert_eq!(
            status,
            200,
            "entitlements: {}",
            r.text().await.unwrap_or_default()
        );
    }

    /// Lets an account allow-list loopback networks as wide as a /8: the
    /// test clients all come from 127.0.0.1.
    pub async fn allow_loopback_allowlists(&self, account: Uuid) {
        self.set_entitlements(
            account,
            json!({"allowlist": {"min_prefix_v4": 8, "special_ranges": true}}),
        )
        .await;
    }

    pub async fn create_user(&self, account: Uuid, username: &str, password: &str) -> Uuid {
        let r = self
            .http
            .post(self.api(&format!("/v1/accounts/{account}/users")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "username": username, "password": password }))
            .send()
            .await
            .unwrap();
        created_id(r, "create user").await
    }

    /// A source that answers all four provenance questions: datacenter
    /// addresses we own. Created once per stack, on first use.
    pub async fn complete_dc_source(&self) -> Uuid {
        if let Some(id) = *self.dc_source.lock().unwrap() {
            return id;
        }
        let id = self
            .create_source(json!({
                "name": "proxynet-tests-dc",
                "source_type": "dc",
                "channel": "owned",
                "supplier": "proxynet-tests",
                "agreement_ref": "internal: test racks",
                "notice_description": "addresses of our own hosts; no third party involved",
                "opt_out": "not applicable: operator-owned hardware",
                "liable_party": "proxynet-tests operator",
                "abuse_contact": "abuse@example.test",
                "countries": ["DE", "US", "FR"],
            }))
            .await;
        *self.dc_source.lock().unwrap() = Some(id);
        id
    }

    /// `POST /v1/sources` with `body`; the new source's id.
    pub async fn create_source(&self, body: serde_json::Value) -> Uuid {
        let r = self
            .http
            .post(self.api("/v1/sources"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        created_id(r, "create source").await
    }

    pub async fn enrollment_token(&self, name: &str) -> String {
        let source = self.complete_dc_source().await;
        self.enrollment_token_for(name, source, "DE").await
    }

    pub async fn enrollment_token_for(&self, name: &str, source: Uuid, country: &str) -> String {
        self.enrollment_token_granting(name, source, country, false)
            .await
    }

    /// A token whose exit the operator declares behind NAT (or not).
    pub async fn enrollment_token_granting(
        &self,
        name: &str,
        source: Uuid,
        country: &str,
        behind_nat: bool,
    ) -> String {
        let r = self
            .http
            .post(self.api("/v1/enrollment-tokens"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({ "name": name, "source_id": source, "country": country, "behind_nat": behind_nat }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "create enrollment token");
        r.json::<serde_json::Value>().await.unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// An exit enrolled by the test itself, with no agent behind it
    /// (`POST /v1/agent/enroll` with a fresh token of the complete
    /// datacenter source): its id and credential, so the test can speak
    /// as its agent, honest or not ([`Self::beat_as`], [`crate::reflector`]).
    pub async fn enroll_by_hand(&self, name: &str, egress_ips: &[IpAddr]) -> (Uuid, String) {
        let token = self.enrollment_token(name).await;
        let r = self
            .http
            .post(self.api("/v1/agent/enroll"))
            .json(&json!({ "token": token, "egress_ips": egress_ips, "hostname": name }))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(status, 201, "enroll {name}: {body}");
        (
            body["exit_id"].as_str().unwrap().parse().unwrap(),
            body["credential"].as_str().unwrap().to_owned(),
        )
    }

    /// One heartbeat as `exit`'s agent with `credential`: the status and
    /// the reply (`null` unless 200). Beats closer than a quarter interval
    /// apart are answered 429.
    pub async fn beat_as(
        &self,
        exit: Uuid,
        credential: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let r = self
            .http
            .post(self.api(&format!("/v1/agent/exits/{exit}/heartbeat")))
            .bearer_auth(credential)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let reply = if status == 200 {
            r.json().await.unwrap()
        } else {
            serde_json::Value::Null
        };
        (status, reply)
    }

    /// Arguments for an agent serving `egress_ip`, with the test widening of loopback.
    pub fn agent_args(&self, egress_ip: IpAddr, state_file: &std::path::Path) -> Vec<String> {
        self.agent_args_via(&self.api_url, egress_ip, state_file)
    }

    /// The same, reaching the control-api at `api_url` (e.g. through a
    /// link the test can break).
    pub fn agent_args_via(
        &self,
        api_url: &str,
        egress_ip: IpAddr,
        state_file: &std::path::Path,
    ) -> Vec<String> {
        let mut args = self.agent_args_without_egress(api_url, state_file);
        args.splice(4..4, ["--egress-ip".to_owned(), egress_ip.to_string()]);
        args
    }

    /// [`Self::agent_args_via`] without any `--egress-ip`: the caller adds
    /// the agent's egress addresses. Starts with the control-api URL and
    /// the state file (four words).
    fn agent_args_without_egress(
        &self,
        api_url: &str,
        state_file: &std::path::Path,
    ) -> Vec<String> {
        vec![
            "--control-api".into(),
            api_url.to_owned(),
            "--state-file".into(),
            state_file.display().to_string(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
            "--egress-allow".into(),
            "127.0.0.0/8".into(),
            "--drain-announce-ms".into(),
            "500".into(),
            // The test control-api speaks plain http on loopback.
            "--allow-insecure-control-api".into(),
        ]
        .into_iter()
        .chain(
            redis_service_addr()
                .map(|r| vec!["--egress-protected".into(), r])
                .unwrap_or_default(),
        )
        .chain(
            self.options
                .protected
                .iter()
                .flat_map(|a| ["--egress-protected".to_owned(), a.clone()]),
        )
        .chain(self.options.agent_args.iter().cloned())
        .collect()
    }

    pub async fn add_agent(&mut self, egress_ip: IpAddr) -> usize {
        self.add_agent_with_ips(&[egress_ip]).await
    }

    /// An agent serving several egress IPs (the first names it).
    pub async fn add_agent_with_ips(&mut self, egress_ips: &[IpAddr]) -> usize {
        let token = self
            .enrollment_token(&format!("exit-{}", egress_ips[0]))
            .await;
        self.add_agent_with_token(egress_ips, token).await
    }

    /// An agent enrolled with `token` (e.g. of a particular source).
    pub async fn add_agent_with_token(&mut self, egress_ips: &[IpAddr], token: String) -> usize {
        let api = self.api_url.clone();
        self.add_agent_via(&api, egress_ips, token).await
    }

    /// An agent that reaches the control-api at `api_url`.
    pub async fn add_agent_via(
        &mut self,
        api_url: &str,
        egress_ips: &[IpAddr],
        token: String,
    ) -> usize {
        let api_url = api_url.to_owned();
        self.add_agent_with_args(&api_url, egress_ips, token, &[])
            .await
    }

    /// [`Self::add_agent_via`] with flags of its own (e.g. `--upstream`).
    pub async fn add_agent_with_args(
        &mut self,
        api_url: &str,
        egress_ips: &[IpAddr],
        token: String,
        extra: &[String],
    ) -> usize {
        let egress_ip = egress_ips[0];
        let state = self.dir.path().join(format!("agent-{egress_ip}.json"));
        let mut args = self.agent_args_via(api_url, egress_ip, &state);
        for more in &egress_ips[1..] {
            args.extend(["--egress-ip".into(), more.to_string()]);
        }
        args.extend(extra.iter().cloned());
        args.extend(["--enroll-token".into(), token]);
        let log = self
            .options
            .log_dir
            .as_ref()
            .map(|d| d.join(format!("exit-agent-{egress_ip}.log")));
        let (proc, addrs) = crate::process::spawn_ready_logged::<AgentAddrs>(
            "exit-agent",
            &args,
            &[],
            log.as_deref(),
        )
        .await;
        self.agents.push(Agent {
            proc,
            addrs,
            egress_ip,
            relaunch: None,
        });
        self.agents.len() - 1
    }

    /// An agent on `host`'s EXIT namespace, serving `egress_ips` and
    /// `prefixes` (at least one of either), its egress policy allowing
    /// `host`'s TARGET networks, with `extra` arguments. The stack must have
    /// been started with `host.stack_options(..)`, so the agent reaches the
    /// control-api and the link listener. Its admin listener is on EXIT's
    /// loopback (not reachable from the test).
    pub async fn add_agent_in(
        &mut self,
        host: &crate::netns::ExitHost,
        egress_ips: &[IpAddr],
        prefixes: &[proxynet_common::egress::Cidr],
        extra: &[&str],
    ) -> usize {
        assert!(
            !egress_ips.is_empty() || !prefixes.is_empty(),
            "an agent needs an egress IP or prefix"
        );
        let name = host.exit.name().to_owned();
        // The operator grants NAT on the token; the agent's flag alone does not.
        let behind_nat = extra.contains(&"--behind-nat");
        let source = self.complete_dc_source().await;
        let token = self
            .enrollment_token_granting(&format!("exit-{name}"), source, "DE", behind_nat)
            .await;
        let state = self.dir.path().join(format!("agent-{name}.json"));
        let api_url = self.api_url.clone();
        let mut args = self.agent_args_without_egress(&api_url, &state);
        for ip in egress_ips {
            args.extend(["--egress-ip".into(), ip.to_string()]);
        }
        for prefix in prefixes {
            args.extend(["--egress-prefix".into(), prefix.to_string()]);
        }
        for network in host.target_networks() {
            args.extend(["--egress-allow".into(), network.to_string()]);
        }
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let wrapper = host.exit.wrapper();
        let mut first_start = args.clone();
        first_start.extend(["--enroll-token".into(), token]);
        let log = self
            .options
            .log_dir
            .as_ref()
            .map(|d| d.join(format!("exit-agent-{name}.log")));
        let (proc, addrs) = crate::process::spawn_ready_via::<AgentAddrs>(
            &wrapper,
            "exit-agent",
            &first_start,
            &[],
            log.as_deref(),
        )
        .await;
        let egress_ip = egress_ips
            .first()
            .copied()
            .unwrap_or_else(|| prefixes[0].network());
        self.agents.push(Agent {
            proc,
            addrs,
            egress_ip,
            relaunch: Some(Relaunch { wrapper, args }),
        });
        self.agents.len() - 1
    }

    /// Kills agent `i` (SIGKILL) and starts it again from its state file.
    pub async fn restart_agent(&mut self, i: usize) {
        self.agents[i].proc.kill().await;
        let egress_ip = self.agents[i].egress_ip;
        let relaunch = self.agents[i].relaunch.take();
        let (wrapper, args) = match &relaunch {
            Some(r) => (r.wrapper.clone(), r.args.clone()),
            None => {
                let state = self.dir.path().join(format!("agent-{egress_ip}.json"));
                (Vec::new(), self.agent_args(egress_ip, &state))
            }
        };
        let log = self
            .options
            .log_dir
            .as_ref()
            .map(|d| d.join(format!("exit-agent-{i}-restarted.log")));
        let (proc, addrs) = crate::process::spawn_ready_via::<AgentAddrs>(
            &wrapper,
            "exit-agent",
            &args,
            &[],
            log.as_deref(),
        )
        .await;
        self.agents[i] = Agent {
            proc,
            addrs,
            egress_ip,
            relaunch,
        };
    }

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

    pub fn whoami_url(&self) -> String {
        format!("http://{}/", self.whoami)
    }

    /// The account's ledger grouped by user.
    pub async fn usage_by_user(&self, account: Uuid) -> Vec<serde_json::Value> {
        self.http
            .get(self.api(&format!("/v1/accounts/{account}/usage?group_by=user")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json::<Vec<serde_json::Value>>()
            .await
            .unwrap_or_default()
    }

    /// Waits until the ledger shows exactly `up`/`down` bytes for `user`
    /// (failing at once if it ever shows more).
    pub async fn wait_for_usage(&self, account: Uuid, user: Uuid, up: u64, down: u64) {
        eventually(
            &format!("ledger to show {up}/{down} bytes for {user}"),
            Duration::from_secs(20),
            || async {
                let rows = self.usage_by_user(account).await;
                let row = rows.iter().find(|r| r["user_id"] == user.to_string())?;
                let seen = (row["bytes_up"].as_u64()?, row["bytes_down"].as_u64()?);
                assert!(
                    seen.0 <= up && seen.1 <= down,
                    "over-counted: {seen:?} > {up}/{down}"
                );
                (seen == (up, down)).then_some(())
            },
        )
        .await;
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
}

/// The `id` of what a `201 Created` answer made; anything else fails the
/// test, naming `what` and the body.
pub async fn created_id(r: reqwest::Response, what: &str) -> Uuid {
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, 201, "{what}: {body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Where the stack's services listen unless [`StackOptions::service_ip`] says otherwise.
const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

pub async fn spawn_control_api(
    stores: &TestStores,
    options: &StackOptions,
) -> (Proc, SocketAddr, SocketAddr) {
    let listen = SocketAddr::new(options.service_ip.unwrap_or(LOOPBACK), 0);
    spawn_control_api_at(stores, options, listen).await
}

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

pub async fn spawn_superproxy(stores: &TestStores, extra_args: &[String]) -> (Proc, ProxyAddrs) {
    spawn_superproxy_with(stores, extra_args, true, &[], None).await
}

pub async fn spawn_superproxy_with(
    stores: &TestStores,
    extra_args: &[String],
    protect_redis: bool,
    env: &[(String, String)],
    log: Option<&std::path::Path>,
) -> (Proc, ProxyAddrs) {
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
    log: Option<&std::path::Path>,
) -> (Proc, ProxyAddrs) {
    let mut args: Vec<String> = vec![
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--socks-listen".into(),
        "127.0.0.1:0".into(),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
        "--link-listen".into(),
        SocketAddr::new(link_ip, 0).to_string(),
        "--egress-allow".into(),
        "127.0.0.0/8".into(),
        "--pool-refresh-ms".into(),
        "200".into(),
        "--announce-interval-ms".into(),
        "300".into(),
    ];
    if let Some(redis) = redis_service_addr().filter(|_| protect_redis) {
        args.extend(["--egress-protected".into(), redis]);
    }
    args.extend_from_slice(extra_args);
    let mut envs = stores.redis_env();
    envs.extend([
        ("PROXYNET_DRAIN_DELAY_MS", "0".to_owned()),
        ("PROXYNET_DRAIN_TIMEOUT_MS", "10000".to_owned()),
    ]);
    envs.extend(env.iter().map(|(k, v)| (k.as_str(), v.clone())));
    crate::process::spawn_ready_logged::<ProxyAddrs>("superproxy", &args, &envs, log).await
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

/// The test Redis as `127.0.0.1:PORT`: one of "the stack's own services" that
/// the egress policy must always deny.
pub fn redis_service_addr() -> Option<String> {
    std::env::var("PROXYNET_TEST_REDIS_PORT")
        .ok()
        .map(|p| format!("127.0.0.1:{p}"))
}
