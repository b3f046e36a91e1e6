//! The resource side of fencing: [`Fence`] and the in-memory [`FenceGate`].
//!
//! A lock alone cannot stop a holder that was paused (GC, swap, a stopped VM)
//! past its TTL from writing after someone else took the lock. The resource
//! can: it remembers the highest [`FencingToken`] it accepted and refuses lower
//! ones. The check must be atomic with the write. The same rule in the
//! resources people actually use:
//!
//! **Postgres** (the row keeps the highest token it accepted):
//!
//! ```sql
//! UPDATE accounts SET balance = $1, fence = $2
//!  WHERE id = $3 AND fence <= $2;      -- 0 rows updated: a stale holder
//! ```
//!
//! **etcd** (a `Txn` comparing a token stored beside the value):
//!
//! ```text
//! Txn(If:   Value("res/fence") <= token      -- or: the lock key's create_revision
//!     Then: Put("res/value", v), Put("res/fence", token)
//!     Else: Get("res/fence"))                -- rejected
//! ```
//!
//! **Redis** (one Lua script, so check and write are atomic):
//!
//! ```lua
//! -- KEYS[1] = value key, KEYS[2] = fence key, ARGV[1] = value, ARGV[2] = token
//! local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
//! if tonumber(ARGV[2]) < highest then return 0 end
//! redis.call('SET', KEYS[2], ARGV[2])
//! redis.call('SET', KEYS[1], ARGV[1])
//! return 1
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use crate::{FencingToken, Result};

/// What a fenced resource decided about a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The token is not lower than any accepted before: the write may proceed.
    Accepted,
    /// A newer holder has written already: the write must not happen.
    Rejected {
        /// The highest token accepted so far.
        highest: FencingToken,
    },
}

impl Admission {
    /// `true` for [`Admission::Accepted`].
    pub fn is_accepted(self) -> bool {
        matches!(self, Admission::Accepted)
    }
}

/// A resource that checks fencing tokens: `admit` accepts a token iff it is
/// not lower than the highest it already accepted for that resource, and
/// then remembers it.
pub trait Fence: Send + Sync {
    /// Checks `token` for `resource` and, if accepted, records it.
    ///
    /// # Errors
    ///
    /// Whatever the resource's store reports; [`FenceGate`] never fails.
    ///
    /// # Cancel safety
    ///
    /// Implementation-defined; [`FenceGate`]'s future is ready at once.
    fn admit(&self, resource: &str, token: FencingToken) -> impl Future<Output = Result<Admission>> + Send;
}

/// An in-memory fence, per resource name. Cloning shares the state.
///
/// ```
/// use dlock_core::{Admission, FenceGate, FencingToken};
///
/// let gate = FenceGate::new();
/// assert!(gate.check("orders", FencingToken::new(7)).is_accepted());
/// assert!(gate.check("orders", FencingToken::new(7)).is_accepted()); // same holder again
/// assert_eq!(
///     gate.check("orders", FencingToken::new(5)),
///     Admission::Rejected { highest: FencingToken::new(7) }
/// );
/// // A fenced write: runs the closure only when admitted, atomically with the check.
/// let mut record = Vec::new();
/// assert!(gate.write("orders", FencingToken::new(9), || record.push("v9")).is_ok());
/// assert!(gate.write("orders", FencingToken::new(8), || record.push("v8")).is_err());
/// assert_eq!(record, ["v9"]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct FenceGate {
    highest: Arc<Mutex<HashMap<String, FencingToken>>>,
}

impl FenceGate {
    /// An empty gate: the first token for each resource is accepted.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks and records `token` for `resource` (the synchronous form of
    /// [`Fence::admit`]).
    pub fn check(&self, resource: &str, token: FencingToken) -> Admission {
        self.write(resource, token, || ()).map_or_else(
            |highest| Admission::Rejected { highest },
            |()| Admission::Accepted,
        )
    }

    /// A fenced write: if `token` is admitted for `resource`, runs `write`
    /// while still holding the gate (so no lower token can slip in between)
    /// and returns its output; otherwise returns `Err(highest)` and does not
    /// run it.
    ///
    /// # Errors
    ///
    /// `Err(highest)` when a higher token was already accepted.
    pub fn write<T>(
        &self,
        resource: &str,
        token: FencingToken,
        write: impl FnOnce() -> T,
    ) -> Result<T, FencingToken> {
        let mut map = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(resource) {
            Some(&highest) if token < highest => Err(highest),
            _ => {
                map.insert(resource.to_owned(), token);
                Ok(write())
            }
        }
    }

    /// The highest token accepted for `resource` so far.
    pub fn highest(&self, resource: &str) -> Option<FencingToken> {
        self.highest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(resource)
            .copied()
    }
}

impl Fence for FenceGate {
    fn admit(&self, resource: &str, token: FencingToken) -> impl Future<Output = Result<Admission>> + Send {
        std::future::ready(Ok(self.check(resource, token)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_are_independent() {
        let gate = FenceGate::new();
        assert!(gate.check("a", FencingToken::new(10)).is_accepted());
        assert!(gate.check("b", FencingToken::new(1)).is_accepted());
        assert!(!gate.check("a", FencingToken::new(9)).is_accepted());
        assert_eq!(gate.highest("a"), Some(FencingToken::new(10)));
        assert_eq!(gate.highest("c"), None);
    }

    #[tokio::test]
    async fn admit_matches_check() {
        let gate = FenceGate::new();
        assert_eq!(
            gate.admit("r", FencingToken::new(3)).await.unwrap(),
            Admission::Accepted
        );
        assert_eq!(
            gate.admit("r", FencingToken::new(2)).await.unwrap(),
            Admission::Rejected {
                highest: FencingToken::new(3)
            }
        );
    }
}
