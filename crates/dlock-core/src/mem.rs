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
//! - each guard's local deadline and renewals are kept by the drivers'
//!   one renewal engine ([`Keeper`](crate::driver::Keeper), one per
//!   client): `auto_extend` renews at `ttl / 3`, and `lost()` fires at the
//!   local deadline if the backend has not expired the grant first;
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

use crate::driver::{Drift, Keeper, Kept, Refusal, Validity};
use crate::{
    AcquireOptions, Capabilities, Error, Fencing, FencingToken, Guard, Lock, LockKey, LostSignal, Result,
    Wait, Waiting,
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
    /// Keeps every guard of this client: deadlines, renewals.
    keeper: Keeper,
}

#[derive(Default)]
struct Server {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    keys: HashMap<Name, Entry>,
    last_token: u64,
    last_id: u64,
}

/// What a name is used as: mutexes, read-write locks and semaphores of the
/// same name are separate (as the layouts of the network backends are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Mutex,
    ReadWrite,
    Semaphore,
}

type Name = (Kind, LockKey);

/// What a grant takes of its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Share {
    /// A mutex grant, or a read-write lock's write grant.
    Exclusive,
    /// A read grant.
    Shared,
    /// `count` of a semaphore's `limit` permits.
    Permits { count: u32, limit: u32 },
}

#[derive(Default)]
struct Entry {
    holders: Vec<Member>,
    waiters: VecDeque<Waiter>,
}

impl Entry {
    /// Whether `claim` can be granted next to the current holders.
    fn fits(&self, claim: Share) -> bool {
        match claim {
            Share::Exclusive => self.holders.is_empty(),
            Share::Shared => self.holders.iter().all(|h| h.claim == Share::Shared),
            Share::Permits { count, limit } => {
                let taken: u64 = self
                    .holders
                    .iter()
                    .map(|h| match h.claim {
                        Share::Permits { count, .. } => u64::from(count),
                        _ => u64::from(limit),
                    })
                    .sum();
                taken + u64::from(count) <= u64::from(limit)
            }
        }
    }

    fn holder(&self, id: u64) -> Option<&Member> {
        self.holders.iter().find(|h| h.id == id)
    }
}

/// A holder of a name.
struct Member {
    id: u64,
    token: FencingToken,
    deadline: Instant,
    /// The holder's validity: the backend's expiry fires its `lost()`.
    validity: Arc<Validity>,
    claim: Share,
}

struct Waiter {
    id: u64,
    ttl: Duration,
    claim: Share,
    grant: oneshot::Sender<Grant>,
}

struct Grant {
    token: FencingToken,
    validity: Arc<Validity>,
    lost: LostSignal,
}

impl Server {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave `State` half-updated in a
        // way that breaks exclusion (every update is a single assignment), so
        // keep going rather than poisoning every later call.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the expiry timer of `id`'s grant of `name`. Called by the
    /// acquire that receives the grant (always inside a runtime), not where
    /// the grant is made: a hand-off may happen in a guard's drop, outside
    /// one. Until it runs, any call on the name expires an overdue holder
    /// itself (`reap_if_due`).
    fn expire_in_background(self: &Arc<Self>, name: &Name, id: u64) {
        drop(tokio::spawn(expire_when_due(
            Arc::downgrade(self),
            name.clone(),
            id,
        )));
    }

    /// Makes `id` a holder of `name` (its acquire starts the expiry timer).
    /// Every grant takes the next token, whatever its claim.
    fn grant(self: &Arc<Self>, st: &mut State, name: &Name, id: u64, ttl: Duration, claim: Share) -> Grant {
        st.last_token += 1;
        let token = FencingToken::new(st.last_token);
        let now = Instant::now();
        let deadline = crate::driver::saturating_add(now, ttl);
        let (validity, lost) = Validity::of_key(BACKEND, &name.1, now, ttl, Drift::NONE);
        st.keys.entry(name.clone()).or_default().holders.push(Member {
            id,
            token,
            deadline,
            validity: Arc::clone(&validity),
            claim,
        });
        Grant {
            token,
            validity,
            lost,
        }
    }

    /// Takes `id` out of `name`'s holders.
    fn free(self: &Arc<Self>, st: &mut State, name: &Name, id: u64) {
        if let Some(entry) = st.keys.get_mut(name) {
            entry.holders.retain(|h| h.id != id);
        }
        self.admit(st, name);
    }

