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
//! The token is an `INCR` of the fence counter in the same script as the
//! `SET NX`, so grants and tokens are ordered together. An absent counter is
//! seeded from the server's `TIME` in microseconds, so tokens keep increasing
//! across a restart of a Redis that keeps nothing on disk (and across the
//! counter's own expiry, 24 h after the last grant). They could go backwards
//! only if the counter is lost *and* the server's clock is set back past the
//! last token (or a key is granted more than a million times a second).

/// `SET NX PX` and, only if that succeeded, the fence `INCR` (an absent
/// counter, `INCR` = 1, is seeded from the clock first). The key's type is
/// looked at only when the `SET NX` failed: the common path is the fewest
/// commands the server can run for a fenced grant.
///
/// `KEYS[1]` lock key, `KEYS[2]` fence counter; `ARGV[1]` value, `ARGV[2]`
/// TTL in ms. Returns `{1, token}` when granted, `{0, pttl}` when held
/// (`pttl` = -1 if the holder set no expiry). A lock key holding another
/// type is a `WRONGTYPE` error.
pub const ACQUIRE: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = redis.call('INCR', KEYS[2])
  if token == 1 then
    local now = redis.call('TIME')
    redis.call('SET', KEYS[2], now[1] .. string.format('%06d', tonumber(now[2])))
    token = redis.call('INCR', KEYS[2])
  end
  redis.call('PEXPIRE', KEYS[2], 86400000)
  return {1, token}
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'string' then
  return redis.error_reply('WRONGTYPE dlock: the lock key holds a ' .. kind)
end
return {0, redis.call('PTTL', KEYS[1])}
"#;

/// `SET NX PX` alone, for Redlock, which gives no fencing token.
///
/// `KEYS[1]` lock key; `ARGV[1]` value, `ARGV[2]` TTL in ms. Returns
/// `{1, 0}` when granted, `{0, pttl, holder's value}` when held (the value
/// tells a real holder from a split vote across nodes); `WRONGTYPE` as
/// [`ACQUIRE`].
pub const ACQUIRE_UNFENCED: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, 0}
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'string' then
  return redis.error_reply('WRONGTYPE dlock: the lock key holds a ' .. kind)
end
return {0, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1])}
"#;

/// Compare-value delete, then announce on the release channel. (A key of
/// another type makes `GET` fail: that is "held by someone else".)
///
/// `KEYS[1]` lock key; `ARGV[1]` our value, `ARGV[2]` channel. Returns 1
/// released, 0 already gone (expired), -1 held by someone else (untouched).
pub const RELEASE: &str = r#"
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' and v.err then return -1 end
if not v then return 0 end
if v ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '1')
return 1
"#;

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
