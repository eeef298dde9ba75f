//! The byte totals this instance publishes for the fleet view: bytes (up,
//! down) per exit since start, and the instance's running totals
//! ([`Stats`]), both advanced by what each flush collected.
//!
//! Its own type because it only ever grows from collected bytes and is
//! read by the fleet view, never by the ledger or the quotas.

use crate::metrics::Stats;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use uuid::Uuid;

/// Bytes per exit and the instance's totals, for the fleet view.
pub(super) struct ExitTotals {
    /// Bytes (up, down) per exit since start, for the fleet view.
    per_exit: Mutex<HashMap<Uuid, (u64, u64)>>,
    /// Where byte totals are counted for the fleet view.
    stats: Arc<Stats>,
}

impl ExitTotals {
    pub(super) fn new(stats: Arc<Stats>) -> Self {
        Self {
            per_exit: Mutex::new(HashMap::new()),
            stats,
        }
    }

    /// Bytes (up, down) through `exit` on this instance since start.
    pub(super) fn get(&self, exit: Uuid) -> (u64, u64) {
        self.per_exit
            .lock()
            .ok()
            .and_then(|m| m.get(&exit).copied())
            .unwrap_or_default()
    }

    /// Forgets exits no longer linked here (bounded memory).
    pub(super) fn retain(&self, linked: &[Uuid]) {
        if let Ok(mut m) = self.per_exit.lock() {
            m.retain(|id, _| linked.contains(id));
        }
    }

    /// Adds one flush's bytes: (exit, up, down) per ledger row.
    pub(super) fn add(&self, moved: impl IntoIterator<Item = (Uuid, u64, u64)>) {
        let (mut up, mut down) = (0, 0);
        let mut exits = self.per_exit.lock().ok();
        for (exit, du, dd) in moved {
            up += du;
            down += dd;
            if let Some(exits) = exits.as_mut() {
                let e = exits.entry(exit).or_default();
                e.0 += du;
                e.1 += dd;
            }
        }
        drop(exits);
        self.stats.bytes(up, down);
    }
}
