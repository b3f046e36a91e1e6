//! Deliberately broken drivers: the kit proves it can fail.
//!
//! [`NaiveLock`] is a small polled in-process lock that, with
//! [`Flaw::None`], keeps the contract (the kit's own tests run every scenario
//! on it and expect a pass). Each other [`Flaw`] plants one classic bug; the
//! kit's tests assert that at least one scenario catches each. Because the
//! flawless `NaiveLock` passes, every failure is due to the flaw alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::{
    AcquireOptions, Capabilities, Error, Fencing, FencingToken, Guard, Lock, LockKey, LostSignal,
    LostTrigger, Result, Wait, Waiting, drift,
};
use tokio::task::JoinHandle;

use crate::LockFactory;

const BACKEND: &str = "naive";
const POLL: Duration = Duration::from_millis(5);

/// One planted bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// No bug: keeps the contract.
    None,
    /// Grants every acquire, held or not.
    GrantsToEveryone,
    /// Every grant carries the same token.
    ReusesTokens,
    /// Ignores the TTL: a lock lives until released.
    NeverExpires,
    /// Release deletes whatever holds the key (a plain `DEL`), not only its own.
    ReleaseDeletesAnyHolder,
    /// Extend re-creates an expired lock instead of refusing.
    ExtendResurrects,
    /// `lost()` never fires.
    LostNeverFires,
    /// A waiting acquire keeps trying in the background after it is dropped
    /// and then holds the lock nobody will release.
    CancelLeavesHeld,
}

impl Flaw {
    /// Every flaw but [`Flaw::None`].
    pub const BROKEN: [Flaw; 7] = [
        Flaw::GrantsToEveryone,
        Flaw::ReusesTokens,
        Flaw::NeverExpires,
        Flaw::ReleaseDeletesAnyHolder,
        Flaw::ExtendResurrects,
        Flaw::LostNeverFires,
        Flaw::CancelLeavesHeld,
    ];
}

#[derive(Default)]
struct Table {
    entries: HashMap<LockKey, Entry>,
    last_token: u64,
    last_owner: u64,
}

#[derive(Clone, Copy)]
struct Entry {
    owner: u64,
    deadline: Instant,
}

impl Table {
    fn live(&mut self, key: &LockKey) -> Option<Entry> {
        let now = Instant::now();
        self.entries.retain(|_, e| e.deadline > now);
        self.entries.get(key).copied()
    }
}

/// A polled in-process lock with an optional planted [`Flaw`]. Clones are the
/// same client; [`NaiveLock::client`] makes another.
#[derive(Clone)]
pub struct NaiveLock {
    table: Arc<Mutex<Table>>,
    crashed: Arc<AtomicBool>,
    flaw: Flaw,
}

impl NaiveLock {
    /// A new backend and its first client, with `flaw` planted.
    pub fn new(flaw: Flaw) -> Self {
        NaiveLock {
            table: Arc::default(),
            crashed: Arc::default(),
            flaw,
        }
    }

