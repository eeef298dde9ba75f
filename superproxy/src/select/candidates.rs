//! One tunnel's candidates, in the order the opener tries them (pingora's
//! `BackendIter` idea): the session's pin first when it is usable (or, for
//! a `rotate-tunnel` connection, the exit its last request used), then
//! power-of-two draws from the pool snapshot, never an exit already tried,
//! at most `cap` in all. A soft session that lost its exit draws as like
//! the lost one as it can ([`Candidates::draw_like`]). A UDP association's
//! candidates are only exits whose link carries UDP: the others are passed
//! over without costing an attempt.

use uuid::Uuid;

use super::{matches, Candidate, Pool};
use crate::link::dial::carries_udp;
use crate::username::Targeting;

/// The exits one tunnel may still try.
pub struct Candidates<'a> {
    pool: &'a Pool,
    targeting: &'a Targeting,
    tried: Vec<Uuid>,
    cap: usize,
    /// Only exits whose link carries UDP.
    needs_udp: bool,
    /// Exits passed over for not carrying UDP (in `tried`, but no attempt).
    passed_over: usize,
}

/// How many exits a UDP association passes over before it gives up: a
/// bound on the draws in a pool of mostly older agents.
const MAX_PASSED_OVER: usize = 64;

impl<'a> Candidates<'a> {
    pub fn new(pool: &'a Pool, targeting: &'a Targeting, cap: usize) -> Self {
        Self {
            pool,
            targeting,
            tried: Vec::with_capacity(cap),
            cap,
            needs_udp: false,
            passed_over: 0,
        }
    }

    /// Only exits whose link carries UDP (a SOCKS5 UDP association).
    pub fn needing_udp(mut self, needs_udp: bool) -> Self {
        self.needs_udp = needs_udp;
        self
    }

    /// Whether a matching exit was passed over for not carrying UDP.
    pub fn passed_over_for_udp(&self) -> bool {
        self.passed_over > 0
    }

    /// Whether `exit`, eligible and matching, cannot carry what is asked
    /// (a session pinned to an exit without UDP asks for an association).
    pub fn lacks_udp(&self, exit: Uuid) -> bool {
        self.needs_udp
            && self
                .pool
                .eligible(&exit)
                .is_some_and(|c| matches(&c.record, self.targeting) && !carries_udp(&c.link))
    }

    /// What this tunnel's exits must match (the username's asks and the
    /// account's bounds).
    pub fn targeting(&self) -> &Targeting {
        self.targeting
    }

    /// No attempt is left.
    pub fn exhausted(&self) -> bool {
        self.tried.len() - self.passed_over >= self.cap
    }

    /// The next exit drawn from the pool (power of two choices among the
    /// eligible, matching, untried ones), counted as tried. The first draw
    /// of a tunnel whose targeting prefers an exit (`rotate-tunnel`: the one
    /// the connection's last request used) takes that exit while it is
    /// eligible, matching, healthy and below capacity.
    pub fn draw(&mut self) -> Option<Candidate> {
        if self.exhausted() {
            return None;
        }
        if let Some(kept) = self.preferred() {
            return Some(kept);
        }
        let targeting = self.targeting;
        self.draw_with(|pool, tried| pool.pick(tried, targeting))
    }

    /// The next exit for a soft session that lost its pinned exit `lost`:
    /// the most like it (same country, city and ASN; then country and city;
    /// then country; then any matching exit), counted as tried.
    pub fn draw_like(&mut self, lost: Uuid) -> Option<Candidate> {
        if self.exhausted() {
            return None;
        }
        let Some(lost) = self.pool.record(&lost) else {
            // Nothing known of it (a record removed meanwhile): any will do.
            return self.draw();
        };
        let targeting = self.targeting;
        self.draw_with(|pool, tried| pool.pick_like(tried, targeting, &lost))
    }

    /// The preferred exit, on the first draw only.
    fn preferred(&mut self) -> Option<Candidate> {
        let kept = self.targeting.prefer.filter(|_| self.tried.is_empty())?;
        if self.targeting.exit.is_some_and(|e| e != kept) {
            return None;
        }
        let exactly = Targeting {
            exit: Some(kept),
            ..self.targeting.clone()
        };
        let picked = self
            .pool
            .pick(&self.tried, &exactly)
            .filter(|c| !self.needs_udp || carries_udp(&c.link))?;
        self.tried.push(kept);
        Some(picked)
    }

    /// Draws with `pick` until an exit fits the purpose (UDP), or none is left.
    fn draw_with(
        &mut self,
        pick: impl Fn(&Pool, &[Uuid]) -> Option<Candidate>,
    ) -> Option<Candidate> {
        loop {
            let picked = pick(self.pool, &self.tried)?;
            self.tried.push(picked.record.id);
            if !self.needs_udp || carries_udp(&picked.link) {
                return Some(picked);
            }
            self.passed_over += 1;
            if self.passed_over >= MAX_PASSED_OVER {
                return None;
            }
        }
    }

    /// Exactly `exit` (a session's pin), if it is eligible, matches the
    /// targeting and was not tried yet; counted as tried.
    pub fn exactly(&mut self, exit: Uuid) -> Option<Candidate> {
        if self.exhausted() || self.tried.contains(&exit) {
            return None;
        }
        let usable = self
            .pool
            .eligible(&exit)
            .filter(|c| matches(&c.record, self.targeting))
            .filter(|c| !self.needs_udp || carries_udp(&c.link))?;
        self.tried.push(exit);
        Some(usable)
    }

    /// `exit` in place of the last candidate drawn, `drawn`, when it is
    /// eligible, matches this request's targeting and was not tried: another
    /// superproxy re-pinned the session first, and the pin it wrote wins.
    pub fn follow(&mut self, exit: Uuid, drawn: Candidate) -> Candidate {
        if exit == drawn.record.id {
            return drawn;
        }
        let usable = self
            .pool
            .eligible(&exit)
            .filter(|c| matches(&c.record, self.targeting) && !self.tried.contains(&exit))
            .filter(|c| !self.needs_udp || carries_udp(&c.link));
        match usable {
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
