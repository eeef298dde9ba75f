//! Reports by header: `Proxynet-Report: blocked` on a request of a sticky
//! session says the site it asks for refused the exit the session is
//! pinned to (docs/health.md, "Reports by header"). It does what an
//! account's `blocked` report to `POST /v1/feedback` does for that account:
//! the exit is cooled for the site in the account's routing — here at once,
//! before this request's exit is chosen (so the session's pin counts as
//! lost), then in Redis with the contract's script
//! ([`site_cooldowns::ACCOUNT_COOL_SCRIPT`], the control-api's) and
//! announced (`acool:`), so every superproxy skips the exit for the
//! account's next tunnels to the site within a second.
//!
//! It never cools the fleet: it is not stored with the API's reports, so
//! it is no corroboration either (one account can never take an exit out
//! of rotation for anybody else). Without a session there is no exit to
//! name, and the header is ignored; so is a session without a pin yet,
//! another value than `blocked`, and every report of a user past
//! [`REPORTS_PER_MINUTE`] (bursts of [`REPORT_BURST`]), counted in
//! `proxynet_site_reports_total{source="header"}` by what became of it.

use governor::{DefaultKeyedRateLimiter, Quota};
use proxynet_store::site_cooldowns::{
    self, AccountAnnouncement, ACCOUNT_COOLDOWNS_PER_ACCOUNT, ACCOUNT_COOLDOWNS_TOTAL,
    ACCOUNT_COOL_MS,
};
use redis::AsyncCommands;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

use super::{later, SiteBook};
use crate::request::SiteReport;

/// Reports by header one user may send a minute, once its burst is spent
/// (the API's rate for a key's reports).
pub(crate) const REPORTS_PER_MINUTE: u32 = 10;

/// Reports by header one user may send at once after a quiet spell.
pub(crate) const REPORT_BURST: u32 = 30;

/// The exit a report names: the one its session is pinned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReportedExit {
    /// The request asked for no session.
    NoSession,
    /// Its session has no pin yet (its first request).
    NoPin,
    /// Its session is pinned to this exit.
    Pinned(Uuid),
}

/// Each user's rate of reports by header.
pub(super) struct ReportRates(DefaultKeyedRateLimiter<Uuid>);

impl Default for ReportRates {
    fn default() -> Self {
        let per_minute = NonZeroU32::new(REPORTS_PER_MINUTE).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(REPORT_BURST).unwrap_or(NonZeroU32::MIN);
        Self(DefaultKeyedRateLimiter::keyed(
            Quota::per_minute(per_minute).allow_burst(burst),
        ))
    }
}

impl ReportRates {
    /// Charges one report to `user`: false past its rate.
    fn allow(&self, user: Uuid) -> bool {
        self.0.check_key(&user).is_ok()
    }

    /// Forgets users gone quiet (bounded memory: only users who reported
    /// within about three minutes are held).
    pub(super) fn forget_quiet(&self) {
        self.0.retain_recent();
        self.0.shrink_to_fit();
    }
}

impl SiteBook {
    /// Takes a `Proxynet-Report` header of `user` (of `account`) on a
    /// request to `site` whose session names `reported`: `blocked` cools
    /// the session's exit for the site in the account's routing, here at
    /// once (the selection that follows skips it) and then for the fleet's
    /// superproxies (Redis, announced), in a task of its own. Everything
    /// else is ignored. Either way counted.
    pub(crate) fn report(
        self: &Arc<Self>,
        report: SiteReport,
        account: Uuid,
        user: Uuid,
        reported: ReportedExit,
        site: Option<&Arc<str>>,
    ) {
        let (verdict, result) = match report {
            SiteReport::Blocked => ("blocked", self.take_blocked(account, user, reported, site)),
            SiteReport::Unrecognized => ("unrecognized", "ignored"),
        };
        crate::metrics::site_report(verdict, result);
    }

