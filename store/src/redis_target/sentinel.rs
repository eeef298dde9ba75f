//! Redis behind Sentinel: the sentinels name the master, and a
//! [`SentinelConnection`] follows it across failovers.
//!
//! The redis crate resolves a master through the sentinels (checking with
//! `ROLE` that the node it found believes it is the master) but hands back a
//! plain client: a connection manager built on it would reconnect to the old
//! address forever. So the connection here holds the current master's
//! reconnecting connection and, when a command fails in a way a failover
//! explains (the master is gone, refuses, times out, or answers `READONLY`
//! because it has been demoted), asks the sentinels again in the background
//! and swaps in a connection to the new master. Commands in flight at the
//! switch fail once, as they would on any lost connection; every caller
//! already treats that as a store outage (the data plane routes from memory,
//! usage waits and is re-sent). A slow check every few seconds catches a
//! switch that no command has tripped over yet.

use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisError, RedisFuture};
use redis::{RedisConnectionInfo, ServerErrorKind, Value};

/// Sentinel lookups at most this often, however many commands fail at once.
const LOOKUP_GAP: Duration = Duration::from_millis(250);
/// The unprompted check that the master is still where we write.
const WATCH_EVERY: Duration = Duration::from_secs(5);
/// One lookup (sentinels, then `ROLE` on the master) may take this long.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// Where the sentinels are and how to speak to the master they name.
#[derive(Clone)]
pub(crate) struct SentinelSettings {
    /// The sentinels, without the master's credentials.
    sentinels: Vec<ConnectionInfo>,
    master_name: String,
    /// Database, user and password for the master (and its replicas).
    master_node: SentinelNodeConnectionInfo,
    db: i64,
}

impl SentinelSettings {
    /// `nodes` are the sentinels' URLs; their user, password and database
    /// are the master's (what `--redis-url` means without Sentinel), and
    /// `sentinel_password` is what the sentinels themselves ask for.
    pub(crate) fn new(
        nodes: &[String],
        master_name: &str,
        sentinel_password: Option<&str>,
    ) -> Result<Self, String> {
        if master_name.is_empty() {
            return Err("--redis-sentinel-master may not be empty".into());
        }
        let mut master_settings: Option<RedisConnectionInfo> = None;
        let mut sentinels = Vec::with_capacity(nodes.len());
        for node in nodes {
            let info = redis::IntoConnectionInfo::into_connection_info(node.as_str())
                .map_err(|e| format!("invalid sentinel URL {}: {e}", crate::redact_url(node)))?;
            if !matches!(info.addr(), ConnectionAddr::Tcp(..)) {
                return Err(format!(
                    "{}: sentinels are reached over plain TCP (redis://host:port)",
                    crate::redact_url(node)
                ));
            }
            let settings = info.redis_settings();
            match &master_settings {
                None => master_settings = Some(settings.clone()),
                Some(first)
                    if first.db() != settings.db()
                        || first.username() != settings.username()
                        || first.password() != settings.password() =>
                {
                    return Err(
                        "every sentinel URL must carry the same user, password and database (they are the master's)"
                            .into(),
                    );
                }
                Some(_) => {}
            }
            let mut to_sentinel = RedisConnectionInfo::default();
            if let Some(password) = sentinel_password {
                to_sentinel = to_sentinel.set_password(password);
            }
            sentinels.push(info.set_redis_settings(to_sentinel));
        }
        let master_settings = master_settings.ok_or("no sentinel URL given")?;
        Ok(Self {
            sentinels,
            master_name: master_name.to_owned(),
            db: master_settings.db(),
            master_node: SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(master_settings),
        })
    }

    pub(crate) fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The data nodes the first answering sentinel knows: the master and
    /// its replicas, as `host:port` (for the egress policy's protected set:
    /// `--redis-url` names only the sentinels). Empty if none answers.
    pub(crate) async fn data_nodes(&self) -> Vec<(String, u16)> {
        for sentinel in &self.sentinels {
            let asking = async {
                let client = redis::Client::open(sentinel.clone())?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                let master: (String, u16) = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master_name)
                    .query_async(&mut conn)
                    .await?;
                let replicas: Vec<std::collections::HashMap<String, String>> =
                    redis::cmd("SENTINEL")
                        .arg("replicas")
                        .arg(&self.master_name)
                        .query_async(&mut conn)
                        .await?;
                let mut nodes = vec![master];
                nodes.extend(replicas.into_iter().filter_map(|replica| {
                    Some((
                        replica.get("ip")?.clone(),
                        replica.get("port")?.parse().ok()?,
                    ))
                }));
                Ok::<_, RedisError>(nodes)
            };
            if let Ok(Ok(nodes)) = tokio::time::timeout(LOOKUP_TIMEOUT, asking).await {
                return nodes;
            }
        }
        Vec::new()
    }

    /// A client for the master the sentinels name now (its role checked).
    pub(crate) async fn master(&self) -> redis::RedisResult<redis::Client> {
        let mut sentinel = Sentinel::build(self.sentinels.clone())?;
        lookup(&mut sentinel, self).await
    }
}

