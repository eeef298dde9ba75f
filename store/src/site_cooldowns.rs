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
//!
//! Account-scoped cooldowns (a customer's `blocked` report, `POST
//! /v1/feedback`) cool an exit for one site in that account's routing only;
//! the fleet's cooldowns above are written only once reports from several
//! accounts agree (docs/health.md, "Customer feedback"). Same slot:
//! - [`Keys::site_account_cooldowns`]: a hash, field
//!   [`account_field`]`(account, exit, site)` → `UNTIL_MS` (Redis clock);
//! - [`Keys::site_account_cooldowns_by_until`]: the same fields scored by
//!   until, so ended ones are forgotten a bounded step at a time;
//! - [`Keys::site_account_cooldowns_of_account`]: per account, a sorted set
//!   of its `EXIT SITE` pairs scored by until (the per-account bound evicts
//!   the soonest to end; it expires with the account's last cooldown).
//!
//! Written by [`ACCOUNT_COOL_SCRIPT`] and [`ACCOUNT_LIFT_SCRIPT`], announced
//! as [`AccountAnnouncement`]s on the same channel (a separate type: a
//! receiver that knows only the fleet's [`Announcement`] parses them as
//! nothing, never as a fleet cooldown).

use std::net::IpAddr;

use uuid::Uuid;

use crate::policy::{normalize_entry, normalize_host, registrable_domain, PolicyTarget};
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

    /// `ACCOUNT EXIT SITE` → `UNTIL_MS`: every account-scoped cooldown.
    pub fn site_account_cooldowns(&self) -> String {
        format!("{}{{sites}}:acool", self.prefix())
    }

    /// `ACCOUNT EXIT SITE` scored by until (what has ended is forgotten).
    pub fn site_account_cooldowns_by_until(&self) -> String {
        format!("{}{{sites}}:acool:until", self.prefix())
    }

    /// One account's cooled `EXIT SITE` pairs, scored by until.
    pub fn site_account_cooldowns_of_account(&self, account: Uuid) -> String {
        format!("{}{{sites}}:acool:account:{account}", self.prefix())
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
/// ended cooldowns still remembered included. With `KEYS[1]`
/// [`Keys::site_account_cooldowns`] it reads the account-scoped ones the
/// same way (values `UNTIL_MS`; bounded by [`ACCOUNT_COOLDOWNS_TOTAL`]).
pub const READ_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('HGETALL', KEYS[1])}
";

/// The site an address counts as: an IPv4 address its /24, an IPv6 one its
/// /64 (what one host or customer controls), so walking a block makes no
/// fresh records.
pub fn site_of_ip(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            format!("{a}.{b}.{c}.0/24")
        }
        v6 => PolicyTarget::Ip(v6).registrable_domain(),
    }
}

/// The site a customer names, as cooldowns are keyed: a host name as its
/// registrable domain (`www.shop.example.co.uk` → `example.co.uk`, the
/// Public Suffix List as the traffic policy uses it), an address as its
/// block ([`site_of_ip`]), an address block written as one (`/24` for IPv4,
/// `/64` for IPv6) as itself. A URL counts as its host. `Err` says why a
/// value cannot be a site.
pub fn site_of(raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    let host = match raw.split_once("://") {
        Some((_, rest)) => url_host(rest).ok_or_else(|| format!("{raw:?}: no host in the URL"))?,
        None => raw,
    };
    if host.is_empty() {
        return Err("an empty site".into());
    }
    if host.contains('/') {
        // Canonical and masked: `198.51.100.7/24` is `198.51.100.0/24`.
        let block = normalize_entry(host)?;
        let wanted = if block.contains(':') { "/64" } else { "/24" };
        if !block.ends_with(wanted) {
            return Err(format!(
                "{host:?}: an address block is a site only as an IPv4 /24 or an IPv6 /64"
            ));
        }
        return Ok(block);
    }
    let name = normalize_host(host).map_err(|e| format!("{host:?}: {e}"))?;
    let site = match name.parse::<IpAddr>() {
        Ok(ip) => site_of_ip(ip),
        Err(_) => registrable_domain(&name).to_owned(),
    };
    if site.contains(' ') || site.is_empty() {
        return Err(format!("{host:?}: not a valid site"));
    }
    Ok(site)
}

/// The host of a URL's remainder after `scheme://`: no user info, port,
/// path, query or fragment; an IPv6 literal without its brackets.
fn url_host(rest: &str) -> Option<&str> {
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = hostport.strip_prefix('[') {
        return v6.split_once(']').map(|(host, _)| host);
    }
    Some(hostport.split_once(':').map_or(hostport, |(host, _)| host))
}

/// The hash field of one account-scoped cooldown.
pub fn account_field(account: Uuid, exit: Uuid, site: &str) -> String {
    format!("{account} {exit} {site}")
}

