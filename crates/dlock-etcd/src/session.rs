//! A session: one lease, kept alive in the background, and the signal that
//! fires when it is, or may be, gone.
//!
//! A *shared* session (guards with auto-extend) is kept alive for good. A
//! guard without auto-extend has a lease of its own, granted before its key
//! is written: kept alive while its acquire waits, then only until the
//! guard's deadline ([`Session::hold_for`]), when it is revoked. Its key is
//! never rewritten (Go's `RWMutex` orders contenders by modification
//! revision: a rewrite would move ours behind theirs).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::driver::{Drift, Outcome, Refusal, Validity, saturating_add};
use dlock_core::trace::{self, why};
use dlock_core::{Error, LockKey, LostSignal, LostTrigger, Result};
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

/// How long a lease is kept alive, and what its keep-alives have done.
struct Hold {
    /// `None`: for good (a shared session; an own lease while its acquire
    /// waits). `Some(t)`: until `t`, a grant's deadline without auto-extend.
    until: Mutex<Option<Instant>>,
    /// When the last keep-alive the server confirmed was sent (at first:
    /// when the lease was granted).
    last: Mutex<Instant>,
    /// Told when `until` moves.
    moved: tokio::sync::Notify,
}

impl Hold {
    fn until(&self) -> Option<Instant> {
        *self.until.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn last(&self) -> Instant {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A keep-alive sent at `sent` was confirmed (the lease has `ttl`
    /// again): the local deadline moves to `sent + ttl`, or to `until` if
    /// that comes first.
    fn renewed(&self, state: &Validity, sent: Instant, ttl: Duration) {
        let until = self.until();
        {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            *last = (*last).max(sent);
        }
        state.renewed(
            sent,
            until.map_or(ttl, |t| ttl.min(t.saturating_duration_since(sent))),
        );
    }

    /// The last confirmed keep-alive keeps a lease of `ttl` past `until`:
    /// no more are needed.
    fn covered(&self, ttl: Duration) -> bool {
        self.until()
            .is_some_and(|t| saturating_add(self.last(), ttl) >= t)
    }

    /// Keep alive until `until` from now on; a keep-alive sent at `sent`
    /// was confirmed (`ttl` as in [`renewed`](Self::renewed)). The keeper is
    /// told once both are in (told earlier, it could wait for the old
    /// deadline).
    fn hold_until(&self, state: &Validity, until: Instant, sent: Instant, ttl: Duration) {
        *self.until.lock().unwrap_or_else(PoisonError::into_inner) = Some(until);
        self.renewed(state, sent, ttl);
        self.moved.notify_one();
    }
}

/// One lease and its keeper.
pub(crate) struct Session {
    pub(crate) lease: i64,
    pub(crate) ttl: Duration,
    /// The lease TTL asked for, in etcd's whole seconds (the server may
    /// grant another).
    pub(crate) asked_seconds: i64,
    /// Kept alive for good and shared by the handle's guards with
    /// auto-extend; otherwise one guard's own ([`hold_for`](Self::hold_for)).
    pub(crate) shared: bool,
    state: Arc<Validity>,
    hold: Arc<Hold>,
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
    tell_all(&followers, state.why().unwrap_or(why::SESSION_ENDED));
}

/// Fires every follower's trigger with `why`, and every later follower's
/// at once.
fn tell_all(followers: &Followers, why: &'static str) {
    let list = followers
        .list
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    for (trigger, key) in list.into_iter().flat_map(HashMap::into_values) {
        dlock_core::driver::lose(&trigger, BACKEND, &key, why);
    }
}

/// Runs its closure if dropped before [`finished`](Self::finished): a
/// session's task dropped unfinished, with the runtime it ran on.
struct Unfinished<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Unfinished<F> {
    fn finished(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for Unfinished<F> {
    fn drop(&mut self) {
        if let Some(then) = self.0.take() {
            then();
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease", &self.lease)
            .field("ttl", &self.ttl)
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Grants a lease of `ttl` (rounded up to whole seconds, at least 2) and
    /// starts its keeper: keep-alives at a third of the TTL, for good (a
    /// `shared` session) or until [`hold_for`](Self::hold_for) says.
    pub(crate) async fn open(
        client: &Client,
        ttl: Duration,
        shared: bool,
        timeout: Duration,
        abandoned: Arc<AtomicBool>,
    ) -> Result<Arc<Self>> {
        let (sent, asked) = (Instant::now(), ttl);
        let (lease, ttl) = protocol::grant_lease(client, lease_seconds(ttl), timeout).await?;
        let (state, signal) = Validity::new(sent, ttl, Drift::DEFAULT);
        let hold = Arc::new(Hold {
            until: Mutex::new(None),
            last: Mutex::new(sent),
            moved: tokio::sync::Notify::new(),
        });
        // Both tasks run on the runtime that opened the session. If it
        // shuts down while the session is in use, nothing keeps the lease
        // alive or watches it any more: the session ends (a later acquire
        // opens a new one) and every guard on it is told at once.
        let followers = Arc::new(Followers {
            list: Mutex::new(Some(HashMap::new())),
            next: AtomicU64::new(0),
        });
        let keeping = keep_alive(
            client.clone(),
            lease,
            ttl,
            timeout,
            Arc::clone(&state),
            Arc::clone(&hold),
            Arc::clone(&abandoned),
            Arc::clone(&followers),
        );
        let gone = Unfinished(Some({
            let state = Arc::clone(&state);
            move || state.lose(why::KEEPER_GONE)
        }));
        let task = tokio::spawn(async move {
            keeping.await;
            gone.finished();
        });
        let telling = tell_followers(signal.clone(), Arc::clone(&state), Arc::clone(&followers));
        let gone = Unfinished(Some({
            let followers = Arc::clone(&followers);
            move || tell_all(&followers, why::KEEPER_GONE)
        }));
        drop(tokio::spawn(async move {
            telling.await;
            gone.finished();
        }));
        Ok(Arc::new(Session {
            lease,
            ttl,
            asked_seconds: lease_seconds(asked),
            shared,
            state,
            hold,
            signal,
            task,
            client: client.clone(),
            abandoned,
            timeout,
            attempts: AtomicU64::new(0),
            followers,
        }))
    }

    /// Holds this (own) lease for `ttl` from now and no longer: one
    /// keep-alive now (the lease has its whole TTL again), then as many as
    /// reach `ttl` from now, then none; at that deadline the guard is lost
    /// and the lease revoked (its key goes). A `ttl` shorter than the
    /// lease's is kept by that revoke; a longer one by keep-alives. No key
    /// is written: its revisions stay as they were.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when the keep-alive is not answered in time
    /// (the deadline stays as it was); `Ok(Err(Expired))` when the lease is
    /// gone.
    ///
    /// # Cancel safety
    ///
    /// Dropping it after sending may leave the lease refreshed at the
    /// server and the deadline where it was (the safe side).
    pub(crate) async fn hold_for(&self, ttl: Duration) -> Result<Outcome> {
        let sent = Instant::now();
        match tokio::time::timeout(self.timeout, KeepAlive::open(&self.client, self.lease)).await {
            Ok(Renewal::Alive(_)) => {
                self.hold
                    .hold_until(&self.state, saturating_add(sent, ttl), sent, self.ttl);
                Ok(Ok(()))
            }
            Ok(Renewal::Gone) => {
                self.state.lose(why::SESSION_ENDED);
                Ok(Err(Refusal::Expired))
            }
            Ok(Renewal::Failed) | Err(_) => Err(Error::unavailable(
                BACKEND,
                format!("no answer to a keep-alive of lease {:x}", self.lease),
            )),
        }
    }

    /// As [`hold_for`](Self::hold_for), counted from the last confirmed
    /// keep-alive (or the grant of the lease) instead of a new one: for a
    /// grant that did not wait, whose lease was just granted.
    pub(crate) fn hold_from_last(&self, ttl: Duration) {
        let last = self.hold.last();
        self.hold
            .hold_until(&self.state, saturating_add(last, ttl), last, self.ttl);
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

/// Keeps `lease` alive: a keep-alive every `ttl / 3` (the first one opens
/// a stream), for good or until the hold's `until`; the local deadline moves
/// with each confirmed one. Fires the signal when the lease is gone (TTL 0
/// in a reply: expired or revoked), when no keep-alive was confirmed before
/// the deadline, or at the deadline the hold asked for: then it revokes the
/// lease too, so that etcd frees the key when the guard's TTL says, not at
/// the end of a longer lease.
#[allow(clippy::too_many_arguments)] // what the keeper task owns, each for its own reason
async fn keep_alive(
    client: Client,
    lease: i64,
    ttl: Duration,
    timeout: Duration,
    state: Arc<Validity>,
    hold: Arc<Hold>,
    abandoned: Arc<AtomicBool>,
    followers: Arc<Followers>,
) {
    let period = ttl / 3;
    let mut stream: Option<KeepAlive> = None;
    // Reported once per run of failures (retries come every 100 ms).
    let mut failing = false;
    loop {
        if abandoned.load(Ordering::SeqCst) {
            return;
        }
        if hold.covered(ttl) {
            // No more keep-alives: the deadline ends the hold, unless an
            // extend moves it first.
            stream = None;
            let moved = hold.moved.notified();
            tokio::select! {
                () = tokio::time::sleep_until(state.deadline().into()) => {
                    if hold.covered(ttl) && Instant::now() >= state.deadline() {
                        state.lose(why::DEADLINE);
                        // Every guard hears it before the revoke frees the
                        // name for others (not later, from the telling task).
                        tell_all(&followers, why::DEADLINE);
                        if !abandoned.load(Ordering::SeqCst) {
                            let _ = protocol::revoke_lease(&client, lease, timeout).await;
                        }
                        return;
                    }
                }
                () = moved => {}
            }
            continue;
        }
        let due = saturating_add(hold.last(), period).min(state.deadline());
        // Until the next keep-alive is due, or the hold moves (an extend:
        // it may need none now, or a deadline come sooner).
        let moved = hold.moved.notified();
        tokio::select! {
            () = tokio::time::sleep_until(due.into()) => {}
            () = moved => continue,
        }
        if abandoned.load(Ordering::SeqCst) {
            return;
        }
        let sent = Instant::now();
        if sent >= state.deadline() {
            state.lose(why::DEADLINE);
            return;
        }
        let deadline = state.deadline();
        let answer = match stream.as_mut() {
            Some(open) => tokio::time::timeout_at(deadline.into(), open.renew()).await,
            // Opening a stream sends a keep-alive; its answer gives the
            // lease its whole TTL again.
            None => match tokio::time::timeout_at(deadline.into(), KeepAlive::open(&client, lease)).await {
                Ok(Renewal::Alive(opened)) => {
                    stream = Some(opened);
                    Ok(Renewal::Alive(ttl))
                }
                Ok(Renewal::Gone) => Ok(Renewal::Gone),
                Ok(Renewal::Failed) => Ok(Renewal::Failed),
                Err(elapsed) => Err(elapsed),
            },
        };
        match answer {
            Ok(Renewal::Alive(granted)) => {
                failing = false;
                hold.renewed(&state, sent, granted);
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
                let what = if stream.is_some() {
                    "a keep-alive got no answer"
                } else {
                    "a keep-alive stream could not be opened"
                };
                report_once(&mut failing, lease, what);
                // A new stream shortly (not in a tight loop).
                stream = None;
                let retry = saturating_add(Instant::now(), Duration::from_millis(100)).min(state.deadline());
                tokio::time::sleep_until(retry.into()).await;
                if Instant::now() >= state.deadline() {
                    state.lose(why::DEADLINE);
                    return;
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
