//! Exact byte accounting: meters on every tunnel, flushed to the ledger.
//!
//! Three rooms: [`meter`] (the hot path: counting and quota budgets),
//! this module (batches to the Redis usage stream and the shared quota
//! counters) and [`spill`] (the disk file for batches Redis did not take).
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

mod meter;
mod spill;

pub use meter::{Budget, Meter, MeterHandle, Metered, QuotaBinding, QuotaOwner};

use proxynet_protocol::redis_target::RedisConnection;
use proxynet_protocol::store::{Keys, QuotaPeriod, SourceType, TargetRow, UsageBatch, UsageRow};
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
    /// Where byte totals are counted (set once at start).
    pub stats: std::sync::OnceLock<Arc<crate::metrics::Stats>>,
    /// Whether the current Redis outage was already logged (one warning
    /// per outage, not one per flush).
    outage_logged: std::sync::atomic::AtomicBool,
    /// A send or replay failed since the last clean flush: budgets stay.
    keep_budgets: std::sync::atomic::AtomicBool,
}

/// (account, user, exit, egress IP, target host, target port, minute)
type TargetKey = (Uuid, Uuid, Uuid, std::net::IpAddr, String, u16, i64);

/// (account, user, exit, source type): one ledger row per minute.
type RowKey = (Uuid, Uuid, Uuid, Option<SourceType>);

