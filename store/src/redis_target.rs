//! Where the shared state lives — one Redis, a Redis Cluster named by its
//! seed nodes, or a master and replicas watched by Redis Sentinel — and the
//! one connection type every binary uses for it.
//!
//! Everything above this module is written once against [`RedisConnection`]:
//! commands, pipelines, transactions and scripts route by key on a cluster
//! (the key layout in [`crate::store`] keeps every multi-key operation in one
//! hash slot). What differs is only how to connect and how to subscribe:
//! classic pub/sub is cluster-wide (a message published on any node reaches
//! subscribers on every node), so a subscription is simply held on one node,
//! moving to the next seed when that node goes away. Under Sentinel the
//! connection follows the master the sentinels name ([`sentinel`]).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;

use crate::unavailable::{redact_url, StoreUnavailable};
use proxynet_common::secret::Secret;

mod connection;
mod sentinel;
pub use connection::RedisConnection;
pub use sentinel::SentinelConnection;
use sentinel::SentinelSettings;

/// How long a connection attempt or a reply may take before the call fails
/// (and the caller degrades) instead of hanging a request.
const TIMEOUT: Duration = Duration::from_secs(3);

/// The Redis flags both the superproxy and the control-api take.
#[derive(Debug, Clone, clap::Args)]
pub struct RedisArgs {
    /// Redis URL (shared state with the control-api and other superproxies).
    /// With `--redis-cluster`, one or more seed nodes of the cluster,
    /// comma-separated (`redis://h1:7000/,redis://h2:7000/`).
    #[arg(long, env = "PROXYNET_REDIS_URL", hide_env_values = true)]
    pub redis_url: Secret,

    /// The shared state is a Redis Cluster: keys are routed by hash slot and
    /// the topology is discovered from the seed nodes in `--redis-url`.
    #[arg(long, env = "PROXYNET_REDIS_CLUSTER", default_value_t = false)]
    pub redis_cluster: bool,

    /// The shared state is a Redis master with replicas watched by Redis
    /// Sentinel: `--redis-url` lists the sentinels, comma-separated
    /// (`redis://:MASTERPASS@s1:26379/0,redis://:MASTERPASS@s2:26379/0`);
    /// the user, password and database in those URLs are the master's. The
    /// connection follows the master across failovers, and a usage batch
    /// counts as delivered only once a replica holds it.
    #[arg(long, env = "PROXYNET_REDIS_SENTINEL", default_value_t = false)]
    pub redis_sentinel: bool,

    /// The master's name in the sentinels' configuration (`sentinel monitor
    /// NAME ...`).
    #[arg(
        long,
        env = "PROXYNET_REDIS_SENTINEL_MASTER",
        default_value = "mymaster"
    )]
    pub redis_sentinel_master: String,

    /// The password the sentinels themselves require (`requirepass` in
    /// sentinel.conf), when they require one.
    #[arg(long, env = "PROXYNET_REDIS_SENTINEL_PASSWORD", hide_env_values = true)]
    pub redis_sentinel_password: Option<Secret>,

    /// Prefix of every Redis key of this stack (several stacks can share one
    /// Redis). It may not contain `{` or `}`: those would override the hash
    /// tags that keep related keys in one cluster slot.
    #[arg(long, env = "PROXYNET_REDIS_PREFIX", default_value = "pn:", value_parser = key_prefix)]
    pub redis_prefix: String,

    /// Refuse to start unless Redis persists with its append-only file
    /// (`appendonly yes`). Usage batches wait in the Redis usage stream until
    /// the control-api records them; a Redis that restarts without AOF loses
    /// the ones not yet recorded (up to a flush interval of every
    /// superproxy's traffic). Without this flag a Redis without AOF is only
    /// warned about at start.
    #[arg(long, env = "PROXYNET_REDIS_REQUIRE_AOF", default_value_t = false)]
    pub redis_require_aof: bool,
}

