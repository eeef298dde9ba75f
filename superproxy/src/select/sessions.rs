//! Sticky sessions: the (user, session) → (exit, egress IP) pin, shared by
//! every superproxy. The value's format is [`PinValue`]'s:
//! `EXIT_ID[ EGRESS_IP][ idle:DEADLINE_MS]`.
//!
//! A pin lives in Redis with the session's TTL, set with compare-and-set so
//! two superproxies choosing at once agree on one exit: whoever loses the race
//! adopts the winner's pin. The TTL is fixed at pinning time (`sesstime` is how
//! long the exit stays the same, not an idle timeout); an operator may move it
//! (`PATCH /v1/users/{id}/sessions/{s}` sets the key's TTL), and because every
//! tunnel reads the pin and its TTL from Redis, every superproxy follows from
//! its next tunnel on. Writing a new egress IP onto the same exit keeps the
//! TTL Redis holds, not the one this instance last read.
//!
//! A `sessidle` session's pin also carries an idle deadline on Redis' clock:
//! every tunnel through the pin moves it to now + the idle time
//! ([`Sessions::touch`]); a pin read after its deadline is gone — removed,
//! and the tunnel picks afresh ([`PinValue::idle_expired`] is the rule).
//!
//! A local copy of recent pins keeps sessions on their exit while Redis is
//! unreachable; it is used only then, so it never hides a change made in
//! Redis.

use proxynet_store::redis_target::RedisConnection;
use proxynet_store::session_pin::PinValue;
use proxynet_store::Keys;
use proxynet_wire::username::Session;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// Returns `{value, pttl_ms, now_ms}` for a pin (now on Redis' clock), or nil.
const GET_PIN: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return nil end
local t = redis.call('TIME')
return {v, redis.call('PTTL', KEYS[1]), tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
";

/// `KEYS[1]` the pin, `KEYS[2]` the user's session index; `ARGV[1]` expected
/// current pin without its idle deadline ('' for none), `ARGV[2]` new pin
/// likewise, `ARGV[3]` ttl ms, `ARGV[4]` the session id, `ARGV[5]` the most
/// live sessions the user may hold, `ARGV[6]` the idle time in ms (0: no
/// `sessidle`). Sets the pin only if it is still what the caller saw (the
/// idle deadline aside: it moves with every tunnel); returns the pin in
/// force afterwards as `{value, pttl_ms, now_ms}`, or `{'CAP', -2, 0}` when
/// a new session would exceed the cap. A pin that vanished meanwhile (its
/// session expired) is a new session: set under the cap like any other. The
/// same exit again (a new egress IP) keeps the TTL the key has.
const SET_PIN: &str = r"
local v = redis.call('GET', KEYS[1])
local base = v and string.gsub(v, ' idle:%d+$', '')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if v == false or base == ARGV[1] then
  if v == false then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    if redis.call('ZSCORE', KEYS[2], ARGV[4]) == false
       and redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then
      return {'CAP', -2, 0}
    end
  end
  local ttl = tonumber(ARGV[3])
  if v ~= false and string.match(base, '^%S+') == string.match(ARGV[2], '^%S+') then
    local left = redis.call('PTTL', KEYS[1])
    if left > 0 then ttl = left end
  end
  local value = ARGV[2]
  if tonumber(ARGV[6]) > 0 then
    value = value .. ' idle:' .. string.format('%d', now + tonumber(ARGV[6]))
  end
  redis.call('SET', KEYS[1], value, 'PX', ttl)
  redis.call('ZADD', KEYS[2], now + ttl, ARGV[4])
  redis.call('PEXPIRE', KEYS[2], math.max(ttl, redis.call('PTTL', KEYS[2])))
  return {value, ttl, now}
end
return {v, redis.call('PTTL', KEYS[1]), now}
";

/// `KEYS[1]` the pin; `ARGV[1]` the pin without its idle deadline, `ARGV[2]`
/// the idle time in ms. A tunnel used the pin: its idle deadline moves to
/// now + the idle time (its TTL unchanged). 0 if the pin is another by now.
const TOUCH_PIN: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local base = string.gsub(v, ' idle:%d+$', '')
if base ~= ARGV[1] then return 0 end
local left = redis.call('PTTL', KEYS[1])
if left <= 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], base .. ' idle:' .. string.format('%d', now + tonumber(ARGV[2])), 'PX', left)
return 1
";

/// `KEYS[1]` the pin, `KEYS[2]` the user's session index; `ARGV[1]` the pin
/// as read, `ARGV[2]` the session id. Removes an idle-expired pin unless
/// another superproxy replaced it meanwhile.
const DROP_IDLE_PIN: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
";

