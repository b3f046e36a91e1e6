//! [`Guard`]: proof of holding a lock, and the [`LostSignal`] that says
//! when it may be gone.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::{FencingToken, LockKey, Result};

/// Proof of holding a lock. Owned, `'static`, `Send`: it can move into a task.
///
/// # Dropping and releasing
///
/// [`release(self)`](Guard::release) gives the lock back and says whether
/// that happened. Dropping a guard without releasing schedules a
/// *best-effort* release (for network backends: in the background); if that
/// fails, the backend's TTL or lease frees the key.
pub trait Guard: Send + Sync + 'static {
    /// The key this guard holds.
    fn key(&self) -> &LockKey;

    /// The fencing token of this grant, or `None` where the backend gives
    /// none ([`Fencing::None`](crate::Fencing::None)).
    fn token(&self) -> Option<FencingToken>;

    /// A signal that resolves when the lock is, or may be, lost (TTL ran out,
    /// renewal failed, session ended), and also once the guard is released or
    /// dropped. Clone it freely; `guard.lost().await` waits for it.
    fn lost(&self) -> LostSignal;

    /// `true` while this client can still trust the grant: not lost, not past
    /// its local deadline (measured on the monotonic clock from when the
    /// acquire was sent, minus drift), and, for session backends, connected.
    fn is_held(&self) -> bool;

    /// Resets the lock's TTL to `ttl` from now.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a TTL of zero or more than
    ///   [`AcquireOptions::MAX_TTL`](crate::AcquireOptions::MAX_TTL), before
    ///   anything is sent (the lock stays held as it was);
    /// - [`Error::Lost`](crate::Error::Lost) if the lock had already expired (an extend never
    ///   re-creates an expired lock);
    /// - [`Error::NotHeld`](crate::Error::NotHeld) if someone else holds the key now;
    /// - [`Error::Unavailable`](crate::Error::Unavailable) / [`Error::Backend`](crate::Error::Backend) when the backend failed:
    ///   the lock may or may not have been extended.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not leave the TTL extended; the lock
    /// stays held either way.
    fn extend(&self, ttl: Duration) -> impl Future<Output = Result<()>> + Send;

    /// Gives the lock back and stops the watchdog.
    ///
    /// # Errors
    ///
    /// - [`Error::Lost`](crate::Error::Lost) if the lock had already expired;
    /// - [`Error::NotHeld`](crate::Error::NotHeld) if someone else holds the key now (their lock is
    ///   left alone);
    /// - [`Error::Unavailable`](crate::Error::Unavailable) / [`Error::Backend`](crate::Error::Backend): the release may not have
    ///   happened; the TTL frees the key.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the guard, which schedules the same
    /// best-effort release as `Drop`.
    fn release(self) -> impl Future<Output = Result<()>> + Send;
}

/// What [`Lock::with_lock`](crate::Lock::with_lock) hands to its closure: the key, the token, and the
/// lost signal of the guard it holds.
#[derive(Debug, Clone)]
pub struct Held {
    pub(crate) key: LockKey,
    pub(crate) token: Option<FencingToken>,
    pub(crate) lost: LostSignal,
}

impl Held {
    /// The key held.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The grant's fencing token, if the backend gives one: pass it to the
    /// resource you write ([`Fence`](crate::Fence)).
    pub fn token(&self) -> Option<FencingToken> {
        self.token
    }

    /// The guard's lost signal.
    pub fn lost(&self) -> &LostSignal {
        &self.lost
    }
}

/// A cloneable signal that resolves once a lock is, or may be, lost, or once
/// its guard is gone. Obtained from [`Guard::lost`]; awaiting it waits.
///
/// ```
/// use dlock_core::LostSignal;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (trigger, signal) = LostSignal::pair();
/// assert!(!signal.is_lost());
/// trigger.fire();
/// signal.clone().await; // resolves at once
/// assert!(signal.is_lost());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct LostSignal {
    inner: Arc<LostInner>,
}

