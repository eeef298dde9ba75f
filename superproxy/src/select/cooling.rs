//! The exits cooled for one target site, as selection reads them: what
//! [`crate::sites::SiteBook`] decides (the fleet's cooldowns joined with an
//! account's own) and hands each tunnel's candidates. Here, not beside the
//! book, so selection depends on no more than this value.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use uuid::Uuid;

/// The exits cooled for one site: exit → (until, level).
pub(crate) type Exits = HashMap<Uuid, (Instant, u32)>;

/// The exits cooled for one site. Immutable but for its panic flag: a
/// change replaces it whole, so a tunnel holding one reads a consistent set.
#[derive(Debug)]
pub(crate) struct SiteCooling {
    pub(crate) site: Arc<str>,
    pub(crate) exits: Exits,
    /// Set off the tunnel path while nearly every eligible exit is cooled
    /// for the site: its cooling is then ignored.
    pub(crate) panic: AtomicBool,
}

impl SiteCooling {
    pub(crate) fn new(site: Arc<str>, exits: Exits, panic: bool) -> Self {
        Self {
            site,
            exits,
            panic: AtomicBool::new(panic),
        }
    }

    /// The site it is for.
    pub(crate) fn site(&self) -> &str {
        &self.site
    }

    /// Whether `exit` is cooled for the site at `now`.
    pub(crate) fn cools(&self, exit: Uuid, now: Instant) -> bool {
        self.exits.get(&exit).is_some_and(|(until, _)| *until > now)
    }

    /// `exit`'s cooldown, if it has one (ended or not): until, level.
    #[cfg(test)]
    pub(crate) fn cooldown(&self, exit: Uuid) -> Option<(Instant, u32)> {
        self.exits.get(&exit).copied()
    }

    /// Whether cooling is ignored for the site now (panic).
    pub(crate) fn in_panic(&self) -> bool {
        self.panic.load(Ordering::Relaxed)
    }

    /// A copy with `exit` cooled until `until`, the panic flag kept.
    pub(crate) fn with(&self, exit: Uuid, until: Instant, level: u32) -> Self {
        let mut exits = self.exits.clone();
        exits.insert(exit, (until, level));
        Self::new(self.site.clone(), exits, self.in_panic())
    }

    /// This (the fleet's) cooling of the site joined with one account's
    /// own of it, `own`: an exit either cools is cooled, until the later of
    /// the two. Never in panic: the caller leaves out a fleet's cooling
    /// that is.
    pub(crate) fn joined(&self, own: &SiteCooling) -> Self {
        let mut exits = self.exits.clone();
        for (exit, (until, level)) in &own.exits {
            exits
                .entry(*exit)
                .and_modify(|cooled| {
                    if *until > cooled.0 {
                        cooled.0 = *until;
                    }
                })
                .or_insert((*until, *level));
        }
        Self::new(self.site.clone(), exits, false)
    }

    /// A copy without `exit`; `None` when nothing would be left.
    pub(crate) fn without(&self, exit: Uuid) -> Option<Self> {
        let exits: Exits = self
            .exits
            .iter()
            .filter(|(id, _)| **id != exit)
            .map(|(id, c)| (*id, *c))
            .collect();
        (!exits.is_empty()).then(|| Self::new(self.site.clone(), exits, self.in_panic()))
    }
}
