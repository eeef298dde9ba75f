//! proxynet superproxy: the data plane.
//!
//! A tunnel passes these stages, always in this order:
//! [`accept`] (connection limit, drain guard, pre-auth bounds; knows no
//! protocol) → [`ingress`] (speak the client's protocol: HTTP CONNECT,
//! absolute-form, SOCKS5, over TCP or TLS) → [`pipeline`], which runs the
//! stages proper, a file each: authenticate (credentials via
//! [`credentials`], throttled by [`login_throttle`]) → authorize (the account's
//! entitlements bound the username's asks) → admit ([`admission`]: limits,
//! quotas) → open (an exit from [`select`]: the pool, a session pin, egress IP,
//! safe retry; dialled over a [`link`]) → meter ([`usage`]) → splice (bytes
//! both ways, `proxynet_common::splice`, shared with the agent) → access log.
//! [`request`] holds the plain data every stage reads.
//! Around them: [`open_tunnels`] and [`revocation`] (cut what a revocation
//! no longer allows), [`announce`] (tell agents where to dial), [`events`]
//! (change events), [`health`] and [`probe`] (exit health), [`sites`]
//! (which exits each target site refuses, shared by the fleet), [`admin`]
//! (health and pool endpoints), [`error`] (the one error type every ingress
//! answers with), [`reflector`] (tells agents the public address their
//! traffic leaves from). Background loops share one shape
//! (`proxynet_common::tasks`): built with their parts, `run(stop)`.
//!
//! [`Superproxy::bind`] binds every listener (port 0 is fine) and reports the
//! addresses; [`Superproxy::serve`] runs until its shutdown future resolves,
//! then drains (seed 000 §5.9): readiness red while still serving for
//! `drain_delay`, listeners closed, open tunnels given `drain_timeout`, the
//! rest cut, usage flushed.

mod accept;
mod admin;
mod admission;
mod allowlist;
mod announce;
mod config;
mod credentials;
pub mod error;
mod events;
mod health;
mod ingress;
mod link;
mod login_throttle;
mod metrics;
mod open_tunnels;
mod operator_policy;
mod pipeline;
mod probe;
mod reflector;
mod request;
mod revocation;
mod select;
mod sites;
mod target;
mod usage;

/// The parsers a client's first bytes meet, for the fuzz targets.
pub mod parsers {
    pub use crate::accept::proxy_protocol;
    pub use crate::ingress::http::head_guard::{chunked::Chunked, validate::validate_head};
    pub use crate::ingress::http::MAX_HEADERS;
    pub use crate::pipeline::sni;
    pub use crate::target::Target;
}

/// Exit selection over a hand-built pool, for the benches.
pub mod selection {
    pub use crate::health::{HealthBook, HealthConfig};
    pub use crate::link::registry::{Link, LinkSender, MuxLink};
    pub use crate::select::{choose, Candidate, PoolView};
}

/// The script that advances a shared quota counter once per batch (the
/// usage tests run it against a real Redis).
pub use usage::ADD_ONCE_SCRIPT;

use proxynet_common::egress::EgressPolicy;
use proxynet_store::redis_target::{RedisConnection, RedisTarget};
use proxynet_store::{Keys, StoreUnavailable, SuperproxyRecord};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use uuid::Uuid;

use accept::{Gate, Listeners};
use admin::AdminState;
pub use config::Config;
use credentials::Authenticator;
use ingress::{IngressLimits, Ingresses};
use link::registry::LinkRegistry;
use link::tls::LinkIdentity;
use pipeline::open::{RetryBudget, TunnelOpener};
use pipeline::{Admit, Login, Pipeline};
use proxynet_common::tasks::Tasks;
use revocation::Revoker;
use select::Pool;

