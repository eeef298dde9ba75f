//! Exact byte accounting: meters on every tunnel, flushed to the ledger.
//!
//! Every stream to an exit is wrapped in a [`Metered`] reader/writer that
//! counts bytes as they cross it: written to the exit = up (client → target),
//! read from the exit = down. For CONNECT and SOCKS5 that is exactly the tunnel
//! payload; for absolute-form HTTP it is the request and response as relayed
//! (heads included, hop-by-hop fields already removed) — see docs/usage.md.
//!
//! Once a second the [`UsageRecorder`] takes every meter's delta, sums them per
//! (account, user, exit, minute) and appends one batch with a fresh id to the
//! Redis usage stream; meters of finished tunnels are flushed one last time and
//! dropped. If Redis is unreachable the batch is kept and retried (the same
//! batch id, so the ledger cannot count it twice); beyond
//! `usage_memory_batches` in memory, batches go to an append-only spill file
//! (`usage_spill_dir`) and are replayed, oldest first, when Redis answers
//! again — also by the next superproxy started on the same directory.
//!
//! Each batch also advances the shared quota counters of its users. That
//! update is idempotent too: every batch carries this instance's sequence
//! number, and a counter moves only for a sequence number above the last one
//! it applied from this instance, so a batch re-sent after a lost reply never
//! counts twice. A clean shutdown flushes (or spills); `kill -9` loses at
//! most one flush interval.

use proxynet_protocol::redis_target::RedisConnection;
use proxynet_protocol::store::{Keys, QuotaPeriod, TargetRow, UsageBatch, UsageRow};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
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

/// Counters of one tunnel (or one forwarded request's upstream connection).
#[derive(Debug)]
pub struct Meter {
    pub account_id: Uuid,
    pub user_id: Uuid,
    pub exit_id: Uuid,
    /// The user's bandwidth quota, if any: its bytes count against it.
    pub quota: Option<(u64, QuotaPeriod)>,
    up: AtomicU64,
    down: AtomicU64,
    done: AtomicBool,
    /// Set when the user's quota is exhausted: the stream fails its next I/O.
    cut: AtomicBool,
    /// Bytes the user may still move through this instance; shared by all the
    /// user's tunnels here, so one stream is cut within one chunk of its quota.
    budget: Option<Arc<AtomicI64>>,
}

impl Meter {
    pub fn up(&self) -> u64 {
        self.up.load(Ordering::Relaxed)
    }
    pub fn down(&self) -> u64 {
        self.down.load(Ordering::Relaxed)
    }
}

/// Marks its meter finished when dropped, so the next flush is its last.
pub struct MeterHandle(pub Arc<Meter>);

impl Drop for MeterHandle {
    fn drop(&mut self) {
        self.0.done.store(true, Ordering::Release);
    }
}

/// An I/O stream to an exit that counts what crosses it.
pub struct Metered<IO> {
    io: IO,
    meter: MeterHandle,
}

impl<IO> Metered<IO> {
    pub fn new(io: IO, meter: MeterHandle) -> Self {
        Self { io, meter }
    }

    fn count(&self, n: u64) {
        if let Some(budget) = &self.meter.0.budget {
            let n = i64::try_from(n).unwrap_or(i64::MAX);
            if budget.fetch_sub(n, Ordering::Relaxed) - n <= 0 {
                self.meter.0.cut.store(true, Ordering::Relaxed);
            }
        }
    }
}

fn quota_cut() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "bandwidth quota exhausted",
    )
}

impl<IO: AsyncRead + Unpin> AsyncRead for Metered<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.meter.0.cut.load(Ordering::Relaxed) {
            return Poll::Ready(Err(quota_cut()));
        }
        let before = buf.filled().len();
        let result = Pin::new(&mut self.io).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        if n > 0 {
            self.meter.0.down.fetch_add(n, Ordering::Relaxed);
            self.count(n);
        }
        result
    }
}

impl<IO: proxynet_protocol::splice::ChunkIo> proxynet_protocol::splice::ChunkIo for Metered<IO> {
    fn chunked(&self) -> bool {
        self.io.chunked()
    }

