//! The protocol: key layout, lock values and the Lua scripts. Everything
//! dlock's Redis drivers do to a Redis server is here.
//!
//! # Keys
//!
//! - lock key: `{prefix}{key}` (prefix default `dlock:`, may be empty, so
//!   another client's plain `SET name value NX PX ttl` lock on `name` and ours
//!   exclude each other);
//! - fence counter: in the lock key's hash slot, so both can be touched by one
//!   script on a Redis Cluster: `{<lock key>}:dlock-fence`, or, when the lock
//!   key already carries a hash tag `{t}`, `<lock key>:dlock-fence` (same tag);
//! - release channel: `dlock:released:<lock key>` (pub/sub; not a key);
//! - a read-write lock's, beside the lock key in its slot (named as the fence
//!   counter is: `{<lock key>}<suffix>`, or `<lock key><suffix>` for a
//!   tagged key): readers [`READERS_SUFFIX`], writer [`WRITER_SUFFIX`],
//!   waiting writers [`WRITERS_WAITING_SUFFIX`]; channel [`rw_channel`];
//! - a semaphore's: holders [`PERMITS_SUFFIX`]; channel [`permits_channel`].
//!
//! # Values
//!
//! `dlock1 <128-bit nonce in hex> <host> <pid> <unix ms at acquire>`: the
//! nonce makes release and extend compare-and-act; the rest tells an operator
//! who holds the lock (`RedisLock::holder` in `dlock-redis`).
//!
//! A reader's member of the readers' sorted set is its value followed by
//! its own fencing token, `<value> t<token>`; a permit holder's member of
//! the holders' sorted set is `<count> <value> t<token>` (see
//! [`with_token`], [`split_token`]). The script that grants appends the
//! token it computed, so an operator view can tell each holder's own token
//! (the fence counter is only the name's latest). Members written before
//! the token was stored (`<value>`, `<count> <value>`) are still released,
//! extended and counted; they show no token.
//!
//! # Fencing
//!
//! The token is computed in the same script as the `SET NX`, so grants and
//! tokens are ordered together: `max(counter + 1, server TIME in µs)`,
//! stored back as the new counter (a hybrid logical clock). The clock term
//! is what keeps tokens increasing when the counter is stale or gone: a
//! restart without persistence, a restart from an RDB snapshot or an
//! `appendfsync everysec` AOF that missed the last grants, a failover to an
//! asynchronous replica that had not received them, the counter's own
//! expiry (24 h after the last grant).
//!
//! What is then assumed, precisely: the server that grants after such an
//! event has a clock that is not behind the last grant's server clock by
//! more than the time that passed between the two grants (for a failover:
//! the new master's clock is not behind the old one's by more than the
//! failover took; for a restart: the host's clock was not set back). Lua
//! numbers are doubles and hold microseconds since 1970 exactly (below
//! 2^53 until the year 2255). A key granted more than a million times a
//! second runs ahead of the clock by the excess, which is harmless: the
//! counter term still increases.

/// What a mutex script does with its waiter (the Lua locals `waiter`,
/// `queue` and `gone_at` set first) when it grants: the waiter leaves the
/// queue. As [`ACQUIRE`] says.
macro_rules! waiter_served {
    () => {
        r#"  if waiter and waiter ~= '' then
    redis.call('ZREM', queue, waiter)
    redis.call('ZREM', gone_at, waiter)
  end
"#
    };
}

