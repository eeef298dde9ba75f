//! Per-client limits enforced before any expensive work.
//!
//! [`AuthFailureLimiter`]: every password check that is not answered from the
//! verification cache is charged to its source address (IPv4, or IPv6 per
//! /64, the block one host usually controls) *when it starts*, at most
//! `auth_failures_per_minute` per minute. An address over budget is answered
//! `429` with `Retry-After` — without an argon2 verification — and blocked
//! for a time that doubles with each further offence (1 minute, 2, 4, … up to
//! an hour; forgotten after an hour of good behaviour). Charging at the start
//! means 50 simultaneous wrong passwords are limited like 50 sequential ones,
//! and a client that hangs up mid-check has still spent its attempt.
//! Successful checks are cached for `auth_cache_ttl_secs`, so a client with a
//! right password spends one attempt per credential per cache lifetime.

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use proxynet_common::tasks::Stop;
use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{ErrorKind, ProxyError};

/// The first block; each further offence doubles it.
const FIRST_BLOCK: Duration = Duration::from_secs(60);
/// The longest block.
const MAX_BLOCK: Duration = Duration::from_secs(3600);
/// Offences are forgotten after this long without one.
const STRIKE_MEMORY: Duration = Duration::from_secs(3600);

pub(crate) struct AuthFailureLimiter {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
    clock: DefaultClock,
    blocks: Mutex<HashMap<IpAddr, Block>>,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    until: Instant,
    strikes: u32,
    last_strike: Instant,
}

/// The address a limit applies to: IPv4 as is, IPv6 by its /64.
pub(crate) fn limit_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

fn refusal(until: Instant) -> ProxyError {
    let secs = until
        .saturating_duration_since(Instant::now())
        .as_secs()
        .max(1);
    let mut e = ProxyError::new(
        ErrorKind::TooManyRequests,
        "too many failed authentications from this address",
    );
    e.retry_after = Some(u32::try_from(secs).unwrap_or(u32::MAX));
    e
}

impl AuthFailureLimiter {
    pub(crate) fn new(failures_per_minute: u32) -> Self {
        let per_minute = NonZeroU32::new(failures_per_minute.max(1)).unwrap_or(NonZeroU32::MIN);
        Self {
            limiter: DefaultKeyedRateLimiter::keyed(Quota::per_minute(per_minute)),
            clock: DefaultClock::default(),
            blocks: Mutex::new(HashMap::new()),
        }
    }

    /// Refuses a client that is blocked.
    pub(crate) fn check(&self, ip: IpAddr) -> Result<(), ProxyError> {
        let key = limit_key(ip);
        let block = self.blocks.lock().ok().and_then(|b| b.get(&key).copied());
        match block {
            Some(block) if block.until > Instant::now() => Err(refusal(block.until)),
            _ => Ok(()),
        }
    }

    /// Charges one attempt (a password check about to run, or a malformed
    /// login); over budget, the address is blocked and the attempt refused.
    pub(crate) fn charge(&self, ip: IpAddr) -> Result<(), ProxyError> {
        self.check(ip)?;
        let key = limit_key(ip);
        let Err(not_until) = self.limiter.check_key(&key) else {
            return Ok(());
        };
        let refill = not_until.wait_time_from(self.clock.now());
        let now = Instant::now();
        let Ok(mut blocks) = self.blocks.lock() else {
            return Err(refusal(now + refill));
        };
        let previous = blocks
            .get(&key)
            .filter(|b| now.duration_since(b.last_strike) < STRIKE_MEMORY);
        let strikes = previous.map_or(1, |b| b.strikes.saturating_add(1));
        let growing = FIRST_BLOCK
            .saturating_mul(1u32 << (strikes - 1).min(6))
            .min(MAX_BLOCK);
        let until = now + growing.max(refill);
        blocks.insert(
            key,
            Block {
                until,
                strikes,
                last_strike: now,
            },
        );
        Err(refusal(until))
    }

    /// Drops state of addresses that are quiet again (bounded memory).
    pub(crate) fn housekeeping(&self) {
        self.limiter.retain_recent();
        let now = Instant::now();
        if let Ok(mut blocks) = self.blocks.lock() {
            blocks
                .retain(|_, b| b.until > now || now.duration_since(b.last_strike) < STRIKE_MEMORY);
        }
    }

    pub(crate) async fn run_housekeeping(self: std::sync::Arc<Self>, stop: Stop) {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            self.housekeeping();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_over_budget_block_the_address_only() {
        let limiter = AuthFailureLimiter::new(3);
        let bad: IpAddr = "198.51.100.7".parse().unwrap();
        let good: IpAddr = "198.51.100.8".parse().unwrap();
        for _ in 0..3 {
            assert!(limiter.charge(bad).is_ok());
        }
        assert!(limiter.check(bad).is_ok(), "the budget is three attempts");
        let refused = limiter.charge(bad).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::TooManyRequests);
        assert!(refused.retry_after.unwrap() >= 59, "{refused:?}");
        assert!(limiter.check(bad).is_err());
        assert!(limiter.check(good).is_ok());
    }

    #[test]
    fn blocks_grow_with_each_offence() {
        let limiter = AuthFailureLimiter::new(1);
        let bad: IpAddr = "198.51.100.9".parse().unwrap();
        assert!(limiter.charge(bad).is_ok());
        let first = limiter.charge(bad).unwrap_err().retry_after.unwrap();
        // Pretend the block ran out: the next offence doubles it.
        if let Ok(mut blocks) = limiter.blocks.lock() {
            blocks.get_mut(&bad).unwrap().until = Instant::now();
        }
        let second = limiter.charge(bad).unwrap_err().retry_after.unwrap();
        assert!(second >= 2 * first - 1, "{first} then {second}");
    }

    #[test]
    fn ipv6_clients_share_their_64() {
        assert_eq!(
            limit_key("2001:db8:1:2:3:4:5:6".parse().unwrap()),
            limit_key("2001:db8:1:2:ffff::1".parse().unwrap())
        );
        assert_ne!(
            limit_key("2001:db8:1:2::1".parse().unwrap()),
            limit_key("2001:db8:1:3::1".parse().unwrap())
        );
    }
}
