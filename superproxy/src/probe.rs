//! The active half of health checking: probe every linked exit on an
//! interval, then publish this instance's observations for the fleet.
//!
//! Each superproxy writes its view of each exit into the exit's Redis hash
//! (one field per superproxy, expiring after three probe intervals), so the
//! control-api can show how the whole fleet sees an exit and one instance's
//! network blip is visible as exactly that.

use futures_util::future::join_all;
use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::Keys;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

use crate::health::HealthBook;
use crate::link::dial;
use crate::link::registry::LinkRegistry;

pub(crate) struct Prober {
    pub stats: Arc<crate::metrics::Stats>,
    pub usage: Arc<crate::usage::UsageRecorder>,
    pub superproxy_id: Uuid,
    pub registry: Arc<LinkRegistry>,
    pub health: Arc<HealthBook>,
    pub redis: RedisConnection,
    pub keys: Keys,
}

impl Prober {
    pub(crate) async fn run(self, stop: Stop) {
        let config = self.health.config;
        let mut tick = tokio::time::interval(config.probe_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            self.round().await;
        }
    }

    async fn round(&self) {
        let links = self.registry.snapshot();
        let timeout = self.health.config.probe_timeout;
        let results = join_all(
            links
                .values()
                .map(|link| async move { (link.exit_id, dial::probe(link, timeout).await) }),
        )
        .await;
        for (exit, rtt) in &results {
            self.health.record_probe(*exit, *rtt);
            crate::metrics::probe(*rtt);
        }
        let linked: Vec<Uuid> = links.keys().copied().collect();
        self.health.retain(&linked);
        self.usage.retain_exits(&linked);
        self.health.update_panic(&linked);
        let now = Instant::now();
        let views: Vec<_> = linked
            .iter()
            .map(|id| self.health.exit(*id).view(now))
            .collect();
        crate::metrics::health(
            linked.len(),
            views.iter().filter(|v| v.available).count(),
            views.iter().filter(|v| v.ejected).count(),
            self.health.in_panic(),
        );
        if let Err(e) = self.publish(&linked).await {
            crate::metrics::store_error("redis", "health_publish");
            tracing::debug!(error = %e, "publishing health observations failed");
        }
    }

    async fn publish(&self, linked: &[Uuid]) -> Result<(), redis::RedisError> {
        let now = Instant::now();
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let ttl_ms = (self.health.config.probe_interval * 3).as_millis() as u64;
        // This instance's totals, for the fleet's tunnels/s, errors and
        // bytes/s, then one group per exit (each health hash is in its own
        // slot): one pipeline on a single Redis.
        let stats = serde_json::to_string(&self.stats.snapshot()).unwrap_or_default();
        let mut groups = Vec::with_capacity(linked.len() + 1);
        groups.push(vec![redis::Cmd::pset_ex(
            self.keys.stats(self.superproxy_id),
            stats,
            ttl_ms.max(10_000),
        )]);
        for id in linked {
            let mut view =
                serde_json::to_value(self.health.exit(*id).view(now)).unwrap_or_default();
            let (up, down) = self.usage.exit_bytes(*id);
            view["bytes_up"] = up.into();
            view["bytes_down"] = down.into();
            view["at_ms"] = at_ms.into();
            let key = self.keys.health(*id);
            groups.push(vec![
                redis::Cmd::hset(&key, self.superproxy_id.to_string(), view.to_string()),
                redis::Cmd::pexpire(&key, ttl_ms as i64),
            ]);
        }
        self.redis.exec_groups(groups).await
    }
}
