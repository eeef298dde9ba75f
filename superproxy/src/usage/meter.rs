//! The hot path of accounting: a [`Meter`] per tunnel counting what crosses
//! it, and the byte [`Budget`]s of the quotas its bytes count against.
//!
//! A quota-bound tunnel *reserves* budget before it moves bytes and moves no
//! more than it reserved: a read or write is cut to what is left (a chunk
//! already received is truncated to it), and what a read or write did not
//! use is given back. Every tunnel of one user (and of one account) on this
//! instance draws on the same budget, so however many tunnels run in
//! parallel, this instance moves no more than the budget it holds: the
//! overshoot is bounded by what other instances moved since their last flush,
//! not by the number of tunnels times a read size.

mod metered;

pub(crate) use metered::Metered;

use proxynet_store::{QuotaPeriod, SourceType};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use uuid::Uuid;

/// Bytes one quota owner (a user, or an account) may still move through
/// this instance.
#[derive(Debug)]
pub(crate) struct Budget {
    left: AtomicI64,
    /// Bytes reserved against it since it was made (net of give-backs), so
    /// a flush can tell which of them the shared counter has not seen yet.
    spent: AtomicU64,
    /// The limit and quota window it was made for: a raised limit or a new
    /// period makes a fresh budget.
    made_for: (u64, String),
}

impl Budget {
    #[cfg(test)]
    pub(crate) fn new(left: i64) -> Self {
        Self::for_window(left, 0, String::new())
    }

    pub(crate) fn for_window(left: i64, limit: u64, window: String) -> Self {
        Self {
            left: AtomicI64::new(left),
            spent: AtomicU64::new(0),
            made_for: (limit, window),
        }
    }

    /// Whether it was made for this limit and quota window.
    pub(crate) fn is_for(&self, limit: u64, window: &str) -> bool {
        self.made_for.0 == limit && self.made_for.1 == window
    }

    /// Takes up to `want` bytes; how many it got (0 when nothing is left).
    pub(crate) fn reserve(&self, want: usize) -> usize {
        let want = i64::try_from(want).unwrap_or(i64::MAX);
        let mut current = self.left.load(Ordering::Relaxed);
        loop {
            if current <= 0 {
                return 0;
            }
            let take = want.min(current);
            match self.left.compare_exchange_weak(
                current,
                current - take,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.spent.fetch_add(take as u64, Ordering::Relaxed);
                    return take as usize;
                }
                Err(now) => current = now,
            }
        }
    }

    /// Gives back reserved bytes that were not moved.
    pub(crate) fn release(&self, n: usize) {
        if n > 0 {
            self.left.fetch_add(n as i64, Ordering::AcqRel);
            self.spent.fetch_sub(n as u64, Ordering::Relaxed);
        }
    }

    pub(crate) fn left(&self) -> i64 {
        self.left.load(Ordering::Relaxed)
    }

    pub(crate) fn spent(&self) -> u64 {
        self.spent.load(Ordering::Acquire)
    }

    /// Replaces what is left (from the shared counter after a flush).
    pub(crate) fn reset(&self, left: i64) {
        self.left.store(left, Ordering::Release);
    }
}

/// Whose quota a budget is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum QuotaOwner {
    User(Uuid),
    Account(Uuid),
}

impl QuotaOwner {
    pub(crate) fn id(self) -> Uuid {
        match self {
            QuotaOwner::User(id) | QuotaOwner::Account(id) => id,
        }
    }
}

/// One quota a tunnel's bytes count against.
#[derive(Debug, Clone)]
pub(crate) struct QuotaBinding {
    pub owner: QuotaOwner,
    pub limit: u64,
    pub period: QuotaPeriod,
    pub budget: Arc<Budget>,
}

/// `Meter::billing`: the bytes are billed (every meter starts so).
const BILLABLE: u8 = 0;
/// `Meter::billing`: whether the bytes are billed is not known yet (an
/// attempt whose answer may turn out a ban the gateway retries elsewhere).
const HELD: u8 = 1;
/// `Meter::billing`: the bytes are recorded as not billable.
const NOT_BILLABLE: u8 = 2;
/// `Meter::billing`: held, then settled as billed (never held again).
const SETTLED_BILLABLE: u8 = 3;
/// Which side of a tunnel ended first, as its exit stream saw it: the exit
/// (its stream ended or failed: the target closed or reset, or the link
/// broke) or the client (it finished sending, so the stream was shut).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndSide {
    Exit,
    Client,
}

const NO_END: u8 = 0;
const EXIT_END: u8 = 1;
const CLIENT_END: u8 = 2;