/// What a mutex script does when the lock key is held: a key of another
/// type is an error; a waiter is queued (its first attempt's time kept),
/// its gone-at time moved on by its window (`ARGV[4]` ms), up to 16
/// waiters past theirs dropped, and the queue kept as long as its longest
/// window. As [`ACQUIRE`] says.
macro_rules! waiter_refused {
    () => {
        r#"local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'string' then
  return redis.error_reply('WRONGTYPE dlock: the lock key holds a ' .. kind)
end
if waiter and waiter ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local window = tonumber(ARGV[4])
  redis.call('ZADD', queue, 'NX', now, waiter)
  redis.call('ZADD', gone_at, now + window, waiter)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', gone_at, '-inf', '(' .. now, 'LIMIT', 0, 16)) do
    redis.call('ZREM', queue, gone)
    redis.call('ZREM', gone_at, gone)
  end
  local keep = math.max(window, redis.call('PTTL', gone_at))
  redis.call('PEXPIRE', queue, keep)
  redis.call('PEXPIRE', gone_at, keep)
end
"#
    };
}

/// `SET NX PX` and, only if that succeeded, the fencing token
/// `max(counter + 1, TIME in µs)` (see the module docs), stored back. The key's type is
/// looked at only when the `SET NX` failed: the common path is the fewest
/// commands the server can run for a fenced grant.
///
/// A waiting client passes its waiter id: a failed attempt queues it (first
/// attempt's time, kept), records when it will count as gone (now plus its
/// own window, `ARGV[4]` ms: each client knows how long its rounds may
/// take) and drops up to 16 waiters past theirs (crashed, cancelled),
/// wherever they are in the queue; a grant takes it out of the queue. See
/// [`RELEASE`] for what the queue is for.
///
/// `KEYS[1]` lock key, `KEYS[2]` fence counter, `KEYS[3]` waiter queue,
/// `KEYS[4]` when each waiter counts as gone; `ARGV[1]` value, `ARGV[2]` TTL in ms,
/// `ARGV[3]` waiter id (empty: not waiting), `ARGV[4]` this waiter's window
/// (ms): not seen again for that long, it counts as gone; the queue outlives
/// the last attempt by the longest window in it. Returns `{1, token}` when granted, `{0, pttl}` when held
/// (`pttl` = -1 if the holder set no expiry). A lock key holding another
/// type is a `WRONGTYPE` error; a fence counter that is not a number below
/// 2^53 (set by someone else: NaN, negative, too large for exact Lua
/// numbers) is an error before anything is granted. `redis.replicate_commands`
/// (a no-op since Redis 5) lets Redis 3.2-4 write after `TIME`.
pub const ACQUIRE: &str = concat!(
    r#"
if redis.replicate_commands then redis.replicate_commands() end
local waiter, queue, gone_at = ARGV[3], KEYS[3], KEYS[4]
local stored = redis.call('GET', KEYS[2])
local counter = tonumber(stored) or 0
if counter ~= counter or counter < 0 or counter >= 9007199254740991 then
  return redis.error_reply('ERR dlock: the fence counter ' .. KEYS[2] .. ' holds ' .. tostring(stored) .. ', not a token below 2^53')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = math.max(counter + 1, now)
  redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', 86400000)
"#,
    waiter_served!(),
    r#"  return {1, token}
end
"#,
    waiter_refused!(),
    r#"return {0, redis.call('PTTL', KEYS[1])}
"#
);

/// `SET NX PX` alone, for Redlock, which gives no fencing token.
///
/// `KEYS[1]` lock key, `KEYS[2]` waiter queue, `KEYS[3]` gone-at times;
/// `ARGV[1]` value, `ARGV[2]` TTL in ms, `ARGV[3]` waiter id (empty: not
/// waiting), `ARGV[4]` the waiter's window (as [`ACQUIRE`], pruned the same
/// way). Returns
/// `{1, 0}` when granted, `{0, pttl, holder's value}` when held (the value
/// tells a real holder from a split vote across nodes); `WRONGTYPE` as
/// [`ACQUIRE`].
pub const ACQUIRE_UNFENCED: &str = concat!(
    r#"
if redis.replicate_commands then redis.replicate_commands() end
local waiter, queue, gone_at = ARGV[3], KEYS[2], KEYS[3]
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
"#,
    waiter_served!(),
    r#"  return {1, 0}
end
"#,
    waiter_refused!(),
    r#"return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1])}
"#
);

/// Compare-value delete, then announce on the release channel. (A key of
/// another type makes `GET` fail: that is "held by someone else".)
///
/// The notice names one waiter, so a release wakes one client, not all of
/// them (no herd): the longest-queued waiter not past its window; waiters
/// past theirs (gone: crashed, cancelled) are dropped from the queue on the
/// way (the server's clock is read only when the queue is not empty: an
/// uncontended release costs one command less). With no queue (Redlock
/// passes none) or nobody alive in it, the notice is `*`: everyone retries. A woken waiter that
/// loses the race to a newcomer stays first in line; waiters also poll, so
/// a notice lost to a dead waiter costs at most one poll.
///
/// `KEYS[1]` lock key, optional `KEYS[2]` waiter queue and `KEYS[3]` last
/// seen times (when each waiter counts as gone); `ARGV[1]` our value,
/// `ARGV[2]` channel. Returns 1 released, 0 already gone (expired), -1 held
/// by someone else (untouched).
pub const RELEASE: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then return -1 end
if not v then return 0 end
if v ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1])
local target = '*'
if KEYS[2] then
  local now = nil
  for _ = 1, 16 do
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not head then break end
    if not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local gone_at = tonumber(redis.call('ZSCORE', KEYS[3], head) or 0)
    if gone_at > now then
      target = head
      break
    end
    redis.call('ZREM', KEYS[2], head)
    redis.call('ZREM', KEYS[3], head)
  end
