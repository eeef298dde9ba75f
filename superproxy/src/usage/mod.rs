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
//! (account, user, exit, source type, domain, billable, minute) and appends one batch with a
//! fresh id to the Redis usage stream; meters of finished tunnels are flushed
//! one last time and dropped. If Redis does not take a batch, it goes to the
//! append-only spill file (`usage_spill_dir`) at once — the first failed send,
//! not a memory bound — and is replayed, oldest first, when Redis answers
//! again (the same batch id, so the ledger cannot count it twice), also by the
//! next superproxy started on the same directory. So `kill -9` during a Redis
//! outage loses at most the one flush interval not yet collected. Without a
//! spill directory batches wait in memory (at most `usage_memory_batches`).
//!
//! A meter whose billing is held (an attempt the gateway may give up on for
//! another exit, [`Meter::hold_billing`]) keeps its bytes out of the batches
//! until it is settled, then they go in whole, billable or not; its bytes
//! count against the quotas as they move all the same (docs/usage.md, "Not
//! billable bytes").
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

pub use meter::{Budget, EndSide, Meter, MeterHandle, Metered, QuotaBinding, QuotaOwner};

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
    /// Counted against the quotas (every byte that moved).
    sent_up: u64,
    sent_down: u64,
    /// Put in ledger rows (what a held meter moved waits for its settlement).
    billed_up: u64,
    billed_down: u64,
    /// Flushes seen since its stream ended while its billing was still held.
    held_after_done: u8,
}

/// What one flush takes from one meter.
#[derive(Debug, PartialEq, Eq)]
struct Taken {
    /// Bytes (up, down) moved since the last flush: for the quotas.
    moved: (u64, u64),
    /// Bytes (up, down) for the ledger and whether they are billed; `None`
    /// while the meter's billing is held.
    billed: Option<((u64, u64), bool)>,
    /// Whether the meter stays tracked.
    keep: bool,
}

impl Tracked {
    fn new(meter: Arc<Meter>) -> Self {
        Self {
            meter,
            sent_up: 0,
            sent_down: 0,
            billed_up: 0,
            billed_down: 0,
            held_after_done: 0,
        }
    }

    /// Takes the meter's deltas for one flush. Quotas count every byte as
    /// it moves; the ledger waits while the meter's billing is held
    /// ([`Meter::hold_billing`]) and then takes all of its bytes as billed
    /// or not. A meter still held [`HELD_AFTER_DONE_FLUSHES`] flushes after
    /// its stream ended, or held when the instance stops (`stopping`), is
    /// billed: nobody is left to settle it.
    fn take(&mut self, stopping: bool) -> Taken {
        // Read `done` first: bytes counted before it was set are then seen
        // below; and the bytes before the billing state, so bytes moved
        // while a meter was held are never billed by a state read before
        // its hold.
        let done = self.meter.done.load(Ordering::Acquire);
        let (up, down) = (self.meter.up(), self.meter.down());
        let moved = (up - self.sent_up, down - self.sent_down);
        self.sent_up = up;
        self.sent_down = down;
        let held = self.meter.billing_held();
        if held && done {
            self.held_after_done = self.held_after_done.saturating_add(1);
        }
        let waiting = held && !stopping && self.held_after_done <= HELD_AFTER_DONE_FLUSHES;
        let billed = (!waiting).then(|| {
            let delta = (up - self.billed_up, down - self.billed_down);
            self.billed_up = up;
            self.billed_down = down;
            (delta, self.meter.billable())
        });
        Taken {
            moved,
            billed,
            keep: !done || waiting,
        }
    }
}

/// How many flushes a meter whose stream ended still held waits for its
/// settlement (the answer that settles it can be judged just after the
/// upstream connection closed) before its bytes are billed.
const HELD_AFTER_DONE_FLUSHES: u8 = 3;

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
    /// The instance is stopping: meters still held are billed now, as
    /// nobody will settle them.
    stopping: std::sync::atomic::AtomicBool,
}

/// (account, user, exit, egress IP, target host, target port, minute)
type TargetKey = (Uuid, Uuid, Uuid, std::net::IpAddr, String, u16, i64);

