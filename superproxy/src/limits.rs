//! Per-client limits enforced before any expensive work.
//!
//! [`AuthFailureLimiter`]: a source address that keeps presenting wrong
//! credentials is answered `429` with `Retry-After` — without an argon2
//! verification — once it exceeds `auth_failures_per_minute`. This bounds both
//! password guessing and the CPU an attacker can make us spend. IPv6 clients
//! are limited per /64, the block a single host usually controls.

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{ErrorKind, ProxyError};

pub struct AuthFailureLimiter {
    limiter: DefaultKeyedRateLimiter<IpAddr>,
    clock: DefaultClock,
    blocked: Mutex<HashMap<IpAddr, Instant>>,
}

/// The address a limit applies to: IPv4 as is, IPv6 by its /64.
fn limit_key(ip: IpAddr) -> IpAddr {
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

impl AuthFailureLimiter {
    pub fn new(failures_per_minute: u32) -> Self {
        let per_minute = NonZeroU32::new(failures_per_minute.max(1)).unwrap_or(NonZeroU32::MIN);
        Self {
            limiter: DefaultKeyedRateLimiter::keyed(Quota::per_minute(per_minute)),
            clock: DefaultClock::default(),
            blocked: Mutex::new(HashMap::new()),
        }
    }

    /// Refuses a client that is over its failure budget.
    pub fn check(&self, ip: IpAddr) -> Result<(), ProxyError> {
        let key = limit_key(ip);
        let until = self.blocked.lock().ok().and_then(|b| b.get(&key).copied());
        match until {
            Some(until) if until > Instant::now() => {
                let secs = until
                    .saturating_duration_since(Instant::now())
                    .as_secs()
                    .max(1);
                let mut e = ProxyError::new(
                    ErrorKind::TooManyRequests,
                    "too many failed authentications from this address",
                );
                e.retry_after = Some(u32::try_from(secs).unwrap_or(u32::MAX));
                Err(e)
            }
            _ => Ok(()),
        }
    }

    /// Counts a failed authentication; over budget, the address is blocked
    /// until the budget refills.
    pub fn record_failure(&self, ip: IpAddr) {
        let key = limit_key(ip);
        if let Err(not_until) = self.limiter.check_key(&key) {
            let wait = not_until.wait_time_from(self.clock.now());
            if let Ok(mut blocked) = self.blocked.lock() {
                blocked.insert(key, Instant::now() + wait);
            }
        }
    }

    /// Drops state of addresses that are quiet again (bounded memory).
    pub fn housekeeping(&self) {
        self.limiter.retain_recent();
        let now = Instant::now();
        if let Ok(mut blocked) = self.blocked.lock() {
            blocked.retain(|_, until| *until > now);
        }
    }

    pub async fn run_housekeeping(self: std::sync::Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        loop {
            tick.tick().await;
            self.housekeeping();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_over_budget_block_the_address_only() {
        let limiter = AuthFailureLimiter::new(3);
        let bad: IpAddr = "198.51.100.7".parse().unwrap();
        let good: IpAddr = "198.51.100.8".parse().unwrap();
        for _ in 0..3 {
            assert!(limiter.check(bad).is_ok());
            limiter.record_failure(bad);
        }
        assert!(limiter.check(bad).is_ok(), "the budget is three failures");
        limiter.record_failure(bad);
        let refused = limiter.check(bad).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::TooManyRequests);
        assert!(refused.retry_after.unwrap() >= 1);
        assert!(limiter.check(good).is_ok());
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
