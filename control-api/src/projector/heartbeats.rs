//! The agents' side of the projection: heartbeats (liveness with a TTL
//! on the Redis clock, drain announcements), the heartbeat reply (the
//! superproxies to dial, what every exit must deny) and the control plane's
//! own presence, which tells superproxies a control-api is answering.

use super::*;
use proxynet_common::tasks::Stop;
use std::net::SocketAddr;

/// How long an exit's admin addresses stay protected after they were last
/// written: every control-api rewrites a beating exit's entry every
/// [`crate::liveness::ADMIN_ADDRS_REFRESH`], so an older one belongs to an
/// exit that stopped beating hours ago, and goes.
const AGENT_ADMIN_KEPT: Duration =
    Duration::from_secs(crate::liveness::ADMIN_ADDRS_REFRESH.as_secs() * 3);

/// Stale entries removed per read of the agents' admin addresses.
const AGENT_ADMIN_PRUNED: usize = 1_000;

/// `KEYS[1]` the hash, `ARGV[1]` the field, `ARGV[2]` its value as read:
/// removes the field only if it still holds that value.
const HDEL_IF_UNCHANGED_SCRIPT: &str = r"
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
";

/// One exit's entry under [`Keys::agent_admin_addrs`]: what its agent's
/// admin listener came to at its last report.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentAdmin {
    /// On addresses the control plane verified the exit holds: every exit
    /// is told to deny these.
    #[serde(default)]
    pub protected: Vec<SocketAddr>,
    /// Claimed on addresses it has not verified: ignored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unverified: Vec<SocketAddr>,
    /// When it was written (Unix ms, the writing control-api's clock).
    pub at_ms: i64,
}

impl AgentAdmin {
    /// Whether the entry is younger than [`AGENT_ADMIN_KEPT`] at `now_ms`.
    fn is_current(&self, now_ms: i64) -> bool {
        let kept = i64::try_from(AGENT_ADMIN_KEPT.as_millis()).unwrap_or(i64::MAX);
        now_ms.saturating_sub(self.at_ms) <= kept
    }
}

