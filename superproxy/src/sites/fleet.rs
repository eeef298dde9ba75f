//! Sharing cooldowns with the fleet: a cooldown decided here is applied at
//! once, then written to Redis by the contract's script over the `{sites}`
//! keys and announced on the change channel (with what the fleet's bound
//! evicted); the resync reads every cooldown back and makes it this
//! instance's, merging a change that raced it.

use proxynet_store::site_cooldowns::{self, Announcement, Cooldown};
use rand::Rng;
use redis::AsyncCommands;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

use super::{
    backoff, later, millis, Exits, Remembered, SiteBook, SiteCooling, JITTER_PERMILLE,
    MAX_COOLDOWNS, MAX_LEVEL,
};

impl SiteBook {
    /// Reads every cooldown from Redis and makes them this instance's
    /// (on each subscription to the change channel and every 30 s). A
    /// change applied meanwhile is kept: the read is merged then.
    pub(crate) async fn resync(&self) {
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

    /// Replaces (or, with `merge`, extends) the cooldowns with what Redis
    /// holds: `flat` is its hash's fields and values, `now_ms` its clock.
    pub(super) fn replace(&self, now_ms: i64, flat: &[String], now: Instant, merge: bool) {
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

    /// Cools `exit` for `site` at `level`: here at once, then in Redis and
    /// on the change channel (in a task of its own: nothing of it is on the
    /// tunnel's path).
    pub(super) fn cool(self: &Arc<Self>, exit: Uuid, site: Arc<str>, level: u32, now: Instant) {
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
}
