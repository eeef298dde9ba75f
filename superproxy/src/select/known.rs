//! What the last reads of the pool said, kept for routing through a
//! silent control plane or an absent store: the records, who is live or
//! draining, where this instance is in the change stream, and what the
//! probed links may hold while liveness cannot be trusted.

use super::sync::Read;
use proxynet_store::ExitRecord;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

#[derive(Default)]
pub(super) struct Known {
    pub(super) live: HashSet<Uuid>,
    /// Exits whose agent announced it is draining.
    pub(super) agent_draining: HashSet<Uuid>,
    pub(super) records: HashMap<Uuid, Arc<ExitRecord>>,
    pub(super) last_success: Option<Instant>,
    pub(super) degraded: bool,
    /// The last change entry applied; `None` until the first full read.
    pub(super) cursor: Option<String>,
    /// Redis' clock (ms) at the last read: expiries after it are news.
    pub(super) read_at_ms: i64,
    /// Since when the control plane's presence key has been missing.
    pub(super) control_silent_since: Option<Instant>,
    /// Exits live when the control plane fell silent: the only ones its
    /// grace may hold (empty while it is present).
    pub(super) live_at_silence: HashSet<Uuid>,
    /// Exits live before a full read that replaced our place in the change
    /// stream and not live in it (the store lost them), and until when their
    /// links may hold them.
    pub(super) lost_in_reset: HashSet<Uuid>,
    pub(super) reset_hold_until: Option<Instant>,
    /// When reads succeeded again after the store was away: liveness that
    /// lapses within [`RESET_HOLD`] of it is held like a reset's.
    pub(super) recovered_at: Option<Instant>,
}

/// How long linked, probed exits whose liveness a store reset lost stay
/// eligible while their agents beat again: two default heartbeat TTLs.
pub(crate) const RESET_HOLD: Duration = Duration::from_secs(30);

impl Known {
    /// Records whether the control plane's presence key was there; true
    /// when that changed (a rebuild is due). Called before the read's own
    /// changes are applied, so the exits live when the control plane fell
    /// silent are those of the last read that still saw it; `first_live` is
    /// the live set of the very first read, when there is no earlier one
    /// (no heartbeat lands while the control plane is silent, so what the
    /// store still lists was live when it fell silent).
    pub(super) fn note_control(
        &mut self,
        present: bool,
        first_live: Option<&HashSet<Uuid>>,
    ) -> bool {
        match (present, self.control_silent_since) {
            (true, Some(since)) => {
                tracing::info!(
                    silent_ms = since.elapsed().as_millis() as u64,
                    "the control plane is back"
                );
                self.control_silent_since = None;
                self.live_at_silence = HashSet::new();
                true
            }
            (false, None) => {
                self.live_at_silence = first_live.unwrap_or(&self.live).clone();
                tracing::warn!(
                    live = self.live_at_silence.len(),
                    "the control plane is silent: exits live now stay eligible for the grace period while their links are up and pass their probes"
                );
                self.control_silent_since = Some(Instant::now());
                true
            }
            _ => false,
        }
    }

    /// Whether `id`'s link and probes may stand in for its heartbeats now:
    /// under the control plane's grace if it was live when the control
    /// plane fell silent, or held after a store reset lost its liveness.
    pub(super) fn held_by_link(&self, id: &Uuid, now: Instant, grace: Duration) -> bool {
        let in_grace = self
            .control_silent_since
            .is_some_and(|since| now.saturating_duration_since(since) < grace);
        let reset_hold = self.reset_hold_until.is_some_and(|until| now < until);
        (in_grace && self.live_at_silence.contains(id))
            || (reset_hold && self.lost_in_reset.contains(id))
    }

    /// Applies a read; true if the pool changed.
    pub(super) fn apply(&mut self, read: Read) -> bool {
        let was_degraded = self.degraded;
        self.last_success = Some(Instant::now());
        self.degraded = false;
        match read {
            Read::Full {
                now_ms,
                cursor,
                live,
                agent_draining,
                records,
                control_present,
            } => {
                let first = self.cursor.is_none().then_some(&live);
                let control_changed = self.note_control(control_present, first);
                crate::metrics::pool_read("full", live.len());
                if self.cursor.is_some() {
                    // We had a place: this read replaces a view that was
                    // current, so what it lacks the store may have lost.
                    let lost: HashSet<Uuid> = self.live.difference(&live).copied().collect();
                    if !lost.is_empty() {
                        tracing::info!(
                            exits = lost.len(),
                            "the store no longer lists exits that were live (restart or flush); linked, probed ones stay eligible while their agents beat again"
                        );
                        self.reset_hold_until = Some(Instant::now() + RESET_HOLD);
                    }
                    self.lost_in_reset = lost;
                }
                self.live = live;
                self.agent_draining = agent_draining;
                self.records = records;
                self.cursor = Some(cursor);
                self.read_at_ms = now_ms;
                let _ = control_changed;
                true
            }
            Read::Delta {
                now_ms,
                cursor,
                expired,
                changed,
                control_present,
            } => {
                let control_changed = self.note_control(control_present, None);
                crate::metrics::pool_read("delta", changed.len() + expired.len());
                let any = !changed.is_empty() || !expired.is_empty();
                // Exits whose liveness lapsed while the store was away (its
                // outage, a Sentinel failover) lapsed because no heartbeat
                // could land, not for anything they did: linked, probed
                // ones stay eligible while their agents beat again, as
                // after a store reset.
                if was_degraded {
                    self.recovered_at = Some(Instant::now());
                }
                let recovering = self
                    .recovered_at
                    .is_some_and(|at| at.elapsed() < RESET_HOLD);
                let lapsed: Vec<Uuid> = if recovering {
                    expired
                        .iter()
                        .copied()
                        .chain(changed.iter().filter(|c| !c.live).map(|c| c.id))
                        .filter(|id| self.live.contains(id))
                        .collect()
                } else {
                    Vec::new()
                };
                for c in changed {
                    // Live again, or lapsed again: either way its own news
                    // from now on.
                    self.lost_in_reset.remove(&c.id);
                    if c.live {
                        self.live.insert(c.id);
                    } else {
                        self.live.remove(&c.id);
                    }
                    if c.agent_draining {
                        self.agent_draining.insert(c.id);
                    } else {
                        self.agent_draining.remove(&c.id);
                    }
                    match c.record {
                        Some(record) => {
                            self.records.insert(c.id, Arc::new(record));
                        }
                        None => {
                            self.records.remove(&c.id);
                        }
                    }
                }
                for id in expired {
                    self.lost_in_reset.remove(&id);
                    self.live.remove(&id);
                }
                if !lapsed.is_empty() {
                    tracing::info!(
                        exits = lapsed.len(),
                        "exits' liveness lapsed while the store was away; linked, probed ones stay eligible while their agents beat again"
                    );
                    self.lost_in_reset.extend(lapsed);
                    if let Some(at) = self.recovered_at {
                        self.reset_hold_until = Some(at + RESET_HOLD);
                    }
                }
                self.cursor = Some(cursor);
                self.read_at_ms = now_ms;
                any || was_degraded || control_changed
            }
        }
    }
}

#[cfg(test)]
mod tests;
