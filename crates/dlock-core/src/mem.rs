//! [`MemLock`]: the in-process driver.
//!
//! It keeps the whole contract for real, so it is both the zero-setup backend
//! (tests, demos, single-process apps) and the reference the conformance kit
//! is checked against:
//!
//! - a grant has a TTL on the monotonic clock ([`Instant`]); a timer task
//!   expires it, fires the holder's [`LostSignal`] and hands the key on;
//! - tokens come from one counter per backend, so they strictly increase per
//!   key in grant order;
//! - waiters queue per key and are granted in FIFO order by direct hand-off
//!   (woken by a message, never polling);
//! - `auto_extend` runs a watchdog that renews at `ttl / 3`;
//! - dropping a guard releases at once; dropping a waiting `acquire` removes
//!   its waiter, or gives back a grant that arrived too late to be returned.
//!
//! "Backend" and "client" are separated as they are for network drivers:
//! [`MemLock::new`] makes a backend and a first client; [`MemLock::client`]
//! makes another, independent client of the same backend (standing in for
//! another process); [`MemLock::abandon`] makes one client vanish without
//! releasing anything, as a killed process would.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::driver::Refusal;
use crate::{
    AcquireOptions, Capabilities, Error, Fencing, FencingToken, Guard, Lock, LockKey, LostSignal,
    LostTrigger, Result, Wait, Waiting, drift,
};

const BACKEND: &str = "mem";

/// The shortest TTL `MemLock` honours; shorter ones are rounded up.
pub const MEM_MIN_TTL: Duration = Duration::from_millis(1);

/// The in-process lock backend. Cheap to clone (clones are the same client).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{AcquireOptions, Guard, Lock, LockKey, MemLock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// let lock = MemLock::new();
/// let key = LockKey::new("invoices")?;
/// let opts = AcquireOptions::default().ttl(Duration::from_secs(10));
///
/// let first = lock.acquire(&key, opts).await?;
/// // Another client of the same backend cannot take it meanwhile.
/// let other = lock.client();
/// assert!(other.try_acquire(&key, opts).await?.is_none());
/// let t1 = first.token().expect("MemLock fences");
/// first.release().await?;
///
/// let second = other.acquire(&key, opts).await?;
/// assert!(second.token().expect("MemLock fences") > t1);
/// second.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MemLock {
    server: Arc<Server>,
    client: Arc<ClientState>,
}

#[derive(Default)]
struct ClientState {
    abandoned: AtomicBool,
}

#[derive(Default)]
struct Server {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    keys: HashMap<LockKey, Entry>,
    last_token: u64,
    last_id: u64,
}

#[derive(Default)]
struct Entry {
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
}

struct Holder {
    id: u64,
    deadline: Instant,
    lost: LostTrigger,
}

struct Waiter {
    id: u64,
    ttl: Duration,
    grant: oneshot::Sender<Grant>,
}

struct Grant {
    token: FencingToken,
    deadline: Instant,
    lost: (LostTrigger, LostSignal),
}

impl Server {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave `State` half-updated in a
        // way that breaks exclusion (every update is a single assignment), so
        // keep going rather than poisoning every later call.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the expiry timer of `id`'s grant of `key`. Called by the
    /// acquire that receives the grant (always inside a runtime), not where
    /// the grant is made: a hand-off may happen in a guard's drop, outside
    /// one. Until it runs, any call on the key expires an overdue holder
    /// itself (`reap_if_due`).
    fn expire_in_background(self: &Arc<Self>, key: &LockKey, id: u64) {
        drop(tokio::spawn(expire_when_due(
            Arc::downgrade(self),
            key.clone(),
            id,
        )));
    }

    /// Makes `id` the holder of `key` (its acquire starts the expiry timer).
    fn grant(self: &Arc<Self>, st: &mut State, key: &LockKey, id: u64, ttl: Duration) -> Grant {
        st.last_token += 1;
        let token = FencingToken::new(st.last_token);
        let deadline = crate::driver::saturating_add(Instant::now(), ttl);
        let (trigger, signal) = LostSignal::pair();
        st.keys.entry(key.clone()).or_default().holder = Some(Holder {
            id,
            deadline,
            lost: trigger.clone(),
        });
        Grant {
            token,
            deadline,
            lost: (trigger, signal),
        }
    }

