//! Exact byte accounting: meters on every tunnel, flushed to the ledger.
//!
//! Four rooms: [`meter`] (the hot path: counting and quota budgets), this
//! module (the recorder: meters, budgets and collecting them into batches),
//! [`delivery`] (sending batches to the Redis usage stream and the shared
//! quota counters, the flush loop) and [`spill`] (the disk file for batches
//! Redis did not take).
//!
//! Every stream to an exit is wrapped in a [`Metered`] reader/writer that
//! counts bytes as they cross it: written to the exit = up (client → target),
//! read from the exit = down. For CONNECT and SOCKS5 that is exactly the tunnel
//! payload; for absolute-form HTTP it is the request and response as relayed
//! (heads included, hop-by-hop fields already removed) — see docs/usage.md.
//!
//! Once a second the [`UsageRecorder`] takes every meter's delta, sums them per
//! (account, user, exit, source type, minute) and appends one batch with a
//! fresh id to the Redis usage stream; meters of finished tunnels are flushed
//! one last time and dropped. If Redis does not take a batch, it goes to the
//! append-only spill file (`usage_spill_dir`) at once — the first failed send,
//! not a memory bound — and is replayed, oldest first, when Redis answers
//! again (the same batch id, so the ledger cannot count it twice), also by the
//! next superproxy started on the same directory. So `kill -9` during a Redis
//! outage loses at most the one flush interval not yet collected. Without a
//! spill directory batches wait in memory (at most `usage_memory_batches`).
//!
//! Each batch also advances the shared quota counters of its users and
//! accounts. That
//! update is idempotent too: every batch carries this instance's sequence
//! number, and a counter moves only for a sequence number above the last one
//! it applied from this instance, so a batch re-sent after a lost reply never
//! counts twice. A clean shutdown flushes (or spills); `kill -9` loses at
//! most one flush interval.

mod delivery;
mod meter;
mod spill;

pub use meter::{Budget, Meter, MeterHandle, Metered, QuotaBinding, QuotaOwner};

use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::{Keys, QuotaPeriod, SourceType, TargetRow, UsageBatch, UsageRow};
use serde::{Deserialize, Serialize};
use spill::Spill;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// (Public so tests can run it against a real Redis.)
/// `KEYS[1]` quota counter, `KEYS[2]` its applied-sequence hash; `ARGV[1]`
/// bytes, `ARGV[2]` expiry (Unix s), `ARGV[3]` superproxy id, `ARGV[4]` batch
/// sequence. Adds the bytes once per (superproxy, sequence); returns the total.
pub const ADD_ONCE_SCRIPT: &str = r"
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '0')
if tonumber(ARGV[4]) > last then
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
  redis.call('EXPIREAT', KEYS[2], ARGV[2])
  local total = redis.call('INCRBY', KEYS[1], ARGV[1])
  redis.call('EXPIREAT', KEYS[1], ARGV[2])
  return total
end
return tonumber(redis.call('GET', KEYS[1]) or '0')
";

/// What a meter had reported at the last flush.
struct Tracked {
    meter: Arc<Meter>,
    sent_up: u64,
    sent_down: u64,
}

/// One quota owner's share of a batch, for its shared counter.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct QuotaDelta {
    /// The user or account whose counter this is.
    #[serde(alias = "user")]
    owner: Uuid,
    counter: String,
    bytes: u64,
    limit: u64,
    /// Counter expiry, Unix seconds.
    expire_at: i64,
    /// The owner's budget's `spent` when the batch was collected: what it
    /// spent after that is not in this batch (not in the spill file: a
    /// replayed batch leaves budgets alone).
    #[serde(skip)]
    spent_at_collect: Option<u64>,
}

/// A batch, the quota counters it advances and its place in this instance's
/// sequence; also the line format of the spill file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pending {
    batch: UsageBatch,
    seq: u64,
    quota: Vec<QuotaDelta>,
}

/// What one quota is, as the pipeline asks for it on a new tunnel.
#[derive(Debug, Clone, Copy)]
pub struct QuotaSpec {
    pub owner: QuotaOwner,
    pub limit: u64,
    pub period: QuotaPeriod,
    /// Bytes used this period according to the shared counter.
    pub used: u64,
}

