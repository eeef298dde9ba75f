//! Sticky sessions: the (user, session) → (exit, egress IP) pin, shared by
//! every superproxy. The value is `EXIT_ID` or `EXIT_ID EGRESS_IP`.
//!
//! A pin lives in Redis with the session's TTL, set with compare-and-set so
//! two superproxies choosing at once agree on one exit: whoever loses the race
//! adopts the winner's pin. The TTL is fixed at pinning time (`sesstime` is how
//! long the exit stays the same, not an idle timeout). A local copy of recent
//! pins keeps sessions on their exit while Redis is unreachable.

use proxynet_store::redis_target::RedisConnection;
use proxynet_store::Keys;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// Returns `{exit, pttl_ms}` for a pin, or nil.
const GET_PIN: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return nil end
return {v, redis.call('PTTL', KEYS[1])}
";

/// `KEYS[1]` the pin, `KEYS[2]` the user's session index; `ARGV[1]`
/// expected current exit ('' for none), `ARGV[2]` new exit, `ARGV[3]` ttl
/// ms, `ARGV[4]` the session id, `ARGV[5]` the most live sessions the user
/// may hold. Sets the pin only if it is still what the caller saw; returns
/// the pin in force afterwards as `{exit, pttl_ms}`, or `{'CAP', -2}` when a
/// new session would exceed the cap. A pin that vanished meanwhile (its
/// session expired) is a new session: set under the cap like any other.
const SET_PIN: &str = r"
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if v == false then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    if redis.call('ZSCORE', KEYS[2], ARGV[4]) == false
       and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then
      return {'CAP', -2}
    end
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[4])
  redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[3]), redis.call('PTTL', KEYS[2])))
  return {ARGV[2], tonumber(ARGV[3])}
end
return {v, redis.call('PTTL', KEYS[1])}
";

/// Most pins remembered locally for Redis outages.
const MAX_LOCAL_PINS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    pub exit: Uuid,
    /// The egress IP the session leaves from (absent in pins written before
    /// sessions kept their IP; the next tunnel records one).
    pub egress_ip: Option<IpAddr>,
    pub expires: Instant,
}

impl Pin {
    fn value(exit: Uuid, egress_ip: Option<IpAddr>) -> String {
        match egress_ip {
            Some(ip) => format!("{exit} {ip}"),
            None => exit.to_string(),
        }
    }
}

impl Pin {
    /// Expiry as Unix seconds, for the `Proxynet-Session-Expires` header.
    pub fn expires_unix(&self) -> u64 {
        let left = self.expires.saturating_duration_since(Instant::now());
        (SystemTime::now() + left)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }
}

pub struct Sessions {
    redis: RedisConnection,
    keys: Keys,
    local: Mutex<HashMap<String, Pin>>,
    /// Live sessions one user may hold.
    max_per_user: usize,
}

/// A new session was refused: the user holds the most live sessions.
#[derive(Debug, Clone, Copy)]
pub struct TooManySessions(pub usize);

impl From<TooManySessions> for crate::error::ProxyError {
    fn from(e: TooManySessions) -> Self {
        let mut error = crate::error::ProxyError::new(
            crate::error::ErrorKind::TooManyRequests,
            format!(
                "this user holds {} live sessions, the most allowed; reuse one or wait for one to expire",
                e.0
            ),
        );
        error.retry_after = Some(60);
        error
    }
}

impl Sessions {
    pub fn new(redis: RedisConnection, keys: Keys, max_per_user: usize) -> Self {
        Self {
            redis,
            keys,
            local: Mutex::new(HashMap::new()),
            max_per_user: max_per_user.max(1),
        }
    }

    /// The pin in force, if any.
    pub async fn get(&self, user: Uuid, session: &str) -> Option<Pin> {
        let key = self.keys.session(user, session);
        let mut redis = self.redis.clone();
        let answer: Result<Option<(String, i64)>, _> = redis::Script::new(GET_PIN)
            .key(&key)
            .invoke_async(&mut redis)
            .await;
        match answer {
            Ok(found) => {
                let pin = found.and_then(|(exit, ttl)| to_pin(&exit, ttl));
                self.remember(&key, pin);
                pin
            }
            Err(e) => {
                tracing::debug!(error = %e, "session lookup failed; using the local pin");
                self.local_pin(&key)
            }
        }
    }

    /// Pins `exit` (and `egress_ip`) if the pin is still `expected`; returns
    /// the pin in force. Re-pinning keeps the expected pin's expiry: the
    /// session's lifetime is fixed when it starts. A new session beyond the
    /// user's cap is refused.
    pub async fn set(
        &self,
        user: Uuid,
        session: &str,
        expected: Option<Pin>,
        exit: Uuid,
        egress_ip: Option<IpAddr>,
        ttl: Duration,
    ) -> Result<Pin, TooManySessions> {
        let ttl = match expected {
            Some(p) if p.exit == exit => p
                .expires
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
            _ => ttl,
        };
        let key = self.keys.session(user, session);
        let mut redis = self.redis.clone();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let answer: Result<(String, i64), _> = redis::Script::new(SET_PIN)
            .key(&key)
            .key(self.keys.session_index(user))
            .arg(
                expected
                    .map(|p| Pin::value(p.exit, p.egress_ip))
                    .unwrap_or_default(),
            )
            .arg(Pin::value(exit, egress_ip))
            .arg(ttl_ms)
            .arg(session)
            .arg(self.max_per_user)
            .invoke_async(&mut redis)
            .await;
        let pin = match answer {
            Ok((sentinel, -2)) if sentinel == "CAP" => {
                return Err(TooManySessions(self.max_per_user))
            }
            Ok((current, pttl)) => to_pin(&current, pttl),
            Err(e) => {
                tracing::debug!(error = %e, "session pin not stored in Redis; pinned locally");
                None
            }
        }
        .unwrap_or(Pin {
            exit,
            egress_ip,
            expires: Instant::now() + ttl,
        });
        self.remember(&key, Some(pin));
        Ok(pin)
    }

    fn remember(&self, key: &str, pin: Option<Pin>) {
        let Ok(mut local) = self.local.lock() else {
            return;
        };
        match pin {
            Some(pin) => {
                if local.len() >= MAX_LOCAL_PINS {
                    let now = Instant::now();
                    local.retain(|_, p| p.expires > now);
                    if local.len() >= MAX_LOCAL_PINS {
                        local.clear();
                    }
                }
                local.insert(key.to_owned(), pin);
            }
            None => {
                local.remove(key);
            }
        }
    }

    fn local_pin(&self, key: &str) -> Option<Pin> {
        let local = self.local.lock().ok()?;
        local
            .get(key)
            .copied()
            .filter(|p| p.expires > Instant::now())
    }
}

fn to_pin(value: &str, pttl_ms: i64) -> Option<Pin> {
    let (exit, egress_ip) = match value.split_once(' ') {
        Some((exit, ip)) => (exit, ip.parse().ok()),
        None => (value, None),
    };
    let exit = exit.parse().ok()?;
    let left = Duration::from_millis(u64::try_from(pttl_ms).ok().filter(|t| *t > 0)?);
    Some(Pin {
        exit,
        egress_ip,
        expires: Instant::now() + left,
    })
}