    /// Clears the holder of `key` and hands the key to the first waiter that
    /// is still there (FIFO). Removes the entry when nobody is left.
    fn free(self: &Arc<Self>, st: &mut State, key: &LockKey) {
        loop {
            let Some(entry) = st.keys.get_mut(key) else { return };
            entry.holder = None;
            let Some(waiter) = entry.waiters.pop_front() else {
                st.keys.remove(key);
                return;
            };
            let grant = self.grant(st, key, waiter.id, waiter.ttl);
            if waiter.grant.send(grant).is_ok() {
                return;
            }
            // That waiter's future is gone: undo its grant and try the next.
        }
    }

    /// Expires the holder of `key` if its deadline has passed (the timer task
    /// may lag behind a caller that checks first).
    fn reap_if_due(self: &Arc<Self>, st: &mut State, key: &LockKey) {
        let due = st
            .keys
            .get(key)
            .and_then(|e| e.holder.as_ref())
            .is_some_and(|h| h.deadline <= Instant::now());
        if due {
            if let Some(h) = st.keys.get_mut(key).and_then(|e| e.holder.take()) {
                crate::trace::lost(BACKEND, key.as_str(), crate::trace::why::EXPIRED);
                h.lost.fire();
            }
            self.free(st, key);
        }
    }

    /// Checks that `id` holds `key` right now.
    fn check_holder(
        self: &Arc<Self>,
        st: &mut State,
        key: &LockKey,
        id: u64,
    ) -> std::result::Result<(), Refusal> {
        self.reap_if_due(st, key);
        match st.keys.get(key).and_then(|e| e.holder.as_ref()) {
            Some(h) if h.id == id => Ok(()),
            Some(_) => Err(Refusal::HeldByOther),
            None => Err(Refusal::Expired),
        }
    }

    fn release(self: &Arc<Self>, key: &LockKey, id: u64) -> std::result::Result<(), Refusal> {
        let mut st = self.state();
        self.check_holder(&mut st, key, id)?;
        self.free(&mut st, key);
        Ok(())
    }

    fn extend(self: &Arc<Self>, key: &LockKey, id: u64, ttl: Duration) -> std::result::Result<(), Refusal> {
        let mut st = self.state();
        self.check_holder(&mut st, key, id)?;
        let mut earlier = false;
        if let Some(h) = st.keys.get_mut(key).and_then(|e| e.holder.as_mut()) {
            let deadline = crate::driver::saturating_add(Instant::now(), ttl);
            earlier = deadline < h.deadline;
            h.deadline = deadline;
        }
        drop(st);
        if earlier {
            // The expiry timer sleeps until the old deadline: one for the new.
            self.expire_in_background(key, id);
        }
        Ok(())
    }

    /// Removes waiter `id` of `key`, or gives the key back if the hand-off
    /// reached `id` after its `acquire` was dropped.
    fn withdraw(self: &Arc<Self>, key: &LockKey, id: u64) {
        let mut st = self.state();
        let Some(entry) = st.keys.get_mut(key) else { return };
        if entry.holder.as_ref().is_some_and(|h| h.id == id) {
            self.free(&mut st, key);
        } else {
            entry.waiters.retain(|w| w.id != id);
        }
    }
}

/// The backend's expiry timer for one grant: sleeps until the holder's
/// deadline (following extensions), then expires it.
async fn expire_when_due(server: Weak<Server>, key: LockKey, id: u64) {
    loop {
        let deadline = {
            let Some(server) = server.upgrade() else { return };
            let st = server.state();
            match st.keys.get(&key).and_then(|e| e.holder.as_ref()) {
                Some(h) if h.id == id => h.deadline,
                _ => return,
            }
        };
        tokio::time::sleep_until(deadline.into()).await;
        let Some(server) = server.upgrade() else { return };
        let mut st = server.state();
        let ours = st
            .keys
            .get(&key)
            .and_then(|e| e.holder.as_ref())
            .is_some_and(|h| h.id == id);
        if !ours {
            return;
        }
        server.reap_if_due(&mut st, &key);
    }
}

