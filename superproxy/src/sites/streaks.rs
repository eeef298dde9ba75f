//! Turning outcomes into cooldowns: each (exit, site) pair's failures in
//! a row, the level an ended cooldown leaves for its pair's probation, and
//! the rule that a streak cools the exit for the fleet only once enough
//! distinct accounts' failures make it up (for the failing account's own
//! routing until then).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use uuid::Uuid;

use super::{SiteBook, Streak, Verdict, MAX_LEVEL, MAX_STREAKS, STREAK_ACCOUNTS, STREAK_IDLE};

impl SiteBook {
    /// Records one outcome through `exit` for `site`. A success ends the
    /// pair's failure streak (free when it has none); a failure extends it,
    /// and the one that reaches the threshold — or any, with `force_cool`
    /// (a retry rule that says `cool`) — cools the exit for the site, here
    /// at once and then for the fleet. Failures of an exit already cooled
    /// for the site (an explicit `exit-…`, a panic) change nothing.
    ///
    /// Whose tunnel it was matters: a streak cools the exit for the fleet
    /// only once the failures of `cool_accounts` distinct accounts make it
    /// up; until then — and for a retry rule's `cool`, which one account
    /// wrote — the exit is cooled for the failing `account`'s own routing
    /// (an account cooldown, as a customer's report makes). A customer's own
    /// site that refuses every exit, a closed port, a forged server name or
    /// a rule matching every answer cost that customer alone.
    pub(crate) fn record(
        self: &Arc<Self>,
        account: Uuid,
        exit: Uuid,
        site: &Arc<str>,
        verdict: Verdict,
        force_cool: bool,
    ) {
        crate::metrics::site_outcome(verdict.as_str());
        self.ratios.note(site, !verdict.is_failure());
        if !verdict.is_failure() {
            self.end_streak(exit, site);
            return;
        }
        let now = Instant::now();
        if self.cooling(site).is_some_and(|c| c.cools(exit, now)) {
            return;
        }
        let remembered = self.remembered_level(exit, site, now);
        let threshold = match remembered {
            // On probation after an earlier cooldown: one failure is enough.
            Some(_) => 1,
            None => self.settings.cool_after.max(1),
        };
        let (failures, accounts) = self.add_failure(account, exit, site, now);
        if failures >= threshold && accounts >= self.settings.cool_accounts.max(1) as usize {
            self.end_streak(exit, site);
            let level = remembered.map_or(0, |l| l.saturating_add(1).min(MAX_LEVEL));
            self.cool(exit, site.clone(), level, now);
            return;
        }
        if (force_cool || failures >= threshold)
            && !self.cooled_for_account(account, exit, site, now)
        {
            self.cool_for_account(account, exit, site);
        }
    }

    /// An HTTP answer relayed through `exit` for `site`: banned (a ban
    /// status or marker) or not; `force_cool` cools at once.
    pub(crate) fn record_http(
        self: &Arc<Self>,
        account: Uuid,
        exit: Uuid,
        site: &Arc<str>,
        banned: bool,
        force_cool: bool,
    ) {
        let verdict = if banned { Verdict::Banned } else { Verdict::Ok };
        self.record(account, exit, site, verdict, force_cool && banned);
    }

    /// Adds `account`'s failure to the pair's streak: how long it is now
    /// and how many distinct accounts made it ((0, 0) when the streaks are
    /// full of live pairs: this one goes untracked).
    fn add_failure(
        &self,
        account: Uuid,
        exit: Uuid,
        site: &Arc<str>,
        now: Instant,
    ) -> (u32, usize) {
        let Ok(mut streaks) = self.streaks.lock() else {
            return (0, 0);
        };
        let key = (exit, site.clone());
        if streaks.len() >= MAX_STREAKS && !streaks.contains_key(&key) {
            streaks.retain(|_, s| now.saturating_duration_since(s.last) < STREAK_IDLE);
            if streaks.len() >= MAX_STREAKS {
                self.streak_count.store(streaks.len(), Ordering::Relaxed);
                return (0, 0);
            }
        }
        let streak = streaks.entry(key).or_insert(Streak {
            failures: 0,
            last: now,
            accounts: Vec::new(),
        });
        streak.failures = streak.failures.saturating_add(1);
        streak.last = now;
        if streak.accounts.len() < STREAK_ACCOUNTS && !streak.accounts.contains(&account) {
            streak.accounts.push(account);
        }
        let made = (streak.failures, streak.accounts.len());
        self.streak_count.store(streaks.len(), Ordering::Relaxed);
        made
    }

    /// Ends the pair's failure streak, if it has one.
    pub(super) fn end_streak(&self, exit: Uuid, site: &Arc<str>) {
        if self.streak_count.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Ok(mut streaks) = self.streaks.lock() {
            if streaks.remove(&(exit, site.clone())).is_some() {
                self.streak_count.store(streaks.len(), Ordering::Relaxed);
            }
        }
    }

    /// The level of the pair's last cooldown while it is remembered.
    pub(super) fn remembered_level(
        &self,
        exit: Uuid,
        site: &Arc<str>,
        now: Instant,
    ) -> Option<u32> {
        let remembered = self.remembered.lock().ok()?;
        if remembered.is_empty() {
            return None;
        }
        remembered
            .get(&(exit, site.clone()))
            .filter(|r| r.forget_at > now)
            .map(|r| r.level)
    }
}
