//! [`FencingToken`]: the number that orders grants of one key.

use std::fmt;

/// A number handed out with each grant of a lock, strictly increasing in grant
/// order for one key across all clients (and across backend restarts where the
/// backend persists, see each driver).
///
/// A resource that remembers the highest token it accepted, and refuses lower
/// ones, cannot be written by a holder whose lock has expired while it was
/// paused: see [`Fence`](crate::Fence). Tokens of different keys are not
/// comparable in any useful way.
///
/// Sources: etcd = the lock key's `create_revision`; ZooKeeper = the lock
/// node's `czxid`; Redis = an `INCR` in the same script as the `SET NX`;
/// [`MemLock`](crate::MemLock) = a per-backend counter. Redlock gives none.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value (drivers use this).
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value, e.g. to store beside a resource or pass to a child process.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FencingToken({})", self.0)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}