pub struct UsageRecorder {
    superproxy_id: Uuid,
    redis: RedisConnection,
    keys: Keys,
    meters: Mutex<Vec<Tracked>>,
    pending: tokio::sync::Mutex<Vec<Pending>>,
    next_seq: AtomicU64,
    spill: Option<Spill>,
    /// Most unsent batches kept in memory (only without a spill directory).
    memory_batches: usize,
    /// Byte budgets of the quota owners (users, accounts) with tunnels here.
    budgets: Mutex<HashMap<Uuid, Arc<Budget>>>,
    /// Tunnels opened since the last flush, per abuse-lookup key.
    targets: Mutex<HashMap<TargetKey, u32>>,
    /// Bytes (up, down) per exit since start, for the fleet view.
    exit_bytes: Mutex<HashMap<Uuid, (u64, u64)>>,
    /// Where byte totals are counted for the fleet view.
    stats: Arc<crate::metrics::Stats>,
    /// Whether the current Redis outage was already logged (one warning
    /// per outage, not one per flush).
    outage_logged: std::sync::atomic::AtomicBool,
    /// A send or replay failed since the last clean flush: budgets stay.
    keep_budgets: std::sync::atomic::AtomicBool,
}

/// (account, user, exit, egress IP, target host, target port, minute)
type TargetKey = (Uuid, Uuid, Uuid, std::net::IpAddr, String, u16, i64);

/// (account, user, exit, source type): one ledger row per minute.
type RowKey = (Uuid, Uuid, Uuid, Option<SourceType>, Option<Arc<str>>);

