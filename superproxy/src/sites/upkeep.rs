//! The book's upkeep, every second: ended cooldowns dropped (their level
//! remembered), each site's panic flag recomputed against the eligible
//! pool, idle streaks swept, the busiest sites' success ratios published;
//! every 30 s a resync with the fleet.

use proxynet_common::tasks::Stop;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use uuid::Uuid;

use super::{
    later, panics, Remembered, SiteBook, SiteCooling, MAX_COOLDOWNS, RESYNC_EVERY, STREAK_IDLE,
    TICK,
};

impl SiteBook {
    /// Every second until `stop`: drops ended cooldowns (remembering their
    /// level), recomputes each site's panic flag, sweeps idle streaks and
    /// publishes the busiest sites' success ratios; every 30 s, a resync
    /// (and the report rates of users gone quiet are forgotten).
    pub(crate) async fn run(self: Arc<Self>, stop: Stop) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut resynced = Instant::now();
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            self.upkeep(Instant::now());
            self.ratios.publish();
            if resynced.elapsed() >= RESYNC_EVERY {
                resynced = Instant::now();
                self.report_rates.forget_quiet();
                self.resync().await;
            }
        }
    }

    /// One round of upkeep against the pool's eligible exits now.
    pub(crate) fn upkeep(&self, now: Instant) {
        let view = self.pool.as_ref().map(|pool| pool.view());
        let eligible = view.as_ref().map_or(0, |v| v.eligible.len());
        self.upkeep_against(now, eligible, |id| {
            view.as_ref().is_some_and(|v| v.index.contains_key(id))
        });
    }

    /// [`Self::upkeep`] with the eligible pool given: `eligible` exits, of
    /// which `is_eligible` says which.
    pub(super) fn upkeep_against(
        &self,
        now: Instant,
        eligible: usize,
        is_eligible: impl Fn(&Uuid) -> bool,
    ) {
        let mut active = 0;
        let mut with_ended = Vec::new();
        if let Ok(sites) = self.sites.read() {
            for (site, cooling) in sites.iter() {
                let (mut live, mut cooled_eligible) = (0, 0);
                for (exit, (until, _)) in &cooling.exits {
                    if *until > now {
                        live += 1;
                        if is_eligible(exit) {
                            cooled_eligible += 1;
                        }
                    }
                }
                active += live;
                if live < cooling.exits.len() {
                    with_ended.push(site.clone());
                }
                let panic = panics(cooled_eligible, eligible, self.settings.panic_percent);
                let was = cooling.panic.swap(panic, Ordering::Relaxed);
                if panic && !was {
                    crate::metrics::site_panic("threshold");
                    tracing::warn!(site = %site, cooled = cooled_eligible, eligible, "nearly every eligible exit is cooled for a site: its cooling is ignored (panic)");
                } else if was && !panic {
                    tracing::info!(site = %site, cooled = cooled_eligible, eligible, "a site is out of panic: its cooling applies again");
                }
            }
        }
        if !with_ended.is_empty() {
            self.expire(&with_ended, now);
        }
        if self.streak_count.load(Ordering::Relaxed) > 0 {
            if let Ok(mut streaks) = self.streaks.lock() {
                streaks.retain(|_, s| now.saturating_duration_since(s.last) < STREAK_IDLE);
                self.streak_count.store(streaks.len(), Ordering::Relaxed);
            }
        }
        if let Ok(mut remembered) = self.remembered.lock() {
            remembered.retain(|_, r| r.forget_at > now);
        }
        crate::metrics::site_cooldowns_active(active);
        crate::metrics::site_account_cooldowns_active(self.accounts.sweep(now));
    }

    /// Drops the ended cooldowns of `sites`, remembering their levels.
    fn expire(&self, sites: &[Arc<str>], now: Instant) {
        let mut ended = Vec::new();
        if let Ok(mut map) = self.sites.write() {
            for site in sites {
                let Some(cooling) = map.get(site).cloned() else {
                    continue;
                };
                let mut live = HashMap::new();
                for (exit, (until, level)) in &cooling.exits {
                    if *until > now {
                        live.insert(*exit, (*until, *level));
                    } else {
                        ended.push(((*exit, site.clone()), *until, *level));
                    }
                }
                if live.is_empty() {
                    map.remove(site);
                } else {
                    let kept = SiteCooling::new(site.clone(), live, cooling.in_panic());
                    map.insert(site.clone(), Arc::new(kept));
                }
            }
        }
        if let Ok(mut remembered) = self.remembered.lock() {
            for (pair, until, level) in ended {
                let forget_at = later(until, self.settings.max);
                if forget_at > now && remembered.len() < MAX_COOLDOWNS {
                    remembered.insert(pair, Remembered { level, forget_at });
                }
            }
        }
    }
}