    /// Grants `name` to the waiters at the front of its queue while they
    /// fit (FIFO: a waiter that does not fit holds back those behind it, so
    /// a waiting writer is not starved by later readers). Removes the entry
    /// when nobody is left.
    fn admit(self: &Arc<Self>, st: &mut State, name: &Name) {
        loop {
            let Some(entry) = st.keys.get_mut(name) else {
                return;
            };
            let fits = entry.waiters.front().is_some_and(|w| entry.fits(w.claim));
            if !fits {
                if entry.holders.is_empty() && entry.waiters.is_empty() {
                    st.keys.remove(name);
                }
                return;
            }
            let Some(waiter) = entry.waiters.pop_front() else {
                return;
            };
            let grant = self.grant(st, name, waiter.id, waiter.ttl, waiter.claim);
            if waiter.grant.send(grant).is_err() {
                // That waiter's future is gone: undo its grant.
                if let Some(entry) = st.keys.get_mut(name) {
                    entry.holders.retain(|h| h.id != waiter.id);
                }
            }
        }
    }

    /// Expires the holders of `name` whose deadline has passed (the timer
    /// task may lag behind a caller that checks first).
    fn reap_if_due(self: &Arc<Self>, st: &mut State, name: &Name) {
        let now = Instant::now();
        let Some(entry) = st.keys.get_mut(name) else {
            return;
        };
        if !entry.holders.iter().any(|h| h.deadline <= now) {
            return;
        }
        entry.holders.retain(|h| {
            if h.deadline > now {
                return true;
            }
            h.validity.lose(crate::trace::why::EXPIRED);
            false
        });
        self.admit(st, name);
    }

    /// Checks that `id` holds `name` right now.
    fn check_holder(
        self: &Arc<Self>,
        st: &mut State,
        name: &Name,
        id: u64,
    ) -> std::result::Result<(), Refusal> {
        self.reap_if_due(st, name);
        let Some(entry) = st.keys.get(name) else {
            return Err(Refusal::Expired);
        };
        if entry.holder(id).is_some() {
            Ok(())
        } else if entry.holders.iter().any(|h| h.claim == Share::Exclusive) {
            Err(Refusal::HeldByOther)
        } else {
            Err(Refusal::Expired)
        }
    }

    fn release(self: &Arc<Self>, name: &Name, id: u64) -> std::result::Result<(), Refusal> {
        let mut st = self.state();
        self.check_holder(&mut st, name, id)?;
        self.free(&mut st, name, id);
        Ok(())
    }

    fn extend(
        self: &Arc<Self>,
        name: &Name,
        id: u64,
        now: Instant,
        ttl: Duration,
    ) -> std::result::Result<(), Refusal> {
        let mut st = self.state();
        self.check_holder(&mut st, name, id)?;
        let mut earlier = false;
        if let Some(h) = st
            .keys
            .get_mut(name)
            .and_then(|e| e.holders.iter_mut().find(|h| h.id == id))
        {
            let deadline = crate::driver::saturating_add(now, ttl);
            earlier = deadline < h.deadline;
            h.deadline = deadline;
        }
        drop(st);
        if earlier {
            // The expiry timer sleeps until the old deadline: one for the new.
            self.expire_in_background(name, id);
        }
        Ok(())
    }

    /// Removes waiter `id` of `name`, or gives the grant back if the
    /// hand-off reached `id` after its `acquire` was dropped.
    fn withdraw(self: &Arc<Self>, name: &Name, id: u64) {
        let mut st = self.state();
        let Some(entry) = st.keys.get_mut(name) else {
            return;
        };
        if entry.holder(id).is_some() {
            self.free(&mut st, name, id);
        } else {
            entry.waiters.retain(|w| w.id != id);
            // The waiter may have held back others that fit now.
            self.admit(&mut st, name);
        }
    }
}

