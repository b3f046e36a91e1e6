//! # dlock-zk
//!
//! A [`dlock_core::Lock`] on ZooKeeper, with fencing tokens: a **correctness
//! lock** when the resource checks the token.
//!
//! ```
//! use dlock_core::{AcquireOptions, Guard, Lock, LockKey};
//! use dlock_zk::{ZkConfig, ZkLock};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock_core::Result<()> {
//! # // The test server of `cargo xtask test`, or a private one.
//! # let server = dlock_testkit::launcher::shared::zk().await.expect("a test zookeeper");
//! # let connect = server.addresses[0].clone();
//! // connect = "zk1:2181,zk2:2181,zk3:2181/app"
//! let lock = ZkLock::connect(ZkConfig::new(connect)).await?;
//! let key = LockKey::new("orders/compaction")?;
//! let guard = lock.acquire(&key, AcquireOptions::default()).await?;
//! println!("{} holds with token {:?}", guard.node(), guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Protocol
//!
//! Apache Curator's `InterProcessMutex` recipe (see the `protocol` module
//! source): an ephemeral-sequential node `{root}/{name}/_c_{uuid}-lock-{seq}`
//! per contender, the lowest sequence holds, each waiter watches only its
//! immediate predecessor, and a create whose reply was lost is found again
//! by its uuid. Curator clients on the same path and dlock exclude each
//! other.
//!
//! ## Guarantees
//!
//! - Strict fencing: the token is the node's `czxid`, which grows across the
//!   whole ensemble (the sequence suffix does not: it is per directory).
//! - FIFO in sequence order.
//! - Sessions, SUSPENDED and LOST: see [`ZkLock`].
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod config;
mod error;
mod guard;
mod lock;
mod protocol;
mod session;

pub use config::{ZkAcl, ZkConfig};
pub use guard::ZkGuard;
pub use lock::ZkLock;

/// The examples of this crate's README, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
