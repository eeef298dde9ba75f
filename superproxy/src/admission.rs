//! Per-user tunnel limits shared by every superproxy: new tunnels per second
//! (GCRA in Redis) and concurrent tunnels (leases in Redis).
//!
//! A lease is a member of the user's sorted set scored by its expiry on Redis'
//! clock. This superproxy renews its leases every third of `lease_ttl` and
//! removes each one when its tunnel ends; if the superproxy dies, its leases
//! simply expire, so they cannot leak for longer than `lease_ttl`. While Redis
//! is unreachable, limits fall back to this instance's own count.

use proxynet_protocol::redis_target::RedisConnection;
use proxynet_protocol::store::{Keys, QuotaPeriod};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;

use crate::error::{ErrorKind, ProxyError};

/// `KEYS[1]` rate key, `ARGV[1]` tunnels per second. GCRA with one second of
/// burst. Returns 0 when allowed, else milliseconds until the next tunnel fits.
const RATE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local emission = 1000 / tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new_tat = tat + emission
local allow_at = new_tat - 1000
if allow_at > now then return math.ceil(allow_at - now) end
redis.call('SET', KEYS[1], string.format('%d', math.floor(new_tat)), 'PX', 2000 + math.ceil(emission))
return 0
";

/// `KEYS[1]` leases, `ARGV[1]` lease id, `ARGV[2]` max, `ARGV[3]` ttl ms.
/// Drops expired leases, then takes one if fewer than max are held. 1 or 0.
const ACQUIRE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) * 2)
return 1
";

/// `KEYS[1]` leases, `ARGV[1]` ttl ms, `ARGV[2..]` lease ids to extend.
const RENEW_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2)
return 1
";

pub struct Admission {
    redis: RedisConnection,
    keys: Keys,
    superproxy_id: Uuid,
    lease_ttl: Duration,
    /// This instance's leases per user: renewed by [`Self::run_renewals`],
    /// and the fallback count while Redis is away.
    held: Mutex<HashMap<Uuid, HashSet<String>>>,
}

/// A concurrency slot; released when dropped.
pub struct Lease {
    admission: Arc<Admission>,
    user: Uuid,
    id: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Ok(mut held) = self.admission.held.lock() {
            if let Some(set) = held.get_mut(&self.user) {
                set.remove(&self.id);
                if set.is_empty() {
                    held.remove(&self.user);
                }
            }
        }
        let (admission, user, id) = (
            self.admission.clone(),
            self.user,
            std::mem::take(&mut self.id),
        );
        tokio::spawn(async move {
            let mut redis = admission.redis.clone();
            let _: Result<i64, _> = redis::cmd("ZREM")
                .arg(admission.keys.leases(user))
                .arg(id)
                .query_async(&mut redis)
                .await;
        });
    }
}

/// The limits of one user, from their record.
#[derive(Debug, Clone, Copy, Default)]
pub struct UserLimits {
    pub max_concurrent_tunnels: Option<u32>,
    pub max_new_tunnels_per_second: Option<u32>,
    /// Bytes (up + down) per period.
    pub bandwidth: Option<(u64, QuotaPeriod)>,
}

impl Admission {
    pub fn new(
        redis: RedisConnection,
        keys: Keys,
        superproxy_id: Uuid,
        lease_ttl: Duration,
    ) -> Self {
        Self {
            redis,
            keys,
            superproxy_id,
            lease_ttl,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// Admits one new tunnel for `user` or says why not (429 + Retry-After).
    pub async fn admit(
        self: &Arc<Self>,
        user: Uuid,
        limits: UserLimits,
    ) -> Result<Option<Lease>, ProxyError> {
        if let Some(rate) = limits.max_new_tunnels_per_second {
            let mut redis = self.redis.clone();
            let wait_ms: Result<i64, _> = redis::Script::new(RATE_SCRIPT)
                .key(self.keys.tunnel_rate(user))
                .arg(rate)
                .invoke_async(&mut redis)
                .await;
            // Redis away: the rate limit is not enforced (the concurrency one still is).
            if let Ok(ms) = wait_ms {
                if ms > 0 {
                    return Err(limited(
                        format!("new-tunnel rate limit ({rate}/s) reached"),
                        ms as u64,
                    ));
                }
            }
        }
        let Some(max) = limits.max_concurrent_tunnels else {
            return Ok(None);
        };
        let id = format!("{}:{}", self.superproxy_id, Uuid::new_v4().simple());
        let mut redis = self.redis.clone();
        let acquired: Result<i64, _> = redis::Script::new(ACQUIRE_SCRIPT)
            .key(self.keys.leases(user))
            .arg(&id)
            .arg(max)
            .arg(self.lease_ttl.as_millis() as u64)
            .invoke_async(&mut redis)
            .await;
        let granted = match acquired {
            Ok(n) => n == 1,
            // Redis away: hold the line with what this instance alone holds.
            Err(_) => self.held_by_us(user) < max as usize,
        };
        if !granted {
            return Err(limited(
                format!("concurrent tunnel limit ({max}) reached"),
                1000,
            ));
        }
        if let Ok(mut held) = self.held.lock() {
            held.entry(user).or_default().insert(id.clone());
        }
        Ok(Some(Lease {
            admission: self.clone(),
            user,
            id,
        }))
    }

    fn held_by_us(&self, user: Uuid) -> usize {
        self.held
            .lock()
            .map(|h| h.get(&user).map_or(0, HashSet::len))
            .unwrap_or(0)
    }

    /// Extends this instance's leases every third of their lifetime.
    pub async fn run_renewals(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.lease_ttl / 3);
        loop {
            tick.tick().await;
            let snapshot: Vec<(Uuid, Vec<String>)> = self
                .held
                .lock()
                .map(|h| {
                    h.iter()
                        .map(|(u, ids)| (*u, ids.iter().cloned().collect()))
                        .collect()
                })
                .unwrap_or_default();
            if snapshot.is_empty() {
                continue;
            }
            let mut redis = self.redis.clone();
            let script = redis::Script::new(RENEW_SCRIPT);
            for (user, ids) in snapshot {
                let mut invocation = script.key(self.keys.leases(user));
                invocation.arg(self.lease_ttl.as_millis() as u64);
                for id in &ids {
                    invocation.arg(id);
                }
                let renewed: Result<i64, _> = invocation.invoke_async(&mut redis).await;
                if let Err(e) = renewed {
                    tracing::debug!(error = %e, "lease renewal failed; retrying next round");
                }
            }
        }
    }
}

fn limited(detail: String, retry_after_ms: u64) -> ProxyError {
    let mut e = ProxyError::new(ErrorKind::TooManyRequests, detail);
    e.retry_after = Some(u32::try_from(retry_after_ms.div_ceil(1000).max(1)).unwrap_or(u32::MAX));
    e
}

impl Admission {
    /// Bytes `user` has used this period according to the shared counter
    /// (`None` when Redis cannot say).
    pub async fn quota_used(&self, user: Uuid, period: QuotaPeriod) -> Option<u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let (window, _, _) = period.window(now);
        let mut redis = self.redis.clone();
        let used: Result<Option<u64>, _> = redis::cmd("GET")
            .arg(self.keys.quota_used(user, &window))
            .query_async(&mut redis)
            .await;
        used.ok().map(|u| u.unwrap_or(0))
    }
}
