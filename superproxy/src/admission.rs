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
use redis::RedisResult;
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

/// `KEYS[1]` leases (and, for a shared set, `KEYS[2]` its holders, kept
/// alive with it), `ARGV[1]` ttl ms, `ARGV[2..]` lease ids to extend.
const RENEW_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[1]), ARGV[i])
end
for k = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[k], tonumber(ARGV[1]) * 2)
end
return 1
";

/// The operator's aggregate per-domain rate, shared fairly between
/// accounts. `KEYS[1]` the aggregate GCRA state, `KEYS[2]` this account's,
/// `KEYS[3]` the accounts that asked in the last second (account → ms);
/// `ARGV[1]` tunnels per second, `ARGV[2]` the account. The asker is noted
/// first (a refused ask counts: it is what makes the others yield), then a
/// tunnel must fit both the account's share (the rate divided by the
/// accounts asking) and the aggregate; only then are both charged. Each
/// bucket holds one second of its rate, at least one tunnel. 0 when
/// allowed, else milliseconds until it would fit.
const SHARED_RATE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[3], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - 1000)
redis.call('PEXPIRE', KEYS[3], 2000)
local askers = redis.call('ZCARD', KEYS[3])
local rate = tonumber(ARGV[1])
local function gcra(key, per_second)
  local emission = 1000 / per_second
  local burst = math.max(1000, emission)
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  local new_tat = tat + emission
  local allow_at = new_tat - burst
  if allow_at > now then return math.ceil(allow_at - now), new_tat, emission end
  return 0, new_tat, emission
end
local wait_mine, tat_mine, emission_mine = gcra(KEYS[2], rate / askers)
if wait_mine > 0 then return wait_mine end
local wait_all, tat_all, emission_all = gcra(KEYS[1], rate)
if wait_all > 0 then return wait_all end
redis.call('SET', KEYS[2], string.format('%d', math.floor(tat_mine)), 'PX', 2000 + math.ceil(emission_mine))
redis.call('SET', KEYS[1], string.format('%d', math.floor(tat_all)), 'PX', 2000 + math.ceil(emission_all))
return 0
";

/// The operator's aggregate per-domain concurrency, shared fairly between
/// accounts. `KEYS[1]` the lease set (members `ACCOUNT|ID`, scored by
/// expiry), `KEYS[2]` leases held per account; `ARGV[1]` the account,
/// `ARGV[2]` the new member, `ARGV[3]` the limit, `ARGV[4]` ttl ms.
/// Expired leases are dropped (and their accounts' counts with them); with
/// `n` accounts holding leases, the asker included, `share` is
/// `ceil(limit / (n + 1))`, what each would hold if one more account came,
/// and `headroom` is a tenth of the limit (at least one place): the asker
/// gets a lease while the total is under the limit and either it holds
/// fewer than `share`, or `headroom` places stay free after it — kept for
/// an account below its share. 1 granted, 0 the limit is reached, -1 the
/// account's share is.
const SHARED_ACQUIRE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, member in ipairs(expired) do
  local account = string.match(member, '^([^|]*)|')
  if account and redis.call('HINCRBY', KEYS[2], account, -1) <= 0 then
    redis.call('HDEL', KEYS[2], account)
  end
end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) end
local total = redis.call('ZCARD', KEYS[1])
if total == 0 then redis.call('DEL', KEYS[2]) end
local limit = tonumber(ARGV[3])
if total >= limit then return 0 end
local mine = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
local holders = redis.call('HLEN', KEYS[2])
if mine == 0 then holders = holders + 1 end
local share = math.ceil(limit / (holders + 1))
local headroom = math.max(1, math.ceil(limit / 10))
if mine >= share and total + 1 > limit - headroom then return -1 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[4]), ARGV[2])
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]) * 2)
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[4]) * 2)
return 1
";

/// `KEYS[1]` a shared lease set, `KEYS[2]` its holders, `ARGV[1]` the
/// member to release: removed, and its account's count with it (only if it
/// was still there: an expired lease was already taken off by the acquire).
const SHARED_RELEASE_SCRIPT: &str = r"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  local account = string.match(ARGV[1], '^([^|]*)|')
  if account and redis.call('HINCRBY', KEYS[2], account, -1) <= 0 then
    redis.call('HDEL', KEYS[2], account)
  end
end
return 1
";