/// Most pins remembered locally for Redis outages.
const MAX_LOCAL_PINS: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pin {
    pub exit: Uuid,
    /// The egress IP the session leaves from (absent in pins written before
    /// sessions kept their IP; the next tunnel records one).
    pub egress_ip: Option<IpAddr>,
    pub expires: Instant,
    /// `sessidle` pins: the Unix ms (Redis' clock) it ends at unless a
    /// tunnel uses it first.
    pub idle_deadline_ms: Option<i64>,
}

impl Pin {
    /// Expiry as Unix seconds, for the `Proxynet-Session-Expires` header.
    pub(crate) fn expires_unix(&self) -> u64 {
        let left = self.expires.saturating_duration_since(Instant::now());
        (SystemTime::now() + left)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// The value compare-and-set compares: which exit and IP, not when.
    fn base(&self) -> String {
        PinValue::base(self.exit, self.egress_ip)
    }
}

/// What a read of a pin found.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    Live(Pin),
    /// A `sessidle` pin no tunnel used until its deadline: gone.
    Idle,
    /// Nothing (or nothing that parses, or a TTL that ran out).
    None,
}

/// Judges a stored pin `value` with `pttl_ms` left, read at `now_ms` on
/// Redis' clock and `at` on ours: the one place the idle rule is applied.
fn judge(value: &str, pttl_ms: i64, now_ms: i64, at: Instant) -> Read {
    let Some(pin) = PinValue::parse(value) else {
        return Read::None;
    };
    let Some(left) = u64::try_from(pttl_ms).ok().filter(|t| *t > 0) else {
        return Read::None;
    };
    if pin.idle_expired(now_ms) {
        return Read::Idle;
    }
    Read::Live(Pin {
        exit: pin.exit,
        egress_ip: pin.egress_ip,
        expires: at + Duration::from_millis(left),
        idle_deadline_ms: pin.idle_deadline_ms,
    })
}

fn unix_ms_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

pub(crate) struct Sessions {
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
    pub(crate) fn new(redis: RedisConnection, keys: Keys, max_per_user: usize) -> Self {
        Self {
            redis,
            keys,
            local: Mutex::new(HashMap::new()),
            max_per_user: max_per_user.max(1),
        }
    }

    /// The pin in force, if any. A `sessidle` pin past its idle deadline is
    /// removed and reported as none: the tunnel picks afresh.
    pub(crate) async fn get(&self, user: Uuid, session: &str) -> Option<Pin> {
        let key = self.keys.session(user, session);
        let mut redis = self.redis.clone();
        let answer: Result<Option<(String, i64, i64)>, _> = redis::Script::new(GET_PIN)
            .key(&key)
            .invoke_async(&mut redis)
            .await;
        match answer {
            Ok(found) => {
                let read = found.as_ref().map_or(Read::None, |(value, pttl, now)| {
                    judge(value, *pttl, *now, Instant::now())
                });
                let pin = match read {
                    Read::Live(pin) => Some(pin),
                    Read::None => None,
                    Read::Idle => {
                        if let Some((value, _, _)) = &found {
                            self.drop_idle(user, session, &key, value).await;
                        }
                        None
                    }
                };
                self.remember(&key, pin);
                pin
            }
            Err(e) => {
                tracing::debug!(error = %e, "session lookup failed; using the local pin");
                self.local_pin(&key)
            }
        }
    }

    async fn drop_idle(&self, user: Uuid, session: &str, key: &str, value: &str) {
        let mut redis = self.redis.clone();
        let dropped: Result<i64, _> = redis::Script::new(DROP_IDLE_PIN)
            .key(key)
            .key(self.keys.session_index(user))
            .arg(value)
            .arg(session)
            .invoke_async(&mut redis)
            .await;
        if let Err(e) = dropped {
            // The next read judges it idle again.
            tracing::debug!(error = %e, "idle session pin not removed");
        }
    }

    /// A tunnel goes through `pin`: a `sessidle` session's idle deadline
    /// moves to now + `idle`. Best effort: a failure leaves the deadline
    /// where it was (and the local copy moved, for Redis outages).
    pub(crate) async fn touch(&self, user: Uuid, session: &str, pin: Pin, idle: Duration) -> Pin {
        let key = self.keys.session(user, session);
        let mut redis = self.redis.clone();
        let touched: Result<i64, _> = redis::Script::new(TOUCH_PIN)
            .key(&key)
            .arg(pin.base())
            .arg(millis(idle).max(1))
            .invoke_async(&mut redis)
            .await;
        if let Err(e) = touched {
            tracing::debug!(error = %e, "session idle deadline not moved in Redis");
        }
        let moved = Pin {
            idle_deadline_ms: Some(
                unix_ms_now().saturating_add(i64::try_from(millis(idle)).unwrap_or(i64::MAX)),
            ),
            ..pin
        };
        self.remember(&key, Some(moved));
        moved
    }