impl UsageRecorder {
    pub fn new(
        superproxy_id: Uuid,
        redis: RedisConnection,
        keys: Keys,
        spill_dir: Option<PathBuf>,
        memory_batches: usize,
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
            stats: std::sync::OnceLock::new(),
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
                    .entry((m.account_id, m.user_id, m.exit_id, m.source_type))
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
            for ((_, _, exit, _), (du, dd)) in &sums {
                let e = exits.entry(*exit).or_default();
                e.0 += du;
                e.1 += dd;
            }
        }
        if let Some(stats) = self.stats.get() {
            stats.bytes(up, down);
        }
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
                |((account_id, user_id, exit_id, source_type), (bytes_up, bytes_down))| UsageRow {
                    account_id,
                    user_id,
                    exit_id,
                    minute,
                    bytes_up,
                    bytes_down,
                    source_type,
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

    /// Sends one batch: the stream entry, then each owner's quota counter
    /// (both idempotent, so a retry after a lost reply counts nothing twice).
    async fn send(&self, next: &Pending) -> Result<(), redis::RedisError> {
        let json = serde_json::to_string(&next.batch).map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Client, "encoding", e.to_string()))
        })?;
        let mut redis = self.redis.clone();
        let _: () = redis::cmd("XADD")
            .arg(self.keys.usage_stream())
            .arg("*")
            .arg("batch")
            .arg(json)
            .query_async(&mut redis)
            .await?;
        // Each owner's counter lives in that owner's slot (on a cluster,
        // maybe each on another node).
        let totals: Vec<u64> = redis
            .query_batch(
                next.quota
                    .iter()
                    .map(|delta| {
                        let mut cmd = redis::cmd("EVAL");
                        cmd.arg(ADD_ONCE_SCRIPT)
                            .arg(2)
                            .arg(&delta.counter)
                            .arg(format!("{}:applied", delta.counter))
                            .arg(delta.bytes)
                            .arg(delta.expire_at)
                            .arg(next.batch.superproxy_id.to_string())
                            .arg(next.seq);
                        cmd
                    })
                    .collect(),
            )
            .await?;
        for (delta, total) in next.quota.iter().zip(totals) {
            // The shared counter is the truth (it includes other instances),
            // less what this instance spent since the batch was collected.
            if let (Some(at_collect), Some(budget)) = (
                delta.spent_at_collect,
                self.budgets
                    .lock()
                    .ok()
                    .and_then(|b| b.get(&delta.owner).cloned()),
            ) {
                let unsent = budget.spent().saturating_sub(at_collect);
                budget.reset(delta.limit as i64 - total as i64 - unsent as i64);
            }
            if total >= delta.limit {
                tracing::info!(owner = %delta.owner, total, limit = delta.limit, "bandwidth quota exhausted; cutting its tunnels");
                self.cut_owner(delta.owner);
            }
        }
        Ok(())
    }

    /// Collects and sends everything not yet in the stream: spilled batches
    /// first (they are older), then those in memory. A batch Redis does not
    /// take goes to the spill file at once (with a spill directory), so
    /// nothing collected lives only in memory beyond one failed send.
    pub async fn flush(&self) {
        let mut pending = self.pending.lock().await;
        if let Some(batch) = self.collect() {
            pending.push(batch);
        }
        if let Some(spill) = &self.spill {
            if let Err(e) = self.replay(spill).await {
                self.keep_budgets.store(true, Ordering::Relaxed);
                if !self.outage_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, "replaying spilled usage failed; keeping it for the next try");
                } else {
                    tracing::debug!(error = %e, "replaying spilled usage failed again");
                }
                // Older batches are still on disk: the new ones follow them
                // there, so the replay order stays oldest first.
                let unsent = std::mem::take(&mut *pending);
                self.spill_or_drop(unsent).await;
                crate::metrics::usage_batches(0);
                return;
            }
        }
        let mut failed = false;
        while let Some(next) = pending.first() {
            match self.send(next).await {
                Ok(()) => {
                    pending.remove(0);
                    crate::metrics::usage_batch("flushed");
                }
                Err(e) => {
                    crate::metrics::store_error("redis", "usage_flush");
                    failed = true;
                    if !self.outage_logged.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, unsent = pending.len(), "usage flush failed; keeping the batches for the next try");
                    }
                    if self.spill.is_some() {
                        let unsent = std::mem::take(&mut *pending);
                        self.spill_or_drop(unsent).await;
                    }
                    break;
                }
            }
        }
        // Budgets of owners with no tunnel here any more are rebuilt from
        // the shared counter on their next tunnel — once that counter has
        // every byte again: during an outage (batches unsent or spilled) a
        // budget is all that holds the quota, so it is kept.
        // (A flush that sent everything after an outage clears the mark; the
        // next one may clean up.)
        if failed {
            self.keep_budgets.store(true, Ordering::Relaxed);
        }
        let counters_current = !failed
            && pending.is_empty()
            && !self.keep_budgets.swap(false, Ordering::Relaxed)
            && self.spill_is_empty().await;
        if !failed && pending.is_empty() && self.outage_logged.swap(false, Ordering::Relaxed) {
            tracing::info!("usage reaches Redis again");
        }
        if counters_current {
            let active: std::collections::HashSet<Uuid> = self
                .meters
                .lock()
                .map(|m| {
                    m.iter()
                        .flat_map(|t| t.meter.quotas.iter().map(|q| q.owner.id()))
                        .collect()
                })
                .unwrap_or_default();
            if let Ok(mut budgets) = self.budgets.lock() {
                budgets.retain(|owner, _| active.contains(owner));
            }
        }
        self.spill_overflow(&mut pending).await;
        crate::metrics::usage_batches(pending.len());
    }

    /// Without a spill directory: drops batches beyond the in-memory bound
    /// (with an error); with one, nothing stays in memory to bound.
    async fn spill_overflow(&self, pending: &mut Vec<Pending>) {
        if pending.len() <= self.memory_batches {
            return;
        }
        let overflow: Vec<Pending> = pending
            .drain(..pending.len() - self.memory_batches)
            .collect();
        self.spill_or_drop(overflow).await;
    }

    async fn spill_or_drop(&self, batches: Vec<Pending>) {
        if batches.is_empty() {
            return;
        }
        match &self.spill {
            Some(spill) => match spill.append(self.superproxy_id, &batches).await {
                Ok(()) => {
                    metrics::counter!("proxynet_usage_batches_total", "outcome" => "spilled")
                        .increment(batches.len() as u64);
                    tracing::debug!(batches = batches.len(), dir = %spill.dir.display(), "usage spilled to disk until Redis returns");
                }
                Err(e) => tracing::error!(error = %e, dropped = batches.len(), "usage batches lost: cannot write the spill file"),
            },
            None => tracing::error!(
                dropped = batches.len(),
                "usage batches dropped after a long Redis outage (set --usage-spill-dir to keep them)"
            ),
        }
    }

    /// Whether no spill file waits (no spill directory: none ever does).
    async fn spill_is_empty(&self) -> bool {
        match &self.spill {
            Some(spill) => spill.files().await.is_ok_and(|f| f.is_empty()),
            None => true,
        }
    }

    /// Sends every spilled batch, file by file, deleting a file once all of
    /// its batches are in. Re-sending a batch after a crash is harmless. A
    /// file that cannot be read (a torn write, bad permissions) is set aside
    /// (`.bad`) rather than blocking every later flush; only Redis errors
    /// stop the replay.
    async fn replay(&self, spill: &Spill) -> Result<(), String> {
        use tokio::io::AsyncBufReadExt;
        for file in spill.files().await.map_err(|e| e.to_string())? {
            let lines = match tokio::fs::File::open(&file).await {
                Ok(f) => tokio::io::BufReader::new(f).lines(),
                Err(e) => {
                    spill.quarantine(&file, &e.to_string()).await;
                    continue;
                }
            };
            let mut lines = lines;
            let mut sent = 0usize;
            loop {
                let line = match lines.next_line().await {
                    Ok(Some(line)) => line,
                    Ok(None) => break,
                    Err(e) => {
                        spill.quarantine(&file, &e.to_string()).await;
                        break;
                    }
                };
                if line.trim().is_empty() {
                    continue;
                }
                let Ok(batch) = serde_json::from_str::<Pending>(&line) else {
                    tracing::error!(file = %file.display(), "skipping an unreadable spilled usage line");
                    continue;
                };
                self.send(&batch).await.map_err(|e| e.to_string())?;
                sent += 1;
            }
            if tokio::fs::try_exists(&file).await.unwrap_or(false) {
                if let Err(e) = tokio::fs::remove_file(&file).await {
                    // Replayed already; sending it again later counts nothing twice.
                    tracing::error!(file = %file.display(), error = %e, "cannot remove a replayed spill file");
                    spill.quarantine(&file, &e.to_string()).await;
                }
            }
            tracing::info!(file = %file.display(), batches = sent, "spilled usage replayed");
        }
        Ok(())
    }

    /// The last flush of a stopping instance: everything in memory reaches
    /// Redis, or the spill file if Redis does not answer within a few tries.
    pub async fn flush_for_shutdown(&self) {
        for _ in 0..5 {
            self.flush().await;
            if self.pending.lock().await.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let mut pending = self.pending.lock().await;
        let left = std::mem::take(&mut *pending);
        self.spill_or_drop(left).await;
    }

    pub async fn run(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.flush().await;
        }
    }
}