pub(crate) struct Admission {
    redis: RedisConnection,
    keys: Keys,
    superproxy_id: Uuid,
    lease_ttl: Duration,
    /// Tunnels a user without a concurrency limit of its own may hold here.
    default_user_max: usize,
    /// This instance's leases per lease set (a user's, an account's, a
    /// domain's): renewed by [`Self::run_renewals`], and the fallback count
    /// while Redis is away.
    held: Mutex<HashMap<String, HeldSet>>,
    /// Tunnels held here per user without a limit of its own.
    local: Mutex<HashMap<Uuid, usize>>,
}

/// This instance's leases in one set.
#[derive(Default)]
struct HeldSet {
    ids: HashSet<String>,
    /// The per-account counts beside a shared set (renewed with it).
    holders: Option<String>,
}

/// A concurrency slot in one lease set; released when dropped.
pub(crate) struct Lease {
    admission: Arc<Admission>,
    set: String,
    id: String,
    /// For a lease of a shared set (the operator's aggregate per-domain
    /// limit): the per-account counts its release must decrement.
    holders: Option<String>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Ok(mut held) = self.admission.held.lock() {
            if let Some(entry) = held.get_mut(&self.set) {
                entry.ids.remove(&self.id);
                if entry.ids.is_empty() {
                    held.remove(&self.set);
                }
            }
        }
        let (admission, set, id, holders) = (
            self.admission.clone(),
            std::mem::take(&mut self.set),
            std::mem::take(&mut self.id),
            self.holders.take(),
        );
        tokio::spawn(async move {
            let mut redis = admission.redis.clone();
            let _: Result<i64, _> = match holders {
                Some(holders) => {
                    redis::Script::new(SHARED_RELEASE_SCRIPT)
                        .key(set)
                        .key(holders)
                        .arg(id)
                        .invoke_async(&mut redis)
                        .await
                }
                None => {
                    redis::cmd("ZREM")
                        .arg(set)
                        .arg(id)
                        .query_async(&mut redis)
                        .await
                }
            };
        });
    }
}

/// A slot in this instance's count of a user without a limit of its own.
pub(crate) struct LocalSlot {
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
pub(crate) struct Leases {
    _user: Option<Lease>,
    _local: Option<LocalSlot>,
    _account: Option<Lease>,
    /// Per-domain leases (the target policy's), held alongside.
    _domain: Vec<Lease>,
}

impl Leases {
    /// These leases and the target policy's, held as one.
    pub(crate) fn with_domain(mut self, domain: Vec<Lease>) -> Self {
        self._domain = domain;
        self
    }

    /// Per-domain leases taken after the tunnel opened (the judgement of a
    /// tunnel to an address by its first bytes), held alongside.
    pub(crate) fn add_domain(&mut self, domain: Vec<Lease>) {
        self._domain.extend(domain);
    }
}

impl Admission {
    pub(crate) fn new(
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
        rate_verdict(wait_ms, || {
            format!("{whose} new-tunnel rate limit ({rate}/s) reached")
        })
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
        if acquire_refusal(acquired, max, || self.held_by_us(&set)).is_some() {
            return Err(limited(
                format!("{whose} concurrent tunnel limit ({max}) reached"),
                1000,
            ));
        }
        Ok(self.hold(set, id, None))
    }

    /// Notes a granted lease as this instance's (for renewal and the
    /// fallback count) and makes the value that releases it.
    fn hold(self: &Arc<Self>, set: String, id: String, holders: Option<String>) -> Lease {
        if let Ok(mut held) = self.held.lock() {
            let entry = held.entry(set.clone()).or_default();
            entry.ids.insert(id.clone());
            if entry.holders.is_none() {
                entry.holders.clone_from(&holders);
            }
        }
        Lease {
            admission: self.clone(),
            set,
            id,
            holders,
        }
    }

