//! One tunnel's candidates, in the order the opener tries them (pingora's
//! `BackendIter` idea): an iterator over one immutable pool snapshot, taken
//! when the tunnel starts choosing, so every draw of a tunnel sees the same
//! pool and takes no lock. The session's pin first when it is usable (or,
//! for a `rotate-tunnel` connection, the exit its last request used), then
//! power-of-two draws from the snapshot, never an exit already tried, at
//! most `cap` in all. A soft session that lost its exit draws as like the
//! lost one as it can ([`Candidates::draw_like`]). A UDP association's
//! candidates are only exits whose link carries UDP: the others are passed
//! over without costing an attempt.
//!
//! A tunnel to a site some exits are cooled for ([`Candidates::for_site`])
//! skips those exits in every draw, unless the site is in panic; a draw
//! that finds only cooled exits takes one of them anyway (a refusal the
//! site may have lifted beats no tunnel at all).

use std::sync::Arc;
use uuid::Uuid;

use super::cooling::SiteCooling;
use super::view::{choose_avoiding, choose_like_avoiding, matches, Candidate, PoolView};
use crate::health::HealthBook;
use crate::link::dial::carries_udp;
use proxynet_store::ExitRecord;
use proxynet_wire::username::Targeting;

/// The exits one tunnel may still try, drawn from one pool snapshot.
pub(crate) struct Candidates<'a> {
    view: Arc<PoolView>,
    health: &'a HealthBook,
    targeting: &'a Targeting,
    tried: Vec<Uuid>,
    cap: usize,
    /// Only exits whose link carries UDP.
    needs_udp: bool,
    /// Exits passed over for not carrying UDP (in `tried`, but no attempt).
    passed_over: usize,
    /// The exits cooled for the tunnel's site, if any is.
    cooling: Option<Arc<SiteCooling>>,
    /// Whether an exit is still eligible in the pool published now: the
    /// snapshot is the tunnel's, the pool moves on meanwhile (a retry can
    /// come seconds later). An exit dropped since (disabled, drained,
    /// blocked, unlinked) is passed over before a session is pinned to it,
    /// costing no attempt. `None`: the snapshot is the truth (unit tests).
    still_live: Option<&'a (dyn Fn(&Uuid) -> bool + Sync)>,
    /// Exits passed over for having left the pool since the snapshot (in
    /// `tried`, but no attempt).
    dropped: usize,
}

/// How many exits a tunnel passes over (an association's without UDP, or
/// exits gone from the pool since the snapshot) before it gives up: a
/// bound on the draws in a pool of mostly older agents, or one emptying.
const MAX_PASSED_OVER: usize = 64;

impl<'a> Candidates<'a> {
    /// At most `cap` candidates from `view` for `targeting`, judged by
    /// `health` (its scores, loads and capacity change under the tunnel; the
    /// pool does not).
    pub(crate) fn new(
        view: Arc<PoolView>,
        health: &'a HealthBook,
        targeting: &'a Targeting,
        cap: usize,
    ) -> Self {
        // Exits the request already went through (a ban retry's) count as
        // tried, so no draw takes them, and cost none of the `cap` attempts.
        let avoided = targeting.avoid.len();
        let mut tried = Vec::with_capacity(cap + avoided);
        tried.extend_from_slice(&targeting.avoid);
        Self {
            view,
            health,
            targeting,
            tried,
            cap: cap + avoided,
            needs_udp: false,
            passed_over: 0,
            cooling: None,
            still_live: None,
            dropped: 0,
        }
    }

    /// Passes over the exits `still_live` says the pool has dropped since
    /// the snapshot.
    pub(crate) fn checking_live(mut self, still_live: &'a (dyn Fn(&Uuid) -> bool + Sync)) -> Self {
        self.still_live = Some(still_live);
        self
    }

    /// Whether `exit` is still in the pool published now (always, without
    /// a check).
    fn live(&self, exit: &Uuid) -> bool {
        self.still_live.is_none_or(|still_live| still_live(exit))
    }

    /// Skips the exits cooled for the tunnel's site (`None`: no exit is).
    pub(crate) fn for_site(mut self, cooling: Option<Arc<SiteCooling>>) -> Self {
        self.cooling = cooling;
        self
    }

    /// The cooling the draws respect: none while the site is in panic.
    fn avoiding(&self) -> Option<&SiteCooling> {
        self.cooling.as_deref().filter(|c| !c.in_panic())
    }

    /// Whether `exit` is cooled for the tunnel's site now (and the site is
    /// not in panic): a session pinned to it does not use it.
    pub(crate) fn cooled(&self, exit: Uuid) -> bool {
        self.avoiding()
            .is_some_and(|c| c.cools(exit, std::time::Instant::now()))
    }

    /// The tunnel's site, when some exit is cooled for it.
    pub(crate) fn site(&self) -> Option<&str> {
        self.cooling.as_deref().map(SiteCooling::site)
    }

    /// Only exits whose link carries UDP (a SOCKS5 UDP association).
    pub(crate) fn needing_udp(mut self, needs_udp: bool) -> Self {
        self.needs_udp = needs_udp;
        self
    }

    /// Whether a matching exit was passed over for not carrying UDP.
    pub(crate) fn passed_over_for_udp(&self) -> bool {
        self.passed_over > 0
    }

    /// The eligible exit `id` of the snapshot, matching the targeting and
    /// carrying what the tunnel needs.
    fn usable(&self, exit: Uuid) -> Option<&Candidate> {
        self.view
            .get(&exit)
            .filter(|c| matches(&c.record, self.targeting))
            .filter(|c| !self.needs_udp || carries_udp(&c.link))
            .filter(|_| self.live(&exit))
    }

