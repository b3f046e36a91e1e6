//! [`RedisGuard`] and its keeper task: the local deadline, the watchdog.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, FencingToken, Guard, LockKey, LostSignal, LostTrigger, Result};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::lock::{Outcome, RedisLock, local_deadline};

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
    lock: RedisLock,
    key: LockKey,
    lock_key: String,
    value: String,
    token: FencingToken,
    lost: LostSignal,
    shared: Arc<Shared>,
    keeper: JoinHandle<()>,
    released: bool,
}

struct Shared {
    deadline: Mutex<Instant>,
    moved: Notify,
    lost: LostTrigger,
}

impl Shared {
    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn move_deadline(&self, to: Instant) {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) = to;
        self.moved.notify_one();
    }
}

impl RedisGuard {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        lock: RedisLock,
        key: LockKey,
        lock_key: String,
        value: String,
        token: FencingToken,
        ttl: Duration,
        sent: Instant,
        opts: AcquireOptions,
    ) -> Self {
        let (trigger, signal) = LostSignal::pair();
        let shared = Arc::new(Shared {
            deadline: Mutex::new(local_deadline(sent, ttl)),
            moved: Notify::new(),
            lost: trigger,
        });
        let keeper = tokio::spawn(keep(
            lock.clone(),
            lock_key.clone(),
            value.clone(),
            ttl,
            opts.auto_extend,
            sent,
            Arc::clone(&shared),
        ));
        RedisGuard {
            lock,
            key,
            lock_key,
            value,
            token,
            lost: signal,
            shared,
            keeper,
            released: false,
        }
    }

    /// The Redis key this guard holds.
    pub fn redis_key(&self) -> &str {
        &self.lock_key
    }
}

/// Fires `lost()` at the local deadline, and renews before it with
/// auto-extend.
async fn keep(
    lock: RedisLock,
    lock_key: String,
    value: String,
    ttl: Duration,
    auto_extend: bool,
    sent: Instant,
    shared: Arc<Shared>,
) {
    let mut next_renewal = sent + ttl / 3;
    loop {
        if lock.is_abandoned() {
            return;
        }
        let deadline = shared.deadline();
        tokio::select! {
            () = tokio::time::sleep_until(deadline.into()) => {
                if shared.deadline() <= Instant::now() {
                    shared.lost.fire();
                    return;
                }
            }
            () = tokio::time::sleep_until(next_renewal.into()), if auto_extend => {
                let sent = Instant::now();
                match tokio::time::timeout_at(deadline.into(), lock.run_extend(&lock_key, &value, ttl)).await {
                    Ok(Ok(Outcome::Done)) => {
                        shared.move_deadline(local_deadline(sent, ttl));
                        next_renewal = sent + ttl / 3;
                    }
                    Ok(Ok(Outcome::Expired | Outcome::HeldByOther)) | Err(_) => {
                        shared.lost.fire();
                        return;
                    }
                    // A network failure: try again soon, until the deadline.
                    Ok(Err(_)) => next_renewal = Instant::now() + (ttl / 20).max(Duration::from_millis(5)),
                }
            }
            () = shared.moved.notified() => {}
        }
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
        !self.lost.is_lost() && !self.lock.is_abandoned() && Instant::now() < self.shared.deadline()
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
        if self.lock.is_abandoned() {
            return Err(Error::unavailable(
                crate::lock::BACKEND,
                "this RedisLock was abandoned",
            ));
        }
        let ttl = ttl.max(crate::MIN_TTL);
        let sent = Instant::now();
        let outcome = self.lock.run_extend(&self.lock_key, &self.value, ttl).await?;
        match outcome {
            Outcome::Done => self.shared.move_deadline(local_deadline(sent, ttl)),
            Outcome::Expired | Outcome::HeldByOther => self.shared.lost.fire(),
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
        self.keeper.abort();
        self.released = true;
        if self.lock.is_abandoned() {
            return Err(Error::unavailable(
                crate::lock::BACKEND,
                "this RedisLock was abandoned",
            ));
        }
        let outcome = self.lock.run_release(&self.lock_key, &self.value).await?;
        self.shared.lost.fire();
        outcome.into_result(&self.key)
    }
}

impl Drop for RedisGuard {
    fn drop(&mut self) {
        self.keeper.abort();
        if !self.released {
            self.lock.release_in_background(
                std::mem::take(&mut self.lock_key),
                std::mem::take(&mut self.value),
            );
        }
    }
}
