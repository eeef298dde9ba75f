//! Per-user and per-account tunnel limits shared by every superproxy: new
//! tunnels per second (GCRA in Redis) and concurrent tunnels (leases in
//! Redis), the user's own and the account's totals (its entitlements). A
//! user without a concurrency limit of its own is held to a default cap
//! counted on this instance alone (`default_user_max_tunnels`), which costs
//! no Redis round trip.
//!
//! A lease is a member of the user's sorted set scored by its expiry on Redis'
//! clock. This superproxy renews its leases every third of `lease_ttl` and
//! removes each one when its tunnel ends; if the superproxy dies, its leases
//! simply expire, so they cannot leak for longer than `lease_ttl`. While Redis
//! is unreachable, limits fall back to this instance's own count.

use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::{Keys, QuotaPeriod};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;

use crate::error::{ErrorKind, ProxyError};
use crate::request::UserLimits;
use crate::usage::QuotaOwner;

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
    /// Tunnels a user without a concurrency limit of its own may hold here.
    default_user_max: usize,
    /// This instance's leases per lease set (a user's or an account's):
    /// renewed by [`Self::run_renewals`], and the fallback count while Redis
    /// is away.
    held: Mutex<HashMap<String, HashSet<String>>>,
    /// Tunnels held here per user without a limit of its own.
    local: Mutex<HashMap<Uuid, usize>>,
}

/// A concurrency slot in one lease set; released when dropped.
pub struct Lease {
    admission: Arc<Admission>,
    set: String,
    id: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Ok(mut held) = self.admission.held.lock() {
            if let Some(ids) = held.get_mut(&self.set) {
                ids.remove(&self.id);
                if ids.is_empty() {
                    held.remove(&self.set);
                }
            }
        }
        let (admission, set, id) = (
            self.admission.clone(),
            std::mem::take(&mut self.set),
            std::mem::take(&mut self.id),
        );
        tokio::spawn(async move {
            let mut redis = admission.redis.clone();
            let _: Result<i64, _> = redis::cmd("ZREM")
                .arg(set)
                .arg(id)
                .query_async(&mut redis)
                .await;
        });
    }
}

/// A slot in this instance's count of a user without a limit of its own.
pub struct LocalSlot {
    admission: Arc<Admission>,
    user: Uuid,
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        if let Ok(mut local) = self.admission.local.lock() {
            if let Some(n) = local.get_mut(&self.user) {
                *n -= 1;
                if *n == 0 {
                    local.remove(&self.user);
                }
            }
        }
    }
}

/// Everything a tunnel holds against concurrency limits: the user's lease
/// (or its slot in the local default count) and the account's lease.
#[derive(Default)]
pub struct Leases {
    _user: Option<Lease>,
    _local: Option<LocalSlot>,
    _account: Option<Lease>,
    /// Per-domain leases (the target policy's), held alongside.
    _domain: Vec<Lease>,
}

impl Leases {
    /// These leases and the target policy's, held as one.
    pub fn with_domain(mut self, domain: Vec<Lease>) -> Self {
        self._domain = domain;
        self
    }
}

impl Admission {
    pub fn new(
        redis: RedisConnection,
        keys: Keys,
        superproxy_id: Uuid,
        lease_ttl: Duration,
        default_user_max: usize,
    ) -> Self {
        Self {
            redis,
            keys,
            superproxy_id,
            lease_ttl,
            default_user_max: default_user_max.max(1),
            held: Mutex::new(HashMap::new()),
            local: Mutex::new(HashMap::new()),
        }
    }

    /// One GCRA check of `key` at `rate` per second; Redis away: allowed
    /// (the concurrency limits still hold).
    async fn rate(&self, key: String, rate: u32, whose: &str) -> Result<(), ProxyError> {
        let mut redis = self.redis.clone();
        let wait_ms: Result<i64, _> = redis::Script::new(RATE_SCRIPT)
            .key(key)
            .arg(rate)
            .invoke_async(&mut redis)
            .await;
        match wait_ms {
            Ok(ms) if ms > 0 => Err(limited(
                format!("{whose} new-tunnel rate limit ({rate}/s) reached"),
                ms as u64,
            )),
            _ => Ok(()),
        }
    }

    /// Takes one of `max` leases in the set `set`, or says why not.
    async fn lease(
        self: &Arc<Self>,
        set: String,
        max: u32,
        whose: &str,
    ) -> Result<Lease, ProxyError> {
        let id = format!("{}:{}", self.superproxy_id, Uuid::new_v4().simple());
        let mut redis = self.redis.clone();
        let acquired: Result<i64, _> = redis::Script::new(ACQUIRE_SCRIPT)
            .key(&set)
            .arg(&id)
            .arg(max)
            .arg(self.lease_ttl.as_millis() as u64)
            .invoke_async(&mut redis)
            .await;
        let granted = match acquired {
            Ok(n) => n == 1,
            // Redis away: hold the line with what this instance alone holds.
            Err(_) => self.held_by_us(&set) < max as usize,
        };
        if !granted {
            return Err(limited(
                format!("{whose} concurrent tunnel limit ({max}) reached"),
                1000,
            ));
        }
        if let Ok(mut held) = self.held.lock() {
            held.entry(set.clone()).or_default().insert(id.clone());
        }
        Ok(Lease {
            admission: self.clone(),
            set,
            id,
        })
    }

