//! Listens for change events from the control plane so caches drop stale
//! entries at once instead of when their TTL runs out. Losing events only
//! delays a change to the cache TTL; the subscription reconnects on its own
//! (on a cluster, to the next seed node: pub/sub is cluster-wide).

use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

use proxynet_protocol::redis_target::RedisTarget;

use crate::pool::Pool;
use crate::revocation::Revoker;

pub async fn run(
    redis: RedisTarget,
    channel: String,
    revoker: Arc<Revoker>,
    pool: Arc<Pool>,
    allowlist: Arc<crate::allowlist::Allowlist>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match redis.subscribe(&channel).await {
            Ok(mut pubsub) => {
                backoff = Duration::from_millis(100);
                let mut messages = pubsub.on_message();
                while let Some(msg) = messages.next().await {
                    let Ok(payload) = msg.get_payload::<String>() else {
                        continue;
                    };
                    if let Some(username) = payload.strip_prefix("user:") {
                        revoker.user_changed(username).await;
                    } else if payload.starts_with("exit:") {
                        pool.refresh().await;
                    } else if payload == "allowlist" {
                        allowlist.refresh().await;
                    }
                }
                tracing::warn!("change-event subscription lost; reconnecting");
            }
            Err(e) => tracing::debug!(error = %e, "change-event subscription failed; retrying"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