impl MemLock {
    /// A new, empty backend and a first client of it.
    pub fn new() -> Self {
        MemLock {
            server: Arc::default(),
            client: Arc::default(),
        }
    }

    /// Another independent client of the same backend: it shares the locks,
    /// not the identity (a [`abandon`](Self::abandon) of one leaves the other
    /// working).
    pub fn client(&self) -> Self {
        MemLock {
            server: Arc::clone(&self.server),
            client: Arc::default(),
        }
    }

    /// Fault injection: this client vanishes as a killed process would. Its
    /// watchdogs stop renewing, its guards' `Drop` releases nothing, and its
    /// later calls fail with [`Error::Unavailable`]. Its locks stay held until
    /// their TTL runs out. Other clients are unaffected.
    ///
    /// # Cancel safety
    ///
    /// Done at once (nothing is awaited).
    pub async fn abandon(&self) {
        self.client.abandoned.store(true, Ordering::SeqCst);
    }

    /// Keys starting with `prefix` that are held or waited on: what a
    /// namespace still holds (for operators and the conformance kit).
    pub fn keys_in_use(&self, prefix: &str) -> Vec<LockKey> {
        let mut keys: Vec<LockKey> = self
            .server
            .state()
            .keys
            .iter()
            .filter(|(k, e)| k.as_str().starts_with(prefix) && (e.holder.is_some() || !e.waiters.is_empty()))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    /// How many clients contend for `key`: the holder (0 or 1) plus waiters.
    pub fn contenders(&self, key: &LockKey) -> usize {
        self.server
            .state()
            .keys
            .get(key)
            .map_or(0, |e| usize::from(e.holder.is_some()) + e.waiters.len())
    }

    fn check_up(&self) -> Result<()> {
        if self.client.abandoned.load(Ordering::SeqCst) {
            return Err(Error::unavailable(BACKEND, "this MemLock client was abandoned"));
        }
        Ok(())
    }

    fn guard(&self, key: &LockKey, id: u64, grant: Grant, opts: AcquireOptions, ttl: Duration) -> MemGuard {
        let local_deadline = Arc::new(Mutex::new(
            grant
                .deadline
                .checked_sub(drift(ttl.min(crate::driver::FAR_FUTURE)))
                .unwrap_or(grant.deadline),
        ));
        let (trigger, signal) = grant.lost;
        let watchdog = opts.auto_extend.then(|| {
            tokio::spawn(watchdog(
                Arc::downgrade(&self.server),
                Arc::clone(&self.client),
                key.clone(),
                id,
                ttl,
                Arc::clone(&local_deadline),
                trigger.clone(),
            ))
        });
        MemGuard {
            lock: self.clone(),
            key: key.clone(),
            id,
            token: grant.token,
            lost: signal,
            _trigger: trigger,
            local_deadline,
            watchdog,
            released: false,
        }
    }
}

impl Default for MemLock {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemLock")
            .field("abandoned", &self.client.abandoned.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The client-side renewal loop of an `auto_extend` guard.
async fn watchdog(
    server: Weak<Server>,
    client: Arc<ClientState>,
    key: LockKey,
    id: u64,
    ttl: Duration,
    local_deadline: Arc<Mutex<Instant>>,
    lost: LostTrigger,
) {
    let period = ttl / 3;
    loop {
        tokio::time::sleep(period).await;
        if client.abandoned.load(Ordering::SeqCst) {
            return;
        }
        let Some(server) = server.upgrade() else {
            crate::trace::lost(BACKEND, key.as_str(), crate::trace::why::SESSION_ENDED);
            lost.fire();
            return;
        };
        let sent = Instant::now();
        match server.extend(&key, id, ttl) {
            Ok(()) => {
                let deadline = crate::driver::Drift::DEFAULT.deadline(sent, ttl);
                *local_deadline.lock().unwrap_or_else(PoisonError::into_inner) = deadline;
            }
            Err(refusal) => {
                if !lost.is_fired() {
                    crate::trace::lost(BACKEND, key.as_str(), refusal.why());
                }
                lost.fire();
                return;
            }
        }
    }
}

impl Lock for MemLock {
    type Guard = MemGuard;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, true, Waiting::Notified, MEM_MIN_TTL)
    }

