//! [`PostgresGuard`] and its slot in the handle's keeper: the local
//! deadline, the watchdog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::driver::{Granted, Lease};
use dlock_core::{AcquireOptions, Error, FencingToken, Guard, LockKey, LostSignal, Result};

use crate::error::BACKEND;
use crate::protocol::{Conn, MIN_TTL};

/// The guard of a PostgreSQL grant: its row's `locked_by` is this guard's
/// value.
///
/// Its local deadline starts as the acquire's send time plus the TTL minus
/// drift; `is_held()` is false past it, and `lost()` fires then unless a
/// renewal moved it. With `auto_extend`, the handle's keeper renews at
/// `ttl / 3`; a renewal the table refuses fires `lost()` at once, one that
/// fails for a network reason is retried until the local deadline.
///
/// Dropping the guard sends the release in the background (best effort;
/// the TTL is the backstop).
#[must_use = "dropping the guard releases the lock (best effort)"]
pub struct PostgresGuard {
    conn: Arc<Conn>,
    value: Arc<str>,
    token: FencingToken,
    lease: Lease,
}

impl PostgresGuard {
    pub(crate) fn new(
        conn: Arc<Conn>,
        key: LockKey,
        value: Arc<str>,
        token: FencingToken,
        ttl: Duration,
        sent: Instant,
        opts: AcquireOptions,
    ) -> Self {
        let granted = Granted::new(sent, ttl, &opts);
        let (name, v) = (Arc::<str>::from(key.as_str()), Arc::clone(&value));
        let lease = Lease::keep(&conn, &key, granted, move |c| {
            let (name, v) = (Arc::clone(&name), Arc::clone(&v));
            async move { c.extend(&name, &v, ttl).await }
        });
        PostgresGuard {
            conn,
            value,
            token,
            lease,
        }
    }
}

impl std::fmt::Debug for PostgresGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresGuard")
            .field("key", self.lease.key())
            .field("token", &self.token)
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard for PostgresGuard {
    fn key(&self) -> &LockKey {
        self.lease.key()
    }

    fn token(&self) -> Option<FencingToken> {
        Some(self.token)
    }

    fn lost(&self) -> LostSignal {
        self.lease.lost()
    }

    fn is_held(&self) -> bool {
        self.lease.is_held(self.conn.is_abandoned())
    }

    /// See [`Guard::extend`]: moves the row's `lock_until` if `locked_by`
    /// is still ours and it has not passed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a TTL of zero or more than
    /// [`AcquireOptions::MAX_TTL`]; [`Error::Lost`] if the grant expired,
    /// [`Error::NotHeld`] if another client holds the name (both also fire
    /// `lost()`); [`Error::Unavailable`] / [`Error::Backend`] when
    /// PostgreSQL fails (the row may or may not have moved).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not leave the row extended; the local
    /// deadline moves only on a confirmed extend.
    async fn extend(&self, ttl: Duration) -> Result<()> {
        let (conn, name, value) = (&self.conn, self.lease.key().as_str(), &self.value);
        self.lease
            .extend(ttl, MIN_TTL, conn.is_abandoned(), async |ttl| {
                conn.extend(name, value, ttl).await
            })
            .await
    }

    /// See [`Guard::release`]: sets the row's `lock_until` to now if
    /// `locked_by` is still ours, and notifies the table's waiters.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the grant had expired, [`Error::NotHeld`] if
    /// another client holds the name now (left untouched);
    /// [`Error::Unavailable`] / [`Error::Backend`] when PostgreSQL fails
    /// (the TTL frees the name).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the statement was sent may or may not
    /// release; the TTL is the backstop.
    async fn release(mut self) -> Result<()> {
        self.lease.stop();
        let key = self.lease.key().clone();
        if self.conn.is_abandoned() {
            self.lease.released();
            return Err(Error::unavailable(BACKEND, "this PostgresLock was abandoned"));
        }
        let outcome = match self.conn.release(key.as_str(), &self.value).await {
            Ok(outcome) => outcome,
            // Drop retries in the background.
            Err(e) => return dlock_core::trace::release_result(BACKEND, &key, Some(self.token), Err(e)),
        };
        self.lease.released();
        let result = outcome.map_err(|r| r.into_error(&key));
        dlock_core::trace::release_result(BACKEND, &key, Some(self.token), result)
    }
}

impl Drop for PostgresGuard {
    fn drop(&mut self) {
        if self.lease.dropped() {
            self.conn.release_in_background(
                self.lease.key().as_str().into(),
                Arc::clone(&self.value),
                self.lease.validity().deadline(),
            );
        }
    }
}
