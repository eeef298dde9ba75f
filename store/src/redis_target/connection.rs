//! [`RedisConnection`]: the one connection type every binary talks to the
//! shared state through, whatever the target (one server, a cluster, a
//! master under Sentinel), with the batched and slot-aware operations that
//! differ between them.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use super::sentinel::SentinelConnection;

/// One Redis server (reconnecting) or a cluster (routing by slot,
/// following MOVED/ASK, reconnecting per node). Cheap to clone: clones share
/// the underlying connections.
#[derive(Clone)]
pub enum RedisConnection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConnection),
}

/// Batches of independent commands: on one server they go out as a few long
/// pipelines (one round trip per [`COMMANDS_PER_PIPELINE`]); on a cluster,
/// where keys of one batch live on different nodes, each group is its own
/// pipeline with [`GROUPS_IN_FLIGHT`] of them outstanding.
const COMMANDS_PER_PIPELINE: usize = 1_000;
const GROUPS_IN_FLIGHT: usize = 32;

impl RedisConnection {
    /// Runs single-key commands that do not depend on each other and
    /// returns their replies in order.
    pub async fn query_batch<T: redis::FromRedisValue + Send>(
        &self,
        commands: Vec<Cmd>,
    ) -> redis::RedisResult<Vec<T>> {
        use futures_util::{StreamExt, TryStreamExt};
        match self {
            Self::Single(_) | Self::Sentinel(_) => {
                let mut replies = Vec::with_capacity(commands.len());
                let mut commands = commands.into_iter().peekable();
                while commands.peek().is_some() {
                    let mut pipe = redis::pipe();
                    for command in commands.by_ref().take(COMMANDS_PER_PIPELINE) {
                        pipe.add_command(command);
                    }
                    let mut conn = self.clone();
                    replies.extend(pipe.query_async::<Vec<T>>(&mut conn).await?);
                }
                Ok(replies)
            }
            Self::Cluster(conn) => {
                let conn = conn.clone();
                futures_util::stream::iter(commands)
                    .map(move |command| {
                        let mut conn = conn.clone();
                        async move { command.query_async::<T>(&mut conn).await }
                    })
                    .buffered(GROUPS_IN_FLIGHT)
                    .try_collect()
                    .await
            }
        }
    }

    /// Runs one write that must survive a failover. Under Sentinel it counts
    /// as done only once a replica acknowledges it (`WAIT`, up to
    /// `timeout`): replication is asynchronous, and a master that dies
    /// before copying a write takes it along. Elsewhere it is a plain query
    /// (a cluster's replicas are the cluster's business; one Redis has none).
    /// The caller must be able to repeat the write: a timeout here does not
    /// mean it was not made.
    pub async fn query_replicated<T: redis::FromRedisValue>(
        &self,
        command: &Cmd,
        timeout: Duration,
    ) -> redis::RedisResult<T> {
        match self {
            Self::Sentinel(conn) => conn.query_replicated(command, timeout).await,
            _ => command.query_async(&mut self.clone()).await,
        }
    }

    /// Up to `limit` keys matching `pattern`, all of which share the hash
    /// slot of `beside` (the pattern fixes their hash tag). SCAN walks one
    /// node's keyspace, so on a cluster it is sent to the node owning that
    /// slot rather than to a random one.
    pub async fn scan_slot_of(
        &self,
        beside: &str,
        pattern: &str,
        limit: usize,
    ) -> redis::RedisResult<Vec<String>> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let mut keys = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1_000);
            let (next, batch): (u64, Vec<String>) = match self {
                Self::Single(_) | Self::Sentinel(_) => scan.query_async(&mut self.clone()).await?,
                Self::Cluster(conn) => {
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::with_key(beside, SlotAddr::Master),
                    ));
                    redis::from_redis_value(conn.clone().route_command(scan, route).await?)?
                }
            };
            keys.extend(batch);
            cursor = next;
            if cursor == 0 || keys.len() >= limit {
                keys.truncate(limit);
                return Ok(keys);
            }
        }
    }

    /// Runs groups of commands whose replies are not needed. Each group stays
    /// in order and must touch one hash slot (on a cluster it is one
    /// pipeline to one node); groups are independent of each other.
    pub async fn exec_groups(&self, groups: Vec<Vec<Cmd>>) -> redis::RedisResult<()> {
        use futures_util::{StreamExt, TryStreamExt};
        let pipeline = |commands: &mut dyn Iterator<Item = Cmd>| {
            let mut pipe = redis::pipe();
            for command in commands {
                pipe.add_command(command).ignore();
            }
            pipe
        };
        match self {
            Self::Single(_) | Self::Sentinel(_) => {
                let mut commands = groups.into_iter().flatten().peekable();
                while commands.peek().is_some() {
                    let mut conn = self.clone();
                    pipeline(&mut commands.by_ref().take(COMMANDS_PER_PIPELINE))
                        .exec_async(&mut conn)
                        .await?;
                }
                Ok(())
            }
            Self::Cluster(conn) => {
                let conn = conn.clone();
                futures_util::stream::iter(groups)
                    .map(move |group| {
                        let mut conn = conn.clone();
                        let pipe = pipeline(&mut group.into_iter());
                        async move { pipe.exec_async(&mut conn).await }
                    })
                    .buffer_unordered(GROUPS_IN_FLIGHT)
                    .try_collect::<()>()
                    .await
            }
        }
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
            Self::Sentinel(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Sentinel(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
            Self::Sentinel(conn) => conn.get_db(),
        }
    }
}