end
redis.call('PUBLISH', ARGV[2], target)
return 1
"#;

/// A waiter gives up: out of the queue. `KEYS[1]` waiter queue, `KEYS[2]`
/// gone-at times; `ARGV[1]` waiter id.
pub const LEAVE: &str = r#"
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"#;

/// The notice that wakes every waiter of a key.
pub const WAKE_ALL: &str = "*";

/// The prefix of waiter ids (`w` and 24 hex digits).
const WAITER_PREFIX: &str = "w";

/// A new waiter id: random, 96 bits.
pub fn new_waiter_id() -> String {
    format!("{WAITER_PREFIX}{:024x}", rand::random::<u128>() >> 32)
}

/// Whether a notice names one waiter (anything else wakes everyone: `*`,
/// or the `1` older versions sent).
pub fn is_waiter_id(notice: &str) -> bool {
    notice.len() == 25
        && notice.starts_with(WAITER_PREFIX)
        && notice[1..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// Compare-value `PEXPIRE`; never re-creates an expired key.
///
/// `KEYS[1]` lock key; `ARGV[1]` our value, `ARGV[2]` new TTL in ms. Returns
/// 1 extended, 0 already gone (expired), -1 held by someone else.
pub const EXTEND: &str = r#"
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then return -1 end
if not v then return 0 end
if v ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#;

/// The start of every script that grants: the fence counter `KEYS[n]`
/// checked (as [`ACQUIRE`] does) and the server's clock read; leaves
/// `counter`, `now_us` and `now` (ms) for the rest of the script.
macro_rules! granting_prelude {
    ($fence:literal) => {
        concat!(
            "if redis.replicate_commands then redis.replicate_commands() end\n",
            "local stored = redis.call('GET', KEYS[",
            $fence,
            "])\n",
            "local counter = tonumber(stored) or 0\n",
            "if counter ~= counter or counter < 0 or counter >= 9007199254740991 then\n",
            "  return redis.error_reply('ERR dlock: the fence counter ' .. KEYS[",
            $fence,
            "] .. ' holds ' .. tostring(stored) .. ', not a token below 2^53')\n",
            "end\n",
            "local t = redis.call('TIME')\n",
            "local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])\n",
            "local now = math.floor(now_us / 1000)\n",
            "local function grant()\n",
            "  local token = math.max(counter + 1, now_us)\n",
            "  redis.call('SET', KEYS[",
            $fence,
            "], string.format('%.0f', token), 'PX', 86400000)\n",
            "  return token\n",
            "end\n",
            // A sorted set of members scored by expiry lives exactly as
            // long as its last member (never shorter: a set without expiry
            // gets one; never longer: nothing lingers after a crash).
            "local function live_until_last(key)\n",
            "  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')\n",
            "  if last[2] then redis.call('PEXPIREAT', key, string.format('%.0f', tonumber(last[2]))) end\n",
            "end\n",
            // A member with its holder's own token (`with_token`).
            "local function with_token(member, token)\n",
            "  return member .. ' t' .. string.format('%.0f', token)\n",
            "end\n",
        )
    };
}

/// A read of a read-write lock: granted unless a writer holds or a writer
/// waits (so a stream of readers cannot starve a writer); a reader is a
/// member `"<value> t<token>"` (its own token: [`with_token`]) of the
/// readers' sorted set, scored by when it expires (server ms), and expired
/// readers are dropped by every attempt.
///
/// `KEYS[1]` readers, `KEYS[2]` writer, `KEYS[3]` waiting writers (id by
/// the server time past which each counts as gone), `KEYS[4]` fence
/// counter; `ARGV[1]` value, `ARGV[2]` TTL in ms. Returns `{1, token}`, or
/// `{0, ms}`: how long the writer (or the first waiting writer's window)
/// has left (-1: a writer without expiry).
pub const READ_ACQUIRE: &str = concat!(
    granting_prelude!(4),
    r#"
local ttl = tonumber(ARGV[2])
local w = redis.call('PTTL', KEYS[2])
if w ~= -2 then return {0, w} end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local waiting = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if waiting[1] then return {0, math.max(1, tonumber(waiting[2]) - now)} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local token = grant()
redis.call('ZADD', KEYS[1], now + ttl, with_token(ARGV[1], token))
live_until_last(KEYS[1])
return {1, token}
"#
);

/// A write of a read-write lock: granted when no writer holds and no
/// reader is left (expired readers dropped first). A waiting writer passes
/// its id: a refused attempt marks it waiting (until now plus its window,
/// `ARGV[4]` ms, as [`ACQUIRE`]'s queue), which holds new readers back; a
/// grant clears its mark.
///
/// `KEYS` as [`READ_ACQUIRE`]; `ARGV[1]` value, `ARGV[2]` TTL in ms,
/// `ARGV[3]` waiter id (empty: not waiting), `ARGV[4]` its window. Returns
/// `{1, token}`, or `{0, ms}`: how long the writer, or the first reader to
/// expire, has left (-1: no expiry).
pub const WRITE_ACQUIRE: &str = concat!(
    granting_prelude!(4),
    r#"
local ttl = tonumber(ARGV[2])
local waiter = ARGV[3]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('PTTL', KEYS[2])
if held == -2 then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[1] then held = math.max(1, tonumber(first[2]) - now) end
end
if held == -2 then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  if waiter ~= '' then redis.call('ZREM', KEYS[3], waiter) end
  return {1, grant()}
end
if waiter ~= '' then
  local window = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[3], now + window, waiter)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  live_until_last(KEYS[3])
end
return {0, held}
"#
);

/// `count` permits of a semaphore of `limit`: granted when the permits of
/// the live holders plus `count` are at most `limit`. A holder is a member
/// `"<count> <value> t<token>"` (its own token: [`with_token`]) of the
/// holders' sorted set, scored by when it expires (server ms); expired
/// holders are dropped by every attempt, so a crashed holder's permits
/// come back at its TTL.
///
/// `KEYS[1]` holders, `KEYS[2]` fence counter; `ARGV[1]` member without
/// the token ([`permits_member`]: `"<count> <value>"`), `ARGV[2]`
/// TTL in ms, `ARGV[3]` count, `ARGV[4]` limit. Returns `{1, token}`, or
/// `{0, ms}`: how long the first holder to expire has left.
pub const PERMITS_ACQUIRE: &str = concat!(
    granting_prelude!(2),
    r#"
local ttl, count, limit = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local used = 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  used = used + (tonumber(string.match(m, '^(%d+) ')) or 1)
end
if used + count <= limit then
  local token = grant()
  redis.call('ZADD', KEYS[1], now + ttl, with_token(ARGV[1], token))
  live_until_last(KEYS[1])
  return {1, token}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, math.max(1, tonumber(first[2]) - now)}
"#
);

