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

mod accounts;
mod ratios;
mod reports;

pub use ratios::TOP_SITES;
pub use reports::{ReportedExit, REPORTS_PER_MINUTE, REPORT_BURST};

use proxynet_common::tasks::Stop;
use proxynet_store::redis_target::RedisConnection;
use proxynet_store::site_cooldowns::{self, AccountAnnouncement, Announcement, Cooldown};
use proxynet_store::Keys;
use rand::Rng;
use redis::AsyncCommands;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use uuid::Uuid;

pub use crate::select::cooling::{Exits, SiteCooling};
use crate::select::Pool;

/// Most (exit, site) failure streaks held at once: a streak exists only
/// after a failure, and one idle for [`STREAK_IDLE`] is swept.
pub const MAX_STREAKS: usize = 10_000;

/// A streak without a new failure for this long is forgotten.
const STREAK_IDLE: Duration = Duration::from_secs(600);

/// Most cooldowns the fleet keeps (the script's global bound; also the
/// bound on the levels this instance remembers).
pub const MAX_COOLDOWNS: usize = 100_000;

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
pub const HANDSHAKE_BYTES: u64 = 64;

/// ... and closed within this long of its start.
pub const HANDSHAKE_TIME: Duration = Duration::from_secs(10);

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
pub enum Verdict {
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
    pub fn as_str(self) -> &'static str {
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
pub struct SiteBook {
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
    pub fn new(settings: SiteSettings) -> Self {
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
    pub fn shared(mut self, redis: RedisConnection, keys: Keys) -> Self {
        self.fleet = Some(Fleet { redis, keys });
        self
    }

    /// Judges the panic rule against `pool`'s eligible exits.
    pub fn over(mut self, pool: Arc<Pool>) -> Self {
        self.pool = Some(pool);
        self
    }

    pub fn settings(&self) -> SiteSettings {
        self.settings
    }

    /// The exits cooled for `site`, if any: one map read, the tunnel path's
    /// whole cost for a site without a record.
    pub fn cooling(&self, site: &str) -> Option<Arc<SiteCooling>> {
        let sites = self.sites.read().ok()?;
        sites.get(site).cloned()
    }

    /// The exits cooled for `site` in `account`'s routing: the fleet's
    /// (none while the site is in panic) and the account's own, joined.
    /// While no account holds a cooldown this is [`Self::cooling`] and one
    /// atomic load; a new set is made only when both the fleet and the
    /// account cool some exit for the site.
    pub fn cooling_for(&self, account: Uuid, site: &str) -> Option<Arc<SiteCooling>> {
        let fleet = self.cooling(site);
        let Some(own) = self.accounts.cooling(account, site) else {
            return fleet;
        };
        match fleet {
            Some(fleet) if !fleet.in_panic() => Some(Arc::new(fleet.joined(&own))),
            _ => Some(own),
        }
    }

    /// Every site with a cooling now (for views of the whole book).
    pub fn all(&self) -> Vec<Arc<SiteCooling>> {
        self.sites
            .read()
            .map(|sites| sites.values().cloned().collect())
            .unwrap_or_default()
    }

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
    pub fn record(
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
    pub fn record_http(
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

    /// Applies a change announced on the events channel: memory only.
    pub fn apply(&self, announcement: Announcement) {
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
    pub fn apply_account(&self, announcement: AccountAnnouncement) {
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
    pub fn cooled_for_account(&self, account: Uuid, exit: Uuid, site: &str, now: Instant) -> bool {
        self.accounts
            .cooling(account, site)
            .is_some_and(|c| c.cools(exit, now))
    }

    /// Reads every cooldown from Redis and makes them this instance's
    /// (on each subscription to the change channel and every 30 s). A
    /// change applied meanwhile is kept: the read is merged then.
    pub async fn resync(&self) {
        let Some(fleet) = &self.fleet else { return };
        let before = self.changes.load(Ordering::Acquire);
        let mut redis = fleet.redis.clone();
        let read: redis::RedisResult<(i64, Vec<String>)> =
            redis::Script::new(site_cooldowns::READ_SCRIPT)
                .key(fleet.keys.site_cooldowns())
                .invoke_async(&mut redis)
                .await;
        match read {
            Ok((now_ms, flat)) => {
                let merge = self.changes.load(Ordering::Acquire) != before;
                self.replace(now_ms, &flat, Instant::now(), merge);
            }
            Err(e) => {
                crate::metrics::store_error("redis", "site_cooldowns_read");
                tracing::debug!(error = %e, "site cooldowns not read; keeping this instance's copy");
            }
        }
        self.accounts.resync(fleet.redis.clone(), &fleet.keys).await;
    }

    /// Every second until `stop`: drops ended cooldowns (remembering their
    /// level), recomputes each site's panic flag, sweeps idle streaks and
    /// publishes the busiest sites' success ratios; every 30 s, a resync
    /// (and the report rates of users gone quiet are forgotten).
    pub async fn run(self: Arc<Self>, stop: Stop) {
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
    pub fn upkeep(&self, now: Instant) {
        let view = self.pool.as_ref().map(|pool| pool.view());
        let eligible = view.as_ref().map_or(0, |v| v.eligible.len());
        self.upkeep_against(now, eligible, |id| {
            view.as_ref().is_some_and(|v| v.index.contains_key(id))
        });
    }

    /// [`Self::upkeep`] with the eligible pool given: `eligible` exits, of
    /// which `is_eligible` says which.
    fn upkeep_against(&self, now: Instant, eligible: usize, is_eligible: impl Fn(&Uuid) -> bool) {
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

    /// Replaces (or, with `merge`, extends) the cooldowns with what Redis
    /// holds: `flat` is its hash's fields and values, `now_ms` its clock.
    fn replace(&self, now_ms: i64, flat: &[String], now: Instant, merge: bool) {
        let memory = i64::try_from(self.settings.max.as_millis()).unwrap_or(i64::MAX);
        let mut fresh: HashMap<Arc<str>, Exits> = HashMap::new();
        let mut ended = Vec::new();
        for pair in flat.chunks_exact(2) {
            let [field, value] = pair else { continue };
            let (Some((exit, site)), Some(cooldown)) =
                (site_cooldowns::parse_field(field), Cooldown::parse(value))
            else {
                continue;
            };
            let level = cooldown.level.min(MAX_LEVEL);
            let left = cooldown.until_ms.saturating_sub(now_ms);
            let site: Arc<str> = Arc::from(site);
            if left > 0 {
                let until = later(now, Duration::from_millis(left.unsigned_abs()));
                fresh.entry(site).or_default().insert(exit, (until, level));
            } else if left > memory.saturating_neg() {
                let forget_in = Duration::from_millis(memory.saturating_add(left).unsigned_abs());
                ended.push(((exit, site), later(now, forget_in), level));
            }
        }
        if let Ok(mut sites) = self.sites.write() {
            let mut next: HashMap<Arc<str>, Arc<SiteCooling>> = HashMap::with_capacity(fresh.len());
            for (site, mut exits) in fresh {
                let old = sites.get(&site);
                if merge {
                    if let Some(old) = old {
                        for (exit, cooldown) in &old.exits {
                            exits.entry(*exit).or_insert(*cooldown);
                        }
                    }
                }
                let panic = old.is_some_and(|c| c.in_panic());
                next.insert(site.clone(), Arc::new(SiteCooling::new(site, exits, panic)));
            }
            if merge {
                for (site, cooling) in sites.iter() {
                    next.entry(site.clone()).or_insert_with(|| cooling.clone());
                }
            }
            *sites = next;
        }
        if let Ok(mut remembered) = self.remembered.lock() {
            for (pair, forget_at, level) in ended {
                if remembered.len() < MAX_COOLDOWNS || remembered.contains_key(&pair) {
                    remembered.insert(pair, Remembered { level, forget_at });
                }
            }
        }
        self.changes.fetch_add(1, Ordering::AcqRel);
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
    fn end_streak(&self, exit: Uuid, site: &Arc<str>) {
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
    fn remembered_level(&self, exit: Uuid, site: &Arc<str>, now: Instant) -> Option<u32> {
        let remembered = self.remembered.lock().ok()?;
        if remembered.is_empty() {
            return None;
        }
        remembered
            .get(&(exit, site.clone()))
            .filter(|r| r.forget_at > now)
            .map(|r| r.level)
    }

    /// Cools `exit` for `site` at `level`: here at once, then in Redis and
    /// on the change channel (in a task of its own: nothing of it is on the
    /// tunnel's path).
    fn cool(self: &Arc<Self>, exit: Uuid, site: Arc<str>, level: u32, now: Instant) {
        let jitter = rand::thread_rng().gen_range(JITTER_PERMILLE);
        let length = backoff(self.settings.base, self.settings.max, level, jitter);
        self.set(exit, &site, later(now, length), level);
        crate::metrics::site_cooled();
        tracing::info!(exit = %exit, site = %site, level, secs = length.as_secs(), "exit cooled for a site");
        if self.fleet.is_none() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let book = self.clone();
            runtime.spawn(async move { book.share(exit, site, jitter).await });
        }
    }

    /// Writes a cooldown decided here to Redis (which may know a higher
    /// level, or a cooldown another instance set first: its answer is
    /// applied here too) and announces it and what it evicted.
    async fn share(&self, exit: Uuid, site: Arc<str>, jitter: u32) {
        let Some(fleet) = &self.fleet else { return };
        let keys = &fleet.keys;
        let mut redis = fleet.redis.clone();
        let written: redis::RedisResult<(i64, u32, i64, Vec<String>)> =
            redis::Script::new(site_cooldowns::COOL_SCRIPT)
                .key(keys.site_cooldowns())
                .key(keys.site_backoff())
                .key(keys.site_cooldowns_of_exit(exit))
                .arg(site_cooldowns::field(exit, &site))
                .arg(&*site)
                .arg(millis(self.settings.base))
                .arg(millis(self.settings.max))
                .arg(jitter)
                .arg(self.settings.per_exit.max(1))
                .arg(MAX_COOLDOWNS)
                .arg(keys.site_cooldowns_of_exit_stem())
                .invoke_async(&mut redis)
                .await;
        let (remaining_ms, level, fresh, evicted) = match written {
            Ok(written) => written,
            Err(e) => {
                crate::metrics::store_error("redis", "site_cooldown_write");
                tracing::warn!(error = %e, exit = %exit, site = %site, "site cooldown not shared with the fleet; it holds here");
                return;
            }
        };
        let cooled = Announcement::Cooled {
            exit,
            site: site.to_string(),
            remaining_ms: remaining_ms.max(0).unsigned_abs(),
            level,
        };
        let mut payloads = Vec::with_capacity(1 + evicted.len());
        if fresh == 1 {
            payloads.push(cooled.encode());
        }
        self.apply(cooled);
        for field in &evicted {
            if let Some((exit, site)) = site_cooldowns::parse_field(field) {
                let lifted = Announcement::Lifted {
                    exit,
                    site: site.to_owned(),
                };
                payloads.push(lifted.encode());
                self.apply(lifted);
            }
        }
        for payload in payloads {
            let published: redis::RedisResult<()> = redis.publish(keys.events(), payload).await;
            if let Err(e) = published {
                crate::metrics::store_error("redis", "site_cooldown_announce");
                tracing::debug!(error = %e, "site cooldown not announced; the others' resync will find it");
            }
        }
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
pub fn backoff(base: Duration, max: Duration, level: u32, jitter_permille: u32) -> Duration {
    let ms = millis(base)
        .saturating_mul(1u64 << level.min(MAX_LEVEL))
        .saturating_mul(u64::from(jitter_permille))
        / 1000;
    Duration::from_millis(ms.clamp(1, millis(max).max(1)))
}

/// Whether `cooled` of `eligible` exits put a site in panic at `percent`.
pub fn panics(cooled: usize, eligible: usize, percent: u32) -> bool {
    eligible > 0
        && cooled.saturating_mul(100) >= (percent.min(100) as usize).saturating_mul(eligible)
}

/// What a CONNECT or SOCKS tunnel's end says about its site: `Ok` when the
/// target sent more than [`HANDSHAKE_BYTES`]; `HandshakeClosed` when the
/// target's side ended first (`exit_ended_first`) with no more than that,
/// within [`HANDSHAKE_TIME`]; nothing for a tunnel cut from outside (a
/// revocation, a drain, a spent quota) or one the client ended.
pub fn tunnel_verdict(
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn book() -> Arc<SiteBook> {
        Arc::new(SiteBook::new(SiteSettings::default()))
    }

    fn site(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    fn cooled(book: &SiteBook, exit: Uuid, site: &str) -> bool {
        book.cooling(site)
            .is_some_and(|c| c.cools(exit, Instant::now()))
    }

    #[test]
    fn failures_in_a_row_cool_an_exit_for_that_site_only() {
        let book = book();
        let (exit, other) = (Uuid::new_v4(), Uuid::new_v4());
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let (refuser, friendly) = (site("refuser.test"), site("friendly.test"));
        assert!(book.cooling("refuser.test").is_none(), "no record: nothing");
        book.record(a, exit, &refuser, Verdict::Refused, false);
        book.record(b, exit, &refuser, Verdict::HandshakeClosed, false);
        assert!(!cooled(&book, exit, "refuser.test"), "two are not three");
        // A success ends the streak: two more are still not three.
        book.record(a, exit, &refuser, Verdict::Ok, false);
        book.record(a, exit, &refuser, Verdict::Refused, false);
        book.record(b, exit, &refuser, Verdict::Refused, false);
        assert!(!cooled(&book, exit, "refuser.test"));
        book.record(b, exit, &refuser, Verdict::Banned, false);
        assert!(
            cooled(&book, exit, "refuser.test"),
            "three, of two accounts"
        );
        assert!(!cooled(&book, other, "refuser.test"), "another exit");
        assert!(book.cooling("friendly.test").is_none(), "another site");
        book.record(a, exit, &friendly, Verdict::Ok, false);
        assert!(book.cooling("friendly.test").is_none());
        // The cooldown: the base, ±20 %.
        let (until, level) = book
            .cooling("refuser.test")
            .and_then(|c| c.cooldown(exit))
            .unwrap();
        assert_eq!(level, 0);
        let left = until.saturating_duration_since(Instant::now());
        assert!(left <= Duration::from_secs(72), "{left:?}");
        assert!(left >= Duration::from_secs(47), "{left:?}");
        assert_eq!(
            book.streak_count.load(Ordering::Relaxed),
            0,
            "no streak left"
        );
    }

    #[test]
    fn one_accounts_failures_cool_the_exit_for_that_account_only() {
        let book = book();
        let exit = Uuid::new_v4();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let s = site("own-site.test");
        for _ in 0..5 {
            book.record(a, exit, &s, Verdict::Refused, false);
        }
        let now = Instant::now();
        assert!(!cooled(&book, exit, "own-site.test"), "not for the fleet");
        assert!(book.cooled_for_account(a, exit, "own-site.test", now));
        assert!(!book.cooled_for_account(b, exit, "own-site.test", now));
        // Another account's failure corroborates: now the fleet's.
        book.record(b, exit, &s, Verdict::Refused, false);
        assert!(cooled(&book, exit, "own-site.test"));
    }

    #[test]
    fn a_forced_cool_needs_one_failure_and_an_ok_never_cools() {
        let book = book();
        let exit = Uuid::new_v4();
        let a = Uuid::new_v4();
        let s = site("banner.test");
        book.record_http(a, exit, &s, false, true);
        assert!(book.cooling("banner.test").is_none());
        assert!(!book.cooled_for_account(a, exit, "banner.test", Instant::now()));
        // A rule's `cool` is one account's word: its own routing only.
        book.record_http(a, exit, &s, true, true);
        assert!(book.cooled_for_account(a, exit, "banner.test", Instant::now()));
        assert!(!cooled(&book, exit, "banner.test"));
    }

    #[test]
    fn the_back_off_doubles_up_to_its_ceiling_within_its_jitter() {
        let (base, max) = (Duration::from_secs(60), Duration::from_secs(6 * 3600));
        assert_eq!(backoff(base, max, 0, 1000), Duration::from_secs(60));
        assert_eq!(backoff(base, max, 1, 1000), Duration::from_secs(120));
        assert_eq!(backoff(base, max, 3, 1000), Duration::from_secs(480));
        assert_eq!(backoff(base, max, 10, 1000), max);
        assert_eq!(backoff(base, max, 200, 1200), max, "no overflow");
        assert_eq!(backoff(base, max, 0, 800), Duration::from_secs(48));
        assert_eq!(backoff(base, max, 0, 1200), Duration::from_secs(72));
        let mut rng = rand::thread_rng();
        for _ in 0..1000 {
            let jitter = rng.gen_range(JITTER_PERMILLE);
            let length = backoff(base, max, 2, jitter);
            assert!(length >= Duration::from_secs(192) && length <= Duration::from_secs(288));
        }
    }

    #[test]
    fn an_ended_cooldown_is_dropped_and_its_pair_cools_again_at_the_first_failure_for_longer() {
        let book = book();
        let exit = Uuid::new_v4();
        let s = site("flaky.test");
        book.apply(Announcement::Cooled {
            exit,
            site: "flaky.test".into(),
            remaining_ms: 10_000,
            level: 0,
        });
        assert!(cooled(&book, exit, "flaky.test"));
        // Twenty seconds on, it has ended.
        book.upkeep_against(Instant::now() + Duration::from_secs(20), 2, |_| true);
        assert!(book.cooling("flaky.test").is_none(), "ended: dropped");
        // Probation: one failure cools again, at the next level (once a
        // second account's corroborates it).
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        book.record(a, exit, &s, Verdict::Refused, false);
        book.record(b, exit, &s, Verdict::Refused, false);
        let (until, level) = book
            .cooling("flaky.test")
            .and_then(|c| c.cooldown(exit))
            .unwrap();
        assert_eq!(level, 1);
        let left = until.saturating_duration_since(Instant::now());
        assert!(
            left >= Duration::from_secs(95) && left <= Duration::from_secs(144),
            "{left:?}"
        );
        // Failures of an exit already cooled change nothing.
        book.record(a, exit, &s, Verdict::Refused, false);
        assert_eq!(
            book.cooling("flaky.test").and_then(|c| c.cooldown(exit)),
            Some((until, 1))
        );
    }

    #[test]
    fn a_site_panics_when_nearly_every_eligible_exit_is_cooled_for_it() {
        assert!(
            !panics(9, 10, 95),
            "90 % cooled: the other 10 % carry the site"
        );
        assert!(panics(10, 10, 95));
        assert!(panics(95, 100, 95));
        assert!(!panics(94, 100, 95));
        assert!(!panics(0, 0, 95), "no pool, no panic");
        assert!(panics(1, 1, 100));
        let book = book();
        let exits: Vec<Uuid> = (0..4).map(|_| Uuid::new_v4()).collect();
        let eligible: HashSet<Uuid> = exits.iter().copied().collect();
        for exit in &exits[..3] {
            book.apply(Announcement::Cooled {
                exit: *exit,
                site: "wall.test".into(),
                remaining_ms: 60_000,
                level: 0,
            });
        }
        let now = Instant::now();
        book.upkeep_against(now, eligible.len(), |id| eligible.contains(id));
        assert!(!book.cooling("wall.test").unwrap().in_panic(), "3 of 4");
        book.apply(Announcement::Cooled {
            exit: exits[3],
            site: "wall.test".into(),
            remaining_ms: 60_000,
            level: 0,
        });
        assert!(
            !book.cooling("wall.test").unwrap().in_panic(),
            "until the next round"
        );
        book.upkeep_against(now, eligible.len(), |id| eligible.contains(id));
        assert!(book.cooling("wall.test").unwrap().in_panic(), "4 of 4");
        // An exit that left the pool does not count.
        book.upkeep_against(now, 5, |id| eligible.contains(id) && *id != exits[0]);
        assert!(!book.cooling("wall.test").unwrap().in_panic(), "3 of 5");
    }

    #[test]
    fn announcements_apply_from_memory() {
        let book = book();
        let exit = Uuid::new_v4();
        let cooled_msg = Announcement::Cooled {
            exit,
            site: "198.51.100.0/24".into(),
            remaining_ms: 60_000,
            level: 2,
        };
        book.apply(Announcement::parse(&cooled_msg.encode()).unwrap());
        assert!(cooled(&book, exit, "198.51.100.0/24"));
        assert_eq!(
            book.cooling("198.51.100.0/24")
                .and_then(|c| c.cooldown(exit))
                .map(|c| c.1),
            Some(2)
        );
        let lifted = Announcement::Lifted {
            exit,
            site: "198.51.100.0/24".into(),
        };
        book.apply(Announcement::parse(&lifted.encode()).unwrap());
        assert!(book.cooling("198.51.100.0/24").is_none());
        // A payload cannot set more than a week.
        book.apply(Announcement::Cooled {
            exit,
            site: "far.test".into(),
            remaining_ms: u64::MAX,
            level: u32::MAX,
        });
        let (until, level) = book
            .cooling("far.test")
            .and_then(|c| c.cooldown(exit))
            .unwrap();
        assert!(until <= Instant::now() + LONGEST);
        assert_eq!(level, MAX_LEVEL);
    }

    #[test]
    fn an_accounts_cooldowns_join_the_fleets_for_its_tunnels_only() {
        let book = book();
        let (fleet_cooled, reported) = (Uuid::new_v4(), Uuid::new_v4());
        let (account, other) = (Uuid::new_v4(), Uuid::new_v4());
        assert!(book.cooling_for(account, "shop.test").is_none());
        let own = AccountAnnouncement::Cooled {
            account,
            exit: reported,
            site: "shop.test".into(),
            remaining_ms: 60_000,
        };
        book.apply_account(AccountAnnouncement::parse(&own.encode()).unwrap());
        let now = Instant::now();
        assert!(book.cooled_for_account(account, reported, "shop.test", now));
        let mine = book.cooling_for(account, "shop.test").unwrap();
        assert!(mine.cools(reported, now));
        assert!(book.cooling_for(other, "shop.test").is_none());
        assert!(book.cooling("shop.test").is_none(), "not the fleet's");
        // With the fleet's: both, for the account; the fleet's alone for
        // any other account.
        book.apply(Announcement::Cooled {
            exit: fleet_cooled,
            site: "shop.test".into(),
            remaining_ms: 60_000,
            level: 1,
        });
        let joined = book.cooling_for(account, "shop.test").unwrap();
        assert!(joined.cools(reported, now) && joined.cools(fleet_cooled, now));
        assert_eq!(joined.cooldown(fleet_cooled).map(|c| c.1), Some(1));
        assert_eq!(joined.site(), "shop.test");
        let theirs = book.cooling_for(other, "shop.test").unwrap();
        assert!(theirs.cools(fleet_cooled, now) && !theirs.cools(reported, now));
        // The fleet's cooling in panic is left out; the account's own stays.
        book.upkeep_against(now, 1, |id| *id == fleet_cooled);
        assert!(book.cooling("shop.test").unwrap().in_panic());
        let joined = book.cooling_for(account, "shop.test").unwrap();
        assert!(!joined.in_panic());
        assert!(joined.cools(reported, now) && !joined.cools(fleet_cooled, now));
        // Lifted: the account's tunnels see the fleet's cooling again.
        let lifted = AccountAnnouncement::Lifted {
            account,
            exit: reported,
            site: "shop.test".into(),
        };
        book.apply_account(AccountAnnouncement::parse(&lifted.encode()).unwrap());
        assert!(!book.cooled_for_account(account, reported, "shop.test", now));
        assert!(book.cooling_for(account, "shop.test").unwrap().in_panic());
        // A payload cannot cool for more than a week.
        book.apply_account(AccountAnnouncement::Cooled {
            account,
            exit: reported,
            site: "far.test".into(),
            remaining_ms: u64::MAX,
        });
        let (until, _) = book
            .cooling_for(account, "far.test")
            .and_then(|c| c.cooldown(reported))
            .unwrap();
        assert!(until <= Instant::now() + LONGEST);
    }

    #[test]
    fn a_resync_takes_what_redis_holds() {
        let book = book();
        let (live, ended, lifted) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        book.apply(Announcement::Cooled {
            exit: lifted,
            site: "a.test".into(),
            remaining_ms: 60_000,
            level: 0,
        });
        let now_ms = 1_700_000_000_000_i64;
        let flat: Vec<String> = vec![
            site_cooldowns::field(live, "a.test"),
            Cooldown {
                until_ms: now_ms + 30_000,
                level: 1,
            }
            .encode(),
            site_cooldowns::field(ended, "a.test"),
            Cooldown {
                until_ms: now_ms - 30_000,
                level: 2,
            }
            .encode(),
            "garbage".into(),
            "1 2".into(),
        ];
        book.replace(now_ms, &flat, Instant::now(), false);
        assert!(cooled(&book, live, "a.test"));
        assert!(!cooled(&book, ended, "a.test"));
        assert!(
            !cooled(&book, lifted, "a.test"),
            "what Redis lacks is lifted"
        );
        assert_eq!(
            book.remembered_level(ended, &site("a.test"), Instant::now()),
            Some(2)
        );
        // A change that raced the read is kept.
        book.apply(Announcement::Cooled {
            exit: lifted,
            site: "b.test".into(),
            remaining_ms: 60_000,
            level: 0,
        });
        book.replace(now_ms, &flat, Instant::now(), true);
        assert!(cooled(&book, lifted, "b.test"));
        assert!(cooled(&book, live, "a.test"));
    }

    #[test]
    fn a_tunnels_end_is_judged_by_who_ended_it_and_what_came_down() {
        let short = Duration::from_millis(50);
        assert_eq!(
            tunnel_verdict(0, false, true, short),
            Some(Verdict::HandshakeClosed)
        );
        assert_eq!(
            tunnel_verdict(64, false, true, short),
            Some(Verdict::HandshakeClosed)
        );
        assert_eq!(tunnel_verdict(65, false, true, short), Some(Verdict::Ok));
        assert_eq!(
            tunnel_verdict(5_000, false, false, short),
            Some(Verdict::Ok)
        );
        assert_eq!(
            tunnel_verdict(0, false, false, short),
            None,
            "the client ended it"
        );
        assert_eq!(
            tunnel_verdict(0, true, true, short),
            None,
            "cut from outside"
        );
        assert_eq!(
            tunnel_verdict(10, false, true, Duration::from_secs(60)),
            None,
            "not within the handshake"
        );
    }
}
