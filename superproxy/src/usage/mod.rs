//! Exact byte accounting: meters on every tunnel, flushed to the ledger.
//!
//! The rooms, each owning its own state: [`meter`] (the hot path: a meter
//! per tunnel and the byte budgets it draws on), [`meters`] (the meters
//! tracked until their last flush, [`meters::MeterBook`]), [`budgets`] (the
//! quota owners' budgets, [`budgets::Budgets`]), [`target_log`] (tunnels
//! opened per target, for abuse lookups), [`exit_totals`] (bytes per exit
//! and the instance's totals, for the fleet view), [`collect`] (summing the
//! meters' deltas into batches, [`collect::Collector`]), [`delivery`]
//! (sending batches to the Redis usage stream and the shared quota
//! counters, the flush loop: [`delivery::Delivery`], which owns the
//! collector) and [`spill`] (the disk file for batches Redis did not take).
//! The [`UsageRecorder`] is only their composition: it hands collection and
//! delivery the other rooms ([`collect::Parts`]), which they reach through
//! their methods alone.
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

mod budgets;
mod collect;
mod delivery;
mod exit_totals;
mod meter;
mod meters;
mod spill;
mod target_log;

pub(crate) use budgets::QuotaSpec;
pub use delivery::ADD_ONCE_SCRIPT;
pub(crate) use meter::{EndSide, Meter, MeterHandle, Metered, QuotaBinding, QuotaOwner};

use budgets::Budgets;
use collect::Parts;
use delivery::Delivery;
use exit_totals::ExitTotals;
use meters::MeterBook;
use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::{Keys, SourceType};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use target_log::TargetLog;
use uuid::Uuid;

/// The byte accounting of this instance: the rooms above, composed; each
/// method hands its work to the room that owns the state.
pub(crate) struct UsageRecorder {
    /// The meters of the tunnels, until their last flush.
    meters: MeterBook,
    /// The quota owners' byte budgets.
    budgets: Budgets,
    /// Tunnels opened per target, for abuse lookups.
    targets: TargetLog,
    /// Bytes per exit and the instance's totals, for the fleet view.
    exits: ExitTotals,
    /// The collector and the unsent batches, Redis and the spill file.
    delivery: Delivery,
}

impl UsageRecorder {
    pub(crate) fn new(
        superproxy_id: Uuid,
        redis: RedisConnection,
        keys: Keys,
        spill_dir: Option<PathBuf>,
        memory_batches: usize,
        stats: Arc<crate::metrics::Stats>,
    ) -> Self {
        Self {
            meters: MeterBook::new(),
            budgets: Budgets::new(),
            targets: TargetLog::new(),
            exits: ExitTotals::new(stats),
            delivery: Delivery::new(superproxy_id, redis, keys, spill_dir, memory_batches),
        }
    }

    /// The rooms collection and delivery read and report back to.
    fn parts(&self) -> Parts<'_> {
        Parts {
            meters: &self.meters,
            budgets: &self.budgets,
            targets: &self.targets,
            exits: &self.exits,
        }
    }

    /// Bytes (up, down) through `exit` on this instance since start.
    pub(crate) fn exit_bytes(&self, exit: Uuid) -> (u64, u64) {
        self.exits.get(exit)
    }

    /// Forgets exits no longer linked here (bounded memory).
    pub(crate) fn retain_exits(&self, linked: &[Uuid]) {
        self.exits.retain(linked);
    }

    /// Notes one opened tunnel for the abuse-lookup record: who reached which
    /// host:port through which egress IP, this minute.
    pub(crate) fn record_target(
        &self,
        account_id: Uuid,
        user_id: Uuid,
        exit_id: Uuid,
        egress_ip: std::net::IpAddr,
        host: String,
        port: u16,
    ) {
        self.targets
            .record(account_id, user_id, exit_id, egress_ip, host, port);
    }

    /// What the owner may still move here (≤ 0: nothing).
    pub(crate) fn budget_left(&self, spec: &QuotaSpec) -> i64 {
        self.budgets.budget(spec).left()
    }

    /// A new meter for a tunnel through `exit_id` on behalf of the user,
    /// bound to `quotas` (the user's and the account's, where set).
    pub(crate) fn meter(
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
                budget: self.budgets.budget(spec),
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
        self.meters.track(meter.clone());
        MeterHandle(meter)
    }

    /// The last flush of a stopping instance: everything in memory reaches
    /// Redis, or the spill file if Redis does not answer within a few tries.
    pub(crate) async fn flush_for_shutdown(&self) {
        self.delivery.flush_for_shutdown(self.parts()).await;
    }

    pub(crate) async fn run(self: Arc<Self>, every: Duration, stop: Stop) {
        self.delivery.run(every, stop, self.parts()).await;
    }
}

#[cfg(test)]
mod tests;
