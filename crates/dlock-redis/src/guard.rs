//! [`RedisGuard`] and its slot in the handle's keeper: the local deadline, the watchdog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::driver::{Kept, Validity};
use dlock_core::{AcquireOptions, Error, FencingToken, Guard, LockKey, LostSignal, Result};

use dlock_redis_protocol::Outcome;
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
    key: LockKey,
    /// What it holds: the mutex (`None`), a read, a write or permits.
    kind: Option<Family>,
    /// Shared with the keeper's renewal (one copy per guard).
    lock_key: Arc<str>,
    value: Arc<str>,
    token: FencingToken,
    lost: LostSignal,
    validity: Arc<Validity>,
    keeper: Kept,
    released: bool,
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
        let (validity, signal) =
            Validity::of_key(BACKEND, &key, sent, ttl, dlock_core::driver::Drift::DEFAULT);
        // The keeper's slot holds the connection weakly: a handle and its
        // guards all gone close it at once, whenever the keeper looks next.
        let keeper = {
            let (c, k, v, stop) = (
                Arc::downgrade(&conn),
                Arc::clone(&lock_key),
                Arc::clone(&value),
                Arc::downgrade(&conn),
            );
            conn.keeper.keep(
                Arc::clone(&validity),
                ttl,
                opts.auto_extend,
                sent,
                Box::new(move || {
                    let (c, k, v) = (c.upgrade(), Arc::clone(&k), Arc::clone(&v));
                    Box::pin(async move {
                        let c = c.ok_or_else(|| Error::unavailable(BACKEND, "the RedisLock is gone"))?;
                        c.extend(kind, &k, &v, ttl).await.map(Outcome::refusal)
                    })
                }),
                move || stop.upgrade().is_none_or(|c| c.is_abandoned()),
            )
        };
        RedisGuard {
            conn,
            key,
            kind,
            lock_key,
            value,
            token,
            lost: signal,
            validity,
            keeper,
            released: false,
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
            .field("key", &self.key)
            .field("token", &self.token)
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard for RedisGuard {
    fn key(&self) -> &LockKey {
        &self.key
    }

    fn token(&self) -> Option<FencingToken> {
        Some(self.token)
    }

    fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    fn is_held(&self) -> bool {
        !self.lost.is_lost() && !self.conn.is_abandoned() && self.validity.is_valid()
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
        dlock_core::driver::check_ttl(BACKEND, ttl)?;
        if self.conn.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this RedisLock was abandoned"));
        }
        let ttl = ttl.max(MIN_TTL);
        let _permit = self.validity.renewal().await;
        let sent = Instant::now();
        let outcome = self
            .conn
            .extend(self.kind, &self.lock_key, &self.value, ttl)
            .await?;
        match outcome.refusal() {
            Ok(()) => {
                self.validity.renewed(sent, ttl);
                self.keeper.moved();
            }
            Err(refusal) => self.validity.lose(refusal.why()),
        }
        outcome.into_result(&self.key)
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
        self.keeper.stop();
        if self.conn.is_abandoned() {
            self.released = true;
            return Err(Error::unavailable(BACKEND, "this RedisLock was abandoned"));
        }
        // On an error (or a dropped future), Drop retries in the background.
        let outcome = match self.conn.release(self.kind, &self.lock_key, &self.value).await {
            Ok(outcome) => outcome,
            Err(e) => return dlock_core::trace::release_result(BACKEND, &self.key, Some(self.token), Err(e)),
        };
        self.released = true;
        self.validity.fire_lost();
        dlock_core::trace::release_result(
            BACKEND,
            &self.key,
            Some(self.token),
            outcome.into_result(&self.key),
        )
    }
}

impl Drop for RedisGuard {
    fn drop(&mut self) {
        self.keeper.stop();
        // The keeper lets go of its slot whenever it looks next: the
        // signal fires now, not with the slot's last reference.
        self.validity.fire_lost();
        if !self.released {
            release_in_background(
                &self.conn,
                self.kind,
                Arc::clone(&self.lock_key),
                Arc::clone(&self.value),
                self.validity.deadline(),
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