async fn lookup(
    sentinel: &mut Sentinel,
    settings: &SentinelSettings,
) -> redis::RedisResult<redis::Client> {
    let asking = sentinel.async_master_for(&settings.master_name, Some(&settings.master_node));
    match tokio::time::timeout(LOOKUP_TIMEOUT, asking).await {
        Ok(found) => found,
        Err(_) => Err(RedisError::from((
            ErrorKind::Io,
            "no sentinel named a master in time",
        ))),
    }
}

/// A connection to whichever node the sentinels call master. Cheap to clone:
/// clones share the connection and its lookups.
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    settings: SentinelSettings,
    config: ConnectionManagerConfig,
    /// The sentinels, with their cached connections; held across a lookup,
    /// so concurrent lookups collapse into one.
    sentinel: tokio::sync::Mutex<Sentinel>,
    current: RwLock<Master>,
    last_lookup: std::sync::Mutex<Option<Instant>>,
    /// When a master without replicas was last reported (once a minute).
    last_alone_warning: std::sync::Mutex<Option<Instant>>,
}

#[derive(Clone)]
struct Master {
    /// Bumped on every switch, so a lookup prompted by an old master's
    /// failure does not undo a newer switch.
    generation: u64,
    address: String,
    connection: ConnectionManager,
}

fn address_of(client: &redis::Client) -> String {
    client.get_connection_info().addr().to_string()
}

impl SentinelConnection {
    pub(crate) async fn connect(
        settings: SentinelSettings,
        config: ConnectionManagerConfig,
    ) -> redis::RedisResult<Self> {
        let mut sentinel = Sentinel::build(settings.sentinels.clone())?;
        let client = lookup(&mut sentinel, &settings).await?;
        let address = address_of(&client);
        let connection = ConnectionManager::new_with_config(client, config.clone()).await?;
        let shared = Arc::new(Shared {
            settings,
            config,
            sentinel: tokio::sync::Mutex::new(sentinel),
            current: RwLock::new(Master {
                generation: 0,
                address,
                connection,
            }),
            last_lookup: std::sync::Mutex::new(None),
            last_alone_warning: std::sync::Mutex::new(None),
        });
        tokio::spawn(watch(Arc::downgrade(&shared)));
        Ok(Self { shared })
    }

    /// Runs `command` and then waits (up to `timeout`) until a replica holds
    /// it, on one connection to one master, so the acknowledgement is for
    /// this write. A master with no replica connected (`ROLE`) cannot be
    /// waited for: the write is taken as it is, with a warning once a minute
    /// (refusing would stop usage delivery until a replica is rebuilt).
    pub(crate) async fn query_replicated<T: redis::FromRedisValue>(
        &self,
        command: &Cmd,
        timeout: Duration,
    ) -> redis::RedisResult<T> {
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let shared = self.shared.clone();
        self.on_master(async move |conn| {
            let role: redis::Role = redis::cmd("ROLE").query_async(&mut *conn).await?;
            let alone = matches!(&role, redis::Role::Primary { replicas, .. } if replicas.is_empty());
            if alone {
                // A master without replicas is either the survivor of a
                // failover (its replica died) or an old master cut off from
                // replicas that now follow another one: only the sentinels
                // can tell. Writes go to it only while they still name it.
                if !shared.still_master().await {
                    return Err(RedisError::from((
                        ErrorKind::Io,
                        "the master has no replica and the sentinels name another: not writing to it",
                    )));
                }
                shared.warn_alone();
                return command.query_async(&mut *conn).await;
            }
            // The write and its WAIT leave as one pipeline on one connection:
            // a reconnect between them cannot make WAIT vouch for nothing.
            let (reply, acknowledged): (T, u64) = redis::pipe()
                .add_command(command.clone())
                .cmd("WAIT")
                .arg(1)
                .arg(millis)
                .query_async(&mut *conn)
                .await?;
            if acknowledged >= 1 {
                return Ok(reply);
            }
            Err(RedisError::from((
                ErrorKind::Io,
                "no replica acknowledged the write in time",
            )))
        })
        .await
    }