impl Projector {
    /// One agent heartbeat: the exit is alive for `ttl` from now (Redis
    /// clock) and its drain announcement is recorded.
    pub async fn heartbeat(
        &self,
        id: Uuid,
        draining: bool,
        ttl: Duration,
    ) -> Result<(), ProjectionError> {
        let mut redis = self.redis.clone();
        let _: i64 = redis::Script::new(HEARTBEAT_SCRIPT)
            .key(self.keys.exits_live())
            .key(self.keys.exits_draining())
            .key(self.keys.exit_changes())
            .arg(id.to_string())
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX))
            .arg(if draining { "1" } else { "0" })
            .arg(EXIT_CHANGES_KEPT)
            .invoke_async(&mut redis)
            .await?;
        Ok(())
    }

    /// Live exit ids according to Redis.
    pub async fn live_exits(&self) -> Result<HashSet<Uuid>, ProjectionError> {
        let mut redis = self.redis.clone();
        let ids: Vec<String> = redis::Script::new(LIVE_MEMBERS_SCRIPT)
            .key(self.keys.exits_live())
            .invoke_async(&mut redis)
            .await?;
        Ok(ids.iter().filter_map(|s| s.parse().ok()).collect())
    }

    /// The heartbeat reply `build` makes from the live superproxies and the
    /// agents' admin addresses, as JSON, reused while at most
    /// [`SUPERPROXY_LIST_REUSE`](super::reply_cache::SUPERPROXY_LIST_REUSE) old; `internal` picks the variant for agents
    /// whose policy reaches internal ranges.
    pub async fn heartbeat_reply<T: serde::Serialize>(
        &self,
        internal: bool,
        build: impl FnOnce(DenyInputs) -> T,
    ) -> Result<bytes::Bytes, ProjectionError> {
        if let Some(reply) = self.cache.reply(internal) {
            return Ok(reply);
        }
        let inputs = DenyInputs {
            superproxies: self.live_superproxies().await?,
            agent_admin: self.agent_admin_addrs().await?,
        };
        let reply = bytes::Bytes::from(serde_json::to_vec(&build(inputs))?);
        self.cache.keep_reply(internal, reply.clone());
        Ok(reply)
    }

    /// Records what exit `exit`'s admin listener came to (see
    /// [`Keys::agent_admin_addrs`]): the addresses every exit denies and the
    /// unverified claims ignored, replacing what it reported before (one
    /// exit can only ever hold its own few entries) and stamped with the
    /// time, so the entry of an exit that stopped beating is pruned.
    pub async fn record_agent_admin(
        &self,
        exit: Uuid,
        protected: &[SocketAddr],
        unverified: &[SocketAddr],
    ) -> Result<(), ProjectionError> {
        let mut redis = self.redis.clone();
        let key = self.keys.agent_admin_addrs();
        if protected.is_empty() && unverified.is_empty() {
            let _: i64 = redis.hdel(&key, exit.to_string()).await?;
        } else {
            let entry = AgentAdmin {
                protected: protected.to_vec(),
                unverified: unverified.to_vec(),
                at_ms: chrono::Utc::now().timestamp_millis(),
            };
            let json = serde_json::to_string(&entry)?;
            let _: i64 = redis.hset(&key, exit.to_string(), json).await?;
        }
        // This instance's next reply reads them afresh (replies are rebuilt
        // at most twice a second); other instances within their reuse.
        self.cache.forget_admin_addrs();
        Ok(())
    }

    /// What exit `exit`'s agent last reported of its admin listener, as
    /// recorded (`None`: nothing, or nothing since long ago).
    pub async fn agent_admin_of(&self, exit: Uuid) -> Result<Option<AgentAdmin>, ProjectionError> {
        let mut redis = self.redis.clone();
        let json: Option<String> = redis
            .hget(self.keys.agent_admin_addrs(), exit.to_string())
            .await?;
        Ok(json
            .and_then(|j| serde_json::from_str::<AgentAdmin>(&j).ok())
            .filter(|entry| entry.is_current(chrono::Utc::now().timestamp_millis())))
    }

    /// Every agent's protected admin addresses, deduplicated (most agents
    /// listen on the same loopback port), read at most every
    /// [`AGENT_ADMIN_REUSE`](super::reply_cache::AGENT_ADMIN_REUSE). Entries written more than [`AGENT_ADMIN_KEPT`]
    /// ago (the exit stopped beating: it is gone) and entries this release
    /// cannot read (a release before verification wrote them, accepting any
    /// declared egress) are left out and removed.
    async fn agent_admin_addrs(&self) -> Result<Vec<SocketAddr>, ProjectionError> {
        if let Some(addrs) = self.cache.admin_addrs() {
            return Ok(addrs);
        }
        let mut redis = self.redis.clone();
        let all: HashMap<String, String> = redis.hgetall(self.keys.agent_admin_addrs()).await?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        let mut addrs: Vec<SocketAddr> = Vec::new();
        let mut stale: Vec<(String, String)> = Vec::new();
        for (exit, json) in all {
            match serde_json::from_str::<AgentAdmin>(&json) {
                Ok(entry) if entry.is_current(now_ms) => addrs.extend(entry.protected),
                _ if stale.len() < AGENT_ADMIN_PRUNED => stale.push((exit, json)),
                _ => {}
            }
        }
        self.prune_agent_admin(stale);
        addrs.sort_unstable();
        addrs.dedup();
        self.cache.keep_admin_addrs(addrs.clone());
        Ok(addrs)
    }

    /// Removes `stale` entries (exit, value as read), each only if it still
    /// holds the value read: an exit that beat meanwhile keeps its new one.
    /// Best effort, in the background and one prune at a time (heartbeat
    /// replies never wait on it, and many replies built at once during an
    /// upgrade start one prune, not one each), in one pipeline of at most
    /// [`AGENT_ADMIN_PRUNED`]: the next read takes the rest.
    fn prune_agent_admin(&self, stale: Vec<(String, String)>) {
        if stale.is_empty() {
            return;
        }
        let Some(under_way) = self.cache.start_prune() else {
            return;
        };
        let mut redis = self.redis.clone();
        let key = self.keys.agent_admin_addrs();
        tokio::spawn(async move {
            let _under_way = under_way;
            let script = redis::Script::new(HDEL_IF_UNCHANGED_SCRIPT);
            let mut pipe = redis::pipe();
            for (exit, json) in &stale {
                pipe.invoke_script(script.key(&key).arg(exit).arg(json));
            }
            let result: Result<Vec<i64>, _> = pipe.query_async(&mut redis).await;
            match result {
                Ok(counts) => {
                    let removed: i64 = counts.iter().sum();
                    if removed > 0 {
                        tracing::info!(
                            removed,
                            "removed the admin addresses of exits gone quiet or recorded before verification"
                        );
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot prune agent admin addresses; retried at the next read")
                }
            }
        });
    }

    pub async fn live_superproxies(&self) -> Result<Vec<SuperproxyRecord>, ProjectionError> {
        let mut redis = self.redis.clone();
        let ids: Vec<String> = redis::Script::new(LIVE_MEMBERS_SCRIPT)
            .key(self.keys.superproxies_live())
            .invoke_async(&mut redis)
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = ids
            .iter()
            .filter_map(|s| s.parse::<Uuid>().ok())
            .map(|id| self.keys.superproxy(id))
            .collect();
        let values: Vec<Option<String>> = redis::cmd("MGET")
            .arg(&keys)
            .query_async(&mut redis)
            .await?;
        Ok(values
            .into_iter()
            .flatten()
            .filter_map(|json| serde_json::from_str(&json).ok())
            .collect())
    }

    /// Exits whose agent announced it is draining.
    pub async fn agent_draining(&self) -> Result<HashSet<Uuid>, ProjectionError> {
        let mut redis = self.redis.clone();
        let ids: Vec<String> = redis.smembers(self.keys.exits_draining()).await?;
        Ok(ids.iter().filter_map(|s| s.parse().ok()).collect())
    }

    /// Says the control plane is taking heartbeats: refreshes
    /// [`Keys::control_plane_alive`] every half `interval`, expiring after
    /// one `interval`, so superproxies notice within a heartbeat interval
    /// that no control-api answers (long before exits' liveness lapses).
    pub async fn run_presence(self, instance: String, interval: Duration, stop: Stop) {
        let every = (interval / 2).max(Duration::from_millis(50));
        let ttl_ms = u64::try_from(interval.as_millis())
            .unwrap_or(u64::MAX)
            .max(100);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            let mut redis = self.redis.clone();
            let written: Result<(), _> = redis::cmd("SET")
                .arg(self.keys.control_plane_alive())
                .arg(&instance)
                .arg("PX")
                .arg(ttl_ms)
                .query_async(&mut redis)
                .await;
            if let Err(e) = written {
                tracing::debug!(error = %e, "cannot refresh the control plane's presence");
            }
        }
    }
}
