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
//! - release channel: `dlock:released:<lock key>` (pub/sub; not a key).
//!
//! # Values
//!
//! `dlock1 <128-bit nonce in hex> <host> <pid> <unix ms at acquire>`: the
//! nonce makes release and extend compare-and-act; the rest tells an operator
//! who holds the lock (`RedisLock::holder` in `dlock-redis`).
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
pub const ACQUIRE: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local waiter = ARGV[3]
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
  if waiter and waiter ~= '' then
    redis.call('ZREM', KEYS[3], waiter)
    redis.call('ZREM', KEYS[4], waiter)
  end
  return {1, token}
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'string' then
  return redis.error_reply('WRONGTYPE dlock: the lock key holds a ' .. kind)
end
if waiter and waiter ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local window = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[3], 'NX', now, waiter)
  redis.call('ZADD', KEYS[4], now + window, waiter)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. now, 'LIMIT', 0, 16)) do
    redis.call('ZREM', KEYS[3], gone)
    redis.call('ZREM', KEYS[4], gone)
  end
  local keep = math.max(window, redis.call('PTTL', KEYS[4]))
  redis.call('PEXPIRE', KEYS[3], keep)
  redis.call('PEXPIRE', KEYS[4], keep)
end
return {0, redis.call('PTTL', KEYS[1])}
"#;

/// `SET NX PX` alone, for Redlock, which gives no fencing token.
///
/// `KEYS[1]` lock key, `KEYS[2]` waiter queue, `KEYS[3]` gone-at times;
/// `ARGV[1]` value, `ARGV[2]` TTL in ms, `ARGV[3]` waiter id (empty: not
/// waiting), `ARGV[4]` the waiter's window (as [`ACQUIRE`], pruned the same
/// way). Returns
/// `{1, 0}` when granted, `{0, pttl, holder's value}` when held (the value
/// tells a real holder from a split vote across nodes); `WRONGTYPE` as
/// [`ACQUIRE`].
pub const ACQUIRE_UNFENCED: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local waiter = ARGV[3]
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if waiter and waiter ~= '' then
    redis.call('ZREM', KEYS[2], waiter)
    redis.call('ZREM', KEYS[3], waiter)
  end
  return {1, 0}
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'string' then
  return redis.error_reply('WRONGTYPE dlock: the lock key holds a ' .. kind)
end
if waiter and waiter ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local window = tonumber(ARGV[4])
  redis.call('ZADD', KEYS[2], 'NX', now, waiter)
  redis.call('ZADD', KEYS[3], now + window, waiter)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, 16)) do
    redis.call('ZREM', KEYS[2], gone)
    redis.call('ZREM', KEYS[3], gone)
  end
  local keep = math.max(window, redis.call('PTTL', KEYS[3]))
  redis.call('PEXPIRE', KEYS[2], keep)
  redis.call('PEXPIRE', KEYS[3], keep)
end
return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1])}
"#;

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
pub const SUFFIXES: [&str; 3] = [FENCE_SUFFIX, QUEUE_SUFFIX, SEEN_SUFFIX];

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

/// What an operator sees in a lock value written by dlock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueInfo {
    /// The random nonce (hex) that makes the value unique.
    pub nonce: String,
    /// The holder's host name.
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// When the holder acquired, as Unix milliseconds (wall clock; for display,
    /// never for validity).
    pub since_unix_ms: u64,
}

/// Makes a fresh lock value: a new 128-bit nonce and this process's identity.
pub fn new_value(host: &str) -> String {
    let nonce: u128 = rand::random();
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    format!("dlock1 {nonce:032x} {host} {} {since}", std::process::id())
}

/// Reads a value written by [`new_value`]; `None` for anything else (a value
/// set by another client).
pub fn parse_value(value: &str) -> Option<ValueInfo> {
    let mut parts = value.split(' ');
    if parts.next()? != "dlock1" {
        return None;
    }
    let nonce = parts.next()?.to_owned();
    let host = parts.next()?.to_owned();
    let pid = parts.next()?.parse().ok()?;
    let since_unix_ms = parts.next()?.parse().ok()?;
    if parts.next().is_some() || nonce.len() != 32 {
        return None;
    }
    Some(ValueInfo {
        nonce,
        host,
        pid,
        since_unix_ms,
    })
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
    fn values_round_trip_and_foreign_values_are_not_ours() {
        let v = new_value("host-1");
        let info = parse_value(&v).unwrap();
        assert_eq!(info.host, "host-1");
        assert_eq!(info.pid, std::process::id());
        assert_ne!(parse_value(&new_value("host-1")).unwrap().nonce, info.nonce);
        for foreign in [
            "",
            "locked",
            "dlock1",
            "dlock1 xyz h 1 2",
            "dlock1 00000000000000000000000000000000 h x 2",
        ] {
            assert_eq!(parse_value(foreign), None, "{foreign:?}");
        }
    }
}
