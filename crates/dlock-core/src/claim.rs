//! [`Claim`]: what an acquire asks for, the one value every driver maps to
//! its layout.

use crate::{Capabilities, Error, Result, Role};

/// What an acquire asks for: the one value a driver's
/// [`Lock::grant`](crate::Lock::grant) receives, whichever public method
/// (`acquire`, `acquire_read`, `acquire_write`, `acquire_permits`) the
/// caller used.
///
/// The provided methods of [`Lock`](crate::Lock) check a claim against
/// the backend's [`Capabilities`] and its own arguments
/// ([`check`](Self::check)) before a driver sees it: a driver's `grant`
/// only ever receives a claim its capabilities offer, with
/// `1 <= count <= limit`.
///
/// ```
/// use dlock_core::{AcquireOptions, Claim, Guard, Lock, LockKey, MemLock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// let lock = MemLock::new();
/// let key = LockKey::new("reports")?;
/// // The same as lock.acquire_read(&key, ..): chosen at run time.
/// let read = lock.acquire_claim(&key, Claim::Read, AcquireOptions::default()).await?;
/// read.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Claim {
    /// The name alone, one holder at a time
    /// ([`Lock::acquire`](crate::Lock::acquire)).
    Mutex,
    /// A read-write lock, shared
    /// ([`Lock::acquire_read`](crate::Lock::acquire_read)).
    Read,
    /// A read-write lock, exclusive
    /// ([`Lock::acquire_write`](crate::Lock::acquire_write)).
    Write,
    /// `count` of the `limit` permits of a semaphore
    /// ([`Lock::acquire_permits`](crate::Lock::acquire_permits)).
    Permits {
        /// How many permits this grant takes.
        count: u32,
        /// How many permits the semaphore has in all.
        limit: u32,
    },
}

impl Claim {
    /// The short name of the claim's kind: `"mutex"`, `"read"`, `"write"`
    /// or `"permits"` (the `claim` field of the `acquire` span).
    pub const fn kind(self) -> &'static str {
        match self {
            Claim::Mutex => "mutex",
            Claim::Read => "read",
            Claim::Write => "write",
            Claim::Permits { .. } => "permits",
        }
    }

    /// What a grant of this claim holds, as the operator views name it.
    pub const fn role(self) -> Role {
        match self {
            Claim::Mutex => Role::Mutex,
            Claim::Read => Role::Read,
            Claim::Write => Role::Write,
            Claim::Permits { count, .. } => Role::Permits(count),
        }
    }

    /// `true` when a holder of the same name in `role` keeps this claim
    /// out: a mutex by the mutex's holder, a read by the writer, a write by
    /// any reader or the writer, permits by other permit holders (when too
    /// many are held). For messages that name who is in the way.
    pub const fn is_kept_out_by(self, role: Role) -> bool {
        match self {
            Claim::Mutex => matches!(role, Role::Mutex),
            Claim::Read => matches!(role, Role::Write),
            Claim::Write => matches!(role, Role::Read | Role::Write),
            Claim::Permits { .. } => matches!(role, Role::Permits(_)),
        }
    }

    /// Checks that `backend`, promising `caps`, offers this claim, and
    /// that a semaphore's numbers make sense. The provided methods of
    /// [`Lock`](crate::Lock) call it before a driver's `grant`.
    ///
    /// # Errors
    ///
    /// - [`Error::Unsupported`] when `caps` do not offer read-write locks
    ///   (for [`Read`](Self::Read) and [`Write`](Self::Write)) or
    ///   semaphores (for [`Permits`](Self::Permits));
    /// - [`Error::InvalidConfig`] unless `1 <= count <= limit`.
    pub fn check(self, backend: &'static str, caps: &Capabilities) -> Result<()> {
        match self {
            Claim::Mutex => Ok(()),
            Claim::Read | Claim::Write if caps.read_write => Ok(()),
            Claim::Permits { count, limit } if caps.semaphores => crate::driver::check_permits(count, limit),
            _ => Err(self.unsupported_because(backend, caps.why_not)),
        }
    }

    /// The [`Error::Unsupported`] of a claim `backend` does not offer: what
    /// [`check`](Self::check) returns, and what a driver's `grant` answers
    /// for a claim its capabilities leave out (which the provided methods
    /// never pass it).
    pub fn unsupported(self, backend: &'static str) -> Error {
        self.unsupported_because(backend, None)
    }

    fn unsupported_because(self, backend: &'static str, why: Option<&'static str>) -> Error {
        let what = match self {
            Claim::Mutex => "mutexes",
            Claim::Read | Claim::Write => "read-write locks",
            Claim::Permits { .. } => "semaphores",
        };
        Error::Unsupported {
            backend,
            what,
            why: why.unwrap_or("the driver does not implement them (see its capabilities)"),
        }
    }
}

impl std::fmt::Display for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claim::Permits { count, limit } => write!(f, "{count} of {limit} permits"),
            other => f.write_str(other.kind()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Fencing, Waiting};

    #[test]
    fn a_claim_is_checked_against_the_capabilities_and_its_numbers() {
        let mutex_only = Capabilities::new(Fencing::None, false, Waiting::Polled, Duration::from_millis(1));
        let all = mutex_only.with_read_write().with_semaphores();
        let permits = |count, limit| Claim::Permits { count, limit };
        for claim in [
            Claim::Mutex,
            Claim::Read,
            Claim::Write,
            permits(1, 1),
            permits(3, 5),
        ] {
            assert!(claim.check("b", &all).is_ok(), "{claim}");
        }
        assert!(Claim::Mutex.check("b", &mutex_only).is_ok());
        let e = Claim::Read
            .check("b", &mutex_only.with_reason("no quorum can count"))
            .unwrap_err();
        assert!(e.to_string().contains("no quorum can count"), "{e}");
        for claim in [Claim::Read, Claim::Write, permits(1, 2)] {
            let e = claim.check("b", &mutex_only).unwrap_err();
            assert!(
                matches!(e, Error::Unsupported { backend: "b", .. }),
                "{claim}: {e:?}"
            );
        }
        for (count, limit) in [(0, 0), (0, 3), (4, 3), (1, 0), (u32::MAX, 1)] {
            let e = permits(count, limit).check("b", &all).unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{count}/{limit}: {e:?}");
        }
        assert_eq!(permits(2, 5).to_string(), "2 of 5 permits");
        assert_eq!(Claim::Read.to_string(), "read");
        assert_eq!(permits(2, 5).role(), Role::Permits(2));
        assert!(Claim::Write.is_kept_out_by(Role::Read) && !Claim::Read.is_kept_out_by(Role::Read));
        assert!(!Claim::Mutex.is_kept_out_by(Role::Write) && permits(1, 3).is_kept_out_by(Role::Permits(2)));
    }
}