    /// A `blocked` report: what became of it (the metric's `result`).
    fn take_blocked(
        self: &Arc<Self>,
        account: Uuid,
        user: Uuid,
        reported: ReportedExit,
        site: Option<&Arc<str>>,
    ) -> &'static str {
        let exit = match reported {
            ReportedExit::NoSession => return "no_session",
            ReportedExit::NoPin => return "no_pin",
            ReportedExit::Pinned(exit) => exit,
        };
        // A UDP association has no one site (and no header to carry a
        // report): nothing to report it for.
        let Some(site) = site else {
            return "ignored";
        };
        // Charged only to reports that would act: a flood of headers
        // without a session costs the limiter nothing.
        if !self.report_rates.allow(user) {
            return "rate_limited";
        }
        tracing::info!(account = %account, exit = %exit, site = %site, "a session's exit reported blocked by its site");
        self.cool_for_account(account, exit, site);
        "cooled"
    }

    /// Cools `exit` for `site` in `account`'s routing only: here at once,
    /// then in Redis and announced to the fleet's superproxies (a task of
    /// its own). What a customer's report does, and what one account's
    /// failures do until other accounts' corroborate them.
    pub(crate) fn cool_for_account(self: &Arc<Self>, account: Uuid, exit: Uuid, site: &Arc<str>) {
        let until = later(Instant::now(), Duration::from_millis(ACCOUNT_COOL_MS));
        if !self.accounts.set(account, exit, site, until) {
            tracing::debug!(account = %account, exit = %exit, site = %site, "exit not cooled here for the account: the bound on account cooldowns is reached");
        }
        tracing::info!(account = %account, exit = %exit, site = %site, "exit cooled for a site in one account's routing");
        crate::metrics::site_account_cooled();
        if self.fleet.is_some() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let (book, site) = (self.clone(), site.clone());
                runtime.spawn(async move { book.share_account(account, exit, site).await });
            }
        }
    }

    /// Writes an account's cooldown to Redis with the contract's script,
    /// as the control-api does for `POST /v1/feedback` (a further report
    /// renews it; beyond the bounds the soonest to end give way), applies
    /// Redis' answer here and announces it and what it evicted.
    async fn share_account(&self, account: Uuid, exit: Uuid, site: Arc<str>) {
        let Some(fleet) = &self.fleet else { return };
        let keys = &fleet.keys;
        let mut redis = fleet.redis.clone();
        let written: redis::RedisResult<(i64, Vec<String>)> =
            redis::Script::new(site_cooldowns::ACCOUNT_COOL_SCRIPT)
                .key(keys.site_account_cooldowns())
                .key(keys.site_account_cooldowns_by_until())
                .key(keys.site_account_cooldowns_of_account(account))
                .arg(site_cooldowns::account_field(account, exit, &site))
                .arg(site_cooldowns::field(exit, &site))
                .arg(ACCOUNT_COOL_MS)
                .arg(ACCOUNT_COOLDOWNS_PER_ACCOUNT)
                .arg(ACCOUNT_COOLDOWNS_TOTAL)
                .arg(account.to_string())
                .invoke_async(&mut redis)
                .await;
        let (remaining_ms, evicted) = match written {
            Ok(written) => written,
            Err(e) => {
                crate::metrics::store_error("redis", "site_account_cooldown_write");
                tracing::warn!(error = %e, account = %account, exit = %exit, site = %site, "reported exit's cooldown not shared with the fleet; it holds here");
                return;
            }
        };
        let cooled = AccountAnnouncement::Cooled {
            account,
            exit,
            site: site.to_string(),
            remaining_ms: remaining_ms.max(0).unsigned_abs(),
        };
        let mut payloads = Vec::with_capacity(1 + evicted.len());
        payloads.push(cooled.encode());
        self.apply_account(cooled);
        for field in &evicted {
            if let Some((account, exit, site)) = site_cooldowns::parse_account_field(field) {
                let lifted = AccountAnnouncement::Lifted {
                    account,
                    exit,
                    site: site.to_owned(),
                };
                payloads.push(lifted.encode());
                self.apply_account(lifted);
            }
        }
        for payload in payloads {
            let published: redis::RedisResult<()> = redis.publish(keys.events(), payload).await;
            if let Err(e) = published {
                crate::metrics::store_error("redis", "site_account_cooldown_announce");
                tracing::debug!(error = %e, "account cooldown not announced; the others' resync will find it");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sites::SiteSettings;

    #[test]
    fn a_blocked_report_cools_the_sessions_exit_for_the_account_and_site_only() {
        let book = Arc::new(SiteBook::new(SiteSettings::default()));
        let (account, other, user) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let (exit, spare) = (Uuid::new_v4(), Uuid::new_v4());
        let site: Arc<str> = Arc::from("shop.test");
        let now = Instant::now();
        // Nothing to name: ignored.
        for reported in [ReportedExit::NoSession, ReportedExit::NoPin] {
            book.report(SiteReport::Blocked, account, user, reported, Some(&site));
        }
        book.report(
            SiteReport::Unrecognized,
            account,
            user,
            ReportedExit::Pinned(exit),
            Some(&site),
        );
        book.report(
            SiteReport::Blocked,
            account,
            user,
            ReportedExit::Pinned(exit),
            None,
        );
        assert!(book.cooling_for(account, "shop.test").is_none());
        // A pinned session's exit: cooled for the account and the site.
        book.report(
            SiteReport::Blocked,
            account,
            user,
            ReportedExit::Pinned(exit),
            Some(&site),
        );
        assert!(book.cooled_for_account(account, exit, "shop.test", now));
        let cooling = book.cooling_for(account, "shop.test").unwrap();
        assert!(cooling.cools(exit, now) && !cooling.cools(spare, now));
        assert!(
            book.cooling_for(other, "shop.test").is_none(),
            "another account"
        );
        assert!(
            book.cooling_for(account, "other.test").is_none(),
            "another site"
        );
        assert!(book.cooling("shop.test").is_none(), "never the fleet");
        // For the contract's half hour.
        let (until, _) = cooling.cooldown(exit).unwrap();
        let left = until.saturating_duration_since(Instant::now());
        assert!(left > Duration::from_secs(29 * 60), "{left:?}");
    }

    #[test]
    fn reports_past_a_users_rate_are_ignored() {
        let book = Arc::new(SiteBook::new(SiteSettings::default()));
        let (account, user, neighbour) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let site: Arc<str> = Arc::from("shop.test");
        let exits: Vec<Uuid> = (0..=REPORT_BURST).map(|_| Uuid::new_v4()).collect();
        for exit in &exits {
            let pinned = ReportedExit::Pinned(*exit);
            book.report(SiteReport::Blocked, account, user, pinned, Some(&site));
        }
        let now = Instant::now();
        let cooled = exits
            .iter()
            .filter(|exit| book.cooled_for_account(account, **exit, "shop.test", now))
            .count();
        assert_eq!(cooled, REPORT_BURST as usize, "the burst, then nothing");
        let last = exits[exits.len() - 1];
        assert!(!book.cooled_for_account(account, last, "shop.test", now));
        // Per user: another user of the account still reports.
        let pinned = ReportedExit::Pinned(last);
        book.report(SiteReport::Blocked, account, neighbour, pinned, Some(&site));
        assert!(book.cooled_for_account(account, last, "shop.test", Instant::now()));
    }
}
