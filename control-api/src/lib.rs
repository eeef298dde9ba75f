//! proxynet control plane.
//!
//! Axum over Postgres: accounts, proxy users, exits and their enrollment, the
//! audit log. It projects what the data plane needs into Redis ([`projector`])
//! and is the only component that writes Postgres.
//!
//! [`ControlApi::bind`] connects both stores, applies migrations, binds the
//! listener (port 0 is fine) and reports the bound address; [`ControlApi::serve`]
//! runs until the shutdown future resolves.

mod audit;
mod auth;
mod ceilings;
mod config;
mod error;
mod extract;
mod ledger;
mod liveness;
mod observe;
mod openapi;
mod passwords;
mod postgres;
mod projector;
mod routes;
mod usage_domains;
mod webhooks;

use proxynet_common::secret::Secret;
use proxynet_common::tasks::{Stop, Tasks};
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::{Keys, StoreUnavailable};
use sqlx::PgPool;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

pub use config::Config;
use passwords::PasswordHashing;
use projector::Projector;

/// Shared by every request handler.
#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub redis: RedisConnection,
    pub projector: Projector,
    pub hashing: PasswordHashing,
    pub admin_token: Secret,
    pub config: Arc<Config>,
    /// Heartbeats waiting for their batched write to Postgres.
    pub heartbeats: Arc<liveness::HeartbeatBook>,
    /// This control plane's own service addresses (API, Redis, Postgres),
    /// handed to agents so they never dial them.
    pub protected: Arc<Vec<SocketAddr>>,
    /// The sampled fleet (metrics and dashboard).
    pub observer: observe::Observer,
    /// Dashboard logins.
    pub sessions: routes::dashboard::Sessions,
    /// When API keys were last used (debounced writes).
    pub key_use: Arc<auth::KeyUse>,
    /// API keys' request rates on this instance.
    pub key_rates: Arc<auth::KeyRates>,
    /// API keys' rates of site reports (`POST /v1/feedback`) on this instance.
    pub feedback_rates: Arc<auth::FeedbackRates>,
}

/// Why the control-api could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("no admin token configured: set PROXYNET_ADMIN_TOKEN (or --admin-token), e.g. `export PROXYNET_ADMIN_TOKEN=$(openssl rand -hex 32)`")]
    NoAdminToken,
    #[error(transparent)]
    Store(#[from] StoreUnavailable),
    #[error("applying migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
}

pub struct ControlApi {
    listener: TcpListener,
    admin: TcpListener,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    state: AppState,
    ledger: ledger::LedgerConsumer,
    /// With several Postgres hosts: keeps the pool on the one taking writes.
    postgres_failover: Option<postgres::Failover>,
}