/// The backend's expiry timer for one grant: sleeps until the holder's
/// deadline (following extensions), then expires it.
async fn expire_when_due(server: Weak<Server>, name: Name, id: u64) {
    loop {
        let deadline = {
            let Some(server) = server.upgrade() else { return };
            let st = server.state();
            match st.keys.get(&name).and_then(|e| e.holder(id)) {
                Some(h) => h.deadline,
                None => return,
            }
        };
        tokio::time::sleep_until(deadline.into()).await;
        let Some(server) = server.upgrade() else { return };
        let mut st = server.state();
        if st.keys.get(&name).and_then(|e| e.holder(id)).is_none() {
            return;
        }
        server.reap_if_due(&mut st, &name);
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

    /// How many clients contend for `key` as a mutex, a read-write lock
    /// or a semaphore: its holders plus its waiters.
    pub fn contenders(&self, key: &LockKey) -> usize {
        self.server
            .state()
            .keys
            .iter()
            .filter(|((_, k), _)| k == key)
            .map(|(_, e)| e.holders.len() + e.waiters.len())
            .sum()
    }

    fn check_up(&self) -> Result<()> {
        if self.client.abandoned.load(Ordering::SeqCst) {
            return Err(Error::unavailable(BACKEND, "this MemLock client was abandoned"));
        }
        Ok(())
    }

    fn guard(&self, name: &Name, id: u64, grant: Grant, opts: AcquireOptions, ttl: Duration) -> MemGuard {
        let (server, renewed, client) = (
            Arc::downgrade(&self.server),
            name.clone(),
            // Weakly: the keeper's slot must not keep the client (and the
            // keeper in it) alive once the client and its guards are gone.
            Arc::downgrade(&self.client),
        );
        let kept = self.client.keeper.keep(
            Arc::clone(&grant.validity),
            ttl,
            opts.auto_extend,
            Instant::now(),
            Box::new(move || {
                // The backend gone, so is every grant it made.
                let outcome = match server.upgrade() {
                    Some(server) => server.extend(&renewed, id, Instant::now(), ttl),
                    None => Err(Refusal::Expired),
                };
                Box::pin(std::future::ready(Ok(outcome)))
            }),
            move || {
                client
                    .upgrade()
                    .is_none_or(|c| c.abandoned.load(Ordering::SeqCst))
            },
        );
        MemGuard {
            lock: self.clone(),
            name: name.clone(),
            id,
            token: grant.token,
            lost: grant.lost,
            validity: grant.validity,
            kept,
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

impl Lock for MemLock {
    type Guard = MemGuard;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, true, Waiting::Notified, MEM_MIN_TTL)
            .with_read_write()
            .with_semaphores()
            .with_holders()
    }

    /// See [`Lock::abandon`].
    /// Fault injection: this client vanishes as a killed process would. Its
    /// watchdogs stop renewing, its guards' `Drop` releases nothing, and its
    /// later calls fail with [`Error::Unavailable`]. Its locks stay held until
    /// their TTL runs out. Other clients are unaffected.
    ///
    /// # Cancel safety
    ///
    /// Done at once (nothing is awaited).
    async fn abandon(&self) {
        self.client.abandoned.store(true, Ordering::SeqCst);
    }

    /// See [`Lock::keys_in_use`]: the names with a holder or a waiter.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] after [`MemLock::abandon`].
    ///
    /// # Cancel safety
    ///
    /// Done at once (nothing is awaited).
    async fn keys_in_use(&self, prefix: &str) -> Result<Vec<String>> {
        self.check_up()?;
        Ok(crate::driver::names(
            self.server
                .state()
                .keys
                .iter()
                .filter(|((_, k), e)| {
                    k.as_str().starts_with(prefix) && (!e.holders.is_empty() || !e.waiters.is_empty())
                })
                .map(|((_, k), _)| k.as_str()),
        ))
    }

    /// See [`Lock::holders`]: the live holders of the name's mutex, then
    /// its read-write lock, then its semaphore, each with its token and
    /// remaining TTL (`id` is `mem:` and the grant's number).
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] after [`MemLock::abandon`].
    ///
    /// # Cancel safety
    ///
    /// Done at once (nothing is awaited).
    async fn holders(&self, key: &LockKey) -> Result<Vec<crate::Holder>> {
        self.check_up()?;
        let now = Instant::now();
        let st = self.server.state();
        let mut all = Vec::new();
        for kind in [Kind::Mutex, Kind::ReadWrite, Kind::Semaphore] {
            let Some(entry) = st.keys.get(&(kind, key.clone())) else {
                continue;
            };
            for m in entry.holders.iter().filter(|m| m.deadline > now) {
                let role = match (kind, m.claim) {
                    (_, Share::Permits { count, .. }) => crate::Role::Permits(count),
                    (Kind::ReadWrite, Share::Shared) => crate::Role::Read,
                    (Kind::ReadWrite, _) => crate::Role::Write,
                    _ => crate::Role::Mutex,
                };
                all.push(crate::Holder {
                    role,
                    id: format!("mem:{}", m.id),
                    detail: String::new(),
                    token: Some(m.token.get()),
                    remaining: Some(m.deadline.saturating_duration_since(now)),
                    since: None,
                });
            }
        }
        Ok(all)
    }

    /// See [`Lock::grant`]: FIFO for every claim; mutexes, read-write
    /// locks and semaphores of one name are apart.
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
    async fn grant(&self, key: &LockKey, claim: crate::Claim, opts: AcquireOptions) -> Result<MemGuard> {
        let (kind, share) = match claim {
            crate::Claim::Mutex => (Kind::Mutex, Share::Exclusive),
            crate::Claim::Read => (Kind::ReadWrite, Share::Shared),
            crate::Claim::Write => (Kind::ReadWrite, Share::Exclusive),
            crate::Claim::Permits { count, limit } => (Kind::Semaphore, Share::Permits { count, limit }),
        };
        self.take(kind, share, key, opts).await
    }
}

impl MemLock {
    /// Takes `claim` of `key` as a `kind`: at once if it fits and nobody
    /// waits, otherwise in FIFO order by hand-off.
    async fn take(&self, kind: Kind, claim: Share, key: &LockKey, opts: AcquireOptions) -> Result<MemGuard> {
        self.check_up()?;
        let started = Instant::now();
        let ttl = opts.ttl.max(MEM_MIN_TTL);
        let timeout = || Error::Timeout {
            key: key.as_str().to_owned(),
        };
        let name: Name = (kind, key.clone());
        let (id, rx) = {
            let mut st = self.server.state();
            self.server.reap_if_due(&mut st, &name);
            st.last_id += 1;
            let id = st.last_id;
            let now = st
                .keys
                .get(&name)
                .is_none_or(|e| e.waiters.is_empty() && e.fits(claim));
            if now {
                let grant = self.server.grant(&mut st, &name, id, ttl, claim);
                drop(st);
                self.server.expire_in_background(&name, id);
                return Ok(self.guard(&name, id, grant, opts, ttl));
            }
            if opts.wait == Wait::No {
                return Err(timeout());
            }
            crate::trace::queued();
            let (tx, rx) = oneshot::channel();
            st.keys
                .entry(name.clone())
                .or_default()
                .waiters
                .push_back(Waiter {
                    id,
                    ttl,
                    claim,
                    grant: tx,
                });
            (id, rx)
        };
        // The waiter goes if this call ends without its grant (a timeout,
        // a dropped future).
        let registration = crate::driver::OnDrop::new((), |()| self.server.withdraw(&name, id));
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
        self.server.expire_in_background(&name, id);
        Ok(self.guard(&name, id, grant, opts, ttl))
    }
}

/// The guard of a [`MemLock`] grant. Dropping it releases the lock at once
/// (unless its client was [abandoned](MemLock::abandon)).
#[must_use = "dropping the guard releases the lock"]
pub struct MemGuard {
    lock: MemLock,
    name: Name,
    id: u64,
    token: FencingToken,
    lost: LostSignal,
    /// Its local deadline and lost trigger (the backend's holder entry
    /// shares it, to fire it on expiry).
    validity: Arc<Validity>,
    /// Its slot in the client's keeper.
    kept: Kept,
    released: bool,
}

impl std::fmt::Debug for MemGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemGuard")
            .field("key", &self.name.1)
            .field("token", &self.token)
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard for MemGuard {
    fn key(&self) -> &LockKey {
        &self.name.1
    }

    fn token(&self) -> Option<FencingToken> {
        Some(self.token)
    }

    fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    fn is_held(&self) -> bool {
        !self.lost.is_lost() && !self.lock.client.abandoned.load(Ordering::SeqCst) && self.validity.is_valid()
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
    /// Cancel safe: it waits only for a renewal in flight (the keeper's),
    /// and the local deadline moves only with the backend's.
    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::driver::check_ttl(BACKEND, ttl)?;
        self.lock.check_up()?;
        let ttl = ttl.max(MEM_MIN_TTL);
        let _permit = self.validity.renewal().await;
        let sent = Instant::now();
        match self.lock.server.extend(&self.name, self.id, sent, ttl) {
            Ok(()) => {
                self.validity.renewed(sent, ttl);
                self.kept.moved();
                Ok(())
            }
            Err(refusal) => {
                self.validity.lose(refusal.why());
                Err(refusal.into_error(&self.name.1))
            }
        }
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
        self.kept.stop();
        self.lock.check_up()?;
        self.released = true;
        let released = self
            .lock
            .server
            .release(&self.name, self.id)
            .map_err(|r| r.into_error(&self.name.1));
        crate::trace::release_result(BACKEND, &self.name.1, Some(self.token), released)
    }
}

impl Drop for MemGuard {
    fn drop(&mut self) {
        self.kept.stop();
        // The keeper lets go of its slot whenever it looks next: the
        // signal fires now, not with the slot's last reference.
        self.validity.fire_lost();
        if !self.released && !self.lock.client.abandoned.load(Ordering::SeqCst) {
            let _ = self.lock.server.release(&self.name, self.id);
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
        assert!(lock.keys_in_use("").await.unwrap().is_empty());
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
        assert!(lock.keys_in_use("").await.unwrap().is_empty());
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
