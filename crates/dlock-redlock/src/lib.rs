//! # dlock-redlock
//!
//! Redlock over N independent Redis nodes: an **efficiency lock**.
//!
//! ```
//! use std::time::Duration;
//! use dlock_core::{AcquireOptions, Guard, Lock, LockKey};
//! use dlock_redlock::{Redlock, RedlockConfig};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock_core::Result<()> {
//! # // The five test nodes of `cargo xtask test`, or private ones.
//! # let servers = dlock_testkit::launcher::shared::redis_nodes().await.expect("test redis nodes");
//! # let nodes = servers.addresses.clone();
//! // nodes = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379", ...]
//! let lock = Redlock::connect(RedlockConfig::new(nodes)).await?;
//! let key = LockKey::new("rebuild-search-index")?;
//! let guard = lock.acquire(&key, AcquireOptions::default().ttl(Duration::from_secs(30))).await?;
//! assert!(guard.token().is_none()); // Redlock gives no fencing token
//! // ... work that is merely wasted, not harmful, if it ever runs twice ...
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## When to use Redlock
//!
//! Use it where a rare second holder only **wastes work**: deduplicating a
//! cron job, a cache rebuild, an expensive report. Do **not** use it where two
//! holders would **corrupt data**: use etcd or ZooKeeper (or a single Redis)
//! and check the fencing token at the resource.
//!
//! Redlock gives **no fencing token** ([`Guard::token`](dlock_core::Guard::token)
//! is `None`, [`Capabilities::fencing`](dlock_core::Capabilities) is `None`).
//! As Martin Kleppmann showed, its safety rests on timing: a client paused
//! (GC, swap, a stopped VM) past the TTL still believes it holds the lock,
//! and a node whose clock jumps forward expires the key early. A random
//! value per grant cannot order holders, so no resource can reject the stale
//! one. Rather than fake a token, dlock says so.
//!
//! ## The algorithm
//!
//! - The acquire script (`SET key value NX PX ttl`, from
//!   [`dlock_redis_protocol::scripts`]) goes to every node **at once**, each
//!   request bounded by `request_timeout` (default 50 ms): one hung node costs at
//!   most that, and nothing once a quorum has said yes (the grant is decided
//!   then; the slower nodes' replies are not awaited, and a later release
//!   reaches them after the acquire on the same connection).
//! - Granted iff a quorum (`N/2 + 1`) said yes **and** the validity
//!   `ttl - elapsed - (ttl x drift_factor + 2 ms)` is positive, `elapsed` on
//!   the monotonic clock from the first send.
//! - Otherwise the value is released on every node at once (the silent ones
//!   too), and the next round waits for a release notice from any node or a
//!   random delay (`retry_jitter`). A waiter queues itself on every node
//!   where the key is held (beside the key, as `dlock-redis` does; where it
//!   is free the waiter's attempt wins that node and gives it back) and a
//!   release names the first live waiter of its node, so one waiter retries
//!   per release, not all. A waiter counts as gone (skipped, and dropped
//!   by the others' attempts) when not seen for four of its rounds
//!   (`retry_jitter + 2 x request_timeout` each: the attempt and the give-back
//!   of a failed one), at least a second.
//! - Extend needs a quorum too; a failed extend fires `lost()` and does not
//!   release the other nodes' keys. Release is compare-value on every node.
//! - No quorum is [`Error::Unavailable`](dlock_core::Error::Unavailable)
//!   whose source is a [`QuorumError`] naming each node and why (timed out,
//!   unreachable, held by another).
//!
//! ## Operating it safely
//!
//! Redlock's exclusion survives a node restart only if the restarted node
//! does not forget a key a client still relies on. Either run the nodes with
//! AOF persistence and `appendfsync always`, or keep a restarted node out of
//! service for longer than the longest TTL in use. The nodes must be
//! independent (no replication between them) and their clocks must not jump.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod config;
mod error;
mod guard;
mod lock;
mod protocol;
mod quorum;

pub use config::RedlockConfig;
pub use guard::RedlockGuard;
pub use lock::Redlock;
pub use protocol::MIN_TTL;
pub use quorum::{NodeFailure, QuorumError};

/// The examples of this crate's README, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