    /// Another independent client of the same backend.
    pub fn client(&self) -> Self {
        NaiveLock {
            table: Arc::clone(&self.table),
            crashed: Arc::default(),
            flaw: self.flaw,
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_up(&self) -> Result<()> {
        if self.crashed.load(Ordering::SeqCst) {
            return Err(Error::unavailable(BACKEND, "client crashed"));
        }
        Ok(())
    }

    /// One attempt: the owner id and token if granted.
    fn try_once(&self, key: &LockKey, ttl: Duration) -> Option<(u64, FencingToken, Instant)> {
        let mut t = self.table();
        if t.live(key).is_some() && self.flaw != Flaw::GrantsToEveryone {
            return None;
        }
        t.last_owner += 1;
        t.last_token += 1;
        let token = if self.flaw == Flaw::ReusesTokens {
            1
        } else {
            t.last_token
        };
        let ttl = if self.flaw == Flaw::NeverExpires {
            Duration::from_secs(3600)
        } else {
            ttl
        };
        let owner = t.last_owner;
        let deadline = dlock_core::driver::saturating_add(Instant::now(), ttl);
        t.entries.insert(key.clone(), Entry { owner, deadline });
        Some((owner, FencingToken::new(token), deadline))
    }

    fn refusal(&self, key: &LockKey, entry: Option<Entry>) -> Error {
        let key = key.as_str().to_owned();
        match entry {
            Some(_) => Error::NotHeld { key },
            None => Error::Lost { key },
        }
    }

    fn release_owner(&self, key: &LockKey, owner: u64) -> Result<()> {
        let mut t = self.table();
        let entry = t.live(key);
        if self.flaw == Flaw::ReleaseDeletesAnyHolder && entry.is_some() {
            t.entries.remove(key);
            return Ok(());
        }
        match entry {
            Some(e) if e.owner == owner => {
                t.entries.remove(key);
                Ok(())
            }
            other => Err(self.refusal(key, other)),
        }
    }

    fn extend_owner(&self, key: &LockKey, owner: u64, ttl: Duration) -> Result<Instant> {
        let mut t = self.table();
        let entry = t.live(key);
        let deadline = dlock_core::driver::saturating_add(Instant::now(), ttl);
        match entry {
            Some(e) if e.owner == owner => {
                t.entries.insert(key.clone(), Entry { owner, deadline });
                Ok(deadline)
            }
            None if self.flaw == Flaw::ExtendResurrects => {
                t.entries.insert(key.clone(), Entry { owner, deadline });
                Ok(deadline)
            }
            other => Err(self.refusal(key, other)),
        }
    }

    fn owns(&self, key: &LockKey, owner: u64) -> bool {
        self.table().live(key).is_some_and(|e| e.owner == owner)
    }

    fn guard(
        &self,
        key: &LockKey,
        owner: u64,
        token: FencingToken,
        deadline: Instant,
        opts: AcquireOptions,
    ) -> NaiveGuard {
        let (trigger, signal) = LostSignal::pair();
        let state = Arc::new(Mutex::new(
            deadline
                .checked_sub(drift(opts.ttl.min(dlock_core::driver::FAR_FUTURE)))
                .unwrap_or(deadline),
        ));
        let monitor = tokio::spawn(monitor(
            self.clone(),
            key.clone(),
            owner,
            opts,
            Arc::clone(&state),
            trigger.clone(),
        ));
        NaiveGuard {
            lock: self.clone(),
            key: key.clone(),
            owner,
            token,
            lost: signal,
            trigger,
            local_deadline: state,
            monitor,
            released: false,
        }
    }
}

/// Renews (with auto-extend) and watches the entry; fires lost when it is gone.
async fn monitor(
    lock: NaiveLock,
    key: LockKey,
    owner: u64,
    opts: AcquireOptions,
    local_deadline: Arc<Mutex<Instant>>,
    lost: LostTrigger,
) {
    let fire = |lost: &LostTrigger| {
        if lock.flaw != Flaw::LostNeverFires {
            lost.fire();
        }
    };
    loop {
        tokio::time::sleep((opts.ttl / 3).min(POLL * 4)).await;
        if lock.crashed.load(Ordering::SeqCst) {
            return;
        }
        let deadline = *local_deadline.lock().unwrap_or_else(PoisonError::into_inner);
        let renew_due = opts.auto_extend
            && dlock_core::driver::saturating_add(Instant::now(), opts.ttl * 2 / 3) >= deadline;
        if renew_due {
            let sent = Instant::now();
            match lock.extend_owner(&key, owner, opts.ttl) {
                Ok(_) => {
                    let d = dlock_core::driver::Drift::DEFAULT.deadline(sent, opts.ttl);
                    *local_deadline.lock().unwrap_or_else(PoisonError::into_inner) = d;
                }
                Err(_) => return fire(&lost),
            }
        }
        if !lock.owns(&key, owner) {
            return fire(&lost);
        }
    }
}

impl Lock for NaiveLock {
    type Guard = NaiveGuard;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, false, Waiting::Polled, Duration::from_millis(1))
    }

