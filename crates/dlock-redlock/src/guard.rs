//! [`RedlockGuard`]: a grant held on a quorum of nodes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::driver::{Granted, Lease, Refusal};
use dlock_core::{AcquireOptions, Error, FencingToken, Guard, LockKey, LostSignal, Result};
use dlock_redis_protocol::millis;

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
    lock_key: String,
    value: String,
    lease: Lease,
    /// The longest TTL any node's key was given (ms): a release that does
    /// not reach every node is retried that long, after which the key has
    /// expired everywhere.
    longest_ttl: AtomicU64,
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
        let granted = Granted::new(sent, ttl, &opts).with_drift(conn.config.drift_of());
        let (k, v) = (lock_key.clone(), value.clone());
        let lease = Lease::keep(&conn, &key, granted, move |c| {
            let (k, v) = (k.clone(), v.clone());
            async move {
                let tally = c.extend_everywhere(&k, &v, ttl).await;
                tally
                    .verdict(c.quorum())
                    .ok_or_else(|| c.no_quorum("extend", tally))
            }
        });
        RedlockGuard {
            conn,
            lock_key,
            value,
            lease,
            longest_ttl: AtomicU64::new(millis(ttl)),
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
            .field("key", self.lease.key())
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard for RedlockGuard {
    fn key(&self) -> &LockKey {
        self.lease.key()
    }

    /// Always `None`: Redlock cannot give a fencing token (see the crate docs).
    fn token(&self) -> Option<FencingToken> {
        None
    }

    fn lost(&self) -> LostSignal {
        self.lease.lost()
    }

    fn is_held(&self) -> bool {
        self.lease.is_held(self.conn.is_abandoned())
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
        let (conn, lock_key, value) = (&self.conn, &self.lock_key, &self.value);
        self.lease
            .extend(ttl, MIN_TTL, conn.is_abandoned(), async |ttl| {
                self.longest_ttl.fetch_max(millis(ttl), Ordering::Relaxed);
                let sent = Instant::now();
                let tally = conn.extend_everywhere(lock_key, value, ttl).await;
                let in_time = ttl > sent.elapsed() + conn.config.drift(ttl);
                match tally.verdict(conn.quorum()) {
                    // Confirmed too late to count on: the keys may be
                    // expiring, so the lease is as good as expired.
                    Some(Ok(())) if !in_time => Ok(Err(Refusal::Expired)),
                    Some(outcome) => Ok(outcome),
                    None => Err(conn.no_quorum("extend", tally)),
                }
            })
            .await
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
    /// Dropping the future before the answers are in releases again in
    /// the background (on every node, until the longest TTL has passed);
    /// the TTL is the backstop.
    async fn release(mut self) -> Result<()> {
        self.lease.stop();
        if self.conn.is_abandoned() {
            self.lease.released();
            return Err(Error::unavailable(BACKEND, "this Redlock was abandoned"));
        }
        // Dropped before the answers are in: Drop releases in the background.
        let tally = self.conn.release_everywhere(&self.lock_key, &self.value).await;
        // Nodes that did not answer are asked again below, not on drop.
        self.lease.released();
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
            Some(outcome) => outcome.map_err(|r| r.into_error(self.lease.key())),
            None => Err(self.conn.no_quorum("release", tally)),
        };
        dlock_core::trace::release_result(BACKEND, self.lease.key(), self.token(), result)
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        if self.lease.dropped() {
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