    /// Whether `exit`, eligible and matching, cannot carry what is asked
    /// (a session pinned to an exit without UDP asks for an association).
    pub(crate) fn lacks_udp(&self, exit: Uuid) -> bool {
        self.needs_udp
            && self
                .view
                .get(&exit)
                .is_some_and(|c| matches(&c.record, self.targeting) && !carries_udp(&c.link))
    }

    /// What this tunnel's exits must match (the username's asks and the
    /// account's bounds).
    pub(crate) fn targeting(&self) -> &Targeting {
        self.targeting
    }

    /// No attempt is left.
    pub(crate) fn exhausted(&self) -> bool {
        self.tried.len() - self.passed_over - self.dropped >= self.cap
    }

    /// The next exit drawn from the snapshot (power of two choices among
    /// the eligible, matching, untried ones), counted as tried. The first
    /// draw of a tunnel whose targeting prefers an exit (`rotate-tunnel`:
    /// the one the connection's last request used) takes that exit while it
    /// is eligible, matching, healthy and below capacity.
    pub(crate) fn draw(&mut self) -> Option<Candidate> {
        if self.exhausted() {
            return None;
        }
        if let Some(kept) = self.preferred() {
            return Some(kept);
        }
        let (targeting, health) = (self.targeting, self.health);
        self.draw_with(|view, tried, avoid| choose_avoiding(view, health, tried, targeting, avoid))
    }

    /// The next exit for a soft session that lost its pinned exit, whose
    /// last known record is `lost`: the most like it (same country, city and
    /// ASN; then country and city; then country; then any matching exit),
    /// counted as tried. Nothing known of it (a record removed meanwhile):
    /// any will do.
    pub(crate) fn draw_like(&mut self, lost: Option<&ExitRecord>) -> Option<Candidate> {
        let Some(lost) = lost else {
            return self.draw();
        };
        if self.exhausted() {
            return None;
        }
        let (targeting, health) = (self.targeting, self.health);
        self.draw_with(|view, tried, avoid| {
            choose_like_avoiding(view, health, tried, targeting, lost, avoid)
        })
    }

    /// The preferred exit, on the first draw only.
    fn preferred(&mut self) -> Option<Candidate> {
        let kept = self.targeting.prefer.filter(|_| self.tried.is_empty())?;
        if self.targeting.exit.is_some_and(|e| e != kept) || self.cooled(kept) {
            return None;
        }
        let exactly = Targeting {
            exit: Some(kept),
            ..self.targeting.clone()
        };
        let picked = choose_avoiding(&self.view, self.health, &self.tried, &exactly, None)
            .filter(|c| !self.needs_udp || carries_udp(&c.link))
            .filter(|_| self.live(&kept))?;
        self.tried.push(kept);
        Some(picked)
    }

    /// Draws with `pick` until an exit fits the purpose (UDP), or none is
    /// left; past the site's cooled exits unless only they are left.
    fn draw_with(
        &mut self,
        pick: impl Fn(&PoolView, &[Uuid], Option<&SiteCooling>) -> Option<Candidate>,
    ) -> Option<Candidate> {
        loop {
            let (view, tried) = (&*self.view, &self.tried);
            let picked = unless_all_cooled(self.avoiding(), |avoid| pick(view, tried, avoid))?;
            self.tried.push(picked.record.id);
            if !self.live(&picked.record.id) {
                self.dropped += 1;
            } else if !self.needs_udp || carries_udp(&picked.link) {
                return Some(picked);
            } else {
                self.passed_over += 1;
            }
            if self.passed_over + self.dropped >= MAX_PASSED_OVER {
                return None;
            }
        }
    }

    /// Exactly `exit` (a session's pin), if it is eligible, matches the
    /// targeting and was not tried yet; counted as tried.
    pub(crate) fn exactly(&mut self, exit: Uuid) -> Option<Candidate> {
        if self.exhausted() || self.tried.contains(&exit) {
            return None;
        }
        let usable = self.usable(exit)?.clone();
        self.tried.push(exit);
        Some(usable)
    }

    /// `exit` in place of the last candidate drawn, `drawn`, when it is
    /// eligible, matches this request's targeting and was not tried: another
    /// superproxy re-pinned the session first, and the pin it wrote wins.
    pub(crate) fn follow(&mut self, exit: Uuid, drawn: Candidate) -> Candidate {
        if exit == drawn.record.id {
            return drawn;
        }
        if self.tried.contains(&exit) || self.cooled(exit) {
            return drawn;
        }
        match self.usable(exit).cloned() {
            Some(pinned) => {
                if let Some(last) = self.tried.last_mut() {
                    *last = exit;
                }
                pinned
            }
            None => drawn,
        }
    }
}

/// The candidates in the order the opener tries them: [`Candidates::draw`]
/// until no attempt is left.
impl Iterator for Candidates<'_> {
    type Item = Candidate;

    fn next(&mut self) -> Option<Candidate> {
        self.draw()
    }
}

/// `pick` with the site's cooling `avoid`; when that finds nothing and
/// something was avoided, `pick` without it (every exit the tunnel could
/// take is cooled for its site: a refusal the site may have lifted beats no
/// tunnel at all), counted in `proxynet_site_panic_total{reason="fallback"}`.
fn unless_all_cooled<T>(
    avoid: Option<&SiteCooling>,
    pick: impl Fn(Option<&SiteCooling>) -> Option<T>,
) -> Option<T> {
    if let Some(picked) = pick(avoid) {
        return Some(picked);
    }
    // Nothing was avoided: nothing more to try.
    avoid?;
    let picked = pick(None)?;
    crate::metrics::site_panic("fallback");
    Some(picked)
}

#[cfg(test)]
mod tests;