    /// See [`Lock::acquire`]. Waiters are granted in FIFO order.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the wait runs out; [`Error::Unavailable`]
    /// after [`MemLock::abandon`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call removes its waiter at once, or releases the
    /// grant if the hand-off reached it in the meantime.
    async fn acquire(&self, key: &LockKey, opts: AcquireOptions) -> Result<MemGuard> {
        crate::trace::acquire(BACKEND, key, &opts, self.acquire_untraced(key, opts)).await
    }
}

impl MemLock {
    async fn acquire_untraced(&self, key: &LockKey, opts: AcquireOptions) -> Result<MemGuard> {
        self.check_up()?;
        let started = Instant::now();
        let ttl = opts.ttl.max(MEM_MIN_TTL);
        let timeout = || Error::Timeout {
            key: key.as_str().to_owned(),
        };
        let (id, rx) = {
            let mut st = self.server.state();
            self.server.reap_if_due(&mut st, key);
            st.last_id += 1;
            let id = st.last_id;
            let free = st.keys.get(key).is_none_or(|e| e.holder.is_none());
            if free {
                let grant = self.server.grant(&mut st, key, id, ttl);
                drop(st);
                self.server.expire_in_background(key, id);
                return Ok(self.guard(key, id, grant, opts, ttl));
            }
            if opts.wait == Wait::No {
                return Err(timeout());
            }
            crate::trace::queued();
            let (tx, rx) = oneshot::channel();
            st.keys
                .entry(key.clone())
                .or_default()
                .waiters
                .push_back(Waiter { id, ttl, grant: tx });
            (id, rx)
        };
        // The waiter goes if this call ends without its grant (a timeout,
        // a dropped future).
        let registration = crate::driver::OnDrop::new((), |()| self.server.withdraw(key, id));
        let grant = match opts.wait {
            Wait::For(d) => {
                match tokio::time::timeout_at(crate::driver::saturating_add(started, d).into(), rx).await {
                    Ok(grant) => grant,
                    Err(_) => return Err(timeout()),
                }
            }
            Wait::Forever | Wait::No => rx.await,
        };
        let grant = grant.map_err(|_| Error::backend(BACKEND, "the waiter's hand-off channel closed"))?;
        registration.disarm();
        self.server.expire_in_background(key, id);
        Ok(self.guard(key, id, grant, opts, ttl))
    }
}

/// The guard of a [`MemLock`] grant. Dropping it releases the lock at once
/// (unless its client was [abandoned](MemLock::abandon)).
#[must_use = "dropping the guard releases the lock"]
pub struct MemGuard {
    lock: MemLock,
    key: LockKey,
    id: u64,
    token: FencingToken,
    lost: LostSignal,
    /// Keeps the signal pending until the guard is gone; the watchdog and the
    /// backend hold clones to fire it.
    _trigger: LostTrigger,
    local_deadline: Arc<Mutex<Instant>>,
    watchdog: Option<JoinHandle<()>>,
    released: bool,
}

impl std::fmt::Debug for MemGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemGuard")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("held", &self.is_held())
            .finish()
    }
}

impl MemGuard {
    fn stop_watchdog(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
    }
}

impl Guard for MemGuard {
    fn key(&self) -> &LockKey {
        &self.key
    }

    fn token(&self) -> Option<FencingToken> {
        Some(self.token)
    }

    fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    fn is_held(&self) -> bool {
        !self.lost.is_lost()
            && !self.lock.client.abandoned.load(Ordering::SeqCst)
            && Instant::now() < *self.local_deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// See [`Guard::extend`].
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the lock expired, [`Error::NotHeld`] if another
    /// client holds it now, [`Error::Unavailable`] after [`MemLock::abandon`].
    ///
    /// # Cancel safety
    ///
    /// The future completes on its first poll; there is nothing to cancel.
    async fn extend(&self, ttl: Duration) -> Result<()> {
        self.lock.check_up()?;
        let ttl = ttl.max(MEM_MIN_TTL);
        let sent = Instant::now();
        self.lock
            .server
            .extend(&self.key, self.id, ttl)
            .map_err(|r| r.into_error(&self.key))?;
        let deadline = crate::driver::Drift::DEFAULT.deadline(sent, ttl);
        *self.local_deadline.lock().unwrap_or_else(PoisonError::into_inner) = deadline;
        Ok(())
    }

    /// See [`Guard::release`].
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] if the lock expired, [`Error::NotHeld`] if another
    /// client holds it now, [`Error::Unavailable`] after [`MemLock::abandon`].
    ///
    /// # Cancel safety
    ///
    /// The future completes on its first poll; there is nothing to cancel.
    async fn release(mut self) -> Result<()> {
        self.stop_watchdog();
        self.lock.check_up()?;
        self.released = true;
        let released = self
            .lock
            .server
            .release(&self.key, self.id)
            .map_err(|r| r.into_error(&self.key));
        crate::trace::release_result(BACKEND, &self.key, Some(self.token), released)
    }
}

impl Drop for MemGuard {
    fn drop(&mut self) {
        self.stop_watchdog();
        if !self.released && !self.lock.client.abandoned.load(Ordering::SeqCst) {
            let _ = self.lock.server.release(&self.key, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> LockKey {
        LockKey::new(name).unwrap()
    }

    #[tokio::test]
    async fn expiry_fires_lost_and_hands_over() {
        let lock = MemLock::new();
        let k = key("k");
        let opts = AcquireOptions::default()
            .ttl(Duration::from_millis(50))
            .auto_extend(false);
        let g = lock.acquire(&k, opts).await.unwrap();
        let waiter = lock.client();
        let g2 = tokio::time::timeout(
            Duration::from_secs(5),
            waiter.acquire(&k, opts.ttl(Duration::from_secs(30))),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(g.lost().is_lost());
        assert!(!g.is_held());
        assert!(g2.token() > g.token());
        assert!(g.release().await.unwrap_err().is_not_held());
        g2.release().await.unwrap();
        assert!(lock.keys_in_use("").is_empty());
    }

    #[tokio::test]
    async fn dropped_waiter_leaves_nothing() {
        let lock = MemLock::new();
        let k = key("k");
        let g = lock.acquire(&k, AcquireOptions::default()).await.unwrap();
        let other = lock.client();
        let r = tokio::time::timeout(
            Duration::from_millis(20),
            other.acquire(&k, AcquireOptions::default()),
        )
        .await;
        assert!(r.is_err());
        assert_eq!(lock.contenders(&k), 1);
        drop(g);
        assert_eq!(lock.contenders(&k), 0);
        assert!(lock.keys_in_use("").is_empty());
    }

    #[tokio::test]
    async fn an_abandoned_client_keeps_the_lock_until_ttl() {
        let lock = MemLock::new();
        let k = key("k");
        let opts = AcquireOptions::default().ttl(Duration::from_millis(60));
        let g = lock.acquire(&k, opts).await.unwrap();
        lock.abandon().await;
        drop(g);
        let other = lock.client();
        assert!(other.try_acquire(&k, opts).await.unwrap().is_none());
        let g2 = tokio::time::timeout(Duration::from_secs(5), other.acquire(&k, opts))
            .await
            .unwrap()
            .unwrap();
        g2.release().await.unwrap();
        assert!(lock.acquire(&k, opts).await.unwrap_err().matches_unavailable());
    }

    trait IsUnavailable {
        fn matches_unavailable(&self) -> bool;
    }
    impl IsUnavailable for Error {
        fn matches_unavailable(&self) -> bool {
            matches!(self, Error::Unavailable { .. })
        }
    }
}