/// A reader or a permit holder leaves: its member out of the sorted set
/// `KEYS[1]`, announced on the channel `ARGV[2]` (to everyone: any release
/// may admit several waiters); with `ARGV[3]` = `1` only when no live
/// member is left (a reader's release can admit only a writer, and only
/// the last one's does). `ARGV[1]` the member: with its token, as the
/// grant stored it, or without (`<value>`, `<count> <value>`) when the
/// grant's reply was lost, so the token is unknown: then the one member
/// `ARGV[1] t<token>` is looked for (a scan of the set, on this path only;
/// the nonce makes the match unique). Returns 1 released, 0 already gone
/// or expired.
pub const MEMBER_RELEASE: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local member = ARGV[1]
local score = redis.call('ZSCORE', KEYS[1], member)
if not score and not string.find(member, ' t%d+$') then
  local head = member .. ' t'
  for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
    if string.sub(m, 1, #head) == head and string.match(string.sub(m, #head + 1), '^%d+$') then
      member = m
      score = redis.call('ZSCORE', KEYS[1], m)
      break
    end
  end
end
if not score then return 0 end
redis.call('ZREM', KEYS[1], member)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', tonumber(last[2]))) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[3] ~= '1' or redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') == 0 then
  redis.call('PUBLISH', ARGV[2], '*')