/// The addresses a running superproxy bound.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Addresses {
    /// HTTP proxy (also accepts SOCKS5).
    pub proxy: SocketAddr,
    /// HTTPS proxy, when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<SocketAddr>,
    pub socks: SocketAddr,
    pub admin: SocketAddr,
    pub link: SocketAddr,
    /// The egress reflector, when configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reflector: Option<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Store(#[from] StoreUnavailable),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("link TLS: {0}")]
    Tls(#[from] link::tls::TlsSetupError),
    #[error("{0}")]
    Other(String),
}

pub struct Superproxy {
    id: Uuid,
    config: Arc<Config>,
    tls_cert: Option<Arc<ingress::tls::ReloadableCert>>,
    pipeline: Arc<Pipeline>,
    parts: Parts,
    admin_state: Arc<AdminState>,
    addresses: Addresses,
    listeners: Listeners,
    admin: TcpListener,
    link: TcpListener,
    reflector: Option<TcpListener>,
    identity: LinkIdentity,
    redis_target: RedisTarget,
    redis: RedisConnection,
    keys: Keys,
}

/// The components the background loops share with the pipeline.
struct Parts {
    auth: Authenticator,
    auth_limiter: Arc<login_throttle::AuthFailureLimiter>,
    admission: Arc<admission::Admission>,
    usage: Arc<usage::UsageRecorder>,
    open_tunnels: Arc<open_tunnels::OpenTunnels>,
    allowlist: Arc<allowlist::Allowlist>,
    operator_policy: Arc<operator_policy::OperatorRules>,
    sites: Arc<sites::SiteBook>,
    stats: Arc<metrics::Stats>,
}

async fn listen(
    what: &'static str,
    addr: SocketAddr,
) -> Result<(TcpListener, SocketAddr), StartError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen { what, addr, source })?;
    let bound =
        listener
            .local_addr()
            .map_err(|source| StartError::Listen { what, addr, source })?;
    Ok((listener, bound))
}

