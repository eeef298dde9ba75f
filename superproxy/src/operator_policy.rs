//! The operator's traffic policy (denied domains and ports, aggregate
//! per-domain limits), as the control-api projected it into one Redis key.
//! Kept here as a copy, re-read on the `policy` change event (within a
//! second of a `PUT /v1/policy`) and every `interval` in case an event is
//! lost. A refresh cuts the open tunnels the new rules refuse. A key that is
//! missing (Redis restarted empty) keeps the last copy until the control-api
//! has projected again.

use proxynet_common::tasks::Stop;
use proxynet_store::policy::{OperatorPolicy, PolicyTarget};
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::Keys;
use redis::AsyncCommands;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::open_tunnels::OpenTunnels;

pub(crate) struct OperatorRules {
    redis: RedisConnection,
    keys: Keys,
    current: RwLock<Arc<OperatorPolicy>>,
    open_tunnels: Arc<OpenTunnels>,
}

impl OperatorRules {
    pub(crate) fn new(redis: RedisConnection, keys: Keys, open_tunnels: Arc<OpenTunnels>) -> Self {
        Self {
            redis,
            keys,
            current: RwLock::new(Arc::new(OperatorPolicy::default())),
            open_tunnels,
        }
    }

    /// The rules in force now.
    pub(crate) fn current(&self) -> Arc<OperatorPolicy> {
        self.current
            .read()
            .map(|p| p.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    /// Re-reads the rules; on failure (or a missing key) the last ones stay.
    pub(crate) async fn refresh(&self) {
        let mut redis = self.redis.clone();
        let json: Result<Option<String>, _> = redis.get(self.keys.operator_policy()).await;
        let policy = match json {
            Ok(Some(json)) => match serde_json::from_str::<OperatorPolicy>(&json) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable operator policy in Redis; keeping the last one");
                    return;
                }
            },
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "operator policy refresh failed; keeping the last one");
                return;
            }
        };
        if *self.current() == policy {
            return;
        }
        let policy = Arc::new(policy);
        if let Ok(mut current) = self.current.write() {
            *current = policy.clone();
        }
        let cut = self.open_tunnels.cut_where_target(|host, port| {
            policy
                .permits(&PolicyTarget::from_normalized(host), port)
                .is_err()
        });
        tracing::info!(tunnels_cut = cut, "operator policy changed");
    }

    pub(crate) async fn run(self: Arc<Self>, interval: Duration, stop: Stop) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            self.refresh().await;
        }
    }
}