/// Counters of one tunnel (or one forwarded request's upstream connection).
#[derive(Debug)]
pub(crate) struct Meter {
    pub account_id: Uuid,
    pub user_id: Uuid,
    pub exit_id: Uuid,
    /// The exit's source type when the tunnel opened: what its bytes are billed as.
    pub source_type: Option<SourceType>,
    /// The target's registrable domain (usage by domain); `None` for a UDP
    /// association, whose datagrams go to many.
    pub domain: Option<Arc<str>>,
    /// The quotas its bytes count against (the user's, the account's).
    pub quotas: Vec<QuotaBinding>,
    up: AtomicU64,
    down: AtomicU64,
    pub(super) done: AtomicBool,
    /// Set when a quota is exhausted: the stream fails its next I/O.
    pub(super) cut: AtomicBool,
    /// [`BILLABLE`], [`HELD`], [`NOT_BILLABLE`] or [`SETTLED_BILLABLE`]
    /// (only ever in that order, skipping some): while held, the usage
    /// recorder keeps the meter's bytes out of the ledger (not out of the
    /// quotas: they moved) until it is settled.
    billing: AtomicU8,
    /// Which side ended first ([`EndSide`]; 0 while neither has).
    first_end: AtomicU8,
}

impl Meter {
    pub(crate) fn new(
        account_id: Uuid,
        user_id: Uuid,
        exit_id: Uuid,
        source_type: Option<SourceType>,
        domain: Option<Arc<str>>,
        quotas: Vec<QuotaBinding>,
    ) -> Self {
        Self {
            account_id,
            user_id,
            exit_id,
            source_type,
            domain,
            quotas,
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            done: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            billing: AtomicU8::new(BILLABLE),
            first_end: AtomicU8::new(NO_END),
        }
    }

    /// Holds the meter's bytes back from the ledger until
    /// [`Meter::settle_billing`] says whether they are billed: for an
    /// attempt that may be given up and retried through another exit.
    /// Called before any byte moves; a settled meter stays settled.
    pub(crate) fn hold_billing(&self) {
        let _ = self
            .billing
            .compare_exchange(BILLABLE, HELD, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Settles a held meter: its bytes (all of them, those moved before and
    /// after) are billed or recorded as not billable. Without a hold it
    /// changes nothing: only a held meter's bytes can be unbilled, so a
    /// late call cannot take back bytes already in the ledger as billed.
    pub(crate) fn settle_billing(&self, billable: bool) {
        let settled = if billable {
            SETTLED_BILLABLE
        } else {
            NOT_BILLABLE
        };
        let _ = self
            .billing
            .compare_exchange(HELD, settled, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Whether the meter's bytes are billed: `false` only once settled so.
    /// A meter still held counts as billed (what the ledger records when its
    /// tunnel ends before anyone settled it).
    pub(crate) fn billable(&self) -> bool {
        self.billing.load(Ordering::Acquire) != NOT_BILLABLE
    }

    /// Whether the meter is held ([`Meter::hold_billing`]) and not settled.
    pub(crate) fn billing_held(&self) -> bool {
        self.billing.load(Ordering::Acquire) == HELD
    }

    /// Which side of the tunnel ended first, if either has: what tells a
    /// target that closed a tunnel from a client that was done with it.
    pub(crate) fn first_end(&self) -> Option<EndSide> {
        match self.first_end.load(Ordering::Acquire) {
            EXIT_END => Some(EndSide::Exit),
            CLIENT_END => Some(EndSide::Client),
            _ => None,
        }
    }

    /// Notes that `side` ended, unless one did before.
    fn note_end(&self, side: u8) {
        let _ = self
            .first_end
            .compare_exchange(NO_END, side, Ordering::AcqRel, Ordering::Relaxed);
    }

    pub(crate) fn up(&self) -> u64 {
        self.up.load(Ordering::Relaxed)
    }
    pub(crate) fn down(&self) -> u64 {
        self.down.load(Ordering::Relaxed)
    }

    /// Stops the stream at its next read or write.
    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }

    pub(crate) fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// Reserves up to `want` bytes from every quota's budget: the least any
    /// of them grants. `want` itself when no quota applies.
    fn reserve(&self, want: usize) -> usize {
        let mut take = want;
        for (i, q) in self.quotas.iter().enumerate() {
            let got = q.budget.reserve(take);
            if got < take {
                // The earlier budgets granted more than this one: give it back.
                for earlier in &self.quotas[..i] {
                    earlier.budget.release(take - got);
                }
                take = got;
            }
            if take == 0 {
                break;
            }
        }
        take
    }

    /// Counts one datagram's payload, `up` (client to target) or down: a UDP
    /// association bills payload, not its framing on the link. Reserved
    /// from every quota first; `false` — and the meter cut — when a quota
    /// cannot cover the whole datagram (a datagram is not sent in part).
    pub(crate) fn charge_datagram(&self, up: bool, n: usize) -> bool {
        if self.is_cut() {
            return false;
        }
        if !self.quotas.is_empty() {
            let granted = self.reserve(n);
            if granted < n {
                self.release(granted);
                self.cut();
                return false;
            }
        }
        let counter = if up { &self.up } else { &self.down };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        true
    }

    fn release(&self, n: usize) {
        if n > 0 {
            for q in &self.quotas {
                q.budget.release(n);
            }
        }
    }
}

/// Marks its meter finished when dropped, so the next flush is its last.
pub(crate) struct MeterHandle(pub Arc<Meter>);

impl Drop for MeterHandle {
    fn drop(&mut self) {
        self.0.done.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
