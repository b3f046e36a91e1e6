//! # dlock-redis
//!
//! A [`dlock_core::Lock`] on one Redis server (or a Redis Cluster), with
//! fencing tokens.
//!
//! ```
//! use std::time::Duration;
//! use dlock_core::{AcquireOptions, Guard, Lock, LockKey};
//! use dlock_redis::{RedisConfig, RedisLock};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock_core::Result<()> {
//! # // The test servers of `cargo xtask test`, or a private one.
//! # let server = dlock_testkit::launcher::shared::redis().await.expect("a test redis");
//! # let url = server.addresses[0].clone();
//! // url = "redis://127.0.0.1:6379"
//! let lock = RedisLock::connect(RedisConfig::from_url(url)).await?;
//! let key = LockKey::new("nightly-report")?;
//! let guard = lock.acquire(&key, AcquireOptions::default().ttl(Duration::from_secs(30))).await?;
//! let token = guard.token().expect("redis gives fencing tokens");
//! assert_eq!(lock.holder(&key).await?.and_then(|h| h.token), Some(token.get()));
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Protocol
//!
//! The whole protocol is in [`scripts`] (shared with `dlock-redlock` through
//! the `dlock-redis-protocol` crate): the key layout and the Lua scripts.
//!
//! - **acquire** = one script: `SET key value NX PX ttl` and, only if that
//!   succeeded, the token `max(counter + 1, server TIME in µs)`, stored back
//!   as the key's fence counter. The token comes back with the grant.
//! - **release / extend** = compare-value scripts with three outcomes: done,
//!   already expired ([`Error::Lost`](dlock_core::Error::Lost)), held by
//!   someone else ([`Error::NotHeld`](dlock_core::Error::NotHeld)). Extend never
//!   re-creates an expired key; release never deletes a value it did not write.
//! - **waiting**: a waiter queues itself (a sorted set beside the key: its
//!   id by first attempt, and when it was last seen) and subscribes to the
//!   key's channel (one subscriber connection per [`RedisLock`], one
//!   subscription per waited-on key). The release script publishes the id
//!   of the longest-queued waiter still within its window (seen in the last
//!   two of its rounds, at least a second: `2 x (150 ms + 2 x
//!   request_timeout)`), so a release wakes **one** waiter, not all (no
//!   herd); `*` (everyone) when nobody waits. Waiters past their window
//!   (crashed, cancelled) are dropped from the queue by the others'
//!   attempts, wherever they are in it. Waiters also poll with jitter, never longer than the holder's
//!   remaining TTL: a notice lost, or naming a waiter that just died, costs
//!   at most one poll. Redis locks stay non-FIFO: a newcomer can take a
//!   free key before the named waiter retries.
//! - **watchdog**: with `auto_extend`, renewal at `ttl / 3`; the local
//!   deadline runs from the acquire's send time minus drift.
//! - **read-write lock** (keys beside the lock key, in its hash slot):
//!   readers are members `"<value> t<token>"` of the sorted set
//!   `{KEY}:dlock-readers`, scored by when each expires (server time, so a
//!   crashed reader drops out at its TTL); the writer is the string `{KEY}:dlock-writer`, set when no
//!   writer holds and no live reader is left. A writer refused while
//!   waiting marks itself in `{KEY}:dlock-wwait` (until its window runs
//!   out), and readers are refused while a live mark is there, so a
//!   stream of readers cannot starve a writer.
//! - **semaphore**: holders are members `"<count> <value> t<token>"` of
//!   the sorted set `{KEY}:dlock-permits`, scored by expiry; a grant
//!   needs the live members' counts plus its own to be at most the limit.
//!   Not FIFO.
//! - Reads, writes and permits take their tokens from the name's fence
//!   counter, like the mutex. A write's or a permit's release wakes every
//!   waiter of the name (`*`: one release can admit several); a read's
//!   only when it was the last reader (only a writer can be waiting then).
//!   [`Lock::holders`](dlock_core::Lock::holders) lists every holder of a name, each with its
//!   own token: a reader's or a permit holder's member carries it
//!   (`<value> t<token>`), as its guard's `token()` reports it.
//! - (`{KEY}` stands for the lock key in braces, its hash tag; a key that
//!   has a tag of its own keeps it: `KEY:dlock-readers`.)
//! - A writer marks itself waiting from its second attempt on (right after
//!   it subscribed); a reader that comes in between goes ahead of it once.
//!   A writer that dies while waiting holds new readers back until its
//!   window runs out (`2 x (150 ms + 2 x request_timeout)`, 8.3 s with the
//!   default timeout); one that gives up takes its mark back and wakes them.
//!
//! ## Guarantees
//!
//! - [`Capabilities`](dlock_core::Capabilities): strict fencing, not FIFO,
//!   notified waiting; read-write locks and semaphores.
//! - Fencing tokens increase across a restart without persistence, a
//!   restart from a snapshot older than the last grant, and a failover to a
//!   replica that missed the last grants (all three tested): the clock term
//!   of `max(counter + 1, TIME in µs)` outruns a stale or lost counter. What
//!   this assumes: the server granting after the event has a clock not
//!   behind the previous grant's server clock by more than the time between
//!   the two grants (for a failover, by more than the failover took).
//! - Exclusion holds while the one server holds its data: with replication,
//!   a failover can lose a lock that was not yet replicated. Where that
//!   matters, check the token at the resource ([`dlock_core::Fence`]).
//! - Works against a Redis Cluster (`redis-cluster://` URLs): scripts touch
//!   only keys passed in `KEYS`, and a lock key shares its hash slot with its
//!   fence counter and its waiter queue.
//! - Interoperates with other clients' `SET name value NX PX ttl` locks on
//!   the same names when `key_prefix` is empty.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod config;
mod error;
mod guard;
mod lock;
mod protocol;

pub use dlock_redis_protocol::scripts;

pub use config::RedisConfig;
pub use guard::RedisGuard;
pub use lock::RedisLock;
pub use protocol::MIN_TTL;

/// The examples of this crate's README, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
