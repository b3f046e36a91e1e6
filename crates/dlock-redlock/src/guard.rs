//! [`RedlockGuard`]: a grant held on a quorum of nodes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::driver::{Kept, Validity};
use dlock_core::{AcquireOptions, Error, FencingToken, Guard, LockKey, LostSignal, Result};
use dlock_redis_protocol::{Outcome, millis};

use crate::error::BACKEND;
use crate::protocol::{Conn, MIN_TTL};

/// The guard of a Redlock grant. Carries **no fencing token**
/// ([`token`](Guard::token) is `None`).
///
/// Its local deadline is the first send of the winning round plus the TTL
/// minus drift; `is_held()` is false past it. With `auto_extend`, a watchdog
/// extends on every node at `ttl / 3` and needs a quorum; a quorum of
/// refusals fires `lost()` at once, too few answers are retried until the
/// deadline. A failed extend does not release the other nodes' keys: they
/// expire by their TTL.
///
/// Dropping the guard releases on every node in the background.
#[must_use = "dropping the guard releases the lock (best effort)"]
pub struct RedlockGuard {
    conn: Arc<Conn>,
    key: LockKey,
    lock_key: String,
    value: String,
    lost: LostSignal,
    validity: Arc<Validity>,
    keeper: Kept,
    /// The longest TTL any node's key was given (ms): a release that does
    /// not reach every node is retried that long, after which the key has
    /// expired everywhere.
    longest_ttl: AtomicU64,
    released: bool,
}

impl RedlockGuard {
    pub(crate) fn new(
        conn: Arc<Conn>,
        key: LockKey,
        lock_key: String,
        value: String,
        ttl: Duration,
        sent: Instant,
        opts: AcquireOptions,
    ) -> Self {
        let (validity, lost) = Validity::of_key(BACKEND, &key, sent, ttl, conn.config.drift_of());
        let keeper = {
            // Weakly held, as in the Redis driver: the handle and its
            // guards all gone close the connections at once.
            let (c, k, v, stop) = (
                Arc::downgrade(&conn),
                lock_key.clone(),
                value.clone(),
                Arc::downgrade(&conn),
            );
            conn.keeper.keep(
                Arc::clone(&validity),
                ttl,
                opts.auto_extend,
                sent,
                Box::new(move || {
                    let (c, k, v) = (c.upgrade(), k.clone(), v.clone());
                    Box::pin(async move {
                        let c = c.ok_or_else(|| Error::unavailable(BACKEND, "the Redlock is gone"))?;
                        let tally = c.extend_everywhere(&k, &v, ttl).await;
                        tally
                            .verdict(c.quorum())
                            .map(Outcome::refusal)
                            .ok_or_else(|| c.no_quorum("extend", tally))
                    })
                }),
                move || stop.upgrade().is_none_or(|c| c.is_abandoned()),
            )
        };
        RedlockGuard {
            conn,
            key,
            lock_key,
            value,
            lost,
            validity,
            keeper,
            longest_ttl: AtomicU64::new(millis(ttl)),
            released: false,
        }
    }
}

impl RedlockGuard {
    /// Until when a background release is worth retrying: the longest TTL
    /// from now (no node's key outlives it).
    fn release_until(&self) -> Instant {
        let ttl = Duration::from_millis(self.longest_ttl.load(Ordering::Relaxed));
        dlock_core::driver::saturating_add(Instant::now(), ttl)
    }
}