impl UsageRecorder {
    pub fn new(
        superproxy_id: Uuid,
        redis: RedisConnection,
        keys: Keys,
        spill_dir: Option<PathBuf>,
        memory_batches: usize,
        stats: Arc<crate::metrics::Stats>,
    ) -> Self {
        Self {
            superproxy_id,
            redis,
            keys,
            meters: Mutex::new(Vec::new()),
            pending: tokio::sync::Mutex::new(Vec::new()),
            next_seq: AtomicU64::new(1),
            spill: spill_dir.map(|dir| Spill { dir }),
            memory_batches: memory_batches.max(1),
            budgets: Mutex::new(HashMap::new()),
            targets: Mutex::new(HashMap::new()),
            exit_bytes: Mutex::new(HashMap::new()),
            stats,
            outage_logged: std::sync::atomic::AtomicBool::new(false),
            keep_budgets: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Bytes (up, down) through `exit` on this instance since start.
    pub fn exit_bytes(&self, exit: Uuid) -> (u64, u64) {
        self.exit_bytes
            .lock()
            .ok()
            .and_then(|m| m.get(&exit).copied())
            .unwrap_or_default()
    }

    /// Forgets exits no longer linked here (bounded memory).
    pub fn retain_exits(&self, linked: &[Uuid]) {
        if let Ok(mut m) = self.exit_bytes.lock() {
            m.retain(|id, _| linked.contains(id));
        }
    }

    /// Notes one opened tunnel for the abuse-lookup record: who reached which
    /// host:port through which egress IP, this minute.
    pub fn record_target(
        &self,
        account_id: Uuid,
        user_id: Uuid,
        exit_id: Uuid,
        egress_ip: std::net::IpAddr,
        host: String,
        port: u16,
    ) {
        let minute = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
            / 60
            * 60;
        if let Ok(mut targets) = self.targets.lock() {
            *targets
                .entry((account_id, user_id, exit_id, egress_ip, host, port, minute))
                .or_default() += 1;
        }
    }

    /// The budget of a quota owner: the running one if it has tunnels here
    /// (and is for the same limit and quota period), else a fresh one of
    /// `limit - used` from the shared counter.
    fn budget(&self, spec: &QuotaSpec) -> Arc<Budget> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let (window, _, _) = spec.period.window(now);
        let fresh = || {
            Arc::new(Budget::for_window(
                i64::try_from(spec.limit.saturating_sub(spec.used)).unwrap_or(i64::MAX),
                spec.limit,
                window.clone(),
            ))
        };
        match self.budgets.lock() {
            Ok(mut b) => {
                let entry = b.entry(spec.owner.id()).or_insert_with(fresh);
                // A new period, or a limit changed: the old budget no
                // longer says what is left.
                if !entry.is_for(spec.limit, &window) {
                    *entry = fresh();
                }
                entry.clone()
            }
            Err(_) => fresh(),
        }
    }

    /// What the owner may still move here (≤ 0: nothing).
    pub fn budget_left(&self, spec: &QuotaSpec) -> i64 {
        self.budget(spec).left()
    }

    /// A new meter for a tunnel through `exit_id` on behalf of the user,
    /// bound to `quotas` (the user's and the account's, where set).
    pub fn meter(
        &self,
        account_id: Uuid,
        user_id: Uuid,
        exit_id: Uuid,
        source_type: Option<SourceType>,
        domain: Option<Arc<str>>,
        quotas: &[QuotaSpec],
    ) -> MeterHandle {
        let bindings = quotas
            .iter()
            .map(|spec| QuotaBinding {
                owner: spec.owner,
                limit: spec.limit,
                period: spec.period,
                budget: self.budget(spec),
            })
            .collect();
        let meter = Arc::new(Meter::new(
            account_id,
            user_id,
            exit_id,
            source_type,
            domain,
            bindings,
        ));
        if let Ok(mut meters) = self.meters.lock() {
            meters.push(Tracked {
                meter: meter.clone(),
                sent_up: 0,
                sent_down: 0,
            });
        }
        MeterHandle(meter)
    }

    /// The shared counter's key for a quota owner in the window of `now`.
    fn counter(&self, owner: QuotaOwner, period: QuotaPeriod, now: i64) -> (String, i64) {
        let (window, _, end) = period.window(now);
        let key = match owner {
            QuotaOwner::User(id) => self.keys.quota_used(id, &window),
            QuotaOwner::Account(id) => self.keys.account_quota_used(id, &window),
        };
        (key, end)
    }

    /// Collects every meter's delta into a batch (none if nothing moved).
    fn collect(&self) -> Option<Pending> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let minute = now / 60 * 60;
        // Each budget's spend is read before the meters: whatever is spent
        // after it is counted as not yet in the shared counter, so a budget
        // refreshed from this batch errs low, never high.
        let spent: HashMap<Uuid, u64> = self
            .budgets
            .lock()
            .map(|b| b.iter().map(|(id, b)| (*id, b.spent())).collect())
            .unwrap_or_default();
        let mut sums: HashMap<RowKey, (u64, u64)> = HashMap::new();
        let mut quota: HashMap<(QuotaOwner, String), (u64, u64, i64)> = HashMap::new();
        let mut meters = self.meters.lock().ok()?;
        meters.retain_mut(|t| {
            // Read `done` first: bytes counted before it was set are then seen below.
            let done = t.meter.done.load(Ordering::Acquire);
            let (up, down) = (t.meter.up(), t.meter.down());
            let delta = (up - t.sent_up, down - t.sent_down);
            if delta != (0, 0) {
                let m = &t.meter;
                let entry = sums
                    .entry((
                        m.account_id,
                        m.user_id,
                        m.exit_id,
                        m.source_type,
                        m.domain.clone(),
                    ))
                    .or_default();
                entry.0 += delta.0;
                entry.1 += delta.1;
                for q in &m.quotas {
                    let (key, end) = self.counter(q.owner, q.period, now);
                    let e = quota.entry((q.owner, key)).or_insert((0, q.limit, end));
                    e.0 += delta.0 + delta.1;
                }
                t.sent_up = up;
                t.sent_down = down;
            }
            !done
        });
        drop(meters);
        let (up, down) = sums
            .values()
            .fold((0, 0), |(u, d), (du, dd)| (u + du, d + dd));
        if let Ok(mut exits) = self.exit_bytes.lock() {
            for ((_, _, exit, _, _), (du, dd)) in &sums {
                let e = exits.entry(*exit).or_default();
                e.0 += du;
                e.1 += dd;
            }
        }
        self.stats.bytes(up, down);
        let targets: Vec<TargetRow> = self
            .targets
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default()
            .into_iter()
            .map(
                |(
                    (account_id, user_id, exit_id, egress_ip, target_host, target_port, minute),
                    tunnels,
                )| {
                    TargetRow {
                        account_id,
                        user_id,
                        exit_id,
                        egress_ip,
                        target_host,
                        target_port,
                        minute,
                        tunnels,
                    }
                },
            )
            .collect();
        if sums.is_empty() && targets.is_empty() {
            return None;
        }
        let rows = sums
            .into_iter()
            .map(
                |((account_id, user_id, exit_id, source_type, domain), (bytes_up, bytes_down))| {
                    UsageRow {
                        account_id,
                        user_id,
                        exit_id,
                        minute,
                        bytes_up,
                        bytes_down,
                        source_type,
                        domain: domain.map(|d| d.to_string()),
                    }
                },
            )
            .collect();
        Some(Pending {
            batch: UsageBatch {
                batch_id: Uuid::new_v4(),
                superproxy_id: self.superproxy_id,
                rows,
                targets,
            },
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            quota: quota
                .into_iter()
                .map(|((owner, counter), (bytes, limit, end))| QuotaDelta {
                    owner: owner.id(),
                    counter,
                    bytes,
                    limit,
                    expire_at: end + 7 * 86_400,
                    spent_at_collect: spent.get(&owner.id()).copied(),
                })
                .collect(),
        })
    }

    /// Stops every tunnel whose bytes count against `owner`'s quota (a user
    /// or an account) on this instance, at its next read or write.
    fn cut_owner(&self, owner: Uuid) {
        if let Ok(meters) = self.meters.lock() {
            for t in meters
                .iter()
                .filter(|t| t.meter.quotas.iter().any(|q| q.owner.id() == owner))
            {
                t.meter.cut();
            }
        }
    }
}
