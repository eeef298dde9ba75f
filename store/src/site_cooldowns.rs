//! Site cooldowns: the fleet's shared memory of which exit a target site
//! refuses (docs/health.md, "Health per target site"). Written by the
//! superproxies that see the refusals, read by every superproxy (held in
//! memory, kept current by change events) and by the control-api (`GET
//! /v1/sites`, `DELETE /v1/sites/{site}/cooldowns/{exit}`).
//!
//! In Redis, all under one hash tag (`{sites}`) so one script reads and
//! writes them together:
//! - [`Keys::site_cooldowns`]: a hash, field [`field`]`(exit, site)` →
//!   [`Cooldown::encode`] (`"UNTIL_MS LEVEL"`, Redis clock);
//! - [`Keys::site_backoff`]: a sorted set of the same fields scored by the
//!   instant their back-off level is forgotten (the level doubles a repeat
//!   offender's next cooldown; a quiet exit starts again from the base);
//! - [`Keys::site_cooldowns_of_exit`]: per exit, a sorted set of its cooled
//!   sites scored by until (the per-exit bound evicts the soonest to end).
//!
//! Changes are announced on [`Keys::events`] as [`Announcement`]s, which
//! carry everything a receiver needs, so applying one costs no Redis read.

use uuid::Uuid;

use crate::Keys;

impl Keys {
    /// `EXIT SITE` → `UNTIL_MS LEVEL`: every live cooldown of the fleet.
    pub fn site_cooldowns(&self) -> String {
        format!("{}{{sites}}:cool", self.prefix())
    }

    /// `EXIT SITE` scored by when its back-off level is forgotten.
    pub fn site_backoff(&self) -> String {
        format!("{}{{sites}}:backoff", self.prefix())
    }

    /// One exit's cooled sites, scored by until.
    pub fn site_cooldowns_of_exit(&self, exit: Uuid) -> String {
        format!("{}{{sites}}:exit:{exit}", self.prefix())
    }

    /// What [`Keys::site_cooldowns_of_exit`] puts before the exit's id: a
    /// script that evicts another exit's cooldown names that exit's index
    /// from it (the same hash tag, so the same slot).
    pub fn site_cooldowns_of_exit_stem(&self) -> String {
        format!("{}{{sites}}:exit:", self.prefix())
    }
}

/// The hash field of one (exit, site) pair. Sites never hold a space (a
/// registrable domain, or an address block such as `198.51.100.0/24`).
pub fn field(exit: Uuid, site: &str) -> String {
    format!("{exit} {site}")
}

/// Splits a field back into its exit and site.
pub fn parse_field(field: &str) -> Option<(Uuid, &str)> {
    let (exit, site) = field.split_once(' ')?;
    if site.is_empty() || site.contains(' ') {
        return None;
    }
    Some((exit.parse().ok()?, site))
}

/// One stored cooldown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cooldown {
    /// When it ends, Redis clock, Unix milliseconds.
    pub until_ms: i64,
    /// How many cooldowns in a row this pair has had (0 the first).
    pub level: u32,
}

impl Cooldown {
    pub fn encode(&self) -> String {
        format!("{} {}", self.until_ms, self.level)
    }

    pub fn parse(value: &str) -> Option<Self> {
        let (until, level) = value.split_once(' ')?;
        Some(Self {
            until_ms: until.parse().ok()?,
            level: level.parse().ok()?,
        })
    }
}

/// A change to the fleet's cooldowns, as announced on the events channel.
/// A receiver applies it to its own clock (`remaining_ms` from now), so the
/// superproxies' clocks need not agree with Redis's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Announcement {
    /// `cool:EXIT SITE REMAINING_MS LEVEL`
    Cooled {
        exit: Uuid,
        site: String,
        remaining_ms: u64,
        level: u32,
    },
    /// `uncool:EXIT SITE` (an operator lifted it, or it was evicted)
    Lifted { exit: Uuid, site: String },
}

impl Announcement {
    pub fn encode(&self) -> String {
        match self {
            Self::Cooled {
                exit,
                site,
                remaining_ms,
                level,
            } => format!("cool:{exit} {site} {remaining_ms} {level}"),
            Self::Lifted { exit, site } => format!("uncool:{exit} {site}"),
        }
    }

    /// The announcement an event payload carries, if it is one.
    pub fn parse(payload: &str) -> Option<Self> {
        if let Some(rest) = payload.strip_prefix("cool:") {
            let mut parts = rest.split(' ');
            let exit = parts.next()?.parse().ok()?;
            let site = parts.next().filter(|s| !s.is_empty())?.to_owned();
            let remaining_ms = parts.next()?.parse().ok()?;
            let level = parts.next()?.parse().ok()?;
            if parts.next().is_some() {
                return None;
            }
            return Some(Self::Cooled {
                exit,
                site,
                remaining_ms,
                level,
            });
        }
        let rest = payload.strip_prefix("uncool:")?;
        let (exit, site) = parse_field(rest)?;
        Some(Self::Lifted {
            exit,
            site: site.to_owned(),
        })
    }
}

