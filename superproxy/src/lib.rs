//! proxynet superproxy: the data plane.
//!
//! Stages of a tunnel, one module each:
//! [`ingress`] (accept and speak the client's protocol) →
//! [`authenticate`] (proxy credentials, argon2 off the hot path) →
//! [`target`] (validate and normalise the destination) →
//! [`tunnel`] (early egress check, pick an exit from the [`pool`], safe retry) →
//! [`link`] (the agents' links and one HTTP/2 stream per tunnel) →
//! splice (bytes both ways, `proxynet_protocol::splice`, shared with the agent).
//! Absolute-form requests pass [`hygiene`] (hop-by-hop headers) on the way.
//! Around them: [`announce`] (tell agents where to dial), [`events`] (cache
//! invalidation), [`admin`] (health and pool endpoints), [`error`] (the one
//! error type every ingress answers with).
//!
//! [`Superproxy::bind`] binds every listener (port 0 is fine) and reports the
//! addresses; [`Superproxy::serve`] runs until its shutdown future resolves.

pub mod admin;
pub mod admission;
pub mod announce;
pub mod authenticate;
pub mod config;
pub mod error;
pub mod events;
pub mod health;
pub mod hygiene;
pub mod ingress;
pub mod limits;
pub mod link;
pub mod pool;
pub mod probe;
pub mod session;
pub mod target;
pub mod tunnel;
pub mod usage;
pub mod username;

use proxynet_protocol::egress::EgressPolicy;
use proxynet_protocol::store::{connect_redis, Keys, StoreUnavailable, SuperproxyRecord};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use uuid::Uuid;

use authenticate::Authenticator;
pub use config::Config;
use link::registry::LinkRegistry;
use link::tls::LinkIdentity;
use pool::Pool;
use tunnel::TunnelOpener;

/// How long in-flight tunnels may take to finish after a stop signal.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// State shared by every connection.
pub struct Gateway {
    pub id: Uuid,
    pub config: Arc<Config>,
    pub auth: Authenticator,
    pub pool: Arc<Pool>,
    pub registry: Arc<LinkRegistry>,
    pub tunnels: TunnelOpener,
    pub usage: Arc<usage::UsageRecorder>,
    pub auth_failures: Arc<limits::AuthFailureLimiter>,
    pub admission: Arc<admission::Admission>,
    draining: AtomicBool,
}

impl Gateway {
    /// Parses the username grammar, then checks the base user's password.
    /// A grammar error is a 400 naming the problem; any credential failure is
    /// the one indistinguishable 407.
    pub async fn authenticate(
        &self,
        username: &str,
        password: &str,
        peer: std::net::IpAddr,
    ) -> Result<tunnel::Client, error::ProxyError> {
        self.auth_failures.check(peer)?;
        let result = self.verify_credentials(username, password).await;
        if let Err(e) = &result {
            if matches!(
                e.kind,
                error::ErrorKind::AuthRequired | error::ErrorKind::BadRequest
            ) {
                self.auth_failures.record_failure(peer);
            }
        }
        result
    }

    async fn verify_credentials(
        &self,
        username: &str,
        password: &str,
    ) -> Result<tunnel::Client, error::ProxyError> {
        let request = username::parse(username).map_err(|e| {
            error::ProxyError::new(error::ErrorKind::BadRequest, format!("proxy username: {e}"))
        })?;
        let mut request = request;
        let user = self.auth.authenticate(&request.user, password).await?;
        // What the account allows this user bounds what the username may ask.
        let targeting = &mut request.targeting;
        if let (Some(asked), Some(allowed)) = (targeting.source_type, &user.allowed_source_types) {
            if !allowed.contains(&asked) {
                return Err(error::ProxyError::new(
                    error::ErrorKind::TargetingNotAllowed,
                    format!("this proxy user may not use type={}", asked.as_str()),
                ));
            }
        }
        if let (Some(asked), Some(allowed)) = (&targeting.country, &user.allowed_countries) {
            if !allowed.contains(asked) {
                return Err(error::ProxyError::new(
                    error::ErrorKind::TargetingNotAllowed,
                    format!("this proxy user may not use country={asked}"),
                ));
            }
        }
        targeting.allowed_types = user.allowed_source_types.clone();
        targeting.allowed_countries = user.allowed_countries.clone();
        Ok(tunnel::Client {
            user_id: user.id,
            account_id: user.account_id,
            limits: admission::UserLimits {
                max_concurrent_tunnels: user.max_concurrent_tunnels,
                max_new_tunnels_per_second: user.max_new_tunnels_per_second,
                bandwidth: user.bandwidth_bytes.map(|b| (b, user.quota_period)),
            },
            request,
        })
    }

