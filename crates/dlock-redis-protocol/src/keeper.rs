//! What a guard keeps on the client side: its local deadline (from the
//! acquire's send time, minus drift), the lost signal, and the task that
//! fires it at the deadline or renews before it with auto-extend.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::{LostSignal, LostTrigger, Result, drift};
use tokio::sync::Notify;

use crate::Outcome;

/// The local deadline of a grant: `sent + ttl - drift(ttl)`, where `sent` is
/// when the acquire (or the renewal) was sent.
pub fn local_deadline(sent: Instant, ttl: Duration) -> Instant {
    (sent + ttl).checked_sub(drift(ttl)).unwrap_or(sent)
}

/// A guard's validity: its local deadline and its lost trigger, shared by the
/// guard and its keeper task.
#[derive(Debug)]
pub struct Validity {
    deadline: Mutex<Instant>,
    moved: Notify,
    lost: LostTrigger,
}

impl Validity {
    /// A validity ending at [`local_deadline`]`(sent, ttl)`, and its signal.
    pub fn new(sent: Instant, ttl: Duration) -> (Arc<Self>, LostSignal) {
        let (trigger, signal) = LostSignal::pair();
        let validity = Validity {
            deadline: Mutex::new(local_deadline(sent, ttl)),
            moved: Notify::new(),
            lost: trigger,
        };
        (Arc::new(validity), signal)
    }

    /// The current local deadline.
    pub fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `true` while the deadline is ahead and the signal has not fired.
    pub fn is_valid(&self) -> bool {
        !self.lost.is_fired() && Instant::now() < self.deadline()
    }

    /// A renewal sent at `sent` with `ttl` was confirmed.
    pub fn renewed(&self, sent: Instant, ttl: Duration) {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) = local_deadline(sent, ttl);
        self.moved.notify_one();
    }

    /// Fires the lost signal.
    pub fn fire_lost(&self) {
        self.lost.fire();
    }
}

/// The keeper task of a guard: fires `lost()` when the local deadline passes;
/// with `auto_extend`, calls `renew` at `ttl / 3` (counted from the last
/// confirmed send). A renewal the servers refuse fires `lost()` at once; one
/// that fails otherwise is retried until the deadline, bounded by it. Ends
/// quietly when `stopped()` turns true (the handle was abandoned).
pub async fn keep<R, Fut>(
    validity: Arc<Validity>,
    ttl: Duration,
    auto_extend: bool,
    sent: Instant,
    mut renew: R,
    stopped: impl Fn() -> bool,
) where
    R: FnMut() -> Fut,
    Fut: Future<Output = Result<Outcome>>,
{
    let mut next_renewal = sent + ttl / 3;
    loop {
        if stopped() {
            return;
        }
        let deadline = validity.deadline();
        tokio::select! {
            () = tokio::time::sleep_until(deadline.into()) => {
                if validity.deadline() <= Instant::now() {
                    validity.fire_lost();
                    return;
                }
            }
            () = tokio::time::sleep_until(next_renewal.into()), if auto_extend => {
                let sent = Instant::now();
                // Boxed: inline, the client library's command future made
                // every idle keeper task several KiB (one per held guard).
                match tokio::time::timeout_at(deadline.into(), Box::pin(renew())).await {
                    Ok(Ok(Outcome::Done)) => {
                        validity.renewed(sent, ttl);
                        next_renewal = sent + ttl / 3;
                    }
                    Ok(Ok(Outcome::Expired | Outcome::HeldByOther)) | Err(_) => {
                        validity.fire_lost();
                        return;
                    }
                    // Not a refusal (a network failure): again soon, until the deadline.
                    Ok(Err(_)) => next_renewal = Instant::now() + (ttl / 20).max(Duration::from_millis(5)),
                }
            }
            () = validity.moved.notified() => {}
        }
    }
}