/// Cools one (exit, site) pair, the one writer of the three keys.
///
/// `KEYS[1]` [`Keys::site_cooldowns`], `KEYS[2]` [`Keys::site_backoff`],
/// `KEYS[3]` [`Keys::site_cooldowns_of_exit`] of the exit; `ARGV[1]` the
/// [`field`], `ARGV[2]` the site, `ARGV[3]` the base length (ms), `ARGV[4]`
/// the longest (ms; also how long a level is remembered after its cooldown
/// ends), `ARGV[5]` the jitter in permille of the length (800..=1200, drawn
/// by the caller), `ARGV[6]` the most cooled sites per exit, `ARGV[7]` the
/// most fields in `KEYS[1]`, `ARGV[8]`
/// [`Keys::site_cooldowns_of_exit_stem`].
///
/// The level is the previous one plus one while the pair is remembered in
/// `KEYS[2]` (its field stays in `KEYS[1]`, ended, until then: readers skip
/// fields whose until has passed), else 0; the length is
/// `min(base × 2^level × jitter, max)` from Redis' clock. A pair already
/// cooled is left as it is (two superproxies seeing the same refusals
/// raise the level once). Beyond the per-exit bound the exit's soonest to
/// end are evicted; beyond the global bound, the soonest forgotten.
///
/// Returns `{remaining_ms, level, fresh (1/0), evicted fields}`: the caller
/// announces [`Announcement::Cooled`] when fresh and
/// [`Announcement::Lifted`] for each live cooldown evicted.
pub const COOL_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local field = ARGV[1]
local max = tonumber(ARGV[4])
local exit = string.match(field, '^(%S+) ')
local function drop(f)
  redis.call('HDEL', KEYS[1], f)
  redis.call('ZREM', KEYS[2], f)
  local e, s = string.match(f, '^(%S+) (%S+)$')
  if e then
    redis.call('ZREM', ARGV[8] .. e, s)
  end
end
local function live(f)
  local v = redis.call('HGET', KEYS[1], f)
  if not v then
    return false
  end
  local u = string.match(v, '^(%-?%d+) ')
  return u ~= nil and tonumber(u) > now
end
for _, f in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)) do
  drop(f)
end
local level = 0
local cur = redis.call('HGET', KEYS[1], field)
if cur then
  local u, l = string.match(cur, '^(%-?%d+) (%d+)$')
  if u then
    if tonumber(u) > now then
      return {tonumber(u) - now, tonumber(l), 0, {}}
    end
    local forget = redis.call('ZSCORE', KEYS[2], field)
    if forget and tonumber(forget) > now then
      level = math.min(tonumber(l) + 1, 30)
    end
  end
end
local length = math.floor(math.min(tonumber(ARGV[3]) * (2 ^ level) * tonumber(ARGV[5]) / 1000, max))
if length < 1 then
  length = 1
end
local untl = now + length
redis.call('HSET', KEYS[1], field, string.format('%d %d', untl, level))
redis.call('ZADD', KEYS[2], untl + max, field)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], untl, ARGV[2])
local evicted = {}
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[6])
if over > 0 and exit then
  for _, s in ipairs(redis.call('ZRANGE', KEYS[3], 0, over)) do
    if over <= 0 then
      break
    end
    if s ~= ARGV[2] then
      local f = exit .. ' ' .. s
      drop(f)
      evicted[#evicted + 1] = f
      over = over - 1
    end
  end
end
over = redis.call('HLEN', KEYS[1]) - tonumber(ARGV[7])
if over > 0 then
  for _, f in ipairs(redis.call('ZRANGE', KEYS[2], 0, math.min(over, 1000))) do
    if over <= 0 then
      break
    end
    if f ~= field then
      if live(f) then
        evicted[#evicted + 1] = f
      end
      drop(f)
      over = over - 1
    end
  end
end
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIREAT', KEYS[3], math.floor(tonumber(last[2])) + 1000)
end
return {length, level, 1, evicted}
";

/// `KEYS[1]` [`Keys::site_cooldowns`]: `{now_ms, fields and values}`, Redis'
/// clock and the whole hash (bounded by the cool script's global bound),
/// ended cooldowns still remembered included.
pub const READ_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('HGETALL', KEYS[1])}
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_cooldowns_and_announcements_round_trip() {
        let exit = Uuid::new_v4();
        for site in ["example.com", "198.51.100.0/24", "2001:db8:1:2::/64"] {
            assert_eq!(parse_field(&field(exit, site)), Some((exit, site)));
            for a in [
                Announcement::Cooled {
                    exit,
                    site: site.into(),
                    remaining_ms: 60_000,
                    level: 2,
                },
                Announcement::Lifted {
                    exit,
                    site: site.into(),
                },
            ] {
                assert_eq!(Announcement::parse(&a.encode()), Some(a));
            }
        }
        let c = Cooldown {
            until_ms: 1_700_000_000_000,
            level: 3,
        };
        assert_eq!(Cooldown::parse(&c.encode()), Some(c));
        for bad in [
            "cool:",
            "cool:x y 1 1",
            "uncool:",
            "exit:abc",
            "cool:{exit} a 1 1 1",
        ] {
            assert_eq!(Announcement::parse(bad), None, "{bad}");
        }
        assert_eq!(parse_field(&format!("{exit} ")), None);
    }

    #[test]
    fn the_exit_index_stem_is_what_each_exits_key_starts_with() {
        let keys = Keys::new("pn:".to_owned());
        let exit = Uuid::new_v4();
        assert_eq!(
            keys.site_cooldowns_of_exit(exit),
            format!("{}{exit}", keys.site_cooldowns_of_exit_stem())
        );
    }
}