    /// Admits one new tunnel for `user` of `account` or says why not (429 +
    /// Retry-After): the user's own limits, or this instance's default cap
    /// when it has none, and the account's totals.
    pub(crate) async fn admit(
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

    /// One owner's per-domain limit (`scope`: `a:ACCOUNT`, `u:USER`): its
    /// rate, then a lease in its concurrency set, shared by every superproxy
    /// like the user limits. The operator's aggregate is
    /// [`Self::admit_shared_domain`].
    pub(crate) async fn admit_domain(
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

    /// The operator's aggregate limit on one domain (`domain`: the key it is
    /// counted under), shared fairly between the accounts using it
    /// (docs/policy.md): `account`'s share of the rate, then a lease within
    /// its share of the concurrency. One script call each, as for an
    /// owner's limit. While Redis is away the rate lets tunnels through and
    /// the concurrency counts this instance's leases, as for the others.
    pub(crate) async fn admit_shared_domain(
        self: &Arc<Self>,
        domain: &str,
        limit: proxynet_store::policy::Limit,
        account: Uuid,
        whose: &str,
    ) -> Result<Option<Lease>, ProxyError> {
        let stem = self.keys.shared_domain(domain);
        if let Some(rate) = limit.new_tunnels_per_second {
            let mut redis = self.redis.clone();
            let wait_ms: Result<i64, _> = redis::Script::new(SHARED_RATE_SCRIPT)
                .key(format!("{stem}:rate"))
                .key(format!("{stem}:rate:{account}"))
                .key(format!("{stem}:askers"))
                .arg(rate)
                .arg(account.to_string())
                .invoke_async(&mut redis)
                .await;
            rate_verdict(wait_ms, || {
                format!("{whose} per-domain ({domain}) new-tunnel rate limit ({rate}/s) reached")
            })?;
        }
        let Some(max) = limit.max_concurrent_tunnels else {
            return Ok(None);
        };
        let set = format!("{stem}:leases");
        let holders = format!("{stem}:holders");
        let id = format!(
            "{account}|{}:{}",
            self.superproxy_id,
            Uuid::new_v4().simple()
        );
        let mut redis = self.redis.clone();
        let acquired: Result<i64, _> = redis::Script::new(SHARED_ACQUIRE_SCRIPT)
            .key(&set)
            .key(&holders)
            .arg(account.to_string())
            .arg(&id)
            .arg(max)
            .arg(self.lease_ttl.as_millis() as u64)
            .invoke_async(&mut redis)
            .await;
        let refusal = acquire_refusal(acquired, max, || self.held_by_us(&set)).map(|why| {
            format!("{whose} per-domain ({domain}) concurrent tunnel limit ({max}){why}")
        });
        match refusal {
            Some(detail) => Err(limited(detail, 1000)),
            None => Ok(Some(self.hold(set, id, Some(holders)))),
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
            .map(|h| h.get(set).map_or(0, |entry| entry.ids.len()))
            .unwrap_or(0)
    }

    /// Extends this instance's leases every third of their lifetime.
    pub(crate) async fn run_renewals(self: Arc<Self>, stop: Stop) {
        let mut tick = tokio::time::interval(self.lease_ttl / 3);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            let snapshot: Vec<(String, Option<String>, Vec<String>)> = self
                .held
                .lock()
                .map(|h| {
                    h.iter()
                        .map(|(set, entry)| {
                            (
                                set.clone(),
                                entry.holders.clone(),
                                entry.ids.iter().cloned().collect(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            if snapshot.is_empty() {
                continue;
            }
            let mut redis = self.redis.clone();
            let script = redis::Script::new(RENEW_SCRIPT);
            for (set, holders, ids) in snapshot {
                let mut invocation = script.key(set);
                if let Some(holders) = holders {
                    invocation.key(holders);
                }
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

    /// Bytes a quota owner has used this period according to the shared
    /// counter (`None` when Redis cannot say).
    pub(crate) async fn quota_used(&self, owner: QuotaOwner, period: QuotaPeriod) -> Option<u64> {
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

fn limited(detail: String, retry_after_ms: u64) -> ProxyError {
    let mut e = ProxyError::new(ErrorKind::TooManyRequests, detail);
    e.retry_after = Some(u32::try_from(retry_after_ms.div_ceil(1000).max(1)).unwrap_or(u32::MAX));
    e
}

/// A rate script's reply: 0 (or Redis away) allowed, else a 429 with its wait.
fn rate_verdict(wait: RedisResult<i64>, why: impl FnOnce() -> String) -> Result<(), ProxyError> {
    match wait {
        Ok(ms) if ms > 0 => Err(limited(why(), ms as u64)),
        _ => Ok(()),
    }
}

/// An acquire script's reply: `None` granted (1), else the end of the
/// refusal's detail (-1: a shared set's fair share). Redis away: refused once
/// this instance alone holds `max` (`held_here`, asked only then).
fn acquire_refusal(
    acquired: RedisResult<i64>,
    max: u32,
    held_here: impl FnOnce() -> usize,
) -> Option<&'static str> {
    match acquired {
        Ok(1) => None,
        Ok(-1) => Some(": the account's fair share is in use"),
        Ok(_) => Some(" reached"),
        Err(_) => (held_here() >= max as usize).then_some(" reached"),
    }
}

#[cfg(test)]
pub(crate) mod test_support;
#[cfg(test)]
mod tests;
