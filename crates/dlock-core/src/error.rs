//! The one error type of dlock.

use std::error::Error as StdError;

/// A boxed error from a backend's client library, kept as the `source` of
/// [`Error::Unavailable`] and [`Error::Backend`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Shorthand for `Result<T, dlock_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when taking, keeping or giving back a lock.
///
/// The variants are *semantic*: callers (and the conformance kit) branch on
/// them with `matches!`, never on message text. Each driver maps its client
/// library's errors into these; nothing a server replies makes a driver panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The wait asked for in [`AcquireOptions::wait`](crate::AcquireOptions)
    /// ran out (for [`Wait::No`](crate::Wait::No): the key was held) before
    /// the lock was granted. Nothing is left held or queued: the driver
    /// removes its place in line before it returns, or, if that fails (the
    /// server out of reach), keeps trying in the background until it is
    /// done or the lease/session it lives on has ended.
    #[error("timed out waiting for lock {key:?}")]
    Timeout {
        /// The key that could not be acquired in time.
        key: String,
    },
    /// The lock is, or may be, no longer held by this guard: its TTL or lease
    /// ran out, its session ended, or a renewal could not finish in time.
    #[error("lock {key:?} was lost")]
    Lost {
        /// The key whose lock was lost.
        key: String,
    },
    /// Someone else holds the lock: a release or extend by anyone but the
    /// owner is refused and changes nothing.
    #[error("lock {key:?} is not held by this guard")]
    NotHeld {
        /// The key the caller does not hold.
        key: String,
    },
    /// The key is not a valid lock name (empty, too long, control characters)
    /// or the backend cannot store it.
    #[error("invalid lock key: {reason}")]
    InvalidKey {
        /// Why the key was refused.
        reason: String,
    },
    /// A configuration value or URL was refused.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The backend could not be reached, or has no quorum.
    #[error("{backend} unavailable: {source}")]
    Unavailable {
        /// The backend's short name.
        backend: &'static str,
        /// What the client library reported.
        #[source]
        source: BoxError,
    },
    /// The backend answered with an error or a reply the driver did not expect.
    #[error("{backend} error: {source}")]
    Backend {
        /// The backend's short name.
        backend: &'static str,
        /// What the client library reported.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// `true` for [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// `true` for [`Error::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost { .. })
    }

    /// `true` for [`Error::NotHeld`].
    pub fn is_not_held(&self) -> bool {
        matches!(self, Error::NotHeld { .. })
    }

    /// Builds an [`Error::Backend`] from anything that converts into a [`BoxError`].
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            source: source.into(),
        }
    }

    /// Builds an [`Error::Unavailable`] from anything that converts into a [`BoxError`].
    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            backend,
            source: source.into(),
        }
    }
}