    async fn acquire(&self, key: &LockKey, opts: AcquireOptions) -> Result<NaiveGuard> {
        self.check_up()?;
        let started = Instant::now();
        if let Some((owner, token, deadline)) = self.try_once(key, opts.ttl) {
            return Ok(self.guard(key, owner, token, deadline, opts));
        }
        let deadline = match opts.wait {
            Wait::No => None,
            Wait::For(d) => Some(dlock_core::driver::saturating_add(started, d)),
            Wait::Forever => Some(started + Duration::from_secs(86_400)),
        };
        let Some(deadline) = deadline else {
            return Err(Error::Timeout {
                key: key.as_str().to_owned(),
            });
        };
        if self.flaw == Flaw::CancelLeavesHeld {
            // The bug: the polling runs in a detached task that outlives us.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (me, k) = (self.clone(), key.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    if let Some(grant) = me.try_once(&k, opts.ttl) {
                        let _ = tx.send(grant);
                        return;
                    }
                    tokio::time::sleep(POLL).await;
                }
            });
            return match rx.await {
                Ok((owner, token, d)) => Ok(self.guard(key, owner, token, d, opts)),
                Err(_) => Err(Error::Timeout {
                    key: key.as_str().to_owned(),
                }),
            };
        }
        loop {
            if let Some((owner, token, d)) = self.try_once(key, opts.ttl) {
                return Ok(self.guard(key, owner, token, d, opts));
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    key: key.as_str().to_owned(),
                });
            }
            tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }
}

/// The guard of a [`NaiveLock`].
#[must_use = "dropping the guard releases the lock"]
pub struct NaiveGuard {
    lock: NaiveLock,
    key: LockKey,
    owner: u64,
    token: FencingToken,
    lost: LostSignal,
    trigger: LostTrigger,
    local_deadline: Arc<Mutex<Instant>>,
    monitor: JoinHandle<()>,
    released: bool,
}

impl Guard for NaiveGuard {
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
        if self.lock.flaw == Flaw::LostNeverFires {
            return true;
        }
        !self.lost.is_lost()
            && Instant::now() < *self.local_deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }
    async fn extend(&self, ttl: Duration) -> Result<()> {
        self.lock.check_up()?;
        let sent = Instant::now();
        self.lock.extend_owner(&self.key, self.owner, ttl)?;
        let d = dlock_core::driver::Drift::DEFAULT.deadline(sent, ttl);
        *self.local_deadline.lock().unwrap_or_else(PoisonError::into_inner) = d;
        Ok(())
    }
    async fn release(mut self) -> Result<()> {
        self.monitor.abort();
        self.lock.check_up()?;
        self.released = true;
        let r = self.lock.release_owner(&self.key, self.owner);
        if self.lock.flaw != Flaw::LostNeverFires {
            self.trigger.fire();
        }
        r
    }
}

impl Drop for NaiveGuard {
    fn drop(&mut self) {
        self.monitor.abort();
        if !self.released && !self.lock.crashed.load(Ordering::SeqCst) {
            let _ = self.lock.release_owner(&self.key, self.owner);
        }
    }
}

/// The [`LockFactory`] of [`NaiveLock`] with a given flaw.
#[derive(Clone)]
pub struct NaiveFactory {
    backend: NaiveLock,
}

impl NaiveFactory {
    /// A factory over a fresh backend with `flaw` planted.
    pub fn new(flaw: Flaw) -> Self {
        NaiveFactory {
            backend: NaiveLock::new(flaw),
        }
    }
}

impl LockFactory for NaiveFactory {
    type Lock = NaiveLock;

    fn name(&self) -> String {
        format!("naive({:?})", self.backend.flaw)
    }

    async fn client(&self) -> Result<NaiveLock> {
        Ok(self.backend.client())
    }

    async fn abandon(&self, client: &NaiveLock) {
        client.crashed.store(true, Ordering::SeqCst);
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        let mut t = self.backend.table();
        let now = Instant::now();
        t.entries.retain(|_, e| e.deadline > now);
        Ok(t.entries
            .keys()
            .filter(|k| k.as_str().starts_with(namespace))
            .map(|k| k.as_str().to_owned())
            .collect())
    }
}
