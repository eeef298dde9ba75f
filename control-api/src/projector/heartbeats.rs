//! The agents' side of the projection: heartbeats (liveness with a TTL
//! on the Redis clock, drain announcements), the heartbeat reply (the
//! superproxies to dial, what every exit must deny) and the control plane's
//! own presence, which tells superproxies a control-api is answering.

use super::*;
use proxynet_common::tasks::Stop;

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
    /// [`SUPERPROXY_LIST_REUSE`] old; `internal` picks the variant for agents
    /// whose policy reaches internal ranges.
    pub async fn heartbeat_reply<T: serde::Serialize>(
        &self,
        internal: bool,
        build: impl FnOnce(DenyInputs) -> T,
    ) -> Result<bytes::Bytes, ProjectionError> {
        let slot = usize::from(internal);
        if let Ok(cached) = self.replies.lock() {
            if let Some((at, reply)) = cached[slot].as_ref() {
                if at.elapsed() < SUPERPROXY_LIST_REUSE {
                    return Ok(reply.clone());
                }
            }
        }
        let inputs = DenyInputs {
            superproxies: self.live_superproxies().await?,
            agent_admin: self.agent_admin_addrs().await?,
        };
        let reply = bytes::Bytes::from(serde_json::to_vec(&build(inputs))?);
        if let Ok(mut cached) = self.replies.lock() {
            cached[slot] = Some((std::time::Instant::now(), reply.clone()));
        }
        Ok(reply)
    }

    /// Records exit `exit`'s admin listener addresses (see
    /// [`Keys::agent_admin_addrs`]), replacing what it reported before: one
    /// exit can only ever hold its own few entries.
    pub async fn record_agent_admin(
        &self,
        exit: Uuid,
        addrs: &[std::net::SocketAddr],
    ) -> Result<(), ProjectionError> {
        let mut redis = self.redis.clone();
        let key = self.keys.agent_admin_addrs();
        if addrs.is_empty() {
            let _: i64 = redis.hdel(&key, exit.to_string()).await?;
        } else {
            let json = serde_json::to_string(addrs)?;
            let _: i64 = redis.hset(&key, exit.to_string(), json).await?;
        }
        // This instance's next reply reads them afresh (replies are rebuilt
        // at most twice a second); other instances within their reuse.
        if let Ok(mut cached) = self.agent_admin.lock() {
            *cached = None;
        }
        Ok(())
    }

    /// Every agent's admin addresses, deduplicated (most agents listen on
    /// the same loopback port), read at most every [`AGENT_ADMIN_REUSE`].
    async fn agent_admin_addrs(&self) -> Result<Vec<std::net::SocketAddr>, ProjectionError> {
        if let Ok(cached) = self.agent_admin.lock() {
            if let Some((at, addrs)) = cached.as_ref() {
                if at.elapsed() < AGENT_ADMIN_REUSE {
                    return Ok(addrs.clone());
                }
            }
        }
        let mut redis = self.redis.clone();
        let all: HashMap<String, String> = redis.hgetall(self.keys.agent_admin_addrs()).await?;
        let mut addrs: Vec<std::net::SocketAddr> = all
            .values()
            .filter_map(|json| serde_json::from_str::<Vec<std::net::SocketAddr>>(json).ok())
            .flatten()
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        if let Ok(mut cached) = self.agent_admin.lock() {
            *cached = Some((std::time::Instant::now(), addrs.clone()));
        }
        Ok(addrs)
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