impl Superproxy {
    pub async fn bind(config: Config) -> Result<Self, StartError> {
        let redis_target = config.redis.target()?;
        let mut redis = redis_target.connect().await?;
        config.redis.check_persistence(&mut redis).await?;
        let keys = Keys::new(config.redis.redis_prefix.clone());
        let identity = match (&config.link_cert, &config.link_key) {
            (Some(cert), Some(key)) => LinkIdentity::from_pem_files(cert, key)?,
            _ => LinkIdentity::self_signed()?,
        };
        let (proxy, proxy_addr) = listen("proxy", config.listen).await?;
        let (socks, socks_addr) = listen("socks", config.socks_listen).await?;
        // Client sockets inherit their options from these listeners.
        proxynet_common::sockets::prepare_client_listener(&proxy);
        proxynet_common::sockets::prepare_client_listener(&socks);
        let (admin, admin_addr) = listen("admin", config.admin_listen).await?;
        let (link, link_addr) = listen("link", config.link_listen).await?;
        let (reflector, reflector_addr) = match config.reflector_listen {
            Some(addr) => {
                let (listener, bound) = listen("reflector", addr).await?;
                (Some(listener), Some(bound))
            }
            None => (None, None),
        };
        let (tls, tls_addr, tls_cert) =
            match (&config.tls_listen, &config.tls_cert, &config.tls_key) {
                (Some(addr), Some(cert), Some(key)) => {
                    let reloadable = Arc::new(
                        ingress::tls::ReloadableCert::new(cert.clone(), key.clone())
                            .map_err(StartError::Other)?,
                    );
                    let server_config = reloadable.server_config().map_err(StartError::Other)?;
                    let (listener, bound) = listen("tls", *addr).await?;
                    proxynet_common::sockets::prepare_client_listener(&listener);
                    (
                        Some((listener, tokio_rustls::TlsAcceptor::from(server_config))),
                        Some(bound),
                        Some(reloadable),
                    )
                }
                _ => (None, None, None),
            };
        let addresses = Addresses {
            tls: tls_addr,
            proxy: proxy_addr,
            socks: socks_addr,
            admin: admin_addr,
            link: link_addr,
            reflector: reflector_addr,
        };

        let registry = Arc::new(LinkRegistry::default());
        let health = Arc::new(health::HealthBook::new(config.health()));
        let open_tunnels = Arc::new(open_tunnels::OpenTunnels::default());
        let pool = Arc::new(Pool::new(
            redis.clone(),
            keys.clone(),
            registry.clone(),
            health,
            open_tunnels.clone(),
            config.control_plane_grace(),
        ));
        let auth = Authenticator::new(
            redis.clone(),
            keys.clone(),
            Duration::from_millis(config.user_cache_ttl_ms),
            Duration::from_secs(config.auth_cache_ttl_secs),
        )
        .map_err(StartError::Other)?;
        let policy = EgressPolicy::new(
            config.egress.policy(
                &[proxy_addr, socks_addr, admin_addr, link_addr]
                    .into_iter()
                    .chain(tls_addr)
                    .chain(reflector_addr)
                    // The address agents dial for the reflector, when it
                    // differs from the bound one (a NAT in front).
                    .chain(config.reflector_advertise)
                    .collect::<Vec<_>>(),
            ),
        );
        let sites = Arc::new(
            sites::SiteBook::new(config.sites())
                .shared(redis.clone(), keys.clone())
                .over(pool.clone()),
        );
        let opener = TunnelOpener {
            sites: sites.clone(),
            pool: pool.clone(),
            sessions: select::sessions::Sessions::new(
                redis.clone(),
                keys.clone(),
                config.max_sessions_per_user,
            ),
            policy,
            connect_budget: config.connect_budget(),
            retry_budget: RetryBudget::new(config.retry_budget_percent),
        };
        // Under Sentinel a usage batch waits for a replica (`WAIT`), which
        // holds up the connection it runs on: usage gets its own.
        let usage_redis = if redis_target.is_replicated() {
            redis_target.connect().await?
        } else {
            redis.clone()
        };
        let id = Uuid::new_v4();
        let stats = Arc::new(metrics::Stats::default());
        let parts = Parts {
            usage: Arc::new(usage::UsageRecorder::new(
                id,
                usage_redis,
                keys.clone(),
                config.usage_spill_dir.clone(),
                config.usage_memory_batches,
                stats.clone(),
            )),
            auth_limiter: Arc::new(login_throttle::AuthFailureLimiter::new(
                config.auth_failures_per_minute,
            )),
            admission: Arc::new(admission::Admission::new(
                redis.clone(),
                keys.clone(),
                id,
                Duration::from_millis(config.lease_ttl_ms.max(300)),
                config.default_user_max_tunnels,
            )),
            auth,
            allowlist: Arc::new(allowlist::Allowlist::new(
                redis.clone(),
                keys.clone(),
                open_tunnels.clone(),
            )),
            operator_policy: Arc::new(operator_policy::OperatorRules::new(
                redis.clone(),
                keys.clone(),
                open_tunnels.clone(),
            )),
            open_tunnels,
            sites,
            stats,
        };
        let pipeline = Arc::new(Pipeline::new(
            Login::new(
                parts.auth.clone(),
                parts.auth_limiter.clone(),
                parts.allowlist.clone(),
            ),
            pipeline::TargetPolicy::new(parts.operator_policy.clone(), parts.admission.clone()),
            Admit::new(parts.admission.clone(), parts.usage.clone()),
            opener,
            parts.usage.clone(),
            parts.open_tunnels.clone(),
            parts.stats.clone(),
        ));
        let admin_state = Arc::new(AdminState {
            metrics: proxynet_common::metrics::install(),
            superproxy_id: id,
            pool,
            links: registry,
            draining: AtomicBool::new(false),
        });
        Ok(Self {
            id,
            config: Arc::new(config),
            pipeline,
            parts,
            admin_state,
            addresses,
            listeners: Listeners { proxy, socks, tls },
            tls_cert,
            admin,
            link,
            reflector,
            identity,
            redis_target,
            redis,
            keys,
        })
    }