    /// Applies the user's tunnel limits; the lease (if any) must live as long
    /// as the tunnel.
    pub async fn admit(
        &self,
        client: &tunnel::Client,
    ) -> Result<Option<admission::Lease>, error::ProxyError> {
        if let Some((quota, period)) = client.limits.bandwidth {
            // Redis away: judge by this instance's budget alone.
            let used = self
                .admission
                .quota_used(client.user_id, period)
                .await
                .unwrap_or(0);
            let left = self.usage.budget_left(client.user_id, quota, used);
            if used >= quota || left <= 0 {
                return Err(error::ProxyError::new(
                    error::ErrorKind::QuotaExhausted,
                    format!(
                        "bandwidth quota exhausted: {quota} bytes per {} period",
                        period.as_str()
                    ),
                ));
            }
        }
        self.admission.admit(client.user_id, client.limits).await
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

/// The addresses a running superproxy bound.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Addresses {
    /// HTTP proxy (also accepts SOCKS5).
    pub proxy: SocketAddr,
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
    gateway: Arc<Gateway>,
    addresses: Addresses,
    proxy: TcpListener,
    socks: TcpListener,
    admin: TcpListener,
    link: TcpListener,
    identity: LinkIdentity,
    redis_client: redis::Client,
    redis: redis::aio::ConnectionManager,
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
        let redis_url = config.redis_url.expose().to_owned();
        let redis = connect_redis(&redis_url).await?;
        let redis_client = redis::Client::open(redis_url.as_str())
            .map_err(|e| StartError::Other(e.to_string()))?;
        let keys = Keys::new(config.redis_prefix.clone());
        let identity = match (&config.link_cert, &config.link_key) {
            (Some(cert), Some(key)) => LinkIdentity::from_pem_files(cert, key)?,
            _ => LinkIdentity::self_signed()?,
        };
        let (proxy, proxy_addr) = listen("proxy", config.listen).await?;
        let (socks, socks_addr) = listen("socks", config.socks_listen).await?;
        let (admin, admin_addr) = listen("admin", config.admin_listen).await?;
        let (link, link_addr) = listen("link", config.link_listen).await?;
        let addresses = Addresses {
            proxy: proxy_addr,
            socks: socks_addr,
            admin: admin_addr,
            link: link_addr,
        };

        let registry = Arc::new(LinkRegistry::default());
        let health = Arc::new(health::HealthBook::new(config.health()));
        let pool = Arc::new(Pool::new(
            redis.clone(),
            keys.clone(),
            registry.clone(),
            health,
        ));
        let auth = Authenticator::new(
            redis.clone(),
            keys.clone(),
            Duration::from_millis(config.user_cache_ttl_ms),
            Duration::from_secs(config.auth_cache_ttl_secs),
        )
        .map_err(StartError::Other)?;
        let policy = EgressPolicy::new(
            config
                .egress
                .policy(&[proxy_addr, socks_addr, admin_addr, link_addr]),
        );
        let tunnels = TunnelOpener {
            pool: pool.clone(),
            sessions: session::Sessions::new(redis.clone(), keys.clone()),
            policy,
            connect_budget: config.connect_budget(),
        };
        let id = Uuid::new_v4();
        let usage = Arc::new(usage::UsageRecorder::new(id, redis.clone(), keys.clone()));
        let gateway = Arc::new(Gateway {
            id,
            usage,
            auth_failures: Arc::new(limits::AuthFailureLimiter::new(
                config.auth_failures_per_minute,
            )),
            admission: Arc::new(admission::Admission::new(
                redis.clone(),
                keys.clone(),
                id,
                Duration::from_millis(config.lease_ttl_ms.max(300)),
            )),
            config: Arc::new(config),
            auth,
            pool,
            registry,
            tunnels,
            draining: AtomicBool::new(false),
        });
        Ok(Self {
            gateway,
            addresses,
            proxy,
            socks,
            admin,
            link,
            identity,
            redis_client,
            redis,
            keys,
        })
    }