/// What Redis says of its durability (`INFO persistence`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// `aof_enabled:1`.
    AppendOnly,
    /// No AOF (RDB snapshots at most): a restart loses recent writes.
    NoAppendOnly,
    /// The server would not say (INFO refused by an ACL).
    Unknown,
}

impl RedisArgs {
    /// Checks the usage stream's durability once at start: a clear warning
    /// when Redis runs without AOF, a refusal with `--redis-require-aof`.
    pub async fn check_persistence(
        &self,
        conn: &mut RedisConnection,
    ) -> Result<Persistence, StoreUnavailable> {
        let info: Result<String, _> = redis::cmd("INFO")
            .arg("persistence")
            .query_async(conn)
            .await;
        let persistence = match info {
            Ok(info) if info.contains("aof_enabled:1") => Persistence::AppendOnly,
            Ok(_) => Persistence::NoAppendOnly,
            Err(_) => Persistence::Unknown,
        };
        match (persistence, self.redis_require_aof) {
            (Persistence::AppendOnly, _) => {}
            (_, true) => {
                return Err(StoreUnavailable {
                    what: "Redis",
                    detail: match persistence {
                        Persistence::Unknown => "--redis-require-aof: Redis would not report its persistence (INFO refused); allow INFO or drop the flag".into(),
                        _ => "--redis-require-aof: Redis runs without its append-only file; set `appendonly yes` (usage not yet in the ledger would be lost on a Redis restart)".into(),
                    },
                })
            }
            (Persistence::NoAppendOnly, false) => tracing::warn!(
                "Redis runs without its append-only file (appendonly no): usage batches not yet in the ledger are lost if Redis restarts; set `appendonly yes`, or pass --redis-require-aof to refuse such a Redis"
            ),
            (Persistence::Unknown, false) => tracing::warn!(
                "Redis does not report its persistence (INFO refused): make sure it runs with `appendonly yes`"
            ),
        }
        Ok(persistence)
    }
}

fn key_prefix(value: &str) -> Result<String, String> {
    if value.contains(['{', '}']) {
        return Err(
            "a key prefix may not contain '{' or '}' (they would override hash tags)".into(),
        );
    }
    Ok(value.to_owned())
}

impl RedisArgs {
    pub fn target(&self) -> Result<RedisTarget, StoreUnavailable> {
        if self.redis_sentinel && self.redis_cluster {
            // Checked here rather than by clap: an environment file that
            // sets PROXYNET_REDIS_CLUSTER=false must not count as a conflict.
            return Err(StoreUnavailable {
                what: "Redis",
                detail: "--redis-sentinel and --redis-cluster exclude each other: Sentinel watches one master, a cluster has many".into(),
            });
        }
        if self.redis_sentinel {
            return RedisTarget::sentinel(
                self.redis_url.expose(),
                &self.redis_sentinel_master,
                self.redis_sentinel_password.as_ref().map(Secret::expose),
            );
        }
        RedisTarget::new(self.redis_url.expose(), self.redis_cluster)
    }
}

/// A validated Redis location: one server, a cluster's seed nodes, or the
/// sentinels of a master.
#[derive(Clone)]
pub struct RedisTarget {
    nodes: Vec<String>,
    cluster: bool,
    /// With Sentinel: `nodes` are the sentinels.
    sentinel: Option<SentinelSettings>,
    /// The seed the next subscription tries first (rotates on failure).
    next_subscription_node: usize,
}