    pub fn addresses(&self) -> Addresses {
        self.addresses
    }

    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let Superproxy {
            id,
            config,
            pipeline,
            parts,
            admin_state,
            ..
        } = self;
        let pool = admin_state.pool.clone();
        let advertise = config.link_advertise.unwrap_or(self.addresses.link);
        // Agents cannot dial an unspecified address: such a bind needs
        // `--reflector-advertise` to be announced.
        let reflector_advertise = config
            .reflector_advertise
            .or(self.addresses.reflector)
            .filter(|a| !a.ip().is_unspecified());
        if self.addresses.reflector.is_some() && reflector_advertise.is_none() {
            tracing::warn!("the reflector listens on an unspecified address and --reflector-advertise is not set: agents are not told about it");
        }
        let announcer = announce::Announcer {
            redis: self.redis.clone(),
            keys: self.keys.clone(),
            record: SuperproxyRecord {
                id,
                link_addr: advertise,
                cert_sha256: self.identity.cert_sha256.clone(),
                service_addrs: announce::service_addresses(
                    &self.addresses,
                    advertise,
                    reflector_advertise,
                ),
                reflector: reflector_advertise,
            },
            interval: config.announce_interval(),
        };
        let revoker = Arc::new(Revoker {
            auth: parts.auth.clone(),
            open_tunnels: parts.open_tunnels.clone(),
        });
        pool.refresh().await;
        parts.allowlist.refresh().await;
        parts.operator_policy.refresh().await;
        parts.sites.resync().await;
        // Stopped last, after every tunnel has ended.
        let mut flusher = Tasks::new();
        let usage = parts.usage.clone();
        let every = config.usage_flush();
        flusher.spawn("usage flush", |stop| usage.run(every, stop));
        let pre_auth = accept::PreAuth::new(config.pre_auth_limits());
        let mut background = Tasks::new();
        {
            let (pool, period) = (pool.clone(), config.pool_refresh());
            background.spawn("pool refresh", |stop| pool.run(period, stop));
        }
        let link_listener = link::listener::LinkListener {
            listener: self.link,
            acceptor: tokio_rustls::TlsAcceptor::from(self.identity.server_config.clone()),
            registry: admin_state.links.clone(),
            redis: self.redis.clone(),
            keys: self.keys.clone(),
            superproxy_id: id,
            versions: config.link_versions.clone(),
            recv_budget: proxynet_wire::mux::RecvBudget::new(
                config.link_receive_budget_mb.saturating_mul(1 << 20),
            ),
        };
        background.spawn("link listener", |stop| link_listener.run(stop));
        {
            let listeners = events::Listeners {
                revoker: revoker.clone(),
                pool: pool.clone(),
                allowlist: parts.allowlist.clone(),
                operator_policy: parts.operator_policy.clone(),
                sites: parts.sites.clone(),
            };
            let (target, channel) = (self.redis_target, self.keys.events());
            background.spawn("change events", |stop| {
                events::run(target, channel, listeners, stop)
            });
        }
        {
            let (allowlist, every) = (parts.allowlist.clone(), config.allowlist_refresh());
            background.spawn("allow-list refresh", |stop| allowlist.run(every, stop));
        }
        {
            // The change event carries a policy change within a second; the
            // poll (at the allow-list's interval) covers a lost event.
            let (rules, every) = (parts.operator_policy.clone(), config.allowlist_refresh());
            background.spawn("operator policy refresh", |stop| rules.run(every, stop));
        }
        {
            // Expiries and the panic rule every second, a resync every 30 s.
            let sites = parts.sites.clone();
            background.spawn("site cooldowns", |stop| sites.run(stop));
        }
        {
            let (admin, state) = (self.admin, admin_state.clone());
            background.spawn("admin endpoint", |stop| admin::run(admin, state, stop));
        }
        let limiter = parts.auth_limiter.clone();
        background.spawn("login throttle upkeep", |stop| {
            limiter.run_housekeeping(stop)
        });
        let admission = parts.admission.clone();
        background.spawn("lease renewals", |stop| admission.run_renewals(stop));
        {
            let (revoker, every) = (revoker.clone(), config.revocation_sweep());
            background.spawn("revocation sweep", |stop| revoker.run_sweep(every, stop));
        }
        let prober = probe::Prober {
            stats: parts.stats.clone(),
            usage: parts.usage.clone(),
            superproxy_id: id,
            registry: admin_state.links.clone(),
            health: pool.health().clone(),
            redis: self.redis.clone(),
            keys: self.keys.clone(),
        };
        background.spawn("exit probes", |stop| prober.run(stop));
        {
            let pre_auth = pre_auth.clone();
            background.spawn("pre-auth deadlines", |stop| pre_auth.run_deadlines(stop));
        }
        if let Some(listener) = self.reflector {
            let key = Arc::new(reflector::ReflectorKey::new(
                self.redis.clone(),
                self.keys.clone(),
            ));
            key.refresh().await;
            {
                let key = key.clone();
                background.spawn("reflector key refresh", |stop| key.run(stop));
            }
            let reflector = reflector::Reflector {
                listener,
                key,
                exits: reflector::ExitCredentials::new(self.redis.clone(), self.keys.clone()),
            };
            background.spawn("egress reflector", |stop| reflector.run(stop));
        }
        if let Some(cert) = self.tls_cert {
            background.spawn("TLS certificate reload", |stop| cert.reload_on_sighup(stop));
        }
        if let Err(e) = announcer.announce_once().await {
            tracing::warn!(error = %e, "first announcement failed; retrying in the background");
        }
        // Stopped first: a withdrawn superproxy must not announce itself again.
        let mut announcing = Tasks::new();
        {
            let announcer = announcer.clone();
            announcing.spawn("announcer", |stop| announcer.run(stop));
        }

