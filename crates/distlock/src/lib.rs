//! # distlock
//!
//! One distributed-lock API over Redis, Redlock, etcd and ZooKeeper (and an
//! in-process backend), with a fencing token on every grant where the backend
//! can honestly give one. This is the crate applications add (the facade of
//! the `dlock-*` drivers; `dlock` on crates.io is an unrelated crate):
//!
//! ```toml
//! distlock = { version = "0.1", features = ["etcd"] }   # or redis, redlock, zk, full
//! ```
//!
//! ```
//! use std::time::Duration;
//! use distlock::{AcquireOptions, Guard, Lock, LockKey};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock::Result<()> {
//! // The backend comes from configuration, e.g. DLOCK_URL=etcd://10.0.0.1:2379
//! let lock = distlock::connect_url("mem://").await?;
//! let key = LockKey::new("nightly-report")?;
//! let guard = lock.acquire(&key, AcquireOptions::default().ttl(Duration::from_secs(30))).await?;
//! if let Some(token) = guard.token() {
//!     // pass `token` with every write; the resource refuses older ones
//!     let _ = token;
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! - Generic code takes `L: Lock`; code that picks its backend at run time
//!   holds the [`AnyLock`] that [`connect`] / [`connect_url`] return.
//! - [`Config`] is the backend choice as data: a URL, TOML or JSON, or the
//!   environment ([`Settings::from_env`]). A backend whose cargo feature is
//!   off is an [`Error::InvalidConfig`] naming the feature, never a compile
//!   error.
//! - Drivers, each behind its feature: [`redis`] (`RedisLock`),
//!   [`redlock`], [`etcd`], [`zk`].
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod config;

pub use config::{Config, Disabled, MAX_TTL, Settings};
pub use dlock_core::*;

/// The etcd driver (feature `etcd`).
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use dlock_etcd as etcd;
/// The PostgreSQL driver (feature `postgres`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use dlock_postgres as postgres;
/// The single-Redis driver (feature `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use dlock_redis as redis;
/// The Redlock driver (feature `redlock`).
#[cfg(feature = "redlock")]
#[cfg_attr(docsrs, doc(cfg(feature = "redlock")))]
pub use dlock_redlock as redlock;
/// The ZooKeeper driver (feature `zk`).
#[cfg(feature = "zk")]
#[cfg_attr(docsrs, doc(cfg(feature = "zk")))]
pub use dlock_zk as zk;

/// Connects the backend `config` names.
///
/// `Config::Mem` makes a new in-process backend each time (it is shared only
/// through clones of the returned handle).
///
/// # Errors
///
/// [`Error::InvalidConfig`] for a backend whose cargo feature is off or a bad
/// setting; otherwise whatever the driver's `connect` reports
/// ([`Error::Unavailable`] when the servers cannot be reached).
///
/// # Cancel safety
///
/// Dropping the future drops the half-built client.
pub async fn connect(config: &Config) -> Result<AnyLock> {
    #[allow(unreachable_patterns)]
    match config {
        Config::Mem => Ok(AnyLock::new(MemLock::new())),
        #[cfg(feature = "redis")]
        Config::Redis(c) => Ok(AnyLock::new(dlock_redis::RedisLock::connect(c.clone()).await?)),
        #[cfg(feature = "redlock")]
        Config::Redlock(c) => Ok(AnyLock::new(dlock_redlock::Redlock::connect(c.clone()).await?)),
        #[cfg(feature = "etcd")]
        Config::Etcd(c) => Ok(AnyLock::new(dlock_etcd::EtcdLock::connect(c.clone()).await?)),
        #[cfg(feature = "zk")]
        Config::Zk(c) => Ok(AnyLock::new(dlock_zk::ZkLock::connect(c.clone()).await?)),
        #[cfg(feature = "postgres")]
        Config::Postgres(c) => Ok(AnyLock::new(
            dlock_postgres::PostgresLock::connect(c.clone()).await?,
        )),
        other => Err(Error::InvalidConfig(format!(
            "the {0} backend is not built in: enable the cargo feature `{0}` of distlock",
            other.backend()
        ))),
    }
}

/// Parses `url` ([`Config::from_url`]) and connects.
///
/// # Errors
///
/// As [`Config::from_url`] and [`connect`].
///
/// # Cancel safety
///
/// As [`connect`].
pub async fn connect_url(url: &str) -> Result<AnyLock> {
    connect(&Config::from_url(url)?).await
}

/// The workspace README's Rust examples, compiled as doctests so they stay
/// true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

/// This crate's README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct CrateReadmeDoctests;