/// (account, user, exit, source type, domain, billable): one ledger row
/// per minute.
type RowKey = (Uuid, Uuid, Uuid, Option<SourceType>, Option<Arc<str>>, bool);

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
            stopping: std::sync::atomic::AtomicBool::new(false),
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
            meters.push(Tracked::new(meter.clone()));
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
    ///
    /// Quotas count every byte as it moves. Ledger rows wait for a meter
    /// whose billing is held ([`Meter::hold_billing`]) until it is settled,
    /// and then carry all of its bytes as billable or not; a meter still
    /// held a few flushes after its stream ended, or when the instance
    /// stops, is billed.
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
        let stopping = self.stopping.load(Ordering::Relaxed);
        let mut meters = self.meters.lock().ok()?;
        meters.retain_mut(|t| {
            let taken = t.take(stopping);
            let m = &t.meter;
            if taken.moved != (0, 0) {
                for q in &m.quotas {
                    let (key, end) = self.counter(q.owner, q.period, now);
                    let e = quota.entry((q.owner, key)).or_insert((0, q.limit, end));
                    e.0 += taken.moved.0 + taken.moved.1;
                }
            }
            if let Some((delta, billable)) = taken.billed.filter(|(delta, _)| *delta != (0, 0)) {
                let entry = sums
                    .entry((
                        m.account_id,
                        m.user_id,
                        m.exit_id,
                        m.source_type,
                        m.domain.clone(),
                        billable,
                    ))
                    .or_default();
                entry.0 += delta.0;
                entry.1 += delta.1;
            }
            taken.keep
        });
        drop(meters);
        let (up, down) = sums
            .values()
            .fold((0, 0), |(u, d), (du, dd)| (u + du, d + dd));
        if let Ok(mut exits) = self.exit_bytes.lock() {
            for ((_, _, exit, _, _, _), (du, dd)) in &sums {
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
                |(
                    (account_id, user_id, exit_id, source_type, domain, billable),
                    (bytes_up, bytes_down),
                )| {
                    UsageRow {
                        account_id,
                        user_id,
                        exit_id,
                        minute,
                        bytes_up,
                        bytes_down,
                        source_type,
                        domain: domain.map(|d| d.to_string()),
                        billable,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked() -> Tracked {
        Tracked::new(Arc::new(Meter::new(
            Uuid::nil(),
            Uuid::nil(),
            Uuid::nil(),
            None,
            None,
            Vec::new(),
        )))
    }

    /// Moves `up` and `down` bytes through the meter.
    fn moves(t: &Tracked, up: usize, down: usize) {
        assert!(t.meter.charge_datagram(true, up));
        assert!(t.meter.charge_datagram(false, down));
    }

    fn end(t: &Tracked) {
        t.meter.done.store(true, Ordering::Release);
    }

    #[test]
    fn a_meter_never_held_is_billed_as_its_bytes_move() {
        let mut t = tracked();
        moves(&t, 3, 4);
        let taken = t.take(false);
        assert_eq!(taken.moved, (3, 4));
        assert_eq!(taken.billed, Some(((3, 4), true)));
        assert!(taken.keep);
        end(&t);
        let taken = t.take(false);
        assert_eq!(taken.billed, Some(((0, 0), true)));
        assert!(
            !taken.keep,
            "a finished meter is flushed once more and dropped"
        );
    }

    #[test]
    fn a_held_meter_counts_for_quotas_at_once_and_for_the_ledger_once_settled() {
        let mut t = tracked();
        t.meter.hold_billing();
        moves(&t, 100, 1_000);
        let taken = t.take(false);
        assert_eq!(taken.moved, (100, 1_000), "quotas count what moved");
        assert_eq!(taken.billed, None, "the ledger waits");
        assert!(taken.keep);
        moves(&t, 0, 500);
        t.meter.settle_billing(false);
        let taken = t.take(false);
        assert_eq!(taken.moved, (0, 500));
        assert_eq!(
            taken.billed,
            Some(((100, 1_500), false)),
            "every byte, as not billable"
        );
        end(&t);
        let taken = t.take(false);
        assert_eq!(taken.billed, Some(((0, 0), false)));
        assert!(!taken.keep);
    }

    #[test]
    fn a_meter_that_ends_still_held_waits_a_few_flushes_then_is_billed() {
        let mut t = tracked();
        t.meter.hold_billing();
        moves(&t, 10, 0);
        end(&t);
        for _ in 0..HELD_AFTER_DONE_FLUSHES {
            let taken = t.take(false);
            assert!(taken.keep && taken.billed.is_none(), "{taken:?}");
        }
        let taken = t.take(false);
        assert_eq!(taken.billed, Some(((10, 0), true)));
        assert!(!taken.keep);

        // Settled during the wait: as settled.
        let mut t = tracked();
        t.meter.hold_billing();
        moves(&t, 10, 0);
        end(&t);
        assert!(t.take(false).keep);
        t.meter.settle_billing(false);
        let taken = t.take(false);
        assert_eq!(taken.billed, Some(((10, 0), false)));
        assert!(!taken.keep);

        // A stopping instance bills what is still held.
        let mut t = tracked();
        t.meter.hold_billing();
        moves(&t, 7, 0);
        let taken = t.take(true);
        assert_eq!(taken.billed, Some(((7, 0), true)));
    }
}