        // Drain in the order that loses nothing (seed 000 §5.9): readiness
        // red first while still serving, then close the listeners, then let
        // open tunnels finish, then cut the rest, then flush usage.
        let mut gate = Gate::new(config.max_connections, pre_auth)
            .with_proxy_protocol(config.proxy_protocol());
        let stop = {
            let admin_state = admin_state.clone();
            let delay = config.drain_delay();
            async move {
                shutdown.await;
                admin_state.draining.store(true, Ordering::Relaxed);
                tracing::info!(
                    delay_ms = delay.as_millis() as u64,
                    "draining: readiness is red; still serving"
                );
                tokio::time::sleep(delay).await;
            }
        };
        let ingresses = Ingresses::new(
            pipeline,
            IngressLimits {
                header_read_timeout: config.header_read_timeout(),
                tunnel: config.tunnel_limits(),
                udp_advertise: config.udp_advertise_addr,
            },
        );
        accept::run(self.listeners, &ingresses, &gate, stop).await;
        tracing::info!(
            open = gate.open(config.max_connections),
            "listeners closed; waiting for open tunnels"
        );
        // Agents keep the links of a withdrawn superproxy open for their
        // tunnels (they stop new streams with GOAWAY), so withdrawing now
        // only stops new links.
        announcing.stop(TASK_STOP).await;
        announcer.withdraw().await;
        if !gate.wait_idle(config.drain_timeout()).await {
            tracing::warn!(
                open = gate.open(config.max_connections),
                "drain timeout reached; cutting the remaining tunnels"
            );
            gate.cut_all();
            let _ = gate.wait_idle(Duration::from_secs(5)).await;
        }
        // Every tunnel has ended: its bytes reach the ledger (or the spill
        // file) first, while the shutdown budget is still whole; the other
        // loops meter nothing any more.
        flusher.stop(TASK_STOP).await;
        parts.usage.flush_for_shutdown().await;
        background.stop(TASK_STOP).await;
        tracing::info!("stopped");
    }
}

/// How long the background loops get to return once told to stop.
const TASK_STOP: Duration = Duration::from_secs(5);
