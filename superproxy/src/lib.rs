//! proxynet superproxy: the data plane.
//!
//! A tunnel passes these stages, one module each, always in this order
//! ([`pipeline`] runs them for every ingress):
//! [`accept`] (connection limit, drain guard) → [`ingress`] (speak the
//! client's protocol: HTTP CONNECT, absolute-form, SOCKS5) →
//! [`authenticate`] (credentials, argon2 off the hot path; [`limits`] charges
//! attempts) → [`target`] (validate and normalise the destination) →
//! [`admission`] (per-user limits and quota) → [`tunnel`] (pick an exit from
//! the [`pool`], egress IP, safe retry) → [`link`] (the agents' links, one
//! HTTP/2 stream per tunnel) → [`usage`] (meter) → splice (bytes both ways,
//! `proxynet_protocol::splice`, shared with the agent).
//! Around them: [`open_tunnels`] and [`revocation`] (cut what a revocation
//! no longer allows), [`announce`] (tell agents where to dial), [`events`]
//! (change events), [`health`] and [`probe`] (exit health), [`admin`]
//! (health and pool endpoints), [`error`] (the one error type every ingress
//! answers with).
//!
//! [`Superproxy::bind`] binds every listener (port 0 is fine) and reports the
//! addresses; [`Superproxy::serve`] runs until its shutdown future resolves,
//! then drains (seed 000 §5.9): readiness red while still serving for
//! `drain_delay`, listeners closed, open tunnels given `drain_timeout`, the
//! rest cut, usage flushed.

pub mod accept;
pub mod admin;
pub mod admission;
pub mod allowlist;
pub mod announce;
pub mod authenticate;
pub mod config;
pub mod error;
pub mod events;
pub mod health;
pub mod ingress;
pub mod limits;
pub mod link;
pub mod metrics;
pub mod open_tunnels;
pub mod pipeline;
pub mod pool;
pub mod probe;
pub mod revocation;
pub mod session;
pub mod target;
pub mod tunnel;
pub mod usage;
pub mod username;

