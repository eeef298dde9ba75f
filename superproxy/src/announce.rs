//! Tells the control plane (through Redis) where agents can dial this instance.
//!
//! Agents learn the list from their heartbeat replies, so adding a superproxy
//! needs no change on any exit host.

use proxynet_common::egress::host_interface_addresses;
use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::{Keys, SuperproxyRecord, TOUCH_LIVE_SCRIPT};
use redis::AsyncCommands;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Clone)]
pub(crate) struct Announcer {
    pub redis: RedisConnection,
    pub keys: Keys,
    pub record: SuperproxyRecord,
    pub interval: Duration,
}

impl Announcer {
    pub(crate) async fn run(self, stop: Stop) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            if let Err(e) = self.announce_once().await {
                tracing::warn!(error = %e, "announcing the link address failed; retrying");
            }
        }
    }

    pub(crate) async fn announce_once(&self) -> Result<(), redis::RedisError> {
        let mut redis = self.redis.clone();
        let ttl_ms = u64::try_from(self.interval.as_millis())
            .unwrap_or(u64::MAX)
            .saturating_mul(3);
        let json = serde_json::to_string(&self.record).map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Client, "encoding", e.to_string()))
        })?;
        let _: () = redis
            .pset_ex(self.keys.superproxy(self.record.id), json, ttl_ms)
            .await?;
        let _: i64 = redis::Script::new(TOUCH_LIVE_SCRIPT)
            .key(self.keys.superproxies_live())
            .arg(self.record.id.to_string())
            .arg(ttl_ms)
            .invoke_async(&mut redis)
            .await?;
        Ok(())
    }

    /// Withdraws the announcement so agents stop dialling (best effort).
    pub(crate) async fn withdraw(&self) {
        let mut redis = self.redis.clone();
        let _: Result<(), _> = redis
            .zrem(self.keys.superproxies_live(), self.record.id.to_string())
            .await;
        let _: Result<(), _> = redis.del(self.keys.superproxy(self.record.id)).await;
    }
}

/// Every address the listeners in `bound` answer on, for agents to protect: a
/// specific bind as is, an unspecified one (`0.0.0.0`, `[::]`) as every
/// address of this host (loopback included) and the advertised link address,
/// and the address the reflector is announced at (`reflector`). The
/// reflector is among them so that no exit reaches it through a tunnel:
/// what it signs must be what the asking exit's own line looks like.
pub(crate) fn service_addresses(
    bound: &crate::Addresses,
    advertised: SocketAddr,
    reflector: Option<SocketAddr>,
) -> Vec<SocketAddr> {
    let host = host_interface_addresses();
    let mut out = vec![advertised];
    out.extend(reflector);
    for addr in [bound.proxy, bound.socks, bound.admin, bound.link]
        .into_iter()
        .chain(bound.tls)
        .chain(bound.reflector)
    {
        if addr.ip().is_unspecified() {
            out.extend(host.iter().map(|ip| SocketAddr::new(*ip, addr.port())));
            out.push(SocketAddr::new(advertised.ip(), addr.port()));
        } else {
            out.push(addr);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}