    /// Runs `request` on the current master; a failure a failover explains
    /// starts a lookup in the background.
    async fn on_master<T>(
        &self,
        request: impl AsyncFnOnce(&mut ConnectionManager) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        let Master {
            generation,
            mut connection,
            ..
        } = self.shared.master();
        let result = request(&mut connection).await;
        if let Err(e) = &result {
            if failover_explains(e) {
                tokio::spawn(Shared::follow(self.shared.clone(), generation));
            }
        }
        result
    }
}

/// Errors after which the master may have moved.
fn failover_explains(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || e.kind() == ErrorKind::Server(ServerErrorKind::MasterDown)
}

impl Shared {
    /// Whether the sentinels still name the master this connection writes
    /// to (a lookup; false when none answers).
    async fn still_master(&self) -> bool {
        let current = self.master().address;
        let mut sentinel = self.sentinel.lock().await;
        match lookup(&mut sentinel, &self.settings).await {
            Ok(client) => address_of(&client) == current,
            Err(_) => false,
        }
    }

    fn warn_alone(&self) {
        let Ok(mut last) = self.last_alone_warning.lock() else {
            return;
        };
        if last.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
            *last = Some(Instant::now());
            tracing::warn!(master = %self.master().address, "the Redis master has no replica: writes wait for none and would not survive another failover");
        }
    }

    fn master(&self) -> Master {
        match self.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Asks the sentinels where the master is and, if it moved since
    /// `seen_generation`, switches to it.
    async fn follow(self: Arc<Self>, seen_generation: u64) {
        {
            let Ok(mut last) = self.last_lookup.lock() else {
                return;
            };
            if last.is_some_and(|at| at.elapsed() < LOOKUP_GAP) {
                return;
            }
            *last = Some(Instant::now());
        }
        // One lookup at a time; whoever waits finds its question answered.
        let Ok(mut sentinel) = self.sentinel.try_lock() else {
            return;
        };
        let before = self.master();
        if before.generation != seen_generation {
            return;
        }
        let client = match lookup(&mut sentinel, &self.settings).await {
            Ok(client) => client,
            Err(e) => {
                tracing::debug!(error = %e, "no master from the sentinels yet");
                return;
            }
        };
        let address = address_of(&client);
        if address == before.address {
            return;
        }
        let connection = match ConnectionManager::new_with_config(client, self.config.clone()).await
        {
            Ok(connection) => connection,
            Err(e) => {
                tracing::warn!(master = %address, error = %e, "the sentinels name a new Redis master that does not answer yet");
                return;
            }
        };
        let Ok(mut current) = self.current.write() else {
            return;
        };
        tracing::warn!(from = %before.address, to = %address, "Redis master moved (Sentinel failover); following it");
        *current = Master {
            generation: current.generation + 1,
            address,
            connection,
        };
    }
}

/// The slow check, for a switch no failing command has reported; ends with
/// the last clone of the connection.
async fn watch(shared: Weak<Shared>) {
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let generation = shared.master().generation;
        shared.follow(generation).await;
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.on_master(async move |conn| conn.req_packed_command(cmd).await))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(
            self.on_master(async move |conn| {
                conn.req_packed_commands(pipeline, offset, count).await
            }),
        )
    }

    fn get_db(&self) -> i64 {
        self.shared.settings.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_urls_credentials_are_the_masters_not_the_sentinels() {
        let settings = SentinelSettings::new(
            &[
                "redis://:masterpw@127.0.0.1:26379/2".to_owned(),
                "redis://:masterpw@127.0.0.1:26380/2".to_owned(),
            ],
            "mymaster",
            Some("sentinelpw"),
        )
        .unwrap();
        assert_eq!(settings.db, 2);
        assert_eq!(settings.sentinels.len(), 2);
        for sentinel in &settings.sentinels {
            assert_eq!(sentinel.redis_settings().password(), Some("sentinelpw"));
            assert_eq!(sentinel.redis_settings().db(), 0);
        }
    }

    #[test]
    fn sentinels_that_disagree_on_the_master_credentials_are_refused() {
        let err = SentinelSettings::new(
            &[
                "redis://:a@127.0.0.1:26379/".to_owned(),
                "redis://:b@127.0.0.1:26380/".to_owned(),
            ],
            "mymaster",
            None,
        )
        .err()
        .unwrap();
        assert!(err.contains("same user, password"), "{err}");
        assert!(!err.contains(":a@") && !err.contains(":b@"), "{err}");
        assert!(SentinelSettings::new(&["redis://127.0.0.1:1/".to_owned()], "", None).is_err());
    }

    #[test]
    fn a_demoted_or_vanished_master_prompts_a_lookup_and_a_script_error_does_not() {
        assert!(failover_explains(&RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "READONLY"
        ))));
        assert!(failover_explains(&RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused
        ))));
        assert!(!failover_explains(&RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "ERR script"
        ))));
    }
}