impl ControlApi {
    pub async fn bind(config: Config) -> Result<Self, StartError> {
        let heartbeat_record = Duration::from_secs(config.heartbeat_record_secs.max(1));
        let admin_token = config
            .admin_token
            .clone()
            .filter(|t| !t.is_empty())
            .ok_or(StartError::NoAdminToken)?;
        if config.heartbeat_ttl_ms <= config.heartbeat_interval_ms {
            return Err(StartError::Config(
                "heartbeat TTL must be longer than the heartbeat interval".into(),
            ));
        }
        webhooks::set_max_pending_per_account(config.webhook_max_pending_per_account);
        let key_rates = auth::KeyRates::new(
            auth::KeyRate {
                per_second: config.api_key_rate,
                burst: config.api_key_burst,
            },
            auth::KeyRate {
                per_second: config.operator_key_rate,
                burst: config.operator_key_burst,
            },
        );
        let postgres::Postgres {
            pool: db,
            failover: postgres_failover,
        } = postgres::Postgres::connect(config.database_url.expose()).await?;
        sqlx::migrate!("../migrations").run(&db).await?;
        let redis_target = config.redis.target()?;
        let mut redis = redis_target.connect().await?;
        config.redis.check_persistence(&mut redis).await?;
        let keys = Keys::new(config.redis.redis_prefix.clone());
        let ledger = ledger::LedgerConsumer {
            db: db.clone(),
            redis: redis_target.clone(),
            keys: keys.clone(),
            consumer: config.instance_name.clone(),
        };
        let projector = Projector::new(db.clone(), redis.clone(), keys)
            .with_strict_egress(config.strict_egress_verification);
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| StartError::Listen {
                    addr: config.listen,
                    source,
                })?;
        let admin = TcpListener::bind(config.admin_listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: config.admin_listen,
                source,
            })?;
        let bound = listener.local_addr().map_err(|source| StartError::Listen {
            addr: config.listen,
            source,
        })?;
        // The reflectors agents are told to ask are protected like the
        // stores: no exit may reach one through another exit's tunnel (it
        // would sign that exit's address for the asker).
        let database_hosts =
            postgres::split_hosts(config.database_url.expose()).unwrap_or_default();
        let redis_data_nodes = redis_target.sentinel_data_nodes().await;
        let mut protected = protected_addresses(
            bound,
            &redis_target
                .urls()
                .chain(redis_data_nodes.iter().map(String::as_str))
                .chain(database_hosts.iter().map(String::as_str))
                .chain(config.reflector_urls.iter().map(String::as_str))
                .collect::<Vec<_>>(),
        )
        .await;
        if let Ok(admin_addr) = admin.local_addr() {
            protected.extend(protected_addresses(admin_addr, &[]).await);
        }
        Ok(Self {
            listener,
            admin,
            postgres_failover,
            metrics: proxynet_common::metrics::install(),
            ledger,
            state: AppState {
                db,
                redis,
                projector,
                hashing: PasswordHashing::default(),
                admin_token,
                config: Arc::new(config),
                heartbeats: Arc::new(liveness::HeartbeatBook::new(heartbeat_record)),
                protected: Arc::new(protected),
                observer: observe::Observer::default(),
                sessions: routes::dashboard::Sessions::default(),
                key_use: Arc::default(),
                key_rates: Arc::new(key_rates),
                feedback_rates: Arc::default(),
            },
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn admin_addr(&self) -> std::io::Result<SocketAddr> {
        self.admin.local_addr()
    }

    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let state = &self.state;
        let config = state.config.clone();
        let mut tasks = Tasks::new();
        {
            let (projector, period) = (state.projector.clone(), config.resync_secs.max(1));
            tasks.spawn("resync", move |stop| {
                projector.run_resync_loop(Duration::from_secs(period), stop)
            });
        }
        {
            let projector = state.projector.clone();
            let (instance, interval) = (config.instance_name.clone(), config.heartbeat_interval());
            tasks.spawn("presence", move |stop| {
                projector.run_presence(instance, interval, stop)
            });
        }
        let ledger = self.ledger;
        tasks.spawn("usage ledger", |stop| ledger.run(stop));
        if let Some(failover) = self.postgres_failover {
            tasks.spawn("postgres failover", |stop| failover.run(stop));
        }
        {
            let policy = webhooks::target::policy(config.webhook_allow_internal, &state.protected);
            let deliverer = webhooks::Deliverer::new(state.db.clone(), policy).with_rules(
                webhooks::DeliveryRules {
                    max_attempts: config.webhook_max_attempts,
                    disable_after_failures: config.webhook_disable_after_failures,
                    disable_after: Duration::from_secs(config.webhook_disable_after_secs),
                },
            );
            tasks.spawn("webhook delivery", |stop| deliverer.run(stop));
        }
        {
            let (book, db) = (state.heartbeats.clone(), state.db.clone());
            let every = Duration::from_millis(config.heartbeat_persist_ms.max(100));
            tasks.spawn("heartbeat persistence", move |stop| {
                book.run(db, every, stop)
            });
        }
        {
            let db = state.db.clone();
            tasks.spawn("consent expiry announcements", move |stop| {
                webhooks::consent::run(db, stop)
            });
        }
        {
            let db = state.db.clone();
            tasks.spawn("usage-domain listing prune", move |stop| {
                usage_domains::run_prune(db, stop)
            });
        }
        {
            let db = state.db.clone();
            let retention = Duration::from_secs(config.abuse_retention_days.saturating_mul(86_400));
            let every = Duration::from_secs(config.abuse_prune_interval_secs.max(1));
            tasks.spawn("abuse-log retention", move |stop| {
                routes::abuse::run_retention(db, retention, every, stop)
            });
        }
        {
            let (observer, projector) = (state.observer.clone(), state.projector.clone());
            let every = Duration::from_secs(config.observe_interval_secs.max(1));
            let limit = config.metrics_exit_limit;
            tasks.spawn("fleet sampler", move |stop| {
                observer.run(projector, every, Duration::from_secs(3600), limit, stop)
            });
        }
        {
            // Keys quiet for a while take no memory.
            let rates = state.key_rates.clone();
            let reports = state.feedback_rates.clone();
            tasks.spawn("api key rate housekeeping", move |stop| async move {
                let mut tick = tokio::time::interval(Duration::from_secs(60));
                while stop.run_until_cancelled(tick.tick()).await.is_some() {
                    rates.housekeeping();
                    reports.housekeeping();
                }
            });
        }
        {
            let (admin, metrics) = (self.admin, self.metrics);
            tasks.spawn("admin endpoint", |stop| serve_admin(admin, metrics, stop));
        }
        let (heartbook, db) = (self.state.heartbeats.clone(), self.state.db.clone());
        let app = routes::router(self.state);
        let result = axum::serve(
            self.listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown)
        .await;
        tasks.stop(Duration::from_secs(5)).await;
        // The last beats reach Postgres before we go (best effort).
        let _ = heartbook.persist(&db).await;
        result
    }
}

