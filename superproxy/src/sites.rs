//! Health per target site: which exits a site refuses, learnt from real
//! tunnels and shared by the fleet (docs/health.md, "Health per target
//! site").
//!
//! A site is what the target's registrable domain is (an IPv4 literal: its
//! /24; IPv6: its /64; the TLS server name's domain when the pipeline peeked
//! one). Each outcome through an exit for a site is a [`Verdict`]. Failures
//! in a row (`cool_after`, 3; 1 for a pair on probation after an earlier
//! cooldown) cool the exit *for that site only*, for a length that doubles
//! with each repeat (`base` × 2^level, ±20 % jitter, at most `max`). The
//! exit's global health never hears of it: a site's refusal is not the
//! exit's fault.
//!
//! The decision is applied here at once, then written to Redis by one
//! script over the `{sites}` keys (`proxynet_store::site_cooldowns`, the
//! contract the control-api reads too) and announced on the change channel;
//! every other superproxy applies the announcement from memory, without a
//! Redis read. A resync reads every cooldown on each (re)subscription and
//! every 30 s, so a lost announcement costs at most that.
//!
//! The tunnel path reads one map: [`SiteBook::cooling`] for the tunnel's
//! site is `None` (no allocation, no Redis) unless some exit is cooled for
//! it. Selection then skips the cooled exits, unless the site is in panic:
//! when the cooled exits are at least `panic_percent` (95 %) of the
//! eligible pool, cooling is ignored for the site (recomputed each second
//! off the tunnel path), and a pick that finds only cooled exits takes one
//! of them anyway.
//!
//! Beside the fleet's, cooldowns of one account's routing only
//! ([`accounts`]: a customer's `blocked` report, from `POST /v1/feedback`
//! or the `Proxynet-Report` header, [`reports`]), learnt the same way;
//! [`SiteBook::cooling_for`] joins them with the fleet's for that account's
//! tunnels, and costs one atomic load more while no account holds any.
//! The outcomes also feed the busiest sites' success ratios ([`ratios`]).
//!
//! Besides: `streaks` turns outcomes into cooldowns, `fleet` shares them
//! through Redis and resyncs, `upkeep` is the one-second round.

mod accounts;
mod fleet;
mod ratios;
mod reports;
mod streaks;
mod upkeep;

#[cfg(test)]
mod tests;

pub(crate) use reports::ReportedExit;

use proxynet_store::redis_target::RedisConnection;
use proxynet_store::site_cooldowns::{AccountAnnouncement, Announcement};
use proxynet_store::Keys;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use uuid::Uuid;

pub(crate) use crate::select::cooling::{Exits, SiteCooling};
use crate::select::Pool;

/// Most (exit, site) failure streaks held at once: a streak exists only
/// after a failure, and one idle for [`STREAK_IDLE`] is swept.
pub(crate) const MAX_STREAKS: usize = 10_000;

/// A streak without a new failure for this long is forgotten.
const STREAK_IDLE: Duration = Duration::from_secs(600);

/// Most cooldowns the fleet keeps (the script's global bound; also the
/// bound on the levels this instance remembers).
pub(crate) const MAX_COOLDOWNS: usize = 100_000;

/// How often expiries are dropped and the panic flags recomputed.
const TICK: Duration = Duration::from_secs(1);

/// How often every cooldown is read again from Redis, in case an
/// announcement was lost.
const RESYNC_EVERY: Duration = Duration::from_secs(30);

/// No announcement sets a cooldown longer than this (a bound on what a
/// payload can do to a receiver, whatever its sender's configuration).
const LONGEST: Duration = Duration::from_secs(7 * 24 * 3600);

/// The highest back-off level (2^30 × base is far beyond any `max`).
const MAX_LEVEL: u32 = 30;

/// The jitter of a cooldown's length, in permille: ±20 %.
const JITTER_PERMILLE: std::ops::RangeInclusive<u32> = 800..=1200;

/// A tunnel that moved at most this many bytes down before its target
/// closed it was refused within the handshake (a TLS server's first
/// answer alone is larger).
pub(crate) const HANDSHAKE_BYTES: u64 = 64;

/// ... and closed within this long of its start.
pub(crate) const HANDSHAKE_TIME: Duration = Duration::from_secs(10);

/// The thresholds and lengths, from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct SiteSettings {
    /// Failures in a row that cool an exit for a site.
    pub cool_after: u32,
    /// The first cooldown's length.
    pub base: Duration,
    /// The longest cooldown; also how long a level is remembered after its
    /// cooldown ended.
    pub max: Duration,
    /// Cooling is ignored for a site while at least this share of the
    /// eligible exits is cooled for it, %.
    pub panic_percent: u32,
    /// Most sites one exit is cooled for at once (the fleet's bound).
    pub per_exit: usize,
    /// Distinct accounts whose failures must make a streak before it cools
    /// the exit for the whole fleet; fewer cool it for those accounts'
    /// routing only, so no one account can steer everybody's traffic.
    pub cool_accounts: u32,
}