    fn poll_read_chunk(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<Option<bytes::Bytes>>> {
        if self.meter.0.cut.load(Ordering::Relaxed) {
            return Poll::Ready(Err(quota_cut()));
        }
        let result = Pin::new(&mut self.io).poll_read_chunk(cx);
        if let Poll::Ready(Ok(Some(chunk))) = &result {
            let n = chunk.len() as u64;
            self.meter.0.down.fetch_add(n, Ordering::Relaxed);
            self.count(n);
        }
        result
    }

    fn poll_write_chunk(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        chunk: &mut bytes::Bytes,
    ) -> Poll<io::Result<usize>> {
        if self.meter.0.cut.load(Ordering::Relaxed) {
            return Poll::Ready(Err(quota_cut()));
        }
        let result = Pin::new(&mut self.io).poll_write_chunk(cx, chunk);
        if let Poll::Ready(Ok(n)) = &result {
            self.meter.0.up.fetch_add(*n as u64, Ordering::Relaxed);
            self.count(*n as u64);
        }
        result
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Metered<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.meter.0.cut.load(Ordering::Relaxed) {
            return Poll::Ready(Err(quota_cut()));
        }
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &result {
            self.meter.0.up.fetch_add(*n as u64, Ordering::Relaxed);
            self.count(*n as u64);
        }
        result
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// What a meter had reported at the last flush.
struct Tracked {
    meter: Arc<Meter>,
    sent_up: u64,
    sent_down: u64,
}

/// One user's share of a batch, for their quota counter.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct QuotaDelta {
    user: Uuid,
    counter: String,
    bytes: u64,
    limit: u64,
    /// Counter expiry, Unix seconds.
    expire_at: i64,
}

/// A batch, the quota counters it advances and its place in this instance's
/// sequence; also the line format of the spill file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Pending {
    batch: UsageBatch,
    seq: u64,
    quota: Vec<QuotaDelta>,
}

pub struct UsageRecorder {
    superproxy_id: Uuid,
    redis: RedisConnection,
    keys: Keys,
    meters: Mutex<Vec<Tracked>>,
    pending: tokio::sync::Mutex<Vec<Pending>>,
    next_seq: AtomicU64,
    spill: Option<Spill>,
    /// Most unsent batches kept in memory; older ones are spilled.
    memory_batches: usize,
    /// Per-user byte budgets of users with quotas and tunnels here.
    budgets: Mutex<HashMap<Uuid, Arc<AtomicI64>>>,
    /// Tunnels opened since the last flush, per abuse-lookup key.
    targets: Mutex<HashMap<TargetKey, u32>>,
    /// Bytes (up, down) per exit since start, for the fleet view.
    exit_bytes: Mutex<HashMap<Uuid, (u64, u64)>>,
    /// Where byte totals are counted (set once at start).
    pub stats: std::sync::OnceLock<Arc<crate::metrics::Stats>>,
}

/// (account, user, exit, egress IP, target host, target port, minute)
type TargetKey = (Uuid, Uuid, Uuid, std::net::IpAddr, String, u16, i64);

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

    /// What `user` may still move here: the running budget if the user has
    /// tunnels on this instance, else `quota - used` from the shared counter.
    pub fn budget_left(&self, user: Uuid, quota: u64, used: u64) -> i64 {
        let fresh = i64::try_from(quota.saturating_sub(used)).unwrap_or(i64::MAX);
        self.budgets
            .lock()
            .map(|mut b| {
                b.entry(user)
                    .or_insert_with(|| Arc::new(AtomicI64::new(fresh)))
                    .load(Ordering::Relaxed)
            })
            .unwrap_or(fresh)
    }