end
if tonumber(score) <= now then return 0 end
return 1
"#;

/// A reader or a permit holder extends: its member's expiry moved to now
/// plus `ARGV[2]` ms, unless it is gone or expired (never re-created).
/// `KEYS[1]` the sorted set, `ARGV[1]` the member (with its token, as
/// stored). Returns 1 extended, 0 gone.
pub const MEMBER_EXTEND: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(score) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', tonumber(last[2])))
return 1
"#;

/// A waiting writer gives up: its mark out of the waiting writers
/// `KEYS[1]` (`ARGV[1]` its id), announced on the channel `ARGV[2]` when it
/// was there (readers it held back may come in now).
pub const LEAVE_MARK: &str = r#"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('PUBLISH', ARGV[2], '*')
end
return 1
"#;

/// Every live holder of a read-write lock or a semaphore, for operators
/// (read-only). `KEYS[1]` readers or holders (sorted set), optional
/// `KEYS[2]` writer. Returns `{kind, value or member, ms left, ...}`, kind
/// `w` for the writer (ms -1: no expiry) and `m` for a member (with its
/// token: [`split_token`]); a writer key of another type is left out.
pub const FAMILY_HOLDERS: &str = r#"
local out = {}
if KEYS[2] then
  local v = redis.pcall('GET', KEYS[2])
  if type(v) == 'string' then
    table.insert(out, 'w')
    table.insert(out, v)
    table.insert(out, redis.call('PTTL', KEYS[2]))
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #all, 2 do
  table.insert(out, 'm')
  table.insert(out, all[i])
  table.insert(out, tonumber(all[i + 1]) - now)
end
return out
"#;

/// The suffix of a read-write lock's readers (a sorted set:
/// `"<value> t<token>"` by expiry, server ms).
pub const READERS_SUFFIX: &str = ":dlock-readers";

/// The suffix of a read-write lock's writer (a string with the writer's
/// value and TTL, as a mutex's lock key).
pub const WRITER_SUFFIX: &str = ":dlock-writer";

/// The suffix of a read-write lock's waiting writers (a sorted set: waiter
/// id by the server time, in ms, past which it counts as gone).
pub const WRITERS_WAITING_SUFFIX: &str = ":dlock-wwait";

