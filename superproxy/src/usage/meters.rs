//! The meters being tracked: every tunnel's [`Meter`] with what it had
//! reported at the last flush, until its last flush after it ended.
//!
//! Its own type because only it takes a meter's deltas (and so only it
//! knows what a flush has taken already), and because the instance
//! stopping changes how it takes them: a meter still held then is billed.

use super::meter::Meter;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use uuid::Uuid;

/// How many flushes a meter whose stream ended still held waits for its
/// settlement (the answer that settles it can be judged just after the
/// upstream connection closed) before its bytes are billed.
pub(super) const HELD_AFTER_DONE_FLUSHES: u8 = 3;

/// What a meter had reported at the last flush.
pub(super) struct Tracked {
    pub(super) meter: Arc<Meter>,
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
pub(super) struct Taken {
    /// Bytes (up, down) moved since the last flush: for the quotas.
    pub(super) moved: (u64, u64),
    /// Bytes (up, down) for the ledger and whether they are billed; `None`
    /// while the meter's billing is held.
    pub(super) billed: Option<((u64, u64), bool)>,
    /// Whether the meter stays tracked.
    pub(super) keep: bool,
}

impl Tracked {
    pub(super) fn new(meter: Arc<Meter>) -> Self {
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
    pub(super) fn take(&mut self, stopping: bool) -> Taken {
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

/// Every meter of this instance still to be flushed.
pub(super) struct MeterBook {
    tracked: Mutex<Vec<Tracked>>,
    /// The instance is stopping: meters still held are billed now, as
    /// nobody will settle them.
    stopping: AtomicBool,
}

impl MeterBook {
    pub(super) fn new() -> Self {
        Self {
            tracked: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
        }
    }

    /// Tracks a new tunnel's meter from the next flush on.
    pub(super) fn track(&self, meter: Arc<Meter>) {
        if let Ok(mut tracked) = self.tracked.lock() {
            tracked.push(Tracked::new(meter));
        }
    }

    /// From now on a meter still held is billed at the next flush.
    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Takes every meter's deltas for one flush, handing each to `each`
    /// (under the lock), and drops the meters whose last flush this was.
    /// `None` when the meters cannot be read (a poisoned lock).
    pub(super) fn take_each(&self, mut each: impl FnMut(&Arc<Meter>, &Taken)) -> Option<()> {
        let stopping = self.stopping.load(Ordering::Relaxed);
        let mut tracked = self.tracked.lock().ok()?;
        tracked.retain_mut(|t| {
            let taken = t.take(stopping);
            each(&t.meter, &taken);
            taken.keep
        });
        Some(())
    }

    /// Stops every tunnel whose bytes count against `owner`'s quota (a user
    /// or an account) on this instance, at its next read or write.
    pub(super) fn cut_owner(&self, owner: Uuid) {
        if let Ok(tracked) = self.tracked.lock() {
            for t in tracked
                .iter()
                .filter(|t| t.meter.quotas.iter().any(|q| q.owner.id() == owner))
            {
                t.meter.cut();
            }
        }
    }

    /// The quota owners with a tracked meter (none when the meters cannot
    /// be read).
    pub(super) fn owners(&self) -> HashSet<Uuid> {
        self.tracked
            .lock()
            .map(|m| {
                m.iter()
                    .flat_map(|t| t.meter.quotas.iter().map(|q| q.owner.id()))
                    .collect()
            })
            .unwrap_or_default()
    }
}
