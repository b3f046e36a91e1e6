//! [`RedisGuard`] and its slot in the handle's keeper: the local deadline, the watchdog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::driver::{Granted, Lease};
use dlock_core::{AcquireOptions, Error, FencingToken, Guard, LockKey, LostSignal, Result};

use dlock_redis_protocol::calls::Family;

use crate::error::BACKEND;
use crate::protocol::{Conn, MIN_TTL};

/// The guard of a Redis grant.
///
/// Its local deadline starts as the acquire's send time plus the TTL minus
/// drift (`ttl * 0.01 + 2 ms`); `is_held()` is false past it, and `lost()`
/// fires then unless a renewal moved it. With `auto_extend`, a watchdog
/// renews at `ttl / 3`; a renewal refused by Redis fires `lost()` at once, and
/// one that fails for a network reason is retried until the local deadline.
///
/// Dropping the guard stops the watchdog and sends the release script in the
/// background (best effort; the TTL is the backstop).
#[must_use = "dropping the guard releases the lock (best effort)"]
pub struct RedisGuard {
    conn: Arc<Conn>,
    /// What it holds: the mutex (`None`), a read, a write or permits.
    kind: Option<Family>,
    /// Shared with the keeper's renewal (one copy per guard).
    lock_key: Arc<str>,
    value: Arc<str>,
    token: FencingToken,
    lease: Lease,
}

impl RedisGuard {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        conn: Arc<Conn>,
        kind: Option<Family>,
        key: LockKey,
        lock_key: Arc<str>,
        value: Arc<str>,
        token: FencingToken,
        ttl: Duration,
        sent: Instant,
        opts: AcquireOptions,
    ) -> Self {
        let granted = Granted::new(sent, ttl, &opts);
        let (k, v) = (Arc::clone(&lock_key), Arc::clone(&value));
        let lease = Lease::keep(&conn, &key, granted, move |c| {
            let (k, v) = (Arc::clone(&k), Arc::clone(&v));
            async move { c.extend(kind, &k, &v, ttl).await }
        });
        RedisGuard {
            conn,
            kind,
            lock_key,
            value,
            token,
            lease,
        }
    }

    /// The Redis key this guard holds (a read-write lock's or a
    /// semaphore's keys sit beside it: see the crate docs).
    pub fn redis_key(&self) -> &str {
        &self.lock_key
    }
}

impl std::fmt::Debug for RedisGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisGuard")
            .field("key", self.lease.key())
            .field("token", &self.token)
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard for RedisGuard {
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

    /// See [`Guard::extend`]: a compare-value `PEXPIRE`.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the key expired, [`Error::NotHeld`] if another
    /// client holds it (both also fire `lost()`); [`Error::Unavailable`] /
    /// [`Error::Backend`] when Redis fails (the TTL may or may not have moved).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not leave the TTL extended; the local
    /// deadline moves only on a confirmed extend.
    async fn extend(&self, ttl: Duration) -> Result<()> {
        let (conn, kind, lock_key, value) = (&self.conn, self.kind, &self.lock_key, &self.value);
        self.lease
            .extend(ttl, MIN_TTL, conn.is_abandoned(), async |ttl| {
                conn.extend(kind, lock_key, value, ttl).await
            })
            .await
    }

    /// See [`Guard::release`]: a compare-value `DEL` that announces the
    /// release to waiters.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the key had expired, [`Error::NotHeld`] if another
    /// client holds it now (left untouched); [`Error::Unavailable`] /
    /// [`Error::Backend`] when Redis fails (the TTL frees the key).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the script was sent may or may not release;
    /// the TTL is the backstop.
    async fn release(mut self) -> Result<()> {
        self.lease.stop();
        let key = self.lease.key().clone();
        if self.conn.is_abandoned() {
            self.lease.released();
            return Err(Error::unavailable(BACKEND, "this RedisLock was abandoned"));
        }
        // On an error (or a dropped future), Drop retries in the background.
        let outcome = match self.conn.release(self.kind, &self.lock_key, &self.value).await {
            Ok(outcome) => outcome,
            Err(e) => return dlock_core::trace::release_result(BACKEND, &key, Some(self.token), Err(e)),
        };
        self.lease.released();
        dlock_core::trace::release_result(
            BACKEND,
            &key,
            Some(self.token),
            outcome.map_err(|r| r.into_error(&key)),
        )
    }
}

impl Drop for RedisGuard {
    fn drop(&mut self) {
        if self.lease.dropped() {
            release_in_background(
                &self.conn,
                self.kind,
                Arc::clone(&self.lock_key),
                Arc::clone(&self.value),
                self.lease.validity().deadline(),
            );
        }
    }
}

/// Releases in the background (drops, failed releases, attempts whose
/// reply was lost), retrying until `until` (past it the key expires on its
/// own).
pub(crate) fn release_in_background(
    conn: &Arc<Conn>,
    kind: Option<Family>,
    lock_key: Arc<str>,
    value: Arc<str>,
    until: Instant,
) {
    if conn.is_abandoned() {
        return;
    }
    let (conn, gone) = (Arc::clone(conn), Arc::clone(conn));
    dlock_core::driver::clean_up_in_background(
        format!("redis: release {lock_key}"),
        Some(until),
        move || gone.is_abandoned(),
        move || {
            let (conn, lock_key, value) = (Arc::clone(&conn), Arc::clone(&lock_key), Arc::clone(&value));
            async move { conn.release(kind, &lock_key, &value).await.map(drop) }
        },
    );
}