use proxynet_protocol::egress::EgressPolicy;
use proxynet_protocol::redis_target::{RedisConnection, RedisTarget};
use proxynet_protocol::store::{Keys, StoreUnavailable, SuperproxyRecord};
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
use authenticate::Authenticator;
pub use config::Config;
use link::registry::LinkRegistry;
use link::tls::LinkIdentity;
use pipeline::Pipeline;
use pool::Pool;
use revocation::Revoker;
use tunnel::{RetryBudget, TunnelOpener};

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
    tls_cert: Option<Arc<ingress::tls::ReloadableCert>>,
    pipeline: Arc<Pipeline>,
    admin_state: Arc<AdminState>,
    addresses: Addresses,
    listeners: Listeners,
    admin: TcpListener,
    link: TcpListener,
    identity: LinkIdentity,
    redis_target: RedisTarget,
    redis: RedisConnection,
    keys: Keys,
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
        proxynet_protocol::sockets::prepare_client_listener(&proxy);
        proxynet_protocol::sockets::prepare_client_listener(&socks);
        let (admin, admin_addr) = listen("admin", config.admin_listen).await?;
        let (link, link_addr) = listen("link", config.link_listen).await?;
        let (tls, tls_addr, tls_cert) =
            match (&config.tls_listen, &config.tls_cert, &config.tls_key) {
                (Some(addr), Some(cert), Some(key)) => {
                    let reloadable = Arc::new(
                        ingress::tls::ReloadableCert::new(cert.clone(), key.clone())
                            .map_err(StartError::Other)?,
                    );
                    let server_config = reloadable.server_config().map_err(StartError::Other)?;
                    let (listener, bound) = listen("tls", *addr).await?;
                    proxynet_protocol::sockets::prepare_client_listener(&listener);
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
                    .collect::<Vec<_>>(),
            ),
        );
        let opener = TunnelOpener {
            pool: pool.clone(),
            sessions: session::Sessions::new(
                redis.clone(),
                keys.clone(),
                config.max_sessions_per_user,
            ),
            policy,
            connect_budget: config.connect_budget(),
            retry_budget: RetryBudget::new(config.retry_budget_percent),
        };
        let id = Uuid::new_v4();
        let usage = Arc::new(usage::UsageRecorder::new(
            id,
            redis.clone(),
            keys.clone(),
            config.usage_spill_dir.clone(),
            config.usage_memory_batches,
        ));
        let pipeline = Arc::new(Pipeline {
            id,
            usage,
            auth_limiter: Arc::new(limits::AuthFailureLimiter::new(
                config.auth_failures_per_minute,
            )),
            admission: Arc::new(admission::Admission::new(
                redis.clone(),
                keys.clone(),
                id,
                Duration::from_millis(config.lease_ttl_ms.max(300)),
                config.default_user_max_tunnels,
            )),
            config: Arc::new(config),
            auth,
            opener,
            open_tunnels: open_tunnels.clone(),
            stats: Arc::new(metrics::Stats::default()),
            allowlist: Arc::new(allowlist::Allowlist::new(
                redis.clone(),
                keys.clone(),
                open_tunnels.clone(),
            )),
        });
        let _ = pipeline.usage.stats.set(pipeline.stats.clone());
        let admin_state = Arc::new(AdminState {
            metrics: proxynet_protocol::metrics::install(),
            superproxy_id: id,
            pool,
            links: registry,
            draining: AtomicBool::new(false),
        });
        Ok(Self {
            pipeline,
            admin_state,
            addresses,
            listeners: Listeners { proxy, socks, tls },
            tls_cert,
            admin,
            link,
            identity,
            redis_target,
            redis,
            keys,
        })
    }

    pub fn addresses(&self) -> Addresses {
        self.addresses
    }

    pub fn pipeline(&self) -> Arc<Pipeline> {
        self.pipeline.clone()
    }

    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let pipeline = self.pipeline;
        let admin_state = self.admin_state;
        let pool = admin_state.pool.clone();
        let config = pipeline.config.clone();
        let advertise = config.link_advertise.unwrap_or(self.addresses.link);
        let announcer = announce::Announcer {
            redis: self.redis.clone(),
            keys: self.keys.clone(),
            record: SuperproxyRecord {
                id: pipeline.id,
                link_addr: advertise,
                cert_sha256: self.identity.cert_sha256.clone(),
                service_addrs: announce::service_addresses(&self.addresses, advertise),
            },
            interval: config.announce_interval(),
        };
        let revoker = Arc::new(Revoker {
            auth: pipeline.auth.clone(),
            open_tunnels: pipeline.open_tunnels.clone(),
        });
        pool.refresh().await;
        pipeline.allowlist.refresh().await;
        let usage_flusher = tokio::spawn(pipeline.usage.clone().run(config.usage_flush()));
        let background = vec![
            tokio::spawn(pool.clone().run(config.pool_refresh())),
            tokio::spawn(
                link::listener::LinkListener {
                    listener: self.link,
                    acceptor: tokio_rustls::TlsAcceptor::from(self.identity.server_config.clone()),
                    registry: admin_state.links.clone(),
                    redis: self.redis.clone(),
                    keys: self.keys.clone(),
                    superproxy_id: pipeline.id,
                    versions: config.link_versions.clone(),
                    recv_budget: proxynet_protocol::mux::RecvBudget::new(
                        config.link_receive_budget_mb.saturating_mul(1 << 20),
                    ),
                }
                .run(),
            ),
            tokio::spawn(events::run(
                self.redis_target,
                self.keys.events(),
                revoker.clone(),
                pool.clone(),
                pipeline.allowlist.clone(),
            )),
            tokio::spawn(pipeline.allowlist.clone().run(config.allowlist_refresh())),
            tokio::spawn(admin::run(self.admin, admin_state.clone())),
            tokio::spawn(pipeline.auth_limiter.clone().run_housekeeping()),
            tokio::spawn(pipeline.admission.clone().run_renewals()),
            tokio::spawn(revoker.run_sweep(config.revocation_sweep())),
            tokio::spawn(
                probe::Prober {
                    stats: pipeline.stats.clone(),
                    usage: pipeline.usage.clone(),
                    superproxy_id: pipeline.id,
                    registry: admin_state.links.clone(),
                    health: pool.health().clone(),
                    redis: self.redis.clone(),
                    keys: self.keys.clone(),
                }
                .run(),
            ),
        ];
        if let Err(e) = announcer.announce_once().await {
            tracing::warn!(error = %e, "first announcement failed; retrying in the background");
        }
        let announcing = tokio::spawn(announcer.clone().run());
        let reloads = self
            .tls_cert
            .map(|cert| tokio::spawn(cert.reload_on_sighup()));

        // Drain in the order that loses nothing (seed 000 §5.9): readiness
        // red first while still serving, then close the listeners, then let
        // open tunnels finish, then cut the rest, then flush usage.
        let pre_auth = accept::PreAuth::new(
            config.max_unauthenticated_per_source,
            // Half the connection slots, but never below one address's share.
            (config.max_connections / 2).max(config.max_unauthenticated_per_source),
            config.unauthenticated_timeout(),
        );
        let pre_auth_deadlines = tokio::spawn(pre_auth.clone().run_deadlines());
        let mut gate = Gate::new(config.max_connections, pre_auth);
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
        accept::run(self.listeners, pipeline.clone(), &gate, stop).await;
        tracing::info!(
            open = gate.open(config.max_connections),
            "listeners closed; waiting for open tunnels"
        );
        // Agents keep the links of a withdrawn superproxy open for their
        // tunnels (they stop new streams with GOAWAY), so withdrawing now
        // only stops new links.
        announcing.abort();
        announcer.withdraw().await;
        if !gate.wait_idle(config.drain_timeout()).await {
            tracing::warn!(
                open = gate.open(config.max_connections),
                "drain timeout reached; cutting the remaining tunnels"
            );
            gate.cut_all();
            let _ = gate.wait_idle(Duration::from_secs(5)).await;
        }
        pre_auth_deadlines.abort();
        for task in background.into_iter().chain(reloads) {
            task.abort();
        }
        // Every tunnel has ended: its bytes reach the ledger (or the spill file).
        usage_flusher.abort();
        pipeline.usage.flush_for_shutdown().await;
        tracing::info!("stopped");
    }
}