/// The suffix of a semaphore's holders (a sorted set:
/// `"<count> <value> t<token>"` by expiry, server ms).
pub const PERMITS_SUFFIX: &str = ":dlock-permits";

/// The release channel of a read-write lock (its own prefix, so no
/// mutex's channel can be it).
pub fn rw_channel(lock_key: &str) -> String {
    format!("dlock:released-rw:{lock_key}")
}

/// The release channel of a semaphore.
pub fn permits_channel(lock_key: &str) -> String {
    format!("dlock:released-sem:{lock_key}")
}

/// A semaphore holder's member: its count and its value (the value as
/// held: with its token, [`with_token`], once granted; without, for the
/// acquire script, which appends it).
pub fn permits_member(count: u32, value: &str) -> String {
    format!("{count} {value}")
}

/// What separates a member from its holder's token.
const TOKEN_MARK: &str = " t";

/// A reader's value, or a permit holder's member, with its own fencing
/// token, as the granting script stores it: `"<member> t<token>"` (the
/// Lua `with_token`; a token below 2^53 is written the same way by both).
pub fn with_token(member: &str, token: u64) -> String {
    format!("{member}{TOKEN_MARK}{token}")
}

/// A member as [`with_token`] made it: the member and its token; a member
/// without one (written before tokens were stored, or by someone else) is
/// itself and `None`. (A dlock value ends in digits without a `t`, so it
/// cannot be mistaken for a token.)
pub fn split_token(member: &str) -> (&str, Option<u64>) {
    let digits_only = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    member
        .rsplit_once(TOKEN_MARK)
        .filter(|(_, d)| digits_only(d))
        .and_then(|(rest, d)| Some((rest, Some(d.parse::<u64>().ok()?))))
        .unwrap_or((member, None))
}

/// The name whose read-write lock or semaphore `key` belongs to, for a key
/// holding one of their suffixes (`{dlock:job}:dlock-readers` is
/// `dlock:job`'s); `None` for any other key.
pub fn family_owner(key: &str) -> Option<&str> {
    let base = [READERS_SUFFIX, WRITER_SUFFIX, PERMITS_SUFFIX]
        .iter()
        .find_map(|s| key.strip_suffix(s))?;
    match base.strip_prefix('{').and_then(|b| b.strip_suffix('}')) {
        Some(inner) if !inner.contains('}') => Some(inner),
        _ => hash_tag(base).is_some().then_some(base),
    }
}

/// The suffix of fence counter keys.
pub const FENCE_SUFFIX: &str = ":dlock-fence";

/// The suffix of waiter queues (a sorted set: waiter id by first attempt).
pub const QUEUE_SUFFIX: &str = ":dlock-queue";

/// The suffix of the waiters' gone-at times (a sorted set: waiter id by
/// the server time, in ms, past which it counts as gone).
pub const SEEN_SUFFIX: &str = ":dlock-seen";

/// A key beside `lock_key` in its hash slot (so one script can touch both
/// on a Redis Cluster): `{<lock key>}<suffix>`, or `<lock key><suffix>` when
/// the lock key already carries a hash tag.
pub fn companion_key(lock_key: &str, suffix: &str) -> String {
    if hash_tag(lock_key).is_some() {
        format!("{lock_key}{suffix}")
    } else {
        format!("{{{lock_key}}}{suffix}")
    }
}

/// The suffixes of the companion keys; a lock key holding one could *be*
/// another lock's companion (`{u}a:dlock-fence` is the fence counter of
/// `{u}a`).
pub const SUFFIXES: [&str; 7] = [
    FENCE_SUFFIX,
    QUEUE_SUFFIX,
    SEEN_SUFFIX,
    READERS_SUFFIX,
    WRITER_SUFFIX,
    WRITERS_WAITING_SUFFIX,
    PERMITS_SUFFIX,
];

