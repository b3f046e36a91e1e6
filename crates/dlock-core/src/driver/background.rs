//! Work that outlives the call that started it: detached clean-ups and
//! requests, and the drop guard that starts one.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The first pause between clean-up attempts; it doubles up to
/// [`CLEAN_UP_MAX_PAUSE`].
pub const CLEAN_UP_FIRST_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause between clean-up attempts.
pub const CLEAN_UP_MAX_PAUSE: Duration = Duration::from_secs(2);

/// Runs `attempt` in the background until it succeeds, `gone()` turns true
/// (the lease or session that the entry lives on ended, the handle was
/// abandoned, the key expired by itself: nothing is left to clean), `until`
/// passes, or it fails with anything but [`Error::Unavailable`] (a refused
/// credential, an odd reply: retrying would not help). Pauses between attempts double from
/// [`CLEAN_UP_FIRST_PAUSE`] to [`CLEAN_UP_MAX_PAUSE`]. Every give-up is
/// logged through `tracing` (warn), naming `what`.
///
/// Pass `until: None` for an entry that would otherwise stay for as long as
/// the process lives (a contender on a lease kept alive): giving up on it
/// would block the name for good.
///
/// Outside a Tokio runtime nothing can run: that is logged, and the
/// backstop (TTL, lease, session) is what remains.
pub fn clean_up_in_background<A, Fut, G>(what: String, until: Option<Instant>, gone: G, mut attempt: A)
where
    A: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
    G: Fn() -> bool + Send + 'static,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(target: "dlock", what = %what, why = "no Tokio runtime to clean up in", "clean-up given up");
        return;
    };
    drop(rt.spawn(async move {
        let mut pause = CLEAN_UP_FIRST_PAUSE;
        let mut failures = 0u32;
        loop {
            if gone() {
                return;
            }
            match attempt().await {
                Ok(()) => {
                    if failures > 0 {
                        tracing::debug!(target: "dlock", what = %what, failures, "clean-up done after retries");
                    }
                    return;
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    if until.is_some_and(|u| Instant::now() >= u) {
                        tracing::warn!(target: "dlock", what = %what, failures, error = %e, why = "out of time", "clean-up given up");
                        return;
                    }
                    // Only a backend out of reach is worth another try: a
                    // refused credential or an odd reply will not get better.
                    if !matches!(e, Error::Unavailable { .. }) {
                        tracing::warn!(target: "dlock", what = %what, failures, error = %e, why = "not a transient error", "clean-up given up");
                        return;
                    }
                    if failures == 1 {
                        tracing::debug!(target: "dlock", what = %what, error = %e, "clean-up retried");
                    }
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(CLEAN_UP_MAX_PAUSE);
        }
    }));
}

/// Runs `task` detached on the current Tokio runtime (a single request a
/// drop sends: revoking a lease, giving up a subscription). Outside a
/// runtime nothing can run: that is logged, and the backstop (TTL, lease,
/// session) is what remains.
pub fn spawn_detached<Fut>(what: &str, task: Fut)
where
    Fut: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn(task)),
        Err(_) => {
            tracing::debug!(target: "dlock", what = %what, "no Tokio runtime to run a detached request in")
        }
    }
}

/// An armed drop guard: `clean_up(state)` runs when it is dropped unless it
/// was disarmed first. The shape of every "if this call ends early (an
/// error, a cancelled future), undo what it did": arm it before the request
/// whose effect must be undone, update its state as the call learns more,
/// disarm it once the effect is wanted.
///
/// ```
/// use dlock_core::driver::OnDrop;
/// let mut undo = OnDrop::new(None, |rev: Option<i64>| println!("delete {rev:?}"));
/// *undo.state_mut() = Some(7); // learned from the reply
/// assert_eq!(undo.disarm(), Some(7)); // granted: nothing to undo
/// ```
#[must_use = "dropping it at once runs the clean-up at once"]
pub struct OnDrop<T, F: FnOnce(T)> {
    armed: Option<(T, F)>,
}

impl<T, F: FnOnce(T)> OnDrop<T, F> {
    /// Armed with `state`.
    pub fn new(state: T, clean_up: F) -> Self {
        OnDrop {
            armed: Some((state, clean_up)),
        }
    }

    /// The state the clean-up will get.
    pub fn state_mut(&mut self) -> &mut T {
        match &mut self.armed {
            Some((state, _)) => state,
            // Only `disarm` (which consumes the guard) and `drop` empty it.
            None => unreachable!("an OnDrop is armed until disarmed or dropped"),
        }
    }

    /// The clean-up will not run; returns its state.
    pub fn disarm(mut self) -> T {
        match self.armed.take() {
            Some((state, _)) => state,
            None => unreachable!("an OnDrop is armed until disarmed or dropped"),
        }
    }
}

impl<T, F: FnOnce(T)> Drop for OnDrop<T, F> {
    fn drop(&mut self) {
        if let Some((state, clean_up)) = self.armed.take() {
            clean_up(state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_drop_runs_once_unless_disarmed() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let ran = AtomicU32::new(0);
        {
            let mut undo = OnDrop::new(1, |n| {
                ran.fetch_add(n, Ordering::SeqCst);
            });
            *undo.state_mut() = 5;
        }
        assert_eq!(ran.load(Ordering::SeqCst), 5);
        let undo = OnDrop::new(1, |n| {
            ran.fetch_add(n, Ordering::SeqCst);
        });
        assert_eq!(undo.disarm(), 1);
        assert_eq!(ran.load(Ordering::SeqCst), 5);
    }
}