    /// A new meter for a tunnel through `exit_id` on behalf of the user.
    pub fn meter(
        &self,
        account_id: Uuid,
        user_id: Uuid,
        exit_id: Uuid,
        quota: Option<(u64, QuotaPeriod)>,
    ) -> MeterHandle {
        let budget = quota.and_then(|(limit, _)| {
            let fresh = i64::try_from(limit).unwrap_or(i64::MAX);
            self.budgets.lock().ok().map(|mut b| {
                b.entry(user_id)
                    .or_insert_with(|| Arc::new(AtomicI64::new(fresh)))
                    .clone()
            })
        });
        let meter = Arc::new(Meter {
            account_id,
            user_id,
            exit_id,
            quota,
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            done: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            budget,
        });
        if let Ok(mut meters) = self.meters.lock() {
            meters.push(Tracked {
                meter: meter.clone(),
                sent_up: 0,
                sent_down: 0,
            });
        }
        MeterHandle(meter)
    }

    /// Collects every meter's delta into a batch (none if nothing moved).
    fn collect(&self) -> Option<Pending> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let minute = now / 60 * 60;
        let mut sums: HashMap<(Uuid, Uuid, Uuid), (u64, u64)> = HashMap::new();
        let mut quota: HashMap<(Uuid, String), (u64, u64, i64)> = HashMap::new();
        let mut meters = self.meters.lock().ok()?;
        meters.retain_mut(|t| {
            // Read `done` first: bytes counted before it was set are then seen below.
            let done = t.meter.done.load(Ordering::Acquire);
            let (up, down) = (t.meter.up(), t.meter.down());
            let delta = (up - t.sent_up, down - t.sent_down);
            if delta != (0, 0) {
                let entry = sums
                    .entry((t.meter.account_id, t.meter.user_id, t.meter.exit_id))
                    .or_default();
                entry.0 += delta.0;
                entry.1 += delta.1;
                if let Some((limit, period)) = t.meter.quota {
                    let (window, _, end) = period.window(now);
                    let key = self.keys.quota_used(t.meter.user_id, &window);
                    let q = quota
                        .entry((t.meter.user_id, key))
                        .or_insert((0, limit, end));
                    q.0 += delta.0 + delta.1;
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
            for ((_, _, exit), (du, dd)) in &sums {
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
                |((account_id, user_id, exit_id), (bytes_up, bytes_down))| UsageRow {
                    account_id,
                    user_id,
                    exit_id,
                    minute,
                    bytes_up,
                    bytes_down,
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
                .map(|((user, counter), (bytes, limit, end))| QuotaDelta {
                    user,
                    counter,
                    bytes,
                    limit,
                    expire_at: end + 7 * 86_400,
                })
                .collect(),
        })
    }

    /// Stops every tunnel of `user` on this instance at its next read or write.
    fn cut_user(&self, user: Uuid) {
        if let Ok(meters) = self.meters.lock() {
            for t in meters.iter().filter(|t| t.meter.user_id == user) {
                t.meter.cut.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Sends one batch: the stream entry, then each user's quota counter
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
        // Each user's counter lives in that user's slot (on a cluster, maybe
        // each on another node).
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
            // The shared counter is the truth: it includes other instances.
            if let Some(budget) = self
                .budgets
                .lock()
                .ok()
                .and_then(|b| b.get(&delta.user).cloned())
            {
                budget.store(delta.limit as i64 - total as i64, Ordering::Relaxed);
            }
            if total >= delta.limit {
                tracing::info!(user = %delta.user, total, limit = delta.limit, "bandwidth quota exhausted; cutting the user's tunnels");
                self.cut_user(delta.user);
            }
        }
        Ok(())
    }

    /// Collects and sends everything not yet in the stream: spilled batches
    /// first (they are older), then those in memory.
    pub async fn flush(&self) {
        let mut pending = self.pending.lock().await;
        if let Some(batch) = self.collect() {
            pending.push(batch);
        }
        if let Some(spill) = &self.spill {
            if let Err(e) = self.replay(spill).await {
                tracing::warn!(error = %e, "replaying spilled usage failed; keeping it for the next try");
                self.spill_overflow(&mut pending).await;
                return;
            }
        }
        while let Some(next) = pending.first() {
            match self.send(next).await {
                Ok(()) => {
                    pending.remove(0);
                    crate::metrics::usage_batch("flushed");
                }
                Err(e) => {
                    crate::metrics::store_error("redis", "usage_flush");
                    tracing::warn!(error = %e, unsent = pending.len(), "usage flush failed; keeping the batches for the next try");
                    break;
                }
            }
        }
        // Budgets of users with no tunnel here any more are rebuilt from the
        // shared counter on their next tunnel.
        if pending.is_empty() {
            let active: std::collections::HashSet<Uuid> = self
                .meters
                .lock()
                .map(|m| m.iter().map(|t| t.meter.user_id).collect())
                .unwrap_or_default();
            if let Ok(mut budgets) = self.budgets.lock() {
                budgets.retain(|user, _| active.contains(user));
            }
        }
        self.spill_overflow(&mut pending).await;
        crate::metrics::usage_batches(pending.len());
    }

    /// Moves batches beyond the in-memory bound to the spill file (or, with
    /// no spill directory, drops them with an error).
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
                    tracing::warn!(batches = batches.len(), dir = %spill.dir.display(), "usage spilled to disk until Redis returns");
                }
                Err(e) => tracing::error!(error = %e, dropped = batches.len(), "usage batches lost: cannot write the spill file"),
            },
            None => tracing::error!(
                dropped = batches.len(),
                "usage batches dropped after a long Redis outage (set --usage-spill-dir to keep them)"
            ),
        }
    }

