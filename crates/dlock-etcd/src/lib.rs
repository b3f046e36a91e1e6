//! # dlock-etcd
//!
//! A [`dlock_core::Lock`] on etcd, with fencing tokens: a **correctness
//! lock** when the resource checks the token.
//!
//! ```
//! use std::time::Duration;
//! use dlock_core::{AcquireOptions, Guard, Lock, LockKey};
//! use dlock_etcd::{EtcdConfig, EtcdLock};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock_core::Result<()> {
//! # // The test server of `cargo xtask test`, or a private one.
//! # let server = dlock_testkit::launcher::shared::etcd().await.expect("a test etcd");
//! # let endpoints = server.addresses.clone();
//! // endpoints = ["http://127.0.0.1:2379"]
//! let lock = EtcdLock::connect(EtcdConfig::new(endpoints)).await?;
//! let key = LockKey::new("ledger:eu")?;
//! let guard = lock.acquire(&key, AcquireOptions::default().ttl(Duration::from_secs(10))).await?;
//! let token = guard.token().expect("etcd gives fencing tokens");
//! // A write that etcd itself refuses unless we still hold the lock:
//! assert!(guard.put_if_held("ledger:eu/balance", token.to_string()).await?);
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Protocol
//!
//! The recipe is etcd's own `concurrency.Mutex` (see the `protocol` module
//! source): a key `{prefix}{name}/{lease:x}-{n:x}` per contender (the lease in
//! hex, as Go names it, and a per-acquire number), created in a
//! transaction; the lowest create revision holds; waiters watch only their
//! immediate predecessor; after waking, a waiter checks its own key survived.
//! With an empty prefix, `etcdctl lock NAME` and Go's Mutex interoperate.
//!
//! ## Guarantees
//!
//! - Strict fencing: the token is the key's create revision, which etcd
//!   never reuses, also across restarts and leader changes.
//! - FIFO: contenders are granted in create-revision order.
//! - Exclusion while the holder is not paused past its lease TTL; past it,
//!   the token at the resource is what protects the data
//!   ([`EtcdGuard::put_if_held`] for data kept in etcd).
//! - Sessions: see [`EtcdLock`]. The TTL of `AcquireOptions` is the lease
//!   TTL, in whole seconds, at least 2.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod config;
mod error;
mod guard;
mod lock;
mod protocol;
mod session;

pub use config::EtcdConfig;
pub use guard::EtcdGuard;
pub use lock::EtcdLock;
pub use session::MIN_TTL;

/// The examples of this crate's README, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