/// Never the raw URLs: they may carry a password.
impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl RedisTarget {
    /// `urls` is one URL, or with `cluster` a comma-separated list of seeds
    /// (a comma inside a password is written `%2C` there).
    pub fn new(urls: &str, cluster: bool) -> Result<Self, StoreUnavailable> {
        let given: Vec<&str> = if cluster {
            urls.split(',').collect()
        } else {
            vec![urls]
        };
        let nodes: Vec<String> = given
            .into_iter()
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        let invalid = |detail: String| StoreUnavailable {
            what: "Redis",
            detail,
        };
        if nodes.is_empty() {
            return Err(invalid("no Redis URL given".into()));
        }
        for node in &nodes {
            let info = redis::IntoConnectionInfo::into_connection_info(node.as_str())
                .map_err(|e| invalid(format!("invalid Redis URL {}: {e}", redact_url(node))))?;
            if cluster && info.redis_settings().db() != 0 {
                return Err(invalid(format!(
                    "{} selects database {}; a Redis Cluster has only database 0",
                    redact_url(node),
                    info.redis_settings().db()
                )));
            }
        }
        Ok(Self {
            nodes,
            cluster,
            sentinel: None,
            next_subscription_node: 0,
        })
    }

    /// `urls` lists the sentinels, comma-separated; `master` is the name
    /// they know the master by.
    pub fn sentinel(
        urls: &str,
        master: &str,
        sentinel_password: Option<&str>,
    ) -> Result<Self, StoreUnavailable> {
        let nodes: Vec<String> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        let settings =
            SentinelSettings::new(&nodes, master, sentinel_password).map_err(|detail| {
                StoreUnavailable {
                    what: "Redis",
                    detail,
                }
            })?;
        Ok(Self {
            nodes,
            cluster: false,
            sentinel: Some(settings),
            next_subscription_node: 0,
        })
    }

    /// Whether writes are copied to replicas the target may fail over to
    /// (Sentinel): then a write that must survive a failover waits for one.
    pub fn is_replicated(&self) -> bool {
        self.sentinel.is_some()
    }

    /// The URLs as given (one, or every seed, or every sentinel), for
    /// deriving protected addresses.
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(String::as_str)
    }

    /// Under Sentinel, the master and replicas the sentinels know now, as
    /// `redis://host:port/` (they are not in `--redis-url`, and agents must
    /// be told to deny them too). Empty otherwise.
    pub async fn sentinel_data_nodes(&self) -> Vec<String> {
        let Some(sentinel) = &self.sentinel else {
            return Vec::new();
        };
        sentinel
            .data_nodes()
            .await
            .into_iter()
            .map(|(host, port)| {
                if host.contains(':') {
                    format!("redis://[{host}]:{port}/")
                } else {
                    format!("redis://{host}:{port}/")
                }
            })
            .collect()
    }

    /// The target fit for a log line or an error: passwords replaced.
    pub fn describe(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(|n| redact_url(n)).collect();
        if self.cluster {
            format!("Redis Cluster via {}", nodes.join(","))
        } else if let Some(sentinel) = &self.sentinel {
            format!(
                "Redis master {:?} via sentinels {}",
                sentinel.master_name(),
                nodes.join(",")
            )
        } else {
            nodes.join(",")
        }
    }

    /// Connects (reconnecting on its own afterwards), with replies bounded by
    /// 3 s, and checks the server answers and is of the kind configured.
    pub async fn connect(&self) -> Result<RedisConnection, StoreUnavailable> {
        self.connect_with_reply_timeout(TIMEOUT).await
    }

    /// As [`Self::connect`], for a caller whose commands block on the server
    /// (XREADGROUP ... BLOCK) and so need a longer reply timeout.
    pub async fn connect_with_reply_timeout(
        &self,
        reply_timeout: Duration,
    ) -> Result<RedisConnection, StoreUnavailable> {
        let unavailable = |detail: String| StoreUnavailable {
            what: "Redis",
            detail,
        };
        let connecting = async {
            if let Some(sentinel) = &self.sentinel {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(TIMEOUT))
                    .set_response_timeout(Some(reply_timeout))
                    .set_number_of_retries(1);
                SentinelConnection::connect(sentinel.clone(), config)
                    .await
                    .map(RedisConnection::Sentinel)
                    .map_err(|e| unavailable(format!("cannot reach {}: {e}", self.describe())))
            } else if self.cluster {
                let client = ClusterClientBuilder::new(self.nodes.iter().map(String::as_str))
                    .connection_timeout(TIMEOUT)
                    .response_timeout(reply_timeout)
                    // A few quick retries ride out a failover or a moved slot;
                    // past them the caller's own degraded mode takes over.
                    .retries(3)
                    .min_retry_wait(50)
                    .max_retry_wait(1_000)
                    .build()
                    .map_err(|e| unavailable(format!("invalid cluster seeds: {e}")))?;
                client
                    .get_async_connection()
                    .await
                    .map(RedisConnection::Cluster)
                    .map_err(|e| unavailable(format!("cannot join {}: {e}", self.describe())))
            } else {
                let client = redis::Client::open(self.nodes[0].as_str())
                    .map_err(|e| unavailable(format!("invalid Redis URL: {e}")))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(TIMEOUT))
                    .set_response_timeout(Some(reply_timeout))
                    .set_number_of_retries(1);
                ConnectionManager::new_with_config(client, config)
                    .await
                    .map(RedisConnection::Single)
                    .map_err(|e| unavailable(format!("cannot connect to {}: {e}", self.describe())))
            }
        };
        let mut conn = tokio::time::timeout(TIMEOUT + Duration::from_secs(2), connecting)
            .await
            .map_err(|_| unavailable(format!("no answer from {} within 5 s", self.describe())))??;
        if self.cluster {
            // Joining already read the slot map from a seed: the cluster is there.
            return Ok(conn);
        }
        // INFO may be refused to a least-privilege ACL user (it is in
        // @dangerous): then the server cannot say, and PING must do.
        let cluster_info: Result<String, _> = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut conn)
            .await;
        match cluster_info {
            Ok(info) if info.contains("cluster_enabled:1") => {
                return Err(unavailable(format!(
                    "{} is a Redis Cluster node: start with --redis-cluster (PROXYNET_REDIS_CLUSTER=true)",
                    self.describe()
                )));
            }
            Ok(_) => {}
            Err(_) => {
                let _: String = redis::cmd("PING")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| unavailable(format!("PING to {} failed: {e}", self.describe())))?;
            }
        }
        Ok(conn)
    }

    /// A pub/sub connection subscribed to `channel`. On a cluster it is held
    /// on one node; each call after a failure starts at the next seed, so a
    /// lost node moves the subscription instead of silencing it.
    pub async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<redis::aio::PubSub> {
        if let Some(sentinel) = &self.sentinel {
            // On the master: a replica would do too (PUBLISH is replicated),
            // but the master is the node the sentinels vouch for.
            let attempt = async {
                let mut pubsub = sentinel.master().await?.get_async_pubsub().await?;
                pubsub.subscribe(channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            return tokio::time::timeout(TIMEOUT * 2, attempt)
                .await
                .unwrap_or_else(|_| {
                    Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "subscription timed out",
                    )))
                });
        }
        let first = self.next_subscription_node;
        let mut last_error = None;
        for step in 0..self.nodes.len() {
            let index = (first + step) % self.nodes.len();
            let attempt = async {
                let client = redis::Client::open(self.nodes[index].as_str())?;
                let mut pubsub = client.get_async_pubsub().await?;
                pubsub.subscribe(channel).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            match tokio::time::timeout(TIMEOUT, attempt).await {
                Ok(Ok(pubsub)) => {
                    // The next attempt (after this subscription is lost)
                    // tries another node first.
                    self.next_subscription_node = (index + 1) % self.nodes.len();
                    return Ok(pubsub);
                }
                Ok(Err(e)) => last_error = Some(e),
                Err(_) => {
                    last_error = Some(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "subscription timed out",
                    )))
                }
            }
        }
        self.next_subscription_node = (first + 1) % self.nodes.len();
        Err(last_error.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Client, "no Redis node to subscribe on"))
        }))
    }
}

#[cfg(test)]
mod tests;