impl std::fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockGuard")
            .field("key", &self.key)
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard for RedlockGuard {
    fn key(&self) -> &LockKey {
        &self.key
    }

    /// Always `None`: Redlock cannot give a fencing token (see the crate docs).
    fn token(&self) -> Option<FencingToken> {
        None
    }

    fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    fn is_held(&self) -> bool {
        !self.lost.is_lost() && !self.conn.is_abandoned() && self.validity.is_valid()
    }

    /// See [`Guard::extend`]: the extend script on every node at once; a
    /// quorum must confirm, with validity left.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when a quorum no longer has the key, or the extend
    /// came back after the validity ran out; [`Error::NotHeld`] when a quorum
    /// holds another value (both fire `lost()`); [`Error::Unavailable`] when
    /// too few nodes answered (the lock is unchanged where they did not).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave some nodes extended; the local deadline
    /// moves only on a confirmed quorum.
    async fn extend(&self, ttl: Duration) -> Result<()> {
        dlock_core::driver::check_ttl(BACKEND, ttl)?;
        if self.conn.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this Redlock was abandoned"));
        }
        let ttl = ttl.max(MIN_TTL);
        let _permit = self.validity.renewal().await;
        self.longest_ttl.fetch_max(millis(ttl), Ordering::Relaxed);
        let sent = Instant::now();
        let tally = self
            .conn
            .extend_everywhere(&self.lock_key, &self.value, ttl)
            .await;
        let elapsed = sent.elapsed();
        let in_time = ttl > elapsed + self.conn.config.drift(ttl);
        match tally.verdict(self.conn.quorum()) {
            Some(Outcome::Done) if in_time => {
                self.validity.renewed(sent, ttl);
                self.keeper.moved();
                Ok(())
            }
            Some(Outcome::Done) => {
                // Confirmed too late to count on: the keys may be expiring.
                self.validity.lose(dlock_core::trace::why::DEADLINE);
                Err(Error::Lost {
                    key: self.key.as_str().to_owned(),
                })
            }
            Some(refused) => {
                if let Err(refusal) = refused.refusal() {
                    self.validity.lose(refusal.why());
                }
                refused.into_result(&self.key)
            }
            None => Err(self.conn.no_quorum("extend", tally)),
        }
    }

    /// See [`Guard::release`]: the release script on every node at once.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when a quorum no longer had the key, [`Error::NotHeld`]
    /// when a quorum holds another value (left untouched),
    /// [`Error::Unavailable`] when too few nodes answered (their keys expire
    /// by TTL).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after sending may release on some nodes only; the
    /// TTL is the backstop.
    async fn release(mut self) -> Result<()> {
        self.keeper.stop();
        self.released = true;
        if self.conn.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this Redlock was abandoned"));
        }
        let tally = self.conn.release_everywhere(&self.lock_key, &self.value).await;
        self.validity.fire_lost();
        if tally.unanswered() > 0 {
            // Those nodes are asked again in the background.
            release_in_background(
                &self.conn,
                self.lock_key.clone(),
                self.value.clone(),
                self.release_until(),
            );
        }
        let result = match tally.verdict(self.conn.quorum()) {
            Some(outcome) => outcome.into_result(&self.key),
            None => Err(self.conn.no_quorum("release", tally)),
        };
        dlock_core::trace::release_result(BACKEND, &self.key, self.token(), result)
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        self.keeper.stop();
        // The keeper lets go of its slot whenever it looks next: the
        // signal fires now, not with the slot's last reference.
        self.validity.fire_lost();
        if !self.released {
            let until = self.release_until();
            release_in_background(
                &self.conn,
                std::mem::take(&mut self.lock_key),
                std::mem::take(&mut self.value),
                until,
            );
        }
    }
}

/// Releases on every node in the background (drops, failed releases,
/// attempts without a verdict), again while some node did not answer,
/// until `until` (past it the key has expired everywhere by its TTL).
pub(crate) fn release_in_background(conn: &Arc<Conn>, lock_key: String, value: String, until: Instant) {
    if conn.is_abandoned() {
        return;
    }
    let (conn, gone) = (Arc::clone(conn), Arc::clone(conn));
    dlock_core::driver::clean_up_in_background(
        format!("redlock: release {lock_key}"),
        Some(until),
        move || gone.is_abandoned(),
        move || {
            let (conn, lock_key, value) = (Arc::clone(&conn), lock_key.clone(), value.clone());
            async move {
                match conn.release_everywhere(&lock_key, &value).await.unanswered() {
                    0 => Ok(()),
                    n => Err(Error::unavailable(
                        BACKEND,
                        format!("{n} node(s) did not answer the release"),
                    )),
                }
            }
        },
    );
}
