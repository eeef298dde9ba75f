//! One tunnel's candidates, in the order the opener tries them (pingora's
//! `BackendIter` idea): the session's pin first when it is usable (or, for
//! a `rotate-tunnel` connection, the exit its last request used), then
//! power-of-two draws from the pool snapshot, never an exit already tried,
//! at most `cap` in all. A soft session that lost its exit draws as like
//! the lost one as it can ([`Candidates::draw_like`]). A UDP association's
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
    /// The exits cooled for the tunnel's site, if any is.
    cooling: Option<Arc<SiteCooling>>,
}

/// How many exits a UDP association passes over before it gives up: a
/// bound on the draws in a pool of mostly older agents.
const MAX_PASSED_OVER: usize = 64;

impl<'a> Candidates<'a> {
    pub fn new(pool: &'a Pool, targeting: &'a Targeting, cap: usize) -> Self {
        // Exits the request already went through (a ban retry's) count as
        // tried, so no draw takes them, and cost none of the `cap` attempts.
        let avoided = targeting.avoid.len();
        let mut tried = Vec::with_capacity(cap + avoided);
        tried.extend_from_slice(&targeting.avoid);
        Self {
            pool,
            targeting,
            tried,
            cap: cap + avoided,
            needs_udp: false,
            passed_over: 0,
            cooling: None,
        }
    }

    /// Skips the exits cooled for the tunnel's site (`None`: no exit is).
    pub fn for_site(mut self, cooling: Option<Arc<SiteCooling>>) -> Self {
        self.cooling = cooling;
        self
    }

    /// The cooling the draws respect: none while the site is in panic.
    fn avoiding(&self) -> Option<&SiteCooling> {
        self.cooling.as_deref().filter(|c| !c.in_panic())
    }

    /// Whether `exit` is cooled for the tunnel's site now (and the site is
    /// not in panic): a session pinned to it does not use it.
    pub fn cooled(&self, exit: Uuid) -> bool {
        self.avoiding()
            .is_some_and(|c| c.cools(exit, std::time::Instant::now()))
    }

    /// The tunnel's site, when some exit is cooled for it.
    pub fn site(&self) -> Option<&str> {
        self.cooling.as_deref().map(SiteCooling::site)
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
        self.draw_with(|pool, tried, avoid| pool.pick_avoiding(tried, targeting, avoid))
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
        self.draw_with(|pool, tried, avoid| pool.pick_like(tried, targeting, &lost, avoid))
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
        let picked = self
            .pool
            .pick(&self.tried, &exactly)
            .filter(|c| !self.needs_udp || carries_udp(&c.link))?;
        self.tried.push(kept);
        Some(picked)
    }

    /// Draws with `pick` until an exit fits the purpose (UDP), or none is
    /// left; past the site's cooled exits unless only they are left.
    fn draw_with(
        &mut self,
        pick: impl Fn(&Pool, &[Uuid], Option<&SiteCooling>) -> Option<Candidate>,
    ) -> Option<Candidate> {
        loop {
            let (pool, tried) = (self.pool, &self.tried);
            let picked = unless_all_cooled(self.avoiding(), |avoid| pick(pool, tried, avoid))?;
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
            .filter(|c| !self.needs_udp || carries_udp(&c.link))
            .filter(|_| !self.cooled(exit));
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
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    #[test]
    fn a_pick_ignores_the_cooling_only_when_it_finds_nothing_else() {
        let (cooled, fine) = (Uuid::new_v4(), Uuid::new_v4());
        let until = Instant::now() + Duration::from_secs(60);
        let cooling = SiteCooling::new(
            "refuser.test".into(),
            HashMap::from([(cooled, (until, 0))]),
            false,
        );
        let now = Instant::now();
        // A pool of `exits`: the first not avoided.
        let pick = |exits: &[Uuid]| {
            let exits = exits.to_vec();
            move |avoid: Option<&SiteCooling>| {
                exits
                    .iter()
                    .copied()
                    .find(|e| !avoid.is_some_and(|a| a.cools(*e, now)))
            }
        };
        assert_eq!(
            unless_all_cooled(Some(&cooling), pick(&[cooled, fine])),
            Some(fine)
        );
        assert_eq!(
            unless_all_cooled(Some(&cooling), pick(&[cooled])),
            Some(cooled),
            "only cooled exits left: one of them"
        );
        assert_eq!(unless_all_cooled(None, pick(&[cooled])), Some(cooled));
        assert_eq!(unless_all_cooled(Some(&cooling), pick(&[])), None);
    }

    #[test]
    fn an_accounts_own_cooldowns_are_skipped_for_its_tunnels_only() {
        use crate::sites::{SiteBook, SiteSettings};
        use proxynet_store::site_cooldowns::{AccountAnnouncement, Announcement};

        let book = SiteBook::new(SiteSettings::default());
        let (by_fleet, reported, fine) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let (account, other) = (Uuid::new_v4(), Uuid::new_v4());
        book.apply(Announcement::Cooled {
            exit: by_fleet,
            site: "shop.test".into(),
            remaining_ms: 60_000,
            level: 0,
        });
        book.apply_account(AccountAnnouncement::Cooled {
            account,
            exit: reported,
            site: "shop.test".into(),
            remaining_ms: 60_000,
        });
        let now = Instant::now();
        let pick = |exits: &[Uuid]| {
            let exits = exits.to_vec();
            move |avoid: Option<&SiteCooling>| {
                exits
                    .iter()
                    .copied()
                    .find(|e| !avoid.is_some_and(|a| a.cools(*e, now)))
            }
        };
        let mine = book.cooling_for(account, "shop.test");
        let theirs = book.cooling_for(other, "shop.test");
        assert_eq!(
            unless_all_cooled(mine.as_deref(), pick(&[by_fleet, reported, fine])),
            Some(fine),
            "the account skips both the fleet's and its own"
        );
        assert_eq!(
            unless_all_cooled(theirs.as_deref(), pick(&[by_fleet, reported, fine])),
            Some(reported),
            "another account skips the fleet's only"
        );
        assert_eq!(
            unless_all_cooled(mine.as_deref(), pick(&[reported])),
            Some(reported),
            "only exits cooled for it left: one of them"
        );
        // A site without any record: nothing skipped, nothing allocated.
        assert!(book.cooling_for(account, "other.test").is_none());
    }
}
