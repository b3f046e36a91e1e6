//! A guard's local deadline and lost signal.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::time::Drift;
use crate::{Error, LockKey, LostSignal, LostTrigger};

/// A guard's validity: its local deadline and its lost trigger, shared by
/// the guard and its keeper task.
///
/// Renewals are serialized ([`Validity::renewal`]): with two renewals in
/// flight at once (a manual `extend` racing the keeper), the client could not
/// tell which the server applied last, and a last-writer-wins deadline could
/// outlive the server's TTL.
#[derive(Debug)]
pub struct Validity {
    deadline: Mutex<Instant>,
    moved: tokio::sync::Notify,
    lost: LostTrigger,
    drift: Drift,
    renewing: tokio::sync::Mutex<()>,
    /// The backend and key named in `lost` and `renewal failed` events
    /// (none for a session's validity, which many guards share).
    subject: Option<(&'static str, LockKey)>,
    why: std::sync::OnceLock<&'static str>,
}

impl Validity {
    /// A validity ending at `drift.deadline(sent, ttl)`, and its signal.
    ///
    /// For a session or lease that many guards share: a loss records its
    /// reason ([`why`](Self::why)) but reports nothing; each guard reports
    /// its own `lost` event. A guard's own validity is [`of_key`](Self::of_key).
    pub fn new(sent: Instant, ttl: Duration, drift: Drift) -> (Arc<Self>, LostSignal) {
        Self::build(None, sent, ttl, drift)
    }

    /// The validity of one guard of `backend` on `key`: [`lose`](Self::lose)
    /// and the [`Keeper`](super::Keeper) report `lost` and `renewal failed` events
    /// ([`trace`](crate::trace)) naming them.
    pub fn of_key(
        backend: &'static str,
        key: &LockKey,
        sent: Instant,
        ttl: Duration,
        drift: Drift,
    ) -> (Arc<Self>, LostSignal) {
        Self::build(Some((backend, key.clone())), sent, ttl, drift)
    }

    fn build(
        subject: Option<(&'static str, LockKey)>,
        sent: Instant,
        ttl: Duration,
        drift: Drift,
    ) -> (Arc<Self>, LostSignal) {
        let (trigger, signal) = LostSignal::pair();
        let validity = Validity {
            deadline: Mutex::new(drift.deadline(sent, ttl)),
            moved: tokio::sync::Notify::new(),
            lost: trigger,
            drift,
            renewing: tokio::sync::Mutex::new(()),
            subject,
            why: std::sync::OnceLock::new(),
        };
        (Arc::new(validity), signal)
    }

    /// The current local deadline.
    pub fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The drift this validity takes off every grant.
    pub fn drift(&self) -> Drift {
        self.drift
    }

    /// `true` while the deadline is ahead and the signal has not fired.
    pub fn is_valid(&self) -> bool {
        !self.lost.is_fired() && Instant::now() < self.deadline()
    }

    /// Waits for the right to send a renewal; hold the permit until its
    /// reply is in (or the attempt is abandoned).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing.
    pub async fn renewal(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.renewing.lock().await
    }

    /// A renewal sent at `sent` for `ttl` was confirmed (call it while
    /// holding the [`renewal`](Self::renewal) permit). Ignored once lost.
    pub fn renewed(&self, sent: Instant, ttl: Duration) {
        if self.lost.is_fired() {
            return;
        }
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) = self.drift.deadline(sent, ttl);
        self.moved.notify_one();
    }

    /// Fires the lost signal (idempotent) without a reason: the guard was
    /// released or dropped, nothing was lost. For a loss, call
    /// [`lose`](Self::lose).
    pub fn fire_lost(&self) {
        self.lost.fire();
        self.moved.notify_one();
    }

    /// The lock is, or may be, lost for `why` (one of
    /// [`trace::why`](crate::trace::why)): records the reason, reports the
    /// `lost` event (once, and only with a subject: [`of_key`](Self::of_key)),
    /// then fires the signal. Ignored once the signal fired.
    pub fn lose(&self, why: &'static str) {
        if self.lost.is_fired() {
            return;
        }
        if self.why.set(why).is_ok()
            && let Some((backend, key)) = &self.subject
        {
            crate::trace::lost(backend, key.as_str(), why);
        }
        self.fire_lost();
    }

    /// Why the lock was lost, once [`lose`](Self::lose) said so.
    pub fn why(&self) -> Option<&'static str> {
        self.why.get().copied()
    }

    /// Reports a renewal that failed without a refusal (`renewal failed`),
    /// when this validity has a subject.
    pub fn renewal_failed(&self, error: &Error) {
        if let Some((backend, key)) = &self.subject {
            crate::trace::renewal_failed(backend, key.as_str(), error);
        }
    }

    /// `true` once the lost signal fired.
    pub fn is_lost(&self) -> bool {
        self.lost.is_fired()
    }

    /// Resolves once the deadline has passed (following renewals that move
    /// it) or the signal fired. It does not fire the signal itself.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn ran_out(&self) {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            let at = self.deadline();
            if self.is_lost() || at <= Instant::now() {
                return;
            }
            tokio::select! {
                () = moved => {}
                () = tokio::time::sleep_until(at.into()) => {}
            }
        }
    }
}

/// The lock on `key` is, or may be, lost for `why` (one of
/// [`trace::why`](crate::trace::why)): reports the `lost` event, unless the
/// signal already fired (a release, an earlier loss), then fires `trigger`.
/// For guards whose signal is not a [`Validity`]'s (session backends).
pub fn lose(trigger: &LostTrigger, backend: &'static str, key: &LockKey, why: &'static str) {
    // Only the caller that fires first reports (a keeper and an extend may
    // race to the same loss).
    if trigger.fire_first() {
        crate::trace::lost(backend, key.as_str(), why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_lost_validity_is_not_renewed() {
        let (v, signal) = Validity::new(Instant::now(), Duration::from_secs(10), Drift::DEFAULT);
        let before = v.deadline();
        v.fire_lost();
        v.renewed(Instant::now() + Duration::from_secs(5), Duration::from_secs(10));
        assert_eq!(v.deadline(), before);
        assert!(signal.is_lost() && !v.is_valid());
    }
}
