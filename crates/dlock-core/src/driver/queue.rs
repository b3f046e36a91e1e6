//! The queue recipe etcd and ZooKeeper share, as Curator's `LockInternals`
//! is one for its recipes: a contender enters the queue (a key, a
//! sequential node: the driver's layout), holds at once if it is first (or
//! its permits fit), else waits for its predecessors within the caller's
//! [`Wait`], and gives its place back when out of time. The driver enters
//! and builds the guard; [`wait_turn`] is everything between.

use std::future::Future;
use std::time::Instant;

use super::{OnDrop, within_wait};
use crate::{Error, LockKey, Result, Wait};

/// One contender's place in a backend's queue: the hooks [`wait_turn`]
/// calls.
pub trait Place {
    /// Waits until this contender may hold: `Ok(true)`; `Ok(false)` when
    /// its place went while it waited (its lease or session ended), which
    /// [`wait_turn`] reports as [`Error::Lost`].
    ///
    /// # Cancel safety
    ///
    /// Dropped when the caller's wait runs out; the place is then withdrawn.
    fn wait_turn(&self) -> impl Future<Output = Result<bool>> + Send;

    /// Gives the place back at once (deletes the key or node): one request.
    ///
    /// # Cancel safety
    ///
    /// Dropping it may or may not leave the place; the clean-up that
    /// [`wait_turn`] holds then removes it in the background.
    fn withdraw(&self) -> impl Future<Output = Result<()>> + Send;
}

/// Waits for `place`'s turn, unless it is `first` (it may hold now): the
/// `cleanup` back, still armed, when it may hold; the wait bounded by
/// `wait` from `started`.
///
/// # Errors
///
/// [`Error::Timeout`] when the wait ran out ([`Wait::No`]: at once when not
/// first), after withdrawing the place (if that fails, `cleanup` is dropped
/// armed and retries in the background); [`Error::Lost`] when the place
/// went while it waited; whatever [`Place::wait_turn`] returns.
///
/// # Cancel safety
///
/// Dropping it drops `cleanup` armed: the place is removed in the
/// background.
pub async fn wait_turn<P: Place, S, F: FnOnce(S)>(
    place: &P,
    key: &LockKey,
    first: bool,
    wait: Wait,
    started: Instant,
    cleanup: OnDrop<S, F>,
) -> Result<OnDrop<S, F>> {
    if first {
        return Ok(cleanup);
    }
    if wait == Wait::No {
        return Err(withdrawn(place, cleanup, key).await);
    }
    match within_wait(wait, started, place.wait_turn()).await {
        None => Err(withdrawn(place, cleanup, key).await),
        Some(Ok(true)) => Ok(cleanup),
        Some(Ok(false)) => Err(Error::Lost {
            key: key.as_str().to_owned(),
        }),
        Some(Err(e)) => Err(e),
    }
}

/// Out of time: the place goes at once if it can; if that fails, the
/// clean-up (dropped armed) retries in the background (a place left on a
/// live lease or session would block the lock until it ends).
async fn withdrawn<P: Place, S, F: FnOnce(S)>(place: &P, cleanup: OnDrop<S, F>, key: &LockKey) -> Error {
    if place.withdraw().await.is_ok() {
        cleanup.disarm();
    }
    Error::Timeout {
        key: key.as_str().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A place whose turn comes after `turn_after` (never for `None`), that
    /// counts its withdrawals and may fail them.
    struct Fake {
        turn_after: Option<Duration>,
        survives: bool,
        withdraw_fails: bool,
        withdrawn: AtomicUsize,
    }

    impl Fake {
        fn new(turn_after: Option<Duration>) -> Self {
            Fake {
                turn_after,
                survives: true,
                withdraw_fails: false,
                withdrawn: AtomicUsize::new(0),
            }
        }
    }

    impl Place for Fake {
        async fn wait_turn(&self) -> Result<bool> {
            match self.turn_after {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending::<()>().await,
            }
            Ok(self.survives)
        }

        async fn withdraw(&self) -> Result<()> {
            self.withdrawn.fetch_add(1, Ordering::SeqCst);
            if self.withdraw_fails {
                Err(Error::unavailable("fake", "no answer"))
            } else {
                Ok(())
            }
        }
    }

    fn key() -> LockKey {
        LockKey::new("q").unwrap()
    }

    /// Runs the recipe; returns its verdict and how often the clean-up ran.
    async fn run(place: &Fake, first: bool, wait: Wait) -> (Result<()>, usize) {
        let cleaned = AtomicUsize::new(0);
        let cleanup = OnDrop::new((), |()| {
            cleaned.fetch_add(1, Ordering::SeqCst);
        });
        let r = wait_turn(place, &key(), first, wait, Instant::now(), cleanup)
            .await
            .map(OnDrop::disarm);
        (r, cleaned.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_holds_at_once_and_the_others_wait_their_turn() {
        let first = Fake::new(None);
        assert!(matches!(run(&first, true, Wait::No).await, (Ok(()), 0)));
        let waiter = Fake::new(Some(Duration::from_secs(1)));
        let wait = Wait::For(Duration::from_secs(5));
        assert!(matches!(run(&waiter, false, wait).await, (Ok(()), 0)));
        assert_eq!(waiter.withdrawn.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn out_of_time_withdraws_and_a_failed_withdrawal_leaves_the_clean_up_armed() {
        for wait in [Wait::No, Wait::For(Duration::from_secs(1))] {
            let place = Fake::new(None);
            let (r, cleaned) = run(&place, false, wait).await;
            assert!(matches!(r, Err(Error::Timeout { .. })), "{wait:?}: {r:?}");
            assert_eq!((place.withdrawn.load(Ordering::SeqCst), cleaned), (1, 0));
            let place = Fake {
                withdraw_fails: true,
                ..Fake::new(None)
            };
            let (r, cleaned) = run(&place, false, wait).await;
            assert!(matches!(r, Err(Error::Timeout { .. })), "{wait:?}: {r:?}");
            assert_eq!(
                cleaned, 1,
                "{wait:?}: the clean-up must run when the withdrawal failed"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_place_gone_while_waiting_is_lost() {
        let place = Fake {
            survives: false,
            ..Fake::new(Some(Duration::from_millis(10)))
        };
        let (r, cleaned) = run(&place, false, Wait::Forever).await;
        assert!(matches!(r, Err(Error::Lost { .. })), "{r:?}");
        assert_eq!(cleaned, 1, "a lost place is cleaned up like any other end");
    }
}
