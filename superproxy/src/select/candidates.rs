//! One tunnel's candidates, in the order the opener tries them (pingora's
//! `BackendIter` idea): the session's pin first when it is usable, then
//! power-of-two draws from the pool snapshot, never an exit already tried,
//! at most `cap` in all.

use uuid::Uuid;

use super::{matches, Candidate, Pool};
use crate::username::Targeting;

/// The exits one tunnel may still try.
pub struct Candidates<'a> {
    pool: &'a Pool,
    targeting: &'a Targeting,
    tried: Vec<Uuid>,
    cap: usize,
}

impl<'a> Candidates<'a> {
    pub fn new(pool: &'a Pool, targeting: &'a Targeting, cap: usize) -> Self {
        Self {
            pool,
            targeting,
            tried: Vec::with_capacity(cap),
            cap,
        }
    }

    /// What this tunnel's exits must match (the username's asks and the
    /// account's bounds).
    pub fn targeting(&self) -> &Targeting {
        self.targeting
    }

    /// No attempt is left.
    pub fn exhausted(&self) -> bool {
        self.tried.len() >= self.cap
    }

    /// The next exit drawn from the pool (power of two choices among the
    /// eligible, matching, untried ones), counted as tried.
    pub fn draw(&mut self) -> Option<Candidate> {
        if self.exhausted() {
            return None;
        }
        let picked = self.pool.pick(&self.tried, self.targeting)?;
        self.tried.push(picked.record.id);
        Some(picked)
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
            .filter(|c| matches(&c.record, self.targeting))?;
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
            .filter(|c| matches(&c.record, self.targeting) && !self.tried.contains(&exit));
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
