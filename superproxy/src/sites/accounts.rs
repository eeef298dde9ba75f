//! Account-scoped cooldowns: an exit cooled for a site in one account's
//! routing only — a customer's `blocked` report, by `POST /v1/feedback` or
//! the `Proxynet-Report` header (docs/health.md, "Customer feedback and
//! the sites API"). Learnt as the fleet's are: from the announcements
//! (`acool:` / `auncool:`, applied from their payload, no Redis read) and a
//! read of the contract's hash on each (re)subscription and every 30 s.
//!
//! Bounded as the contract bounds Redis: at most
//! [`ACCOUNT_COOLDOWNS_PER_ACCOUNT`] per account (the soonest to end gives
//! way) and [`ACCOUNT_COOLDOWNS_TOTAL`] in all (beyond it a new one is not
//! held here; Redis, within the same bound, evicts and announces, and the
//! next resync brings what was missed).
//!
//! The tunnel path asks [`AccountCoolings::cooling`] only through
//! `SiteBook::cooling_for`; while no account holds a cooldown that is one
//! atomic load, and otherwise one map read for the tunnel's account and
//! site. Each (account, site) holds an immutable [`SiteCooling`] (never in
//! panic), replaced whole on change like the fleet's.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use proxynet_store::redis_target::RedisConnection;
use proxynet_store::site_cooldowns::{
    self, ACCOUNT_COOLDOWNS_PER_ACCOUNT, ACCOUNT_COOLDOWNS_TOTAL,
};
use proxynet_store::Keys;
use uuid::Uuid;

use super::{later, Exits, SiteCooling};

/// Most cooldowns held for one account (the contract's bound).
const PER_ACCOUNT: usize = ACCOUNT_COOLDOWNS_PER_ACCOUNT as usize;

/// Most cooldowns held for all accounts together (the contract's bound).
const TOTAL: usize = ACCOUNT_COOLDOWNS_TOTAL as usize;

/// One account's cooled sites.
type Sites = HashMap<Arc<str>, Arc<SiteCooling>>;

/// Every account's own cooldowns.
#[derive(Default)]
pub(super) struct AccountCoolings {
    accounts: RwLock<HashMap<Uuid, Sites>>,
    /// How many (account, exit, site) cooldowns are held: while 0, the
    /// tunnel path takes no lock.
    count: AtomicUsize,
    /// Bumped by every change, so a resync that raced one merges instead
    /// of replacing.
    changes: AtomicU64,
}