/// `Err(reason)` when `lock_key` could collide with the layout's own
/// companion keys.
///
/// # Errors
///
/// The reason, for an [`InvalidKey`](dlock_core::Error::InvalidKey).
pub fn check_layout(lock_key: &str) -> Result<(), String> {
    match SUFFIXES.iter().find(|s| lock_key.contains(*s)) {
        Some(s) => Err(format!(
            "{lock_key:?} holds {s:?}, the suffix of dlock's own companion keys: it could be another lock's"
        )),
        None => Ok(()),
    }
}

/// The prefix of release channels.
pub const CHANNEL_PREFIX: &str = "dlock:released:";

/// The hash tag Redis Cluster would use for `key`: the text between the
/// first `{` and the first `}` after it, if non-empty.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    let tag = &key[open + 1..open + 1 + close];
    (!tag.is_empty()).then_some(tag)
}

/// The fence counter key of a lock key, in the same hash slot; `None` when no
/// such key can be formed (the lock key has a `}` but no hash tag), which
/// matters only on a cluster.
pub fn fence_key(lock_key: &str) -> Option<String> {
    if hash_tag(lock_key).is_some() {
        Some(format!("{lock_key}{FENCE_SUFFIX}"))
    } else if lock_key.contains('}') {
        None
    } else {
        Some(format!("{{{lock_key}}}{FENCE_SUFFIX}"))
    }
}

/// The release channel of a lock key.
pub fn channel(lock_key: &str) -> String {
    format!("{CHANNEL_PREFIX}{lock_key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_key_shares_the_lock_keys_slot() {
        assert_eq!(fence_key("dlock:job").as_deref(), Some("{dlock:job}:dlock-fence"));
        assert_eq!(hash_tag("{dlock:job}:dlock-fence"), Some("dlock:job"));
        // A key with its own tag keeps it.
        assert_eq!(
            fence_key("dlock:{user1}:cart").as_deref(),
            Some("dlock:{user1}:cart:dlock-fence")
        );
        assert_eq!(hash_tag("dlock:{user1}:cart:dlock-fence"), Some("user1"));
        // `{}` is not a tag: the whole key is hashed, and the counter's tag is the whole key.
        assert_eq!(hash_tag("a{}b"), None);
        assert_eq!(fence_key("a{}b"), None);
        assert_eq!(fence_key("a}b"), None);
        assert_eq!(fence_key("a{b").as_deref(), Some("{a{b}:dlock-fence"));
        assert_eq!(hash_tag("{a{b}:dlock-fence"), Some("a{b"));
    }

    #[test]
    fn names_that_could_be_companion_keys_are_refused() {
        assert!(check_layout("dlock:job").is_ok());
        assert!(check_layout("{u}a:dlock-fence").is_err());
        assert!(check_layout("{dlock:a}:dlock-queue").is_err());
        assert!(check_layout("x:dlock-seen:y").is_err());
    }

    #[test]
    fn a_members_token_is_told_apart_from_its_value() {
        let v = dlock_core::driver::owner_value("t1");
        let held = with_token(&v, 1_700_000_000_123_456);
        assert_eq!(split_token(&held), (v.as_str(), Some(1_700_000_000_123_456)));
        assert_eq!(
            dlock_core::driver::Owner::from_value(split_token(&held).0)
                .unwrap()
                .host,
            "t1"
        );
        let permit = permits_member(2, &held);
        assert_eq!(permit, format!("2 {v} t1700000000123456"));
        // Members written before tokens were stored: no token, not a wrong one.
        for old in [
            v.as_str(),
            "dlock1 00000000000000000000000000000000 t7 1 2",
            "x t",
            "x t-1",
            "x t1.5",
        ] {
            assert_eq!(split_token(old), (old, None), "{old:?}");
        }
        assert_eq!(
            split_token("x t99999999999999999999"),
            ("x t99999999999999999999", None)
        );
    }
}
