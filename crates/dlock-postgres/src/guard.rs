//! [`PostgresGuard`] and its slot in the handle's keeper: the local
//! deadline, the watchdog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::driver::{Kept, Validity};
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
    key: LockKey,
    value: Arc<str>,
    token: FencingToken,
    lost: LostSignal,
    validity: Arc<Validity>,
    keeper: Kept,
    released: bool,
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
        let (validity, signal) =
            Validity::of_key(BACKEND, &key, sent, ttl, dlock_core::driver::Drift::DEFAULT);
        // The slot holds the connection weakly: a handle and its guards all
        // gone close it, whenever the keeper looks next.
        let keeper = {
            let (c, name, v, stop) = (
                Arc::downgrade(&conn),
                Arc::<str>::from(key.as_str()),
                Arc::clone(&value),
                Arc::downgrade(&conn),
            );
            conn.keeper.keep(
                Arc::clone(&validity),
                ttl,
                opts.auto_extend,
                sent,
                Box::new(move || {
                    let (c, name, v) = (c.upgrade(), Arc::clone(&name), Arc::clone(&v));
                    Box::pin(async move {
                        let c = c.ok_or_else(|| Error::unavailable(BACKEND, "the PostgresLock is gone"))?;
                        c.extend(&name, &v, ttl).await
                    })
                }),
                move || stop.upgrade().is_none_or(|c| c.is_abandoned()),
            )
        };
        PostgresGuard {
            conn,
            key,
            value,
            token,
            lost: signal,
            validity,
            keeper,
            released: false,
        }
    }
}

impl std::fmt::Debug for PostgresGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresGuard")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard for PostgresGuard {
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
        dlock_core::driver::check_ttl(BACKEND, ttl)?;
        if self.conn.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this PostgresLock was abandoned"));
        }
        let ttl = ttl.max(MIN_TTL);
        let _permit = self.validity.renewal().await;
        let sent = Instant::now();
        let outcome = self.conn.extend(self.key.as_str(), &self.value, ttl).await?;
        match outcome {
            Ok(()) => {
                self.validity.renewed(sent, ttl);
                self.keeper.moved();
            }
            Err(refusal) => self.validity.lose(refusal.why()),
        }
        outcome.map_err(|r| r.into_error(&self.key))
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
        self.keeper.stop();
        if self.conn.is_abandoned() {
            self.released = true;
            return Err(Error::unavailable(BACKEND, "this PostgresLock was abandoned"));
        }
        let outcome = match self.conn.release(self.key.as_str(), &self.value).await {
            Ok(outcome) => outcome,
            // Drop retries in the background.
            Err(e) => return dlock_core::trace::release_result(BACKEND, &self.key, Some(self.token), Err(e)),
        };
        self.released = true;
        self.validity.fire_lost();
        let result = outcome.map_err(|r| r.into_error(&self.key));
        dlock_core::trace::release_result(BACKEND, &self.key, Some(self.token), result)
    }
}

impl Drop for PostgresGuard {
    fn drop(&mut self) {
        self.keeper.stop();
        self.validity.fire_lost();
        if !self.released {
            self.conn.release_in_background(
                self.key.as_str().into(),
                Arc::clone(&self.value),
                self.validity.deadline(),
            );
        }
    }
}