impl AccountCoolings {
    /// The exits cooled for `site` in `account`'s routing, if any.
    pub(super) fn cooling(&self, account: Uuid, site: &str) -> Option<Arc<SiteCooling>> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let accounts = self.accounts.read().ok()?;
        accounts.get(&account)?.get(site).cloned()
    }

    /// How many cooldowns are held (ended ones not swept yet included).
    pub(super) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Cools `exit` for `site` in `account`'s routing until `until` (a
    /// later report renews it: the new until replaces the old). At the
    /// account's bound its soonest to end gives way; at the total bound a
    /// new one is not held. Whether it is held.
    pub(super) fn set(&self, account: Uuid, exit: Uuid, site: &str, until: Instant) -> bool {
        self.changes.fetch_add(1, Ordering::AcqRel);
        let Ok(mut accounts) = self.accounts.write() else {
            return false;
        };
        let known = accounts
            .get(&account)
            .and_then(|sites| sites.get(site))
            .is_some_and(|cooling| cooling.exits.contains_key(&exit));
        if !known {
            if self.count.load(Ordering::Relaxed) >= TOTAL {
                return false;
            }
            if let Some(sites) = accounts.get_mut(&account) {
                if held(sites) >= PER_ACCOUNT && evict_soonest(sites) {
                    self.count.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        let sites = accounts.entry(account).or_default();
        let next = match sites.get_key_value(site) {
            Some((key, cooling)) => (key.clone(), cooling.with(exit, until, 0)),
            None => {
                let key: Arc<str> = Arc::from(site);
                let cooling =
                    SiteCooling::new(key.clone(), HashMap::from([(exit, (until, 0))]), false);
                (key, cooling)
            }
        };
        sites.insert(next.0, Arc::new(next.1));
        if !known {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Lifts `account`'s cooldown of `exit` for `site`, if it holds one.
    pub(super) fn lift(&self, account: Uuid, exit: Uuid, site: &str) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        let Ok(mut accounts) = self.accounts.write() else {
            return;
        };
        let Some(sites) = accounts.get_mut(&account) else {
            return;
        };
        if remove(sites, exit, site) {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
        if sites.is_empty() {
            accounts.remove(&account);
        }
    }

    /// Drops the cooldowns that have ended by `now`; how many are left.
    /// Takes the write lock only when something ended (off the tunnel
    /// path, every second, and only while some account holds any).
    pub(super) fn sweep(&self, now: Instant) -> usize {
        if self.count.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let any_ended = self
            .accounts
            .read()
            .map(|accounts| {
                accounts
                    .values()
                    .flat_map(Sites::values)
                    .any(|cooling| has_ended(cooling, now))
            })
            .unwrap_or(false);
        if !any_ended {
            return self.len();
        }
        let Ok(mut accounts) = self.accounts.write() else {
            return self.len();
        };
        let mut count = 0;
        accounts.retain(|_, sites| {
            sites.retain(|_, cooling| {
                if has_ended(cooling, now) {
                    let live: Exits = cooling
                        .exits
                        .iter()
                        .filter(|(_, (until, _))| *until > now)
                        .map(|(exit, cooldown)| (*exit, *cooldown))
                        .collect();
                    if live.is_empty() {
                        return false;
                    }
                    *cooling = Arc::new(SiteCooling::new(cooling.site.clone(), live, false));
                }
                count += cooling.exits.len();
                true
            });
            !sites.is_empty()
        });
        self.count.store(count, Ordering::Relaxed);
        count
    }

    /// Reads every account-scoped cooldown from Redis and makes them this
    /// instance's (with the fleet's: on each subscription and every 30 s).
    /// A change applied meanwhile is kept: the read is merged then.
    pub(super) async fn resync(&self, mut redis: RedisConnection, keys: &Keys) {
        let before = self.changes.load(Ordering::Acquire);
        let read: redis::RedisResult<(i64, Vec<String>)> =
            redis::Script::new(site_cooldowns::READ_SCRIPT)
                .key(keys.site_account_cooldowns())
                .invoke_async(&mut redis)
                .await;
        match read {
            Ok((now_ms, flat)) => {
                let merge = self.changes.load(Ordering::Acquire) != before;
                self.replace(now_ms, &flat, Instant::now(), merge);
            }
            Err(e) => {
                crate::metrics::store_error("redis", "site_account_cooldowns_read");
                tracing::debug!(error = %e, "account site cooldowns not read; keeping this instance's copy");
            }
        }
    }

    /// Replaces (or, with `merge`, extends) the cooldowns with what Redis
    /// holds: `flat` is its hash's fields (`ACCOUNT EXIT SITE`) and values
    /// (`UNTIL_MS`), `now_ms` its clock. Ended ones are left out; so is
    /// what lies beyond the bounds.
    pub(super) fn replace(&self, now_ms: i64, flat: &[String], now: Instant, merge: bool) {
        let mut fresh: HashMap<Uuid, HashMap<Arc<str>, Exits>> = HashMap::new();
        let mut per_account: HashMap<Uuid, usize> = HashMap::new();
        let mut count = 0;
        for pair in flat.chunks_exact(2) {
            let [field, value] = pair else { continue };
            let (Some((account, exit, site)), Ok(until_ms)) = (
                site_cooldowns::parse_account_field(field),
                value.parse::<i64>(),
            ) else {
                continue;
            };
            let left = until_ms.saturating_sub(now_ms);
            if left <= 0 || count >= TOTAL {
                continue;
            }
            let held = per_account.entry(account).or_insert(0);
            if *held >= PER_ACCOUNT {
                continue;
            }
            let until = later(now, Duration::from_millis(left.unsigned_abs()));
            let exits = fresh
                .entry(account)
                .or_default()
                .entry(Arc::from(site))
                .or_default();
            if exits.insert(exit, (until, 0)).is_none() {
                *held += 1;
                count += 1;
            }
        }
        let Ok(mut accounts) = self.accounts.write() else {
            return;
        };
        if merge {
            for (account, sites) in accounts.iter() {
                for (site, cooling) in sites {
                    let exits = fresh
                        .entry(*account)
                        .or_default()
                        .entry(site.clone())
                        .or_default();
                    for (exit, cooldown) in &cooling.exits {
                        if let Entry::Vacant(vacant) = exits.entry(*exit) {
                            vacant.insert(*cooldown);
                            count += 1;
                        }
                    }
                }
            }
        }
        *accounts = fresh
            .into_iter()
            .map(|(account, sites)| {
                let sites: Sites = sites
                    .into_iter()
                    .filter(|(_, exits)| !exits.is_empty())
                    .map(|(site, exits)| {
                        let cooling = SiteCooling::new(site.clone(), exits, false);
                        (site, Arc::new(cooling))
                    })
                    .collect();
                (account, sites)
            })
            .filter(|(_, sites)| !sites.is_empty())
            .collect();
        self.count.store(count, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::AcqRel);
    }
}

/// Whether some cooldown of `cooling` has ended by `now`.
fn has_ended(cooling: &SiteCooling, now: Instant) -> bool {
    cooling.exits.values().any(|(until, _)| *until <= now)
}

/// How many cooldowns one account holds.
fn held(sites: &Sites) -> usize {
    sites.values().map(|cooling| cooling.exits.len()).sum()
}

/// Drops the account's cooldown that ends soonest; whether there was one.
fn evict_soonest(sites: &mut Sites) -> bool {
    let soonest = sites
        .iter()
        .flat_map(|(site, cooling)| {
            cooling
                .exits
                .iter()
                .map(move |(exit, (until, _))| (*until, *exit, site.clone()))
        })
        .min_by_key(|(until, _, _)| *until);
    match soonest {
        Some((_, exit, site)) => remove(sites, exit, &site),
        None => false,
    }
}

/// Removes `exit` from the account's cooling of `site`; whether it held it.
fn remove(sites: &mut Sites, exit: Uuid, site: &str) -> bool {
    let rest = match sites.get_key_value(site) {
        Some((key, cooling)) if cooling.exits.contains_key(&exit) => {
            (key.clone(), cooling.without(exit))
        }
        _ => return false,
    };
    match rest {
        (key, Some(rest)) => {
            sites.insert(key, Arc::new(rest));
        }
        (_, None) => {
            sites.remove(site);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cools(book: &AccountCoolings, account: Uuid, exit: Uuid, site: &str) -> bool {
        book.cooling(account, site)
            .is_some_and(|c| c.cools(exit, Instant::now()))
    }

    #[test]
    fn a_cooldown_is_the_accounts_alone_and_the_sites_alone() {
        let book = AccountCoolings::default();
        let (a, b, exit) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        assert!(book.cooling(a, "shop.test").is_none(), "nothing held");
        let until = Instant::now() + Duration::from_secs(60);
        assert!(book.set(a, exit, "shop.test", until));
        assert!(cools(&book, a, exit, "shop.test"));
        assert!(!cools(&book, b, exit, "shop.test"), "another account");
        assert!(book.cooling(a, "other.test").is_none(), "another site");
        assert!(
            !cools(&book, a, Uuid::new_v4(), "shop.test"),
            "another exit"
        );
        // Renewed, not counted twice.
        assert!(book.set(a, exit, "shop.test", until + Duration::from_secs(60)));
        assert_eq!(book.len(), 1);
        let cooling = book.cooling(a, "shop.test").unwrap();
        assert!(!cooling.in_panic(), "an account's cooling never panics");
        assert_eq!(cooling.site(), "shop.test");
        book.lift(a, exit, "shop.test");
        assert!(book.cooling(a, "shop.test").is_none());
        assert_eq!(book.len(), 0);
        // Lifting what is not held changes nothing.
        book.lift(a, exit, "shop.test");
        book.lift(b, exit, "shop.test");
        assert_eq!(book.len(), 0);
    }

    #[test]
    fn ended_cooldowns_are_swept() {
        let book = AccountCoolings::default();
        let (a, x, y) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let now = Instant::now();
        book.set(a, x, "shop.test", now + Duration::from_secs(10));
        book.set(a, y, "shop.test", now + Duration::from_secs(100));
        book.set(a, x, "other.test", now + Duration::from_secs(10));
        assert_eq!(book.sweep(now), 3, "nothing ended yet");
        assert_eq!(book.sweep(now + Duration::from_secs(20)), 1);
        assert!(
            book.cooling(a, "other.test").is_none(),
            "its last one ended"
        );
        let left = book.cooling(a, "shop.test").unwrap();
        assert!(left.cooldown(x).is_none() && left.cooldown(y).is_some());
        assert_eq!(book.sweep(now + Duration::from_secs(200)), 0);
        assert!(book.cooling(a, "shop.test").is_none());
    }

    #[test]
    fn an_account_at_its_bound_gives_up_its_soonest_to_end() {
        let book = AccountCoolings::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let now = Instant::now() + Duration::from_secs(60);
        let soonest = Uuid::new_v4();
        book.set(a, soonest, "site0.test", now);
        for i in 1..PER_ACCOUNT {
            let until = now + Duration::from_secs(i as u64);
            assert!(book.set(a, Uuid::new_v4(), &format!("site{i}.test"), until));
        }
        assert_eq!(book.len(), PER_ACCOUNT);
        let newest = Uuid::new_v4();
        assert!(book.set(a, newest, "new.test", now + Duration::from_secs(3600)));
        assert_eq!(book.len(), PER_ACCOUNT, "one gave way");
        assert!(
            book.cooling(a, "site0.test").is_none(),
            "the soonest to end"
        );
        assert!(cools(&book, a, newest, "new.test"));
        // Another account is not bounded by this one.
        assert!(book.set(b, newest, "new.test", now));
        assert_eq!(book.len(), PER_ACCOUNT + 1);
    }

    #[test]
    fn a_resync_takes_what_redis_holds_and_keeps_a_change_that_raced_it() {
        let book = AccountCoolings::default();
        let (a, b, x, y) = (
            Uuid::new_v4(),
            Uuid::new_v4(),
            Uuid::new_v4(),
            Uuid::new_v4(),
        );
        let lifted_in_redis = Uuid::new_v4();
        book.set(
            a,
            lifted_in_redis,
            "shop.test",
            Instant::now() + Duration::from_secs(60),
        );
        let now_ms = 1_700_000_000_000_i64;
        let flat: Vec<String> = vec![
            site_cooldowns::account_field(a, x, "shop.test"),
            (now_ms + 30_000).to_string(),
            site_cooldowns::account_field(b, y, "198.51.100.0/24"),
            (now_ms + 60_000).to_string(),
            site_cooldowns::account_field(a, y, "shop.test"),
            (now_ms - 1).to_string(),
            "garbage".into(),
            "1".into(),
            site_cooldowns::account_field(b, x, "shop.test"),
            "soon".into(),
        ];
        book.replace(now_ms, &flat, Instant::now(), false);
        assert!(cools(&book, a, x, "shop.test"));
        assert!(cools(&book, b, y, "198.51.100.0/24"));
        assert!(!cools(&book, a, y, "shop.test"), "ended in Redis");
        assert!(!cools(&book, b, x, "shop.test"), "not a time");
        assert!(
            !cools(&book, a, lifted_in_redis, "shop.test"),
            "what Redis lacks is lifted"
        );
        assert_eq!(book.len(), 2);
        // A change that raced the read is kept.
        book.set(b, x, "raced.test", Instant::now() + Duration::from_secs(60));
        book.replace(now_ms, &flat, Instant::now(), true);
        assert!(cools(&book, b, x, "raced.test"));
        assert!(cools(&book, a, x, "shop.test"));
        assert_eq!(book.len(), 3);
        // The remaining time is taken on this clock: 30 s from now.
        let (until, _) = book.cooling(a, "shop.test").unwrap().cooldown(x).unwrap();
        let left = until.saturating_duration_since(Instant::now());
        assert!(
            left <= Duration::from_secs(30) && left > Duration::from_secs(25),
            "{left:?}"
        );
    }
}
