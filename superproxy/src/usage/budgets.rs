//! The byte budgets of the quota owners (users, accounts) with tunnels
//! here: one [`Budget`] per owner that every tunnel of that owner draws on,
//! refreshed from the shared counter after each batch that reached Redis,
//! and forgotten once the owner has no tunnel here and the shared counter
//! holds every byte again.
//!
//! Its own type because a budget outlives the tunnels that drew on it and
//! only the shared counter's answers (and a Redis outage) decide when it
//! is refreshed or dropped.

use super::meter::{Budget, QuotaOwner};
use proxynet_store::QuotaPeriod;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// What one quota is, as the pipeline asks for it on a new tunnel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuotaSpec {
    pub owner: QuotaOwner,
    pub limit: u64,
    pub period: QuotaPeriod,
    /// Bytes used this period according to the shared counter.
    pub used: u64,
}

/// The budgets, per quota owner.
pub(super) struct Budgets {
    /// Byte budgets of the quota owners (users, accounts) with tunnels here.
    by_owner: Mutex<HashMap<Uuid, Arc<Budget>>>,
    /// A send or replay failed since the last clean flush: budgets stay.
    kept: AtomicBool,
}

impl Budgets {
    pub(super) fn new() -> Self {
        Self {
            by_owner: Mutex::new(HashMap::new()),
            kept: AtomicBool::new(false),
        }
    }

    /// The budget of a quota owner: the running one if it has tunnels here
    /// (and is for the same limit and quota period), else a fresh one of
    /// `limit - used` from the shared counter.
    pub(super) fn budget(&self, spec: &QuotaSpec) -> Arc<Budget> {
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
        match self.by_owner.lock() {
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

    /// Each owner's `spent` now: taken when a batch is collected, before
    /// the meters, so whatever is spent after it is counted as not yet in
    /// the shared counter.
    pub(super) fn spent(&self) -> HashMap<Uuid, u64> {
        self.by_owner
            .lock()
            .map(|b| b.iter().map(|(id, b)| (*id, b.spent())).collect())
            .unwrap_or_default()
    }

    /// After a batch reached the shared counter of `owner` (now at `total`
    /// of `limit`): its budget is what the counter leaves, less what this
    /// instance spent since the batch was collected (`spent_at_collect`;
    /// `None` for a replayed batch, which leaves budgets alone).
    pub(super) fn refresh(
        &self,
        owner: Uuid,
        spent_at_collect: Option<u64>,
        limit: u64,
        total: u64,
    ) {
        if let (Some(at_collect), Some(budget)) = (
            spent_at_collect,
            self.by_owner
                .lock()
                .ok()
                .and_then(|b| b.get(&owner).cloned()),
        ) {
            let unsent = budget.spent().saturating_sub(at_collect);
            budget.reset(limit as i64 - total as i64 - unsent as i64);
        }
    }

    /// A send or replay failed: the budgets are all that holds the quotas
    /// until a clean flush.
    pub(super) fn keep(&self) {
        self.kept.store(true, Ordering::Relaxed);
    }

    /// Whether a send or replay failed since the last call (and clears it).
    pub(super) fn take_kept(&self) -> bool {
        self.kept.swap(false, Ordering::Relaxed)
    }

    /// Forgets the budgets of owners not in `active` (no tunnel here any
    /// more): rebuilt from the shared counter on their next tunnel.
    pub(super) fn retain(&self, active: &HashSet<Uuid>) {
        if let Ok(mut budgets) = self.by_owner.lock() {
            budgets.retain(|owner, _| active.contains(owner));
        }
    }
}