    /// Sends every spilled batch, file by file, deleting a file once all of
    /// its batches are in. Re-sending a batch after a crash is harmless.
    async fn replay(&self, spill: &Spill) -> Result<(), String> {
        for file in spill.files().await.map_err(|e| e.to_string())? {
            let text = tokio::fs::read_to_string(&file)
                .await
                .map_err(|e| format!("{}: {e}", file.display()))?;
            let mut sent = 0usize;
            for line in text.lines().filter(|l| !l.trim().is_empty()) {
                let Ok(batch) = serde_json::from_str::<Pending>(line) else {
                    tracing::error!(file = %file.display(), "skipping an unreadable spilled usage line");
                    continue;
                };
                self.send(&batch).await.map_err(|e| e.to_string())?;
                sent += 1;
            }
            tokio::fs::remove_file(&file)
                .await
                .map_err(|e| format!("{}: {e}", file.display()))?;
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

/// The spill directory: one append-only JSON-lines file per superproxy
/// instance (`usage-<id>.jsonl`), each line a [`Pending`] batch.
struct Spill {
    dir: PathBuf,
}

impl Spill {
    async fn append(&self, superproxy: Uuid, batches: &[Pending]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        tokio::fs::create_dir_all(&self.dir).await?;
        let mut text = String::new();
        for b in batches {
            text.push_str(&serde_json::to_string(b).map_err(std::io::Error::other)?);
            text.push('\n');
        }
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("usage-{superproxy}.jsonl")))
            .await?;
        file.write_all(text.as_bytes()).await?;
        file.sync_data().await
    }

    async fn files(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        let mut entries = match tokio::fs::read_dir(&self.dir).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        while let Some(entry) = entries.next_entry().await? {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("usage-") && name.ends_with(".jsonl") {
                out.push(entry.path());
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn metered_streams_count_exactly_what_crosses_them() {
        let (near, mut far) = tokio::io::duplex(1024);
        let meter = Arc::new(Meter {
            account_id: Uuid::nil(),
            user_id: Uuid::nil(),
            exit_id: Uuid::nil(),
            quota: None,
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            done: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            budget: None,
        });
        let mut metered = Metered::new(near, MeterHandle(meter.clone()));
        let writer = tokio::spawn(async move {
            metered.write_all(&vec![1u8; 100_000]).await.unwrap();
            let mut back = vec![0u8; 3_000];
            metered.read_exact(&mut back).await.unwrap();
            drop(metered);
        });
        let mut got = vec![0u8; 100_000];
        far.read_exact(&mut got).await.unwrap();
        far.write_all(&[2u8; 3_000]).await.unwrap();
        writer.await.unwrap();
        assert_eq!((meter.up(), meter.down()), (100_000, 3_000));
        assert!(
            meter.done.load(Ordering::Acquire),
            "dropping the stream finishes the meter"
        );
    }
}
