//! A session: one lease, kept alive in the background (or, for a guard
//! without auto-extend, left to run out), and the signal that fires when it
//! is, or may be, gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::driver::{Drift, Validity, saturating_add};
use dlock_core::trace::{self, why};
use dlock_core::{LockKey, LostSignal, LostTrigger, Result};
use etcd_client::Client;
use tokio::task::JoinHandle;

use crate::error::BACKEND;
use crate::protocol::{self, KeepAlive, Renewal};

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

/// One lease and its keeper.
pub(crate) struct Session {
    pub(crate) lease: i64,
    pub(crate) ttl: Duration,
    /// The lease TTL asked for, in etcd's whole seconds (the server may
    /// grant another).
    pub(crate) asked_seconds: i64,
    pub(crate) kept_alive: bool,
    state: Arc<Validity>,
    signal: LostSignal,
    task: JoinHandle<()>,
    client: Client,
    abandoned: Arc<AtomicBool>,
    timeout: Duration,
    attempts: AtomicU64,
    /// The guards on this lease, told when it is lost (by one task per
    /// session, not one per guard).
    followers: Arc<Followers>,
}

/// The guards following a session: their triggers, fired with the
/// session's reason when it is lost. `None` once it was.
pub(crate) struct Followers {
    list: Mutex<Option<HashMap<u64, (LostTrigger, LockKey)>>>,
    next: AtomicU64,
}

impl Followers {
    fn remove(&self, id: u64) {
        if let Some(list) = self.list.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            list.remove(&id);
        }
    }
}

/// A guard's place among its session's followers; dropping it (or
/// [`stop`](Following::stop)) leaves.
pub(crate) struct Following {
    followers: Arc<Followers>,
    id: u64,
}