    /// Admits one new tunnel for `user` of `account` or says why not (429 +
    /// Retry-After): the user's own limits, or this instance's default cap
    /// when it has none, and the account's totals.
    pub async fn admit(
        self: &Arc<Self>,
        user: Uuid,
        account: Uuid,
        limits: UserLimits,
    ) -> Result<Leases, ProxyError> {
        if let Some(rate) = limits.max_new_tunnels_per_second {
            self.rate(self.keys.tunnel_rate(user), rate, "the user's")
                .await?;
        }
        if let Some(rate) = limits.account.and_then(|a| a.max_new_tunnels_per_second) {
            self.rate(
                self.keys.account_tunnel_rate(account),
                rate,
                "the account's",
            )
            .await?;
        }
        let mut leases = Leases::default();
        match limits.max_concurrent_tunnels {
            Some(max) => {
                leases._user = Some(
                    self.lease(self.keys.leases(user), max, "the user's")
                        .await?,
                );
            }
            None => leases._local = Some(self.local_slot(user)?),
        }
        if let Some(max) = limits.account.and_then(|a| a.max_concurrent_tunnels) {
            leases._account = Some(
                self.lease(self.keys.account_leases(account), max, "the account's")
                    .await?,
            );
        }
        Ok(leases)
    }

    /// One per-domain limit (`scope`: `op` for the operator's aggregate,
    /// `a:ACCOUNT`, `u:USER`): its rate, then a lease in its concurrency
    /// set, shared by every superproxy like the user limits.
    pub async fn admit_domain(
        self: &Arc<Self>,
        scope: &str,
        domain: &str,
        limit: proxynet_store::policy::Limit,
        whose: &str,
    ) -> Result<Option<Lease>, ProxyError> {
        if let Some(rate) = limit.new_tunnels_per_second {
            self.rate(
                self.keys.domain_rate(scope, domain),
                rate,
                &format!("{whose} per-domain ({domain})"),
            )
            .await?;
        }
        match limit.max_concurrent_tunnels {
            Some(max) => Ok(Some(
                self.lease(
                    self.keys.domain_leases(scope, domain),
                    max,
                    &format!("{whose} per-domain ({domain})"),
                )
                .await?,
            )),
            None => Ok(None),
        }
    }

    /// A slot of the default per-user cap, counted on this instance only (no
    /// Redis round trip for users without limits).
    fn local_slot(self: &Arc<Self>, user: Uuid) -> Result<LocalSlot, ProxyError> {
        let mut local = self
            .local
            .lock()
            .map_err(|_| ProxyError::new(ErrorKind::Internal, "admission state poisoned"))?;
        let held = local.entry(user).or_insert(0);
        if *held >= self.default_user_max {
            return Err(limited(
                format!(
                    "default per-user tunnel limit ({}) reached on this superproxy",
                    self.default_user_max
                ),
                1000,
            ));
        }
        *held += 1;
        Ok(LocalSlot {
            admission: self.clone(),
            user,
        })
    }

    fn held_by_us(&self, set: &str) -> usize {
        self.held
            .lock()
            .map(|h| h.get(set).map_or(0, HashSet::len))
            .unwrap_or(0)
    }

    /// Extends this instance's leases every third of their lifetime.
    pub async fn run_renewals(self: Arc<Self>, stop: Stop) {
        let mut tick = tokio::time::interval(self.lease_ttl / 3);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            let snapshot: Vec<(String, Vec<String>)> = self
                .held
                .lock()
                .map(|h| {
                    h.iter()
                        .map(|(set, ids)| (set.clone(), ids.iter().cloned().collect()))
                        .collect()
                })
                .unwrap_or_default();
            if snapshot.is_empty() {
                continue;
            }
            let mut redis = self.redis.clone();
            let script = redis::Script::new(RENEW_SCRIPT);
            for (set, ids) in snapshot {
                let mut invocation = script.key(set);
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
    /// Bytes a quota owner has used this period according to the shared
    /// counter (`None` when Redis cannot say).
    pub async fn quota_used(&self, owner: QuotaOwner, period: QuotaPeriod) -> Option<u64> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let (window, _, _) = period.window(now);
        let key = match owner {
            QuotaOwner::User(id) => self.keys.quota_used(id, &window),
            QuotaOwner::Account(id) => self.keys.account_quota_used(id, &window),
        };
        let mut redis = self.redis.clone();
        let used: Result<Option<u64>, _> = redis::cmd("GET").arg(key).query_async(&mut redis).await;
        used.ok().map(|u| u.unwrap_or(0))
    }
}