/// The driver's side of a [`LostSignal`]: fires it. Cloneable; the signal also
/// resolves when every clone of the trigger is dropped.
#[derive(Debug)]
pub struct LostTrigger {
    inner: Arc<LostInner>,
}

/// What a signal and its triggers share: one small allocation per guard
/// (a flag, the live triggers, the waiters).
#[derive(Debug)]
struct LostInner {
    fired: AtomicBool,
    triggers: AtomicUsize,
    waiters: tokio::sync::Notify,
}

impl LostSignal {
    /// A new trigger and its signal (for driver authors).
    pub fn pair() -> (LostTrigger, LostSignal) {
        let inner = Arc::new(LostInner {
            fired: AtomicBool::new(false),
            triggers: AtomicUsize::new(1),
            waiters: tokio::sync::Notify::new(),
        });
        (
            LostTrigger {
                inner: Arc::clone(&inner),
            },
            LostSignal { inner },
        )
    }

    /// `true` once the signal has fired (or its trigger is gone).
    pub fn is_lost(&self) -> bool {
        self.inner.fired.load(Ordering::SeqCst) || self.inner.triggers.load(Ordering::SeqCst) == 0
    }

    /// Waits until the signal fires (or its trigger is gone).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is consumed.
    pub async fn wait(&self) {
        loop {
            let notified = self.inner.waiters.notified();
            tokio::pin!(notified);
            // Registered before the look, so a fire in between wakes it.
            notified.as_mut().enable();
            if self.is_lost() {
                return;
            }
            notified.await;
        }
    }
}

impl IntoFuture for LostSignal {
    type Output = ();
    type IntoFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.wait().await })
    }
}

impl LostTrigger {
    /// Fires the signal; idempotent.
    pub fn fire(&self) {
        self.fire_first();
    }

    /// Fires the signal; `true` for the one call that fired it first (of
    /// any number racing), `false` if it had fired already.
    pub fn fire_first(&self) -> bool {
        let first = !self.inner.fired.swap(true, Ordering::SeqCst);
        if first {
            self.inner.waiters.notify_waiters();
        }
        first
    }

    /// `true` once fired.
    pub fn is_fired(&self) -> bool {
        self.inner.fired.load(Ordering::SeqCst)
    }
}

impl Clone for LostTrigger {
    fn clone(&self) -> Self {
        self.inner.triggers.fetch_add(1, Ordering::SeqCst);
        LostTrigger {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// The last trigger gone resolves the signal.
impl Drop for LostTrigger {
    fn drop(&mut self) {
        if self.inner.triggers.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.waiters.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(10);

    /// A fire wakes every waiter, also one that started waiting before it;
    /// only the first of several fires says it was first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fire_wakes_every_waiter_once() {
        let (trigger, signal) = LostSignal::pair();
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let s = signal.clone();
                tokio::spawn(async move { s.wait().await })
            })
            .collect();
        assert!(!signal.is_lost());
        let again = trigger.clone();
        assert!(trigger.fire_first());
        assert!(!again.fire_first());
        assert!(trigger.is_fired() && signal.is_lost());
        for w in waiters {
            tokio::time::timeout(LIMIT, w).await.unwrap().unwrap();
        }
        tokio::time::timeout(LIMIT, signal).await.unwrap();
    }

    /// The signal resolves when the last clone of its trigger is dropped,
    /// not before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_last_trigger_gone_resolves_the_signal() {
        let (trigger, signal) = LostSignal::pair();
        let second = trigger.clone();
        let waiter = {
            let s = signal.clone();
            tokio::spawn(async move { s.wait().await })
        };
        drop(trigger);
        assert!(!signal.is_lost(), "resolved with a trigger left");
        assert!(!second.is_fired());
        drop(second);
        assert!(signal.is_lost());
        tokio::time::timeout(LIMIT, waiter).await.unwrap().unwrap();
    }
}
