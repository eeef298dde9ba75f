//! Collecting: once a flush, every tracked meter's delta is summed into one
//! [`Pending`] batch — ledger rows per (account, user, exit, source type,
//! domain, billable, minute), the quota counters it advances, the target
//! log — with a fresh batch id and this instance's next sequence number.
//!
//! Its own type because the batch id, the sequence and the counter keys
//! are what make delivery idempotent: only the [`Collector`] hands them
//! out, and it reads the other parts ([`Parts`]) only through their methods.

use super::budgets::Budgets;
use super::exit_totals::ExitTotals;
use super::meter::QuotaOwner;
use super::meters::MeterBook;
use super::target_log::TargetLog;
use proxynet_store::{Keys, QuotaPeriod, SourceType, TargetRow, UsageBatch, UsageRow};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// (account, user, exit, source type, domain, billable): one ledger row
/// per minute.
type RowKey = (Uuid, Uuid, Uuid, Option<SourceType>, Option<Arc<str>>, bool);

/// One quota owner's share of a batch, for its shared counter.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct QuotaDelta {
    /// The user or account whose counter this is.
    #[serde(alias = "user")]
    pub(super) owner: Uuid,
    pub(super) counter: String,
    pub(super) bytes: u64,
    pub(super) limit: u64,
    /// Counter expiry, Unix seconds.
    pub(super) expire_at: i64,
    /// The owner's budget's `spent` when the batch was collected: what it
    /// spent after that is not in this batch (not in the spill file: a
    /// replayed batch leaves budgets alone).
    #[serde(skip)]
    pub(super) spent_at_collect: Option<u64>,
}

/// A batch, the quota counters it advances and its place in this instance's
/// sequence; also the line format of the spill file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Pending {
    pub(super) batch: UsageBatch,
    pub(super) seq: u64,
    pub(super) quota: Vec<QuotaDelta>,
}

/// The parts of the recorder a batch is collected from, and that delivery
/// reports back to (budgets refreshed, tunnels cut).
#[derive(Clone, Copy)]
pub(super) struct Parts<'a> {
    pub(super) meters: &'a MeterBook,
    pub(super) budgets: &'a Budgets,
    pub(super) targets: &'a TargetLog,
    pub(super) exits: &'a ExitTotals,
}

/// Makes batches: their ids, this instance's sequence, the counter keys.
pub(super) struct Collector {
    superproxy_id: Uuid,
    keys: Keys,
    /// The sequence number of the next batch (the quota counters apply a
    /// batch of this instance only above the last one they applied).
    next_seq: AtomicU64,
}

impl Collector {
    pub(super) fn new(superproxy_id: Uuid, keys: Keys) -> Self {
        Self {
            superproxy_id,
            keys,
            next_seq: AtomicU64::new(1),
        }
    }

    /// The instance whose batches these are.
    pub(super) fn superproxy_id(&self) -> Uuid {
        self.superproxy_id
    }

    /// The Redis stream the batches go to.
    pub(super) fn usage_stream(&self) -> String {
        self.keys.usage_stream()
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
    /// whose billing is held ([`super::meter::Meter::hold_billing`]) until
    /// it is settled, and then carry all of its bytes as billable or not; a
    /// meter still held a few flushes after its stream ended, or when the
    /// instance stops, is billed.
    pub(super) fn collect(&self, parts: Parts<'_>) -> Option<Pending> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let minute = now / 60 * 60;
        // Each budget's spend is read before the meters: whatever is spent
        // after it is counted as not yet in the shared counter, so a budget
        // refreshed from this batch errs low, never high.
        let spent = parts.budgets.spent();
        let mut sums: HashMap<RowKey, (u64, u64)> = HashMap::new();
        let mut quota: HashMap<(QuotaOwner, String), (u64, u64, i64)> = HashMap::new();
        parts.meters.take_each(|m, taken| {
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
        })?;
        parts.exits.add(
            sums.iter()
                .map(|((_, _, exit, _, _, _), (du, dd))| (*exit, *du, *dd)),
        );
        let targets: Vec<TargetRow> = parts.targets.drain();
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
}
