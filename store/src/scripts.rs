//! The Lua scripts that must be atomic: the user projection's monotonic
//! writes, exit liveness and heartbeats, and the exit change stream the
//! superproxies' pools follow. Each names the keys and arguments it takes.

/// `KEYS[1]` user key, `KEYS[2]` its bucket's index
/// ([`Keys::users_in_bucket`](crate::Keys::users_in_bucket)),
/// `ARGV[1]` JSON, `ARGV[2]` its version, `ARGV[3]` TTL in seconds or '',
/// `ARGV[4]` the username. Writes only if no record with this version or a
/// newer one is there (1 written, 0 kept): the projection is monotonic. The
/// username is indexed either way (a key for it exists).
pub const PUT_USER_SCRIPT: &str = r"
redis.call('SADD', KEYS[2], ARGV[4])
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, rec = pcall(cjson.decode, cur)
  if ok and type(rec) == 'table' and tonumber(rec['version']) and tonumber(rec['version']) >= tonumber(ARGV[2]) then
    return 0
  end
end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[3]))
else
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
";

/// `KEYS[1]` user key, `KEYS[2]` its bucket's index, `ARGV[1]` version,
/// `ARGV[2]` the username: deletes the key only if what it holds is not newer
/// than that version, and unindexes the name when no key is left.
pub const DEL_USER_SCRIPT: &str = r"
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SREM', KEYS[2], ARGV[2])
  return 0
end
local ok, rec = pcall(cjson.decode, cur)
if ok and type(rec) == 'table' and tonumber(rec['version']) and tonumber(rec['version']) > tonumber(ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
return 1
";

/// `KEYS[1]` live set, `ARGV[1]` member, `ARGV[2]` ttl in ms: marks the member
/// alive until Redis' now + ttl and prunes members that expired long ago.
pub const TOUCH_LIVE_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 3600000)
return now
";

/// Entries kept in the exit change stream: a superproxy further behind than
/// this re-reads the whole pool once.
pub const EXIT_CHANGES_KEPT: u64 = 100_000;

/// `KEYS[1]` live set, `KEYS[2]` draining set, `KEYS[3]` change stream,
/// `ARGV[1]` exit id, `ARGV[2]` ttl in ms, `ARGV[3]` `1` if the agent is
/// draining, `ARGV[4]` entries kept in the stream: one agent heartbeat. Only
/// a transition (the exit was not live, or its drain flag flipped) becomes a
/// change entry; a steady beat writes nothing else.
pub const HEARTBEAT_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prev = redis.call('ZSCORE', KEYS[1], ARGV[1])
local changed = (not prev) or tonumber(prev) <= now
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 3600000)
local flipped
if ARGV[3] == '1' then
  flipped = redis.call('SADD', KEYS[2], ARGV[1])
else
  flipped = redis.call('SREM', KEYS[2], ARGV[1])
end
if changed or flipped == 1 then
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'id', ARGV[1])
end
return now
";

/// `KEYS[1]` live set, `KEYS[2]` draining set, `KEYS[3]` change stream,
/// `KEYS[4]` the control plane's presence key:
/// `{now, last change id, live members, draining members, control plane
/// present (1/0)}`: the start of a
/// full pool read, and the point its deltas continue from. An empty stream
/// gets a placeholder entry (no exit id) so the cursor is always a real entry
/// whose disappearance (a flush, trimming past it) the delta can detect.
pub const LIVE_AND_DRAINING_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
local cursor
if last[1] then
  cursor = last[1][1]
else
  cursor = redis.call('XADD', KEYS[3], '*', 'id', '')
end
return {now, cursor, redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf'), redis.call('SMEMBERS', KEYS[2]), redis.call('EXISTS', KEYS[4])}
";

/// `KEYS[1]` record key, `KEYS[2]` change stream, `ARGV[1]` JSON, `ARGV[2]`
/// version, `ARGV[3]` exit id, `ARGV[4]` entries kept: writes an exit record
/// unless a newer one is there, and records the change. 1 if written.
pub const PUT_EXIT_SCRIPT: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, rec = pcall(cjson.decode, cur)
  if ok and type(rec) == 'table' and tonumber(rec['version']) and tonumber(rec['version']) >= tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'id', ARGV[3])
return 1
";

/// `KEYS[1]` record key, `KEYS[2]` change stream, `ARGV[1]` exit id,
/// `ARGV[2]` entries kept: removes a deleted exit's record, recording the change.
pub const DEL_EXIT_SCRIPT: &str = r"
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'id', ARGV[1])
  return 1
end
return 0
";

/// One pool delta. `KEYS[1]` live set, `KEYS[2]` draining set, `KEYS[3]`
/// change stream, `KEYS[4]` the control plane's presence key (its
/// existence is the reply's last element); `ARGV[1]` Redis time (ms) of the previous read, `ARGV[2]`
/// the last change id seen, `ARGV[3]` most changes returned, `ARGV[4]` the
/// exit record key prefix. Returns `{now, complete, cursor, expired, changed}`:
/// `complete` is 0 when the stream no longer holds the cursor (trimmed, or
/// Redis restarted) and the caller must read the pool in full; `expired` are
/// the exits whose liveness ran out since the previous read; `changed` is a
/// flat list of `id, live expiry or '', draining 0/1, record JSON or ''` for
/// every exit named by a change entry after the cursor, as they are now.
pub const POOL_DELTA_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cursor = ARGV[2]
local control = redis.call('EXISTS', KEYS[4])
if #redis.call('XRANGE', KEYS[3], cursor, cursor) == 0 then
  return {now, 0, cursor, {}, {}, control}
end
-- Liveness entries expired longer ago than the heartbeat script keeps them
-- (an hour) are gone from the live set: a reader that far behind cannot
-- learn of those expiries from it and must read in full.
if tonumber(ARGV[1]) < now - 3000000 then
  return {now, 0, cursor, {}, {}, control}
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], now)
local entries = redis.call('XRANGE', KEYS[3], '(' .. cursor, '+', 'COUNT', tonumber(ARGV[3]))
local seen = {}
local changed = {}
for _, entry in ipairs(entries) do
  cursor = entry[1]
  local fields = entry[2]
  local id = fields[2]
  if id and id ~= '' and not seen[id] then
    seen[id] = true
    local score = redis.call('ZSCORE', KEYS[1], id)
    local record = redis.call('GET', ARGV[4] .. id)
    changed[#changed + 1] = id
    changed[#changed + 1] = score or ''
    changed[#changed + 1] = redis.call('SISMEMBER', KEYS[2], id)
    changed[#changed + 1] = record or ''
  end
end
return {now, 1, cursor, expired, changed, control}
";

/// `KEYS[1]` live set: members whose expiry is still in the future by Redis' clock.
pub const LIVE_MEMBERS_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
";