/// Splits an account-scoped field back into its account, exit and site.
pub fn parse_account_field(field: &str) -> Option<(Uuid, Uuid, &str)> {
    let (account, rest) = field.split_once(' ')?;
    let (exit, site) = parse_field(rest)?;
    Some((account.parse().ok()?, exit, site))
}

/// How long a customer's `blocked` report cools the exit for the site in
/// the reporting account's routing (`POST /v1/feedback` and the
/// `Proxynet-Report` request header alike; a further report renews it).
pub const ACCOUNT_COOL_MS: u64 = 30 * 60 * 1000;

/// Account-scoped cooldowns one account holds at most (the soonest to end
/// gives way): [`ACCOUNT_COOL_SCRIPT`]'s `ARGV[4]` for every writer, and
/// the bound a superproxy keeps in memory too.
pub const ACCOUNT_COOLDOWNS_PER_ACCOUNT: u64 = 1_000;

/// Account-scoped cooldowns of all accounts together, at most
/// ([`ACCOUNT_COOL_SCRIPT`]'s `ARGV[5]`; a superproxy's bound too).
pub const ACCOUNT_COOLDOWNS_TOTAL: u64 = 200_000;

/// Cools `ARGV[1]` (an [`account_field`]) for `ARGV[3]` ms from now (Redis
/// clock). `KEYS[1]` [`Keys::site_account_cooldowns`], `KEYS[2]`
/// [`Keys::site_account_cooldowns_by_until`], `KEYS[3]`
/// [`Keys::site_account_cooldowns_of_account`]; `ARGV[2]` the pair's
/// [`field`], `ARGV[4]` the most cooldowns one account holds, `ARGV[5]` the
/// most in all, `ARGV[6]` the account id. Forgets up to 100 ended ones on
/// the way. Returns `{remaining_ms, evicted}`: the fields it evicted to
/// stay within the bounds (announce them lifted).
pub const ACCOUNT_COOL_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dur = tonumber(ARGV[3])
local ended = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)
for _, f in ipairs(ended) do
  redis.call('HDEL', KEYS[1], f)
  redis.call('ZREM', KEYS[2], f)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local untl = now + dur
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', untl))
redis.call('ZADD', KEYS[2], untl, ARGV[1])
redis.call('ZADD', KEYS[3], untl, ARGV[2])
redis.call('PEXPIRE', KEYS[3], math.max(dur, redis.call('PTTL', KEYS[3])))
local evicted = {}
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[4])
if over > 0 then
  local gone = redis.call('ZPOPMIN', KEYS[3], over)
  for i = 1, #gone, 2 do
    local f = ARGV[6] .. ' ' .. gone[i]
    redis.call('HDEL', KEYS[1], f)
    redis.call('ZREM', KEYS[2], f)
    table.insert(evicted, f)
  end
end
over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[5])
if over > 0 then
  local gone = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #gone, 2 do
    redis.call('HDEL', KEYS[1], gone[i])
    table.insert(evicted, gone[i])
  end
end
return {dur, evicted}
";

/// Lifts one account-scoped cooldown: `KEYS` as [`ACCOUNT_COOL_SCRIPT`],
/// `ARGV[1]` the [`account_field`], `ARGV[2]` the pair's [`field`]. 1 when
/// a live cooldown was lifted, 0 when there was none (an ended one is
/// forgotten all the same).
pub const ACCOUNT_LIFT_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[2])
if v and tonumber(v) and tonumber(v) > now then return 1 end
return 0
";

/// A change to one account's cooldowns, as announced on the events channel
/// (applied, like [`Announcement`], to the receiver's own clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccountAnnouncement {
    /// `acool:ACCOUNT EXIT SITE REMAINING_MS`
    Cooled {
        account: Uuid,
        exit: Uuid,
        site: String,
        remaining_ms: u64,
    },
    /// `auncool:ACCOUNT EXIT SITE` (the account reported the pair `ok`,
    /// or the cooldown was evicted)
    Lifted {
        account: Uuid,
        exit: Uuid,
        site: String,
    },
}

impl AccountAnnouncement {
    pub fn encode(&self) -> String {
        match self {
            Self::Cooled {
                account,
                exit,
                site,
                remaining_ms,
            } => format!("acool:{account} {exit} {site} {remaining_ms}"),
            Self::Lifted {
                account,
                exit,
                site,
            } => format!("auncool:{account} {exit} {site}"),
        }
    }

    /// The announcement an event payload carries, if it is one.
    pub fn parse(payload: &str) -> Option<Self> {
        if let Some(rest) = payload.strip_prefix("acool:") {
            let (field, remaining) = rest.rsplit_once(' ')?;
            let (account, exit, site) = parse_account_field(field)?;
            return Some(Self::Cooled {
                account,
                exit,
                site: site.to_owned(),
                remaining_ms: remaining.parse().ok()?,
            });
        }
        let rest = payload.strip_prefix("auncool:")?;
        let (account, exit, site) = parse_account_field(rest)?;
        Some(Self::Lifted {
            account,
            exit,
            site: site.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests;