/// `/metrics` and `/healthz` on the admin listener.
async fn serve_admin(
    listener: TcpListener,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    stop: Stop,
) {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move {
                    match metrics {
                        Some(handle) => (
                            axum::http::StatusCode::OK,
                            [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                            proxynet_common::metrics::render(&handle),
                        ),
                        None => (
                            axum::http::StatusCode::NOT_FOUND,
                            [("content-type", "text/plain")],
                            "metrics disabled\n".to_owned(),
                        ),
                    }
                }
            }),
        );
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        tracing::warn!(error = %e, "admin listener stopped");
    }
}

/// The addresses of this control plane's services: the API listener (an
/// unspecified bind expanded to this host's addresses) and the hosts of the
/// store URLs, resolved now.
async fn protected_addresses(api: SocketAddr, store_urls: &[&str]) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    if api.ip().is_unspecified() {
        out.extend(
            proxynet_common::egress::host_interface_addresses()
                .into_iter()
                .map(|ip| SocketAddr::new(ip, api.port())),
        );
    } else {
        out.push(api);
    }
    for url in store_urls {
        let Some((host, port)) = url_host_port(url) else {
            continue;
        };
        let resolved = tokio::net::lookup_host((host.as_str(), port)).await;
        if let Ok(addrs) = resolved {
            out.extend(addrs);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `scheme://[user[:pass]@]host[:port][/...]` → (host, port), with the
/// scheme's default port (Redis 6379, Postgres 5432, a reflector's plain
/// HTTP 80).
fn url_host_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let default = match scheme {
        "redis" | "rediss" => 6379,
        "postgres" | "postgresql" => 5432,
        "http" => 80,
        _ => return None,
    };
    if let Some(v6) = hostport.strip_prefix('[') {
        let (host, port) = v6.split_once(']')?;
        let port = port
            .strip_prefix(':')
            .map_or(Some(default), |p| p.parse().ok())?;
        return Some((host.to_owned(), port));
    }
    match hostport.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None => Some((hostport.to_owned(), default)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn store_url_hosts() {
        use super::url_host_port;
        assert_eq!(
            url_host_port("postgres://u:p@127.0.0.1:5433/db"),
            Some(("127.0.0.1".into(), 5433))
        );
        assert_eq!(
            url_host_port("redis://127.0.0.1/"),
            Some(("127.0.0.1".into(), 6379))
        );
        assert_eq!(
            url_host_port("redis://[::1]:7000"),
            Some(("::1".into(), 7000))
        );
        assert_eq!(
            url_host_port("http://192.0.2.9:8099/whoami"),
            Some(("192.0.2.9".into(), 8099))
        );
    }
}
