//! Delivering usage: each flush collects the meters into one batch and sends
//! it to the Redis usage stream (advancing the quota counters in the same
//! script); a batch Redis does not take goes to the spill file, replayed
//! oldest first when Redis answers again; the flush loop and the flush at
//! shutdown.
//!
//! Its own type ([`Delivery`]) because it owns what only delivery touches:
//! the queue of unsent batches, the Redis connection, the spill file and
//! the outage state. It owns the [`Collector`] too, as a batch is collected
//! under the queue's lock (so batches queue in sequence order); the other
//! parts it reaches only through their methods ([`Parts`]).

use super::collect::{Collector, Parts, Pending};
use super::spill::Spill;
use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::Keys;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
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

/// How long a usage batch waits for a replica to acknowledge it (Sentinel).
const REPLICA_WAIT: Duration = Duration::from_secs(1);

/// The collector, the batches it made that Redis has not taken yet, and
/// where they go.
pub(super) struct Delivery {
    collector: Collector,
    redis: RedisConnection,
    pending: tokio::sync::Mutex<Vec<Pending>>,
    spill: Option<Spill>,
    /// Most unsent batches kept in memory (only without a spill directory).
    memory_batches: usize,
    /// Whether the current Redis outage was already logged (one warning
    /// per outage, not one per flush).
    outage_logged: AtomicBool,
}

impl Delivery {
    pub(super) fn new(
        superproxy_id: Uuid,
        redis: RedisConnection,
        keys: Keys,
        spill_dir: Option<PathBuf>,
        memory_batches: usize,
    ) -> Self {
        Self {
            collector: Collector::new(superproxy_id, keys),
            redis,
            pending: tokio::sync::Mutex::new(Vec::new()),
            spill: spill_dir.map(|dir| Spill { dir }),
            memory_batches: memory_batches.max(1),
            outage_logged: AtomicBool::new(false),
        }
    }

    /// Sends one batch: the stream entry, then each owner's quota counter
    /// (both idempotent, so a retry after a lost reply counts nothing twice).
    async fn send(&self, next: &Pending, parts: Parts<'_>) -> Result<(), redis::RedisError> {
        let json = serde_json::to_string(&next.batch).map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Client, "encoding", e.to_string()))
        })?;
        let redis = self.redis.clone();
        // Under Sentinel the batch is delivered once a replica holds it too;
        // otherwise it is sent again (the ledger records a batch id once).
        let _: () = redis
            .query_replicated(
                redis::cmd("XADD")
                    .arg(self.collector.usage_stream())
                    .arg("*")
                    .arg("batch")
                    .arg(json),
                REPLICA_WAIT,
            )
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
            parts
                .budgets
                .refresh(delta.owner, delta.spent_at_collect, delta.limit, total);
            if total >= delta.limit {
                tracing::info!(owner = %delta.owner, total, limit = delta.limit, "bandwidth quota exhausted; cutting its tunnels");
                parts.meters.cut_owner(delta.owner);
            }
        }
        Ok(())
    }

    /// Collects and sends everything not yet in the stream: spilled batches
    /// first (they are older), then those in memory. A batch Redis does not
    /// take goes to the spill file at once (with a spill directory), so
    /// nothing collected lives only in memory beyond one failed send.
    pub(super) async fn flush(&self, parts: Parts<'_>) {
        let mut pending = self.pending.lock().await;
        if let Some(batch) = self.collector.collect(parts) {
            pending.push(batch);
        }
        if let Some(spill) = &self.spill {
            if let Err(e) = self.replay(spill, parts).await {
                parts.budgets.keep();
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
            match self.send(next, parts).await {
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
            parts.budgets.keep();
        }
        let counters_current = !failed
            && pending.is_empty()
            && !parts.budgets.take_kept()
            && self.spill_is_empty().await;
        if !failed && pending.is_empty() && self.outage_logged.swap(false, Ordering::Relaxed) {
            tracing::info!("usage reaches Redis again");
        }
        if counters_current {
            let active = parts.meters.owners();
            parts.budgets.retain(&active);
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
            Some(spill) => match spill.append(self.collector.superproxy_id(), &batches).await {
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
    async fn replay(&self, spill: &Spill, parts: Parts<'_>) -> Result<(), String> {
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
                self.send(&batch, parts).await.map_err(|e| e.to_string())?;
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
    pub(super) async fn flush_for_shutdown(&self, parts: Parts<'_>) {
        // Nobody settles a held meter after this: its bytes are billed.
        parts.meters.stop();
        for _ in 0..5 {
            self.flush(parts).await;
            if self.pending.lock().await.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let mut pending = self.pending.lock().await;
        let left = std::mem::take(&mut *pending);
        self.spill_or_drop(left).await;
    }

    /// Flushes every `every` until `stop`.
    pub(super) async fn run(&self, every: Duration, stop: Stop, parts: Parts<'_>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            self.flush(parts).await;
        }
    }
}