    pub fn addresses(&self) -> Addresses {
        self.addresses
    }

    pub fn gateway(&self) -> Arc<Gateway> {
        self.gateway.clone()
    }

    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) {
        let gateway = self.gateway;
        let config = gateway.config.clone();
        let advertise = config.link_advertise.unwrap_or(self.addresses.link);
        let announcer = announce::Announcer {
            redis: self.redis.clone(),
            keys: self.keys.clone(),
            record: SuperproxyRecord {
                id: gateway.id,
                link_addr: advertise,
                cert_sha256: self.identity.cert_sha256.clone(),
            },
            interval: config.announce_interval(),
        };
        gateway.pool.refresh().await;
        let mut background = vec![
            tokio::spawn(gateway.pool.clone().run(config.pool_refresh())),
            tokio::spawn(
                link::listener::LinkListener {
                    listener: self.link,
                    acceptor: tokio_rustls::TlsAcceptor::from(self.identity.server_config.clone()),
                    registry: gateway.registry.clone(),
                    redis: self.redis.clone(),
                    keys: self.keys.clone(),
                }
                .run(),
            ),
            tokio::spawn(events::run(
                self.redis_client,
                self.keys.events(),
                gateway.clone(),
            )),
            tokio::spawn(admin::run(self.admin, gateway.clone())),
            tokio::spawn(gateway.usage.clone().run(config.usage_flush())),
            tokio::spawn(gateway.auth_failures.clone().run_housekeeping()),
            tokio::spawn(gateway.admission.clone().run_renewals()),
            tokio::spawn(
                probe::Prober {
                    superproxy_id: gateway.id,
                    registry: gateway.registry.clone(),
                    health: gateway.pool.health().clone(),
                    redis: self.redis.clone(),
                    keys: self.keys.clone(),
                }
                .run(),
            ),
        ];
        if let Err(e) = announcer.announce_once().await {
            tracing::warn!(error = %e, "first announcement failed; retrying in the background");
        }
        background.push(tokio::spawn(announcer.clone().run()));

        // Every connection task holds a clone of `alive`; when all are gone the
        // receiver sees the channel close, which is how shutdown waits for them.
        let (alive, mut all_done) = mpsc::channel::<()>(1);
        let permits = Arc::new(Semaphore::new(config.max_connections.max(1)));
        tokio::pin!(shutdown);
        loop {
            let (accepted, socks_only) = tokio::select! {
                () = &mut shutdown => break,
                accepted = self.proxy.accept() => (accepted, false),
                accepted = self.socks.accept() => (accepted, true),
            };
            let (stream, peer) = match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                tokio::spawn(refuse_over_limit(stream, socks_only));
                continue;
            };
            let gateway = gateway.clone();
            let alive = alive.clone();
            tokio::spawn(async move {
                if socks_only {
                    ingress::socks5::serve_connection(gateway, stream, peer).await;
                } else {
                    ingress::serve_any(gateway, stream, peer).await;
                }
                drop(permit);
                drop(alive);
            });
        }

        tracing::info!("stopping: withdrawing announcement and draining connections");
        gateway.draining.store(true, Ordering::Relaxed);
        announcer.withdraw().await;
        drop(alive);
        if tokio::time::timeout(DRAIN_TIMEOUT, all_done.recv())
            .await
            .is_err()
        {
            tracing::warn!("drain timeout reached; closing remaining connections");
        }
        for task in background {
            task.abort();
        }
        // Bytes of tunnels that ended during the drain reach the ledger too.
        gateway.usage.flush().await;
    }
}

/// Answers a connection over the limit: an HTTP 503 with `Proxy-Status`
/// (SOCKS clients, which speak first with 0x05, are simply closed).
async fn refuse_over_limit(mut stream: tokio::net::TcpStream, socks_only: bool) {
    if !socks_only {
        let mut first = [0u8; 1];
        let peeked = tokio::time::timeout(Duration::from_secs(1), stream.peek(&mut first)).await;
        if matches!(peeked, Ok(Ok(1))) && first[0] != 0x05 {
            let error = error::ProxyError::new(
                error::ErrorKind::ConnectionLimit,
                "too many connections; try again shortly",
            );
            let _ = stream
                .write_all(&ingress::head_guard::error_response(&error))
                .await;
        }
    }
    let _ = stream.shutdown().await;
}
