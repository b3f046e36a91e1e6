//! [`Capabilities`]: what a backend promises, so callers and the conformance
//! kit can adapt.

use std::time::Duration;

/// Whether grants carry a [`FencingToken`](crate::FencingToken).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// Every grant carries a token, strictly increasing per key in grant order.
    Strict,
    /// Grants carry no token ([`Guard::token`](crate::Guard::token) is `None`):
    /// use this backend only where a duplicate holder wastes work but corrupts
    /// nothing.
    None,
}

/// How a waiter learns that the lock may be free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// The backend notifies waiters (watch, pub/sub, in-process wake-up).
    Notified,
    /// Waiters poll.
    Polled,
}

/// What a grant is of: for the operator views that list every holder of
/// a name (a driver's `holders`, `dlock holder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The mutex ([`Lock::acquire`](crate::Lock::acquire)).
    Mutex,
    /// A read of the read-write lock.
    Read,
    /// The write of the read-write lock.
    Write,
    /// This many permits of the semaphore.
    Permits(u32),
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Role::Mutex => f.write_str("mutex"),
            Role::Read => f.write_str("read"),
            Role::Write => f.write_str("write"),
            Role::Permits(1) => f.write_str("1 permit"),
            Role::Permits(n) => write!(f, "{n} permits"),
        }
    }
}

/// What a backend promises. Returned by
/// [`Lock::capabilities`](crate::Lock::capabilities).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Fencing tokens: strict or none.
    pub fencing: Fencing,
    /// Waiters are granted in the order they started waiting.
    pub fifo: bool,
    /// Notified or polled waiting.
    pub waiting: Waiting,
    /// The shortest TTL the backend honours; shorter requests are rounded up
    /// to it (etcd leases: 2 s; ZooKeeper: the server's minimum session
    /// timeout).
    pub min_ttl: Duration,
    /// Read-write locks: [`Lock::acquire_read`](crate::Lock::acquire_read)
    /// and [`Lock::acquire_write`](crate::Lock::acquire_write).
    pub read_write: bool,
    /// Counting semaphores:
    /// [`Lock::acquire_permits`](crate::Lock::acquire_permits).
    pub semaphores: bool,
    /// The operator views: [`Lock::holders`](crate::Lock::holders) lists
    /// who holds a name (otherwise it answers
    /// [`Error::Unsupported`](crate::Error::Unsupported)).
    pub lists_holders: bool,
    /// Why the backend leaves out the primitives it does not offer, in
    /// one sentence: the `why` of the [`Error::Unsupported`](crate::Error::Unsupported)
    /// an acquire of one of them returns. `None` when the driver gives no
    /// reason ([`with_reason`](Self::with_reason) sets it).
    pub why_not: Option<&'static str>,
}

impl Capabilities {
    /// Builds a capability set (for driver authors): a mutex only, until
    /// [`with_read_write`](Self::with_read_write) and
    /// [`with_semaphores`](Self::with_semaphores) say more.
    pub const fn new(fencing: Fencing, fifo: bool, waiting: Waiting, min_ttl: Duration) -> Self {
        Capabilities {
            fencing,
            fifo,
            waiting,
            min_ttl,
            read_write: false,
            semaphores: false,
            lists_holders: false,
            why_not: None,
        }
    }

    /// The backend offers read-write locks.
    #[must_use]
    pub const fn with_read_write(mut self) -> Self {
        self.read_write = true;
        self
    }

    /// The backend offers counting semaphores.
    #[must_use]
    pub const fn with_semaphores(mut self) -> Self {
        self.semaphores = true;
        self
    }

    /// The backend lists holders ([`lists_holders`](Self::lists_holders)).
    #[must_use]
    pub const fn with_holders(mut self) -> Self {
        self.lists_holders = true;
        self
    }

    /// Says why the backend leaves out what it does not offer (see
    /// [`why_not`](Self::why_not)).
    #[must_use]
    pub const fn with_reason(mut self, why_not: &'static str) -> Self {
        self.why_not = Some(why_not);
        self
    }

    /// `true` when grants carry strictly increasing tokens.
    pub fn fences(&self) -> bool {
        self.fencing == Fencing::Strict
    }
}