impl Default for SiteSettings {
    fn default() -> Self {
        Self {
            cool_after: 3,
            base: Duration::from_secs(60),
            max: Duration::from_secs(6 * 3600),
            panic_percent: 95,
            per_exit: 64,
            cool_accounts: 2,
        }
    }
}

/// What one tunnel or request through an exit says about a site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The site answered: a failure streak ends.
    Ok,
    /// The agent could not connect: refused, timed out or unreachable.
    Refused,
    /// The target closed the tunnel within the handshake (few bytes down,
    /// soon after it opened).
    HandshakeClosed,
    /// An HTTP answer that says the exit is banned (a status or marker a
    /// retry rule names).
    Banned,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Refused => "refused",
            Verdict::HandshakeClosed => "handshake_closed",
            Verdict::Banned => "banned",
        }
    }

    fn is_failure(self) -> bool {
        !matches!(self, Verdict::Ok)
    }
}

/// Failures in a row of one (exit, site) pair.
#[derive(Debug, Clone)]
struct Streak {
    failures: u32,
    last: Instant,
    /// The accounts whose tunnels failed in the streak (the first few).
    accounts: Vec<Uuid>,
}

/// Accounts a streak remembers: enough for any sensible `cool_accounts`.
const STREAK_ACCOUNTS: usize = 8;

/// An ended cooldown's level, until it is forgotten: a pair on probation
/// cools again at its first failure, for longer.
#[derive(Debug, Clone, Copy)]
struct Remembered {
    level: u32,
    forget_at: Instant,
}

/// The fleet's store of cooldowns.
struct Fleet {
    redis: RedisConnection,
    keys: Keys,
}

/// Every site with an exit cooled for it, the failure streaks that may
/// cool more, and the fleet's copy in Redis.
pub(crate) struct SiteBook {
    settings: SiteSettings,
    sites: RwLock<HashMap<Arc<str>, Arc<SiteCooling>>>,
    streaks: Mutex<HashMap<(Uuid, Arc<str>), Streak>>,
    /// How many streaks there are: a success with none to end takes no lock.
    streak_count: AtomicUsize,
    remembered: Mutex<HashMap<(Uuid, Arc<str>), Remembered>>,
    /// Bumped by every change, so a resync that raced one merges instead of
    /// replacing.
    changes: AtomicU64,
    fleet: Option<Fleet>,
    /// The eligible exits, for the panic rule.
    pool: Option<Arc<Pool>>,
    /// Exits cooled for a site in one account's routing only.
    accounts: accounts::AccountCoolings,
    /// Each user's `Proxynet-Report` rate.
    report_rates: reports::ReportRates,
    /// The busiest sites' recent outcomes.
    ratios: ratios::SuccessRatios,
}

impl SiteBook {
    /// A book of this instance's own (no Redis, no pool: no panic rule but
    /// the pick's fallback) until [`Self::shared`] and [`Self::over`].
    pub(crate) fn new(settings: SiteSettings) -> Self {
        Self {
            settings,
            sites: RwLock::new(HashMap::new()),
            streaks: Mutex::new(HashMap::new()),
            streak_count: AtomicUsize::new(0),
            remembered: Mutex::new(HashMap::new()),
            changes: AtomicU64::new(0),
            fleet: None,
            pool: None,
            accounts: accounts::AccountCoolings::default(),
            report_rates: reports::ReportRates::default(),
            ratios: ratios::SuccessRatios::default(),
        }
    }

    /// Shares cooldowns with the fleet through `redis`.
    pub(crate) fn shared(mut self, redis: RedisConnection, keys: Keys) -> Self {
        self.fleet = Some(Fleet { redis, keys });
        self
    }

    /// Judges the panic rule against `pool`'s eligible exits.
    pub(crate) fn over(mut self, pool: Arc<Pool>) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The exits cooled for `site`, if any: one map read, the tunnel path's
    /// whole cost for a site without a record.
    pub(crate) fn cooling(&self, site: &str) -> Option<Arc<SiteCooling>> {
        let sites = self.sites.read().ok()?;
        sites.get(site).cloned()
    }

    /// The exits cooled for `site` in `account`'s routing: the fleet's
    /// (none while the site is in panic) and the account's own, joined.
    /// While no account holds a cooldown this is [`Self::cooling`] and one
    /// atomic load; a new set is made only when both the fleet and the
    /// account cool some exit for the site.
    pub(crate) fn cooling_for(&self, account: Uuid, site: &str) -> Option<Arc<SiteCooling>> {
        let fleet = self.cooling(site);
        let Some(own) = self.accounts.cooling(account, site) else {
            return fleet;
        };
        match fleet {
            Some(fleet) if !fleet.in_panic() => Some(Arc::new(fleet.joined(&own))),
            _ => Some(own),
        }
    }

