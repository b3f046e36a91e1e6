//! # dlock-core
//!
//! The contract every dlock driver keeps, and the in-process driver that
//! keeps it exactly.
//!
//! - [`Lock`]: a connected backend; [`Lock::acquire`], [`Lock::try_acquire`],
//!   [`Lock::with_lock`]. Use it generically (`L: Lock`) or behind
//!   [`AnyLock`] when the backend is chosen at run time.
//! - [`Guard`]: proof of holding a lock: its [`FencingToken`], a
//!   [`LostSignal`], `extend`, `release`.
//! - [`Lock::acquire_all`] and [`MultiGuard`]: several names at once, all
//!   or nothing, in one global order (no deadlock), on any backend.
//! - [`Fence`] / [`FenceGate`]: the resource side that refuses stale holders.
//! - [`Error`]: one error type with semantic variants.
//! - [`MemLock`]: the in-process driver (zero setup; the kit's reference).
//! - [`trace`]: what every driver reports through `tracing`, and the field
//!   names it uses.
//!
//! ## Two tiers of locks
//!
//! An *efficiency* lock only avoids duplicate work; any backend will do. A
//! *correctness* lock protects data from concurrent writers; a lock alone
//! cannot promise that (a holder can be paused past its TTL), so pass the
//! grant's [`FencingToken`] to the resource and have it [`Fence::admit`] the
//! write. Only backends with [`Fencing::Strict`] can do this.
//!
//! ```
//! use std::time::Duration;
//! use dlock_core::{AcquireOptions, FenceGate, Guard, Lock, LockKey, MemLock};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> dlock_core::Result<()> {
//! let lock = MemLock::new();
//! let gate = FenceGate::new(); // stands for the resource (a DB row, an object)
//! let key = LockKey::new("account:17")?;
//!
//! let guard = lock.acquire(&key, AcquireOptions::default().ttl(Duration::from_secs(5))).await?;
//! let token = guard.token().expect("MemLock gives tokens");
//! gate.write("account:17", token, || { /* write the record */ })
//!     .expect("no newer holder has written");
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod any;
mod capabilities;
mod claim;
pub mod driver;
mod error;
mod fence;
mod guard;
mod holder;
mod key;
mod lock;
mod mem;
mod multi;
mod options;
mod token;
pub mod trace;

pub use any::{AnyGuard, AnyLock};
pub use capabilities::{Capabilities, Fencing, Role, Waiting};
pub use claim::Claim;
pub use driver::drift;
pub use error::{BoxError, Error, Result, Unreachable, plain_cause};
pub use fence::{Admission, Fence, FenceGate};
pub use guard::{Guard, Held, LostSignal, LostTrigger};
pub use holder::Holder;
pub use key::LockKey;
pub use lock::Lock;
pub use mem::{MEM_MIN_TTL, MemGuard, MemLock};
pub use multi::MultiGuard;
pub use options::{AcquireOptions, Wait};
pub use token::FencingToken;

/// The examples of this crate's README, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
