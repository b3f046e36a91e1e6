//! A session: one lease, kept alive in the background (or, for a guard
//! without auto-extend, left to run out), and the signal that fires when it
//! is, or may be, gone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::driver::{Drift, saturating_add};
use dlock_core::{LostSignal, LostTrigger, Result};
use etcd_client::Client;
use tokio::task::JoinHandle;

use crate::recipe::bounded;

/// The shortest lease etcd grants.
pub const MIN_TTL: Duration = Duration::from_secs(2);

/// A lease TTL as etcd takes it: whole seconds, rounded up, at least 2, at
/// most [`FAR_FUTURE`](dlock_core::driver::FAR_FUTURE) (a century; etcd's
/// own limit is about 285 years).
pub(crate) fn lease_seconds(ttl: Duration) -> i64 {
    let ttl = ttl.min(dlock_core::driver::FAR_FUTURE);
    let secs = ttl.as_secs().saturating_add(u64::from(ttl.subsec_nanos() > 0));
    i64::try_from(secs.max(MIN_TTL.as_secs())).unwrap_or(i64::MAX)
}

/// What the session's task and its users share.
#[derive(Debug)]
pub(crate) struct LeaseState {
    deadline: Mutex<Instant>,
    lost: LostTrigger,
    signal: LostSignal,
}

impl LeaseState {
    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn renewed(&self, sent: Instant, ttl: Duration) {
        let d = Drift::DEFAULT.deadline(sent, ttl);
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) = d;
    }

    fn fire(&self) {
        self.lost.fire();
    }
}

/// One lease and its keeper.
pub(crate) struct Session {
    pub(crate) lease: i64,
    pub(crate) ttl: Duration,
    /// The lease TTL asked for, in etcd's whole seconds (the server may
    /// grant another).
    pub(crate) asked_seconds: i64,
    pub(crate) kept_alive: bool,
    state: Arc<LeaseState>,
    task: JoinHandle<()>,
    client: Client,
    abandoned: Arc<AtomicBool>,
    timeout: Duration,
    attempts: AtomicU64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("kept_alive", &self.kept_alive)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Grants a lease of `ttl` (rounded up to whole seconds, at least 2) and
    /// starts its keeper: keep-alives at a third of the TTL when
    /// `kept_alive`, otherwise a timer that fires the signal when it runs out.
    pub(crate) async fn open(
        client: &Client,
        ttl: Duration,
        kept_alive: bool,
        timeout: Duration,
        abandoned: Arc<AtomicBool>,
    ) -> Result<Arc<Self>> {
        let (sent, asked) = (Instant::now(), ttl);
        let granted = bounded(timeout, client.clone().lease_grant(lease_seconds(ttl), None)).await?;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0).max(1));
        let (lost, signal) = LostSignal::pair();
        let state = Arc::new(LeaseState {
            deadline: Mutex::new(Drift::DEFAULT.deadline(sent, ttl)),
            lost,
            signal,
        });
        let task = if kept_alive {
            tokio::spawn(keep_alive(
                client.clone(),
                granted.id(),
                ttl,
                Arc::clone(&state),
                Arc::clone(&abandoned),
            ))
        } else {
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                tokio::time::sleep_until(state.deadline().into()).await;
                state.fire();
            })
        };
        Ok(Arc::new(Session {
            lease: granted.id(),
            ttl,
            asked_seconds: lease_seconds(asked),
            kept_alive,
            state,
            task,
            client: client.clone(),
            abandoned,
            timeout,
            attempts: AtomicU64::new(0),
        }))
    }

    /// A number unique among this session's acquires.
    pub(crate) fn next_attempt(&self) -> u64 {
        self.attempts.fetch_add(1, Ordering::Relaxed)
    }

    /// `true` while the lease is known to be alive.
    pub(crate) fn is_alive(&self) -> bool {
        !self.state.lost.is_fired() && Instant::now() < self.state.deadline()
    }

    /// Fires when the lease is, or may be, gone.
    pub(crate) fn lost(&self) -> LostSignal {
        self.state.signal.clone()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
        self.state.fire();
        if self.abandoned.load(Ordering::SeqCst) {
            return;
        }
        // Nobody uses the lease any more: give it back (deleting its keys).
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (client, lease, timeout) = (self.client.clone(), self.lease, self.timeout);
            drop(rt.spawn(async move {
                let _ = bounded(timeout, client.clone().lease_revoke(lease)).await;
            }));
        }
    }
}

/// Keeps `lease` alive: a keep-alive every `ttl / 3`; the local deadline
/// moves with each confirmed one. Fires the signal when the lease is gone
/// (TTL 0 in a reply: expired or revoked) or when no keep-alive was
/// confirmed before the deadline.
async fn keep_alive(
    client: Client,
    lease: i64,
    ttl: Duration,
    state: Arc<LeaseState>,
    abandoned: Arc<AtomicBool>,
) {
    let period = ttl / 3;
    let mut next = saturating_add(Instant::now(), period);
    'stream: loop {
        if abandoned.load(Ordering::SeqCst) {
            return;
        }
        let deadline = state.deadline();
        let opened = tokio::time::timeout_at(deadline.into(), client.clone().lease_keep_alive(lease)).await;
        let (mut keeper, mut replies) = match opened {
            Ok(Ok(pair)) => pair,
            // The client's word for a first reply of TTL 0: the lease
            // expired or was revoked. (Retrying it until the deadline kept
            // a revoked lease "held" for up to a whole TTL.)
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                state.fire();
                return;
            }
            Ok(Err(_)) => {
                let retry = saturating_add(Instant::now(), Duration::from_millis(100)).min(deadline);
                tokio::time::sleep_until(retry.into()).await;
                if Instant::now() >= state.deadline() {
                    state.fire();
                    return;
                }
                continue 'stream;
            }
            Err(_) => {
                state.fire();
                return;
            }
        };
        loop {
            tokio::time::sleep_until(next.min(state.deadline()).into()).await;
            if abandoned.load(Ordering::SeqCst) {
                return;
            }
            let sent = Instant::now();
            if sent >= state.deadline() {
                state.fire();
                return;
            }
            if keeper.keep_alive().await.is_err() {
                next = Instant::now();
                continue 'stream;
            }
            match tokio::time::timeout_at(state.deadline().into(), replies.message()).await {
                Ok(Ok(Some(reply))) if reply.ttl() > 0 => {
                    state.renewed(sent, Duration::from_secs(u64::try_from(reply.ttl()).unwrap_or(0)));
                    next = saturating_add(sent, period);
                }
                // TTL 0: the lease expired or was revoked.
                Ok(Ok(Some(_))) => {
                    state.fire();
                    return;
                }
                Ok(Ok(None) | Err(_)) => {
                    // The stream ended: a new one shortly (not in a tight loop).
                    let retry =
                        saturating_add(Instant::now(), Duration::from_millis(100)).min(state.deadline());
                    tokio::time::sleep_until(retry.into()).await;
                    next = Instant::now();
                    continue 'stream;
                }
                Err(_) => {
                    state.fire();
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ttls_are_whole_seconds_of_at_least_two() {
        assert_eq!(lease_seconds(Duration::from_millis(1)), 2);
        assert_eq!(lease_seconds(Duration::from_millis(2500)), 3);
        assert_eq!(lease_seconds(Duration::from_secs(30)), 30);
        assert_eq!(lease_seconds(Duration::MAX), 100 * 365 * 24 * 3600);
    }
}