    /// Applies a change announced on the events channel: memory only.
    pub(crate) fn apply(&self, announcement: Announcement) {
        match announcement {
            Announcement::Cooled {
                exit,
                site,
                remaining_ms,
                level,
            } => {
                let site = self.site_key(&site);
                let until = later(Instant::now(), Duration::from_millis(remaining_ms));
                self.end_streak(exit, &site);
                self.set(exit, &site, until, level.min(MAX_LEVEL));
            }
            Announcement::Lifted { exit, site } => self.lift(exit, &site),
        }
    }

    /// Applies a change to one account's cooldowns announced on the events
    /// channel: memory only, as [`Self::apply`].
    pub(crate) fn apply_account(&self, announcement: AccountAnnouncement) {
        match announcement {
            AccountAnnouncement::Cooled {
                account,
                exit,
                site,
                remaining_ms,
            } => {
                let until = later(Instant::now(), Duration::from_millis(remaining_ms));
                if !self.accounts.set(account, exit, &site, until) {
                    tracing::debug!(account = %account, exit = %exit, site = %site, "account cooldown not held here: the bound on account cooldowns is reached");
                }
            }
            AccountAnnouncement::Lifted {
                account,
                exit,
                site,
            } => self.accounts.lift(account, exit, &site),
        }
    }

    /// Whether `exit` is cooled for `site` in `account`'s own routing (an
    /// account-scoped cooldown, not the fleet's) at `now`.
    pub(crate) fn cooled_for_account(
        &self,
        account: Uuid,
        exit: Uuid,
        site: &str,
        now: Instant,
    ) -> bool {
        self.accounts
            .cooling(account, site)
            .is_some_and(|c| c.cools(exit, now))
    }

    /// Sets one cooldown here (a copy of the site's cooling with it).
    fn set(&self, exit: Uuid, site: &Arc<str>, until: Instant, level: u32) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        let Ok(mut sites) = self.sites.write() else {
            return;
        };
        let next = match sites.get(site) {
            Some(cooling) => cooling.with(exit, until, level),
            None => SiteCooling::new(site.clone(), HashMap::from([(exit, (until, level))]), false),
        };
        sites.insert(site.clone(), Arc::new(next));
    }

    /// Lifts one cooldown here, and forgets its level (an operator lifted
    /// it, or the fleet's bound evicted it).
    fn lift(&self, exit: Uuid, site: &str) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        if let Ok(mut sites) = self.sites.write() {
            let change = sites
                .get_key_value(site)
                .map(|(key, cooling)| (key.clone(), cooling.without(exit)));
            match change {
                Some((key, Some(rest))) => {
                    sites.insert(key, Arc::new(rest));
                }
                Some((key, None)) => {
                    sites.remove(&key);
                }
                None => {}
            }
        }
        if let Ok(mut remembered) = self.remembered.lock() {
            if !remembered.is_empty() {
                remembered.remove(&(exit, Arc::<str>::from(site)));
            }
        }
    }

    /// The map's own key for `site` when it has one (no new allocation),
    /// else a new one.
    fn site_key(&self, site: &str) -> Arc<str> {
        self.sites
            .read()
            .ok()
            .and_then(|sites| sites.get_key_value(site).map(|(key, _)| key.clone()))
            .unwrap_or_else(|| Arc::from(site))
    }
}

/// A cooldown's length at `level`: `base` × 2^level × `jitter_permille` /
/// 1000, at most `max` (never zero).
pub(crate) fn backoff(base: Duration, max: Duration, level: u32, jitter_permille: u32) -> Duration {
    let ms = millis(base)
        .saturating_mul(1u64 << level.min(MAX_LEVEL))
        .saturating_mul(u64::from(jitter_permille))
        / 1000;
    Duration::from_millis(ms.clamp(1, millis(max).max(1)))
}

/// Whether `cooled` of `eligible` exits put a site in panic at `percent`.
pub(crate) fn panics(cooled: usize, eligible: usize, percent: u32) -> bool {
    eligible > 0
        && cooled.saturating_mul(100) >= (percent.min(100) as usize).saturating_mul(eligible)
}

/// What a CONNECT or SOCKS tunnel's end says about its site: `Ok` when the
/// target sent more than [`HANDSHAKE_BYTES`]; `HandshakeClosed` when the
/// target's side ended first (`exit_ended_first`) with no more than that,
/// within [`HANDSHAKE_TIME`]; nothing for a tunnel cut from outside (a
/// revocation, a drain, a spent quota) or one the client ended.
pub(crate) fn tunnel_verdict(
    down: u64,
    cut: bool,
    exit_ended_first: bool,
    elapsed: Duration,
) -> Option<Verdict> {
    if cut {
        return None;
    }
    if down > HANDSHAKE_BYTES {
        return Some(Verdict::Ok);
    }
    (exit_ended_first && elapsed <= HANDSHAKE_TIME).then_some(Verdict::HandshakeClosed)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `at + d`, never beyond [`LONGEST`] from `at` (and never overflowing).
fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d.min(LONGEST)).unwrap_or(at)
}