impl Following {
    /// No longer told about the session.
    pub(crate) fn stop(&self) {
        self.followers.remove(self.id);
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits for the session's signal, then fires every follower's trigger
/// with the session's reason (and every later follower's at once).
async fn tell_followers(signal: LostSignal, state: Arc<Validity>, followers: Arc<Followers>) {
    signal.wait().await;
    let list = followers
        .list
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let why = state.why().unwrap_or(why::SESSION_ENDED);
    for (trigger, key) in list.into_iter().flat_map(HashMap::into_values) {
        dlock_core::driver::lose(&trigger, BACKEND, &key, why);
    }
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
        let (lease, ttl) = protocol::grant_lease(client, lease_seconds(ttl), timeout).await?;
        let (state, signal) = Validity::new(sent, ttl, Drift::DEFAULT);
        let task = if kept_alive {
            tokio::spawn(keep_alive(
                client.clone(),
                lease,
                ttl,
                Arc::clone(&state),
                Arc::clone(&abandoned),
            ))
        } else {
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                tokio::time::sleep_until(state.deadline().into()).await;
                state.lose(why::DEADLINE);
            })
        };
        let followers = Arc::new(Followers {
            list: Mutex::new(Some(HashMap::new())),
            next: AtomicU64::new(0),
        });
        drop(tokio::spawn(tell_followers(
            signal.clone(),
            Arc::clone(&state),
            Arc::clone(&followers),
        )));
        Ok(Arc::new(Session {
            lease,
            ttl,
            asked_seconds: lease_seconds(asked),
            kept_alive,
            state,
            signal,
            task,
            client: client.clone(),
            abandoned,
            timeout,
            attempts: AtomicU64::new(0),
            followers,
        }))
    }

    /// A number unique among this session's acquires.
    pub(crate) fn next_attempt(&self) -> u64 {
        self.attempts.fetch_add(1, Ordering::Relaxed)
    }

    /// `true` while the lease is known to be alive.
    pub(crate) fn is_alive(&self) -> bool {
        self.state.is_valid()
    }

    /// Fires when the lease is, or may be, gone.
    pub(crate) fn lost(&self) -> LostSignal {
        self.signal.clone()
    }

    /// Fires `trigger` (reporting `lost` for `key`, with the session's
    /// reason) when the lease is, or may be, gone; at once if it is already.
    pub(crate) fn follow(&self, trigger: &LostTrigger, key: &LockKey) -> Following {
        let id = self.followers.next.fetch_add(1, Ordering::Relaxed);
        let mut list = self.followers.list.lock().unwrap_or_else(PoisonError::into_inner);
        match list.as_mut() {
            Some(list) => {
                list.insert(id, (trigger.clone(), key.clone()));
            }
            None => {
                drop(list);
                let why = self.state.why().unwrap_or(why::SESSION_ENDED);
                dlock_core::driver::lose(trigger, BACKEND, key, why);
            }
        }
        Following {
            followers: Arc::clone(&self.followers),
            id,
        }
    }

    /// The lease's validity: why it was lost, once it was.
    pub(crate) fn validity(&self) -> Arc<Validity> {
        Arc::clone(&self.state)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
        self.state.fire_lost();
        if self.abandoned.load(Ordering::SeqCst) {
            return;
        }
        // Nobody uses the lease any more: give it back (deleting its keys).
        let (client, lease, timeout) = (self.client.clone(), self.lease, self.timeout);
        dlock_core::driver::spawn_detached("etcd: revoke a lease nobody uses", async move {
            let _ = protocol::revoke_lease(&client, lease, timeout).await;
        });
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
    state: Arc<Validity>,
    abandoned: Arc<AtomicBool>,
) {
    let period = ttl / 3;
    let mut next = saturating_add(Instant::now(), period);
    // Reported once per run of failures (retries come every 100 ms).
    let mut failing = false;
    'stream: loop {
        if abandoned.load(Ordering::SeqCst) {
            return;
        }
        let deadline = state.deadline();
        let mut stream = match tokio::time::timeout_at(deadline.into(), KeepAlive::open(&client, lease)).await
        {
            Ok(Renewal::Alive(stream)) => stream,
            Ok(Renewal::Gone) => {
                state.lose(why::SESSION_ENDED);
                return;
            }
            Err(_) => {
                state.lose(why::DEADLINE);
                return;
            }
            Ok(Renewal::Failed) => {
                report_once(&mut failing, lease, "a keep-alive stream could not be opened");
                // Not in a tight loop.
                let retry = saturating_add(Instant::now(), Duration::from_millis(100)).min(deadline);
                tokio::time::sleep_until(retry.into()).await;
                if Instant::now() >= state.deadline() {
                    state.lose(why::DEADLINE);
                    return;
                }
                continue 'stream;
            }
        };
        loop {
            tokio::time::sleep_until(next.min(state.deadline()).into()).await;
            if abandoned.load(Ordering::SeqCst) {
                return;
            }
            let sent = Instant::now();
            if sent >= state.deadline() {
                state.lose(why::DEADLINE);
                return;
            }
            match tokio::time::timeout_at(state.deadline().into(), stream.renew()).await {
                Ok(Renewal::Alive(ttl)) => {
                    failing = false;
                    state.renewed(sent, ttl);
                    next = saturating_add(sent, period);
                }
                Ok(Renewal::Gone) => {
                    state.lose(why::SESSION_ENDED);
                    return;
                }
                Err(_) => {
                    state.lose(why::DEADLINE);
                    return;
                }
                Ok(Renewal::Failed) => {
                    report_once(&mut failing, lease, "a keep-alive got no answer");
                    // The stream ended: a new one shortly (not in a tight loop).
                    let retry =
                        saturating_add(Instant::now(), Duration::from_millis(100)).min(state.deadline());
                    tokio::time::sleep_until(retry.into()).await;
                    next = Instant::now();
                    continue 'stream;
                }
            }
        }
    }
}

/// `renewal failed` for `lease`, unless this run of failures (`failing`)
/// was reported already.
fn report_once(failing: &mut bool, lease: i64, what: &str) {
    if !std::mem::replace(failing, true) {
        trace::session_renewal_failed(BACKEND, &format!("{lease:x}"), what);
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