    /// Pins `exit` (and `egress_ip`) for `session` if the pin is still
    /// `expected`; returns the pin in force. Keeping the expected pin's exit
    /// (a new egress IP) keeps its expiry; another exit is a new pin, living
    /// the session's `sesstime`, its `sessidle` deadline starting now. A new
    /// session beyond the user's cap is refused.
    pub(crate) async fn set(
        &self,
        user: Uuid,
        session: &Session,
        expected: Option<Pin>,
        exit: Uuid,
        egress_ip: Option<IpAddr>,
    ) -> Result<Pin, TooManySessions> {
        let (ttl, idle) = (session.ttl, session.idle);
        let session = session.id.as_str();
        let ttl = match expected {
            Some(p) if p.exit == exit => p
                .expires
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1)),
            _ => ttl,
        };
        let key = self.keys.session(user, session);
        let mut redis = self.redis.clone();
        let ttl_ms = millis(ttl).max(1);
        let idle_ms = idle.map_or(0, |d| millis(d).max(1));
        let answer: Result<(String, i64, i64), _> = redis::Script::new(SET_PIN)
            .key(&key)
            .key(self.keys.session_index(user))
            .arg(expected.map(|p| p.base()).unwrap_or_default())
            .arg(PinValue::base(exit, egress_ip))
            .arg(ttl_ms)
            .arg(session)
            .arg(self.max_per_user)
            .arg(idle_ms)
            .invoke_async(&mut redis)
            .await;
        let pin = match answer {
            Ok((sentinel, -2, _)) if sentinel == "CAP" => {
                return Err(TooManySessions(self.max_per_user))
            }
            Ok((current, pttl, now)) => match judge(&current, pttl, now, Instant::now()) {
                Read::Live(pin) => Some(pin),
                // The winner's pin went idle between its write and ours:
                // ours stands for this tunnel; the next read sorts it out.
                Read::Idle | Read::None => None,
            },
            Err(e) => {
                tracing::debug!(error = %e, "session pin not stored in Redis; pinned locally");
                None
            }
        }
        .unwrap_or(Pin {
            exit,
            egress_ip,
            expires: Instant::now() + ttl,
            idle_deadline_ms: idle.map(|d| {
                unix_ms_now().saturating_add(i64::try_from(millis(d)).unwrap_or(i64::MAX))
            }),
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
        let now_ms = unix_ms_now();
        local
            .get(key)
            .copied()
            .filter(|p| p.expires > Instant::now() && p.idle_deadline_ms.is_none_or(|d| d > now_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The idle rule, on an injected clock: a pin is live while its
    /// deadline is ahead of Redis' now, gone from the deadline on, and a
    /// pin without `sessidle` never idles.
    #[test]
    fn a_pin_idle_past_its_deadline_is_gone_and_one_in_use_lives() {
        let exit = Uuid::new_v4();
        let at = Instant::now();
        let minute = 60_000;
        let t0 = 1_700_000_000_000_i64;
        let idle_pin = |deadline: i64| {
            PinValue {
                exit,
                egress_ip: Some("192.0.2.9".parse().unwrap()),
                idle_deadline_ms: Some(deadline),
            }
            .encode()
        };
        // Pinned at t0 with sessidle-1 and a 10-minute TTL.
        let value = idle_pin(t0 + minute);
        let Read::Live(pin) = judge(&value, 10 * minute, t0 + 59_999, at) else {
            panic!("live within the idle time")
        };
        assert_eq!(pin.exit, exit);
        assert_eq!(pin.idle_deadline_ms, Some(t0 + minute));
        assert_eq!(pin.expires, at + Duration::from_millis(10 * 60_000));
        assert_eq!(judge(&value, 9 * minute, t0 + minute, at), Read::Idle);
        assert_eq!(judge(&value, 5 * minute, t0 + 5 * minute, at), Read::Idle);
        // A tunnel at t0 + 50 s moved the deadline: live past the first one.
        let touched = idle_pin(t0 + 50_000 + minute);
        assert!(matches!(
            judge(&touched, 9 * minute, t0 + 100_000, at),
            Read::Live(_)
        ));
        // No sessidle: only the TTL ends it.
        let plain = PinValue::base(exit, None);
        assert!(matches!(
            judge(&plain, 1, i64::MAX, at),
            Read::Live(p) if p.idle_deadline_ms.is_none()
        ));
        assert_eq!(judge(&plain, 0, t0, at), Read::None);
        assert_eq!(judge(&plain, -2, t0, at), Read::None);
        assert_eq!(judge("not a pin", minute, t0, at), Read::None);
    }
}
