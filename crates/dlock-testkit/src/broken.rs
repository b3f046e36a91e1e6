//! Deliberately broken drivers: the kit proves it can fail.
//!
//! [`NaiveLock`] is a small polled in-process lock that, with
//! [`Flaw::None`], keeps the contract (the kit's own tests run every scenario
//! on it and expect a pass). Each other [`Flaw`] plants one classic bug; the
//! kit's tests assert that at least one scenario catches each. Because the
//! flawless `NaiveLock` passes, every failure is due to the flaw alone.
//!
//! Its clients can talk over a simulated [`Link`]: each request and each
//! reply crosses it under the link's fault (delayed, lost after the request
//! timeout, reset), so the link scenarios run on it as on a network driver.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::{
    AcquireOptions, Capabilities, Error, Fencing, FencingToken, Guard, Lock, LockKey, LostSignal,
    LostTrigger, MultiGuard, Result, Wait, Waiting,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::LockFactory;
use crate::launcher::Fault;
use crate::link::{Link, Linked};

const BACKEND: &str = "naive";
const POLL: Duration = Duration::from_millis(5);
/// How long a request over a silent link waits for its reply.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(200);

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
    /// An acquire dropped after its request was granted but before the reply
    /// arrived leaves the grant on the server: nobody holds it, nobody
    /// releases it, it lives for its TTL.
    CancelInFlightLeavesHeld,
    /// A request that cannot reach the server counts as "held by someone
    /// else": `try_acquire` gives `Ok(None)`, `acquire` waits and times out.
    UnreachableLooksHeld,
    /// A release whose request or reply is lost reports `Ok(())`.
    ReleaseIgnoresLinkErrors,
    /// Failed renewals are retried without end: `lost()` fires only once the
    /// server is heard again and says the lock is gone, long after the local
    /// deadline.
    LostOnlyWhenHeard,
    /// Reports nothing of its own through `tracing` ([`dlock_core::trace`]):
    /// no `queued`, `released` or `lost` (the `acquire` span and its
    /// outcome come from the core, whatever the driver does).
    Silent,
    /// [`Lock::acquire_all`] takes the names in the order given, not in
    /// one global order: two clients asking for `{a, b}` and `{b, a}` can
    /// each hold one name and wait for the other.
    AllInGivenOrder,
    /// A read ignores a waiting writer: a stream of readers starves it.
    ReaderIgnoresWaitingWriter,
    /// A semaphore admits one permit more than its limit.
    SemaphoreOverAdmits,
    /// A write is granted while reads hold (only another write keeps it
    /// out).
    WriterIgnoresReaders,
}

impl Flaw {
    /// Every flaw but [`Flaw::None`].
    pub const BROKEN: [Flaw; 16] = [
        Flaw::GrantsToEveryone,
        Flaw::ReusesTokens,
        Flaw::NeverExpires,
        Flaw::ReleaseDeletesAnyHolder,
        Flaw::ExtendResurrects,
        Flaw::LostNeverFires,
        Flaw::CancelLeavesHeld,
        Flaw::CancelInFlightLeavesHeld,
        Flaw::UnreachableLooksHeld,
        Flaw::ReleaseIgnoresLinkErrors,
        Flaw::LostOnlyWhenHeard,
        Flaw::Silent,
        Flaw::AllInGivenOrder,
        Flaw::ReaderIgnoresWaitingWriter,
        Flaw::SemaphoreOverAdmits,
        Flaw::WriterIgnoresReaders,
    ];
}

#[derive(Default)]
struct Table {
    entries: HashMap<LockKey, Entry>,
    /// Read-write locks (`false`) and semaphores (`true`) by name.
    family: HashMap<(bool, LockKey), Family>,
    last_token: u64,
    last_owner: u64,
}

#[derive(Clone, Copy)]
struct Entry {
    owner: u64,
    deadline: Instant,
}

/// What a read-write or semaphore grant takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Share {
    Read,
    Write,
    Permits { count: u32, limit: u32 },
}

/// The holders of one read-write lock or semaphore.
#[derive(Default)]
struct Family {
    holders: Vec<Member>,
    /// A writer waits (refreshed by its polls): readers keep out.
    writer_waits_until: Option<Instant>,
}

#[derive(Clone, Copy)]
struct Member {
    owner: u64,
    deadline: Instant,
    claim: Share,
}

/// How long a waiting writer's mark outlives its last poll.
const WRITER_MARK: Duration = Duration::from_millis(200);

impl Table {
    /// The live member `owner` of any family named `key`.
    fn member(&mut self, key: &LockKey, owner: u64) -> Option<&mut Member> {
        let now = Instant::now();
        self.family
            .iter_mut()
            .filter(|((_, k), _)| k == key)
            .flat_map(|(_, f)| f.holders.iter_mut())
            .find(|m| m.owner == owner && m.deadline > now)
    }

    fn forget_member(&mut self, key: &LockKey, owner: u64) {
        for ((_, k), f) in &mut self.family {
            if k == key {
                f.holders.retain(|m| m.owner != owner);
            }
        }
        let now = Instant::now();
        self.family.retain(|_, f| {
            f.holders.retain(|m| m.deadline > now);
            !f.holders.is_empty() || f.writer_waits_until.is_some_and(|u| u > now)
        });
    }

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
    /// The simulated link every request and reply crosses, if any.
    link: Option<watch::Receiver<Fault>>,
    /// A client of a backend that is not there: every request is refused.
    nowhere: bool,
}

impl NaiveLock {
    /// A new backend and its first client, with `flaw` planted.
    pub fn new(flaw: Flaw) -> Self {
        NaiveLock {
            table: Arc::default(),
            crashed: Arc::default(),
            flaw,
            link: None,
            nowhere: false,
        }
    }

    /// Another independent client of the same backend.
    pub fn client(&self) -> Self {
        NaiveLock {
            table: Arc::clone(&self.table),
            crashed: Arc::default(),
            flaw: self.flaw,
            link: None,
            nowhere: false,
        }
    }

    /// Another independent client whose requests and replies cross `link`.
    pub fn client_over(&self, link: &Link) -> Self {
        NaiveLock {
            link: Some(link.watch()),
            ..self.client()
        }
    }

    /// Another client, of a backend that is not there.
    pub fn client_of_nowhere(&self) -> Self {
        NaiveLock {
            nowhere: true,
            ..self.client()
        }
    }

    /// One crossing of the link (a request, or its reply) under its fault.
    async fn cross(&self) -> Result<()> {
        self.check_up()?;
        if self.nowhere {
            return Err(Error::unavailable(BACKEND, "connection refused"));
        }
        let Some(mut link) = self.link.clone() else {
            return Ok(());
        };
        loop {
            let fault = *link.borrow_and_update();
            match fault {
                Fault::None => return Ok(()),
                Fault::Delay(d) => {
                    tokio::time::sleep(d).await;
                    // As the proxy does: what was on its way when the link
                    // went silent or was reset is lost.
                    let now = *link.borrow();
                    return match now {
                        Fault::Blackhole => {
                            tokio::time::sleep(REQUEST_TIMEOUT).await;
                            Err(Error::unavailable(BACKEND, "no reply within the request timeout"))
                        }
                        Fault::Reset => Err(Error::unavailable(BACKEND, "connection reset")),
                        _ => Ok(()),
                    };
                }
                Fault::Blackhole => {
                    tokio::time::sleep(REQUEST_TIMEOUT).await;
                    return Err(Error::unavailable(BACKEND, "no reply within the request timeout"));
                }
                Fault::Reset => return Err(Error::unavailable(BACKEND, "connection reset")),
                Fault::Pause => {
                    if link.changed().await.is_err() {
                        return Err(Error::unavailable(BACKEND, "the link is gone"));
                    }
                }
            }
        }
    }

    /// One request: across the link, `op` on the server, the reply back.
    async fn call<T>(&self, op: impl FnOnce() -> T) -> Result<T> {
        self.cross().await?;
        let reply = op();
        self.cross().await?;
        Ok(reply)
    }

    /// One acquire attempt over the link. A grant whose reply does not
    /// arrive (lost, or the caller gone) is given back in the background.
    async fn attempt(
        &self,
        key: &LockKey,
        ttl: Duration,
        claim: Option<Share>,
        waiting: bool,
    ) -> Result<Option<(u64, FencingToken, Instant)>> {
        let r = async {
            self.cross().await?;
            let grant = match claim {
                None => self.try_once(key, ttl),
                Some(claim) => self.try_family(key, claim, ttl, waiting),
            };
            let give_back =
                grant
                    .filter(|_| self.flaw != Flaw::CancelInFlightLeavesHeld)
                    .map(|(owner, ..)| {
                        let (me, key) = (self.clone(), key.clone());
                        dlock_core::driver::OnDrop::new((), move |()| me.release_in_background(key, owner))
                    });
            self.cross().await?;
            if let Some(give_back) = give_back {
                give_back.disarm();
            }
            Ok(grant)
        }
        .await;
        match r {
            Err(Error::Unavailable { .. }) if self.flaw == Flaw::UnreachableLooksHeld => Ok(None),
            r => r,
        }
    }

    /// Releases `owner`'s hold on `key` over the link, retried for a few
    /// seconds (the kit's TTLs outlast that: past it, the TTL frees it).
    fn release_in_background(&self, key: LockKey, owner: u64) {
        let me = self.clone();
        dlock_core::driver::spawn_detached("naive release", async move {
            let until = Instant::now() + Duration::from_secs(5);
            while Instant::now() < until && !me.crashed.load(Ordering::SeqCst) {
                if me.call(|| me.release_owner(&key, owner)).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
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

    /// One read-write or semaphore attempt (`waiting`: the caller will
    /// poll again, so a writer marks itself waiting).
    fn try_family(
        &self,
        key: &LockKey,
        claim: Share,
        ttl: Duration,
        waiting: bool,
    ) -> Option<(u64, FencingToken, Instant)> {
        let mut t = self.table();
        let now = Instant::now();
        let name = (matches!(claim, Share::Permits { .. }), key.clone());
        let fam = t.family.entry(name.clone()).or_default();
        fam.holders.retain(|m| m.deadline > now);
        let writer_waits = fam.writer_waits_until.is_some_and(|u| u > now);
        let fits = match claim {
            Share::Write if self.flaw == Flaw::WriterIgnoresReaders => {
                fam.holders.iter().all(|m| m.claim != Share::Write)
            }
            Share::Write => fam.holders.is_empty(),
            Share::Read => {
                fam.holders.iter().all(|m| m.claim == Share::Read)
                    && (!writer_waits || self.flaw == Flaw::ReaderIgnoresWaitingWriter)
            }
            Share::Permits { count, limit } => {
                let limit = u64::from(limit) + u64::from(self.flaw == Flaw::SemaphoreOverAdmits);
                let taken: u64 = fam
                    .holders
                    .iter()
                    .map(|m| match m.claim {
                        Share::Permits { count, .. } => u64::from(count),
                        _ => 0,
                    })
                    .sum();
                taken + u64::from(count) <= limit
            }
        };
        if !fits {
            if claim == Share::Write && waiting {
                fam.writer_waits_until = Some(now + WRITER_MARK);
            }
            return None;
        }
        if claim == Share::Write {
            fam.writer_waits_until = None;
        }
        let deadline = dlock_core::driver::saturating_add(now, ttl);
        t.last_owner += 1;
        t.last_token += 1;
        let (owner, token) = (t.last_owner, t.last_token);
        t.family.entry(name).or_default().holders.push(Member {
            owner,
            deadline,
            claim,
        });
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
        if t.member(key, owner).is_some() {
            t.forget_member(key, owner);
            return Ok(());
        }
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
        let deadline = dlock_core::driver::saturating_add(Instant::now(), ttl);
        if let Some(m) = t.member(key, owner) {
            m.deadline = deadline;
            return Ok(deadline);
        }
        let entry = t.live(key);
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
        let mut t = self.table();
        t.member(key, owner).is_some() || t.live(key).is_some_and(|e| e.owner == owner)
    }

    /// The guard of a grant whose request was sent at `sent`.
    fn guard(
        &self,
        key: &LockKey,
        owner: u64,
        token: FencingToken,
        sent: Instant,
        opts: AcquireOptions,
    ) -> NaiveGuard {
        let (trigger, signal) = LostSignal::pair();
        let state = Arc::new(Mutex::new(
            dlock_core::driver::Drift::DEFAULT.deadline(sent, opts.ttl),
        ));
        let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let gone = MonitorGone {
            stopped: Arc::clone(&stopped),
            lost: (self.flaw != Flaw::LostNeverFires).then(|| trigger.clone()),
        };
        let task = monitor(
            self.clone(),
            key.clone(),
            owner,
            opts,
            Arc::clone(&state),
            trigger.clone(),
        );
        let monitor = tokio::spawn(async move {
            let _gone = gone;
            task.await;
        });
        NaiveGuard {
            lock: self.clone(),
            key: key.clone(),
            owner,
            token,
            lost: signal,
            trigger,
            local_deadline: state,
            monitor,
            stopped,
            released: false,
        }
    }
}

/// Fires a guard's `lost()` when its monitor task is dropped before the
/// guard stopped it (the runtime it ran on shut down).
struct MonitorGone {
    stopped: Arc<std::sync::atomic::AtomicBool>,
    lost: Option<LostTrigger>,
}

impl Drop for MonitorGone {
    fn drop(&mut self) {
        if let Some(lost) = &self.lost
            && !self.stopped.load(std::sync::atomic::Ordering::SeqCst)
        {
            lost.fire();
        }
    }
}

/// Renews (with auto-extend) and watches the entry over the link; fires lost
/// when it is gone, or when the local deadline passes first.
async fn monitor(
    lock: NaiveLock,
    key: LockKey,
    owner: u64,
    opts: AcquireOptions,
    local_deadline: Arc<Mutex<Instant>>,
    lost: LostTrigger,
) {
    let fire = |lost: &LostTrigger, why: &'static str| match lock.flaw {
        Flaw::LostNeverFires => {}
        Flaw::Silent => lost.fire(),
        _ => dlock_core::driver::lose(lost, BACKEND, &key, why),
    };
    let heeds_deadline = lock.flaw != Flaw::LostOnlyWhenHeard;
    loop {
        tokio::time::sleep((opts.ttl / 3).min(POLL * 4)).await;
        if lock.crashed.load(Ordering::SeqCst) {
            return;
        }
        let deadline = *local_deadline.lock().unwrap_or_else(PoisonError::into_inner);
        if heeds_deadline && Instant::now() >= deadline {
            return fire(&lost, dlock_core::trace::why::DEADLINE);
        }
        let renew_due = opts.auto_extend
            && dlock_core::driver::saturating_add(
                Instant::now(),
                opts.ttl.min(dlock_core::driver::FAR_FUTURE) / 3 * 2,
            ) >= deadline;
        // Ok(false): the server says the lock is gone; Err: no answer.
        let check = async {
            if renew_due {
                let sent = Instant::now();
                let renewed = lock.call(|| lock.extend_owner(&key, owner, opts.ttl)).await?;
                if renewed.is_ok() {
                    let d = dlock_core::driver::Drift::DEFAULT.deadline(sent, opts.ttl);
                    *local_deadline.lock().unwrap_or_else(PoisonError::into_inner) = d;
                }
                Ok::<bool, Error>(renewed.is_ok())
            } else {
                lock.call(|| lock.owns(&key, owner)).await
            }
        };
        let verdict = if heeds_deadline {
            tokio::select! {
                r = check => r,
                // Out of time, unless an extend moved the deadline meanwhile.
                () = tokio::time::sleep_until(deadline.into()) => {
                    Ok(Instant::now() < *local_deadline.lock().unwrap_or_else(PoisonError::into_inner))
                }
            }
        } else {
            check.await
        };
        if let Ok(false) = verdict {
            return fire(&lost, dlock_core::trace::why::EXPIRED);
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
            .with_read_write()
            .with_semaphores()
    }

    async fn abandon(&self) {
        self.crashed.store(true, Ordering::SeqCst);
    }

    /// Names with a live holder or an entry (no abandon check: the kit's
    /// residue reads through any client).
    async fn keys_in_use(&self, namespace: &str) -> Result<Vec<String>> {
        let mut t = self.table();
        let now = Instant::now();
        t.entries.retain(|_, e| e.deadline > now);
        for f in t.family.values_mut() {
            f.holders.retain(|m| m.deadline > now);
        }
        let held = t
            .family
            .iter()
            .filter(|(_, f)| !f.holders.is_empty())
            .map(|((_, k), _)| k);
        Ok(dlock_core::driver::names(
            t.entries
                .keys()
                .chain(held)
                .map(LockKey::as_str)
                .filter(|k| k.starts_with(namespace)),
        ))
    }

    async fn grant(
        &self,
        key: &LockKey,
        claim: dlock_core::Claim,
        opts: AcquireOptions,
    ) -> Result<NaiveGuard> {
        let family = match claim {
            dlock_core::Claim::Mutex => None,
            dlock_core::Claim::Read => Some(Share::Read),
            dlock_core::Claim::Write => Some(Share::Write),
            dlock_core::Claim::Permits { count, limit } => Some(Share::Permits { count, limit }),
        };
        self.take(key, opts, family).await
    }

    async fn acquire_all(&self, keys: &[LockKey], opts: AcquireOptions) -> Result<MultiGuard<NaiveGuard>> {
        if self.flaw != Flaw::AllInGivenOrder {
            return dlock_core::driver::acquire_all(self, keys, opts).await;
        }
        // The bug: no global order.
        let mut parts = Vec::new();
        for key in keys {
            parts.push(self.acquire(key, opts).await?);
        }
        Ok(MultiGuard::from_parts(parts))
    }
}

impl NaiveLock {
    /// A mutex (`claim` `None`), read-write or semaphore acquire.
    async fn take(&self, key: &LockKey, opts: AcquireOptions, claim: Option<Share>) -> Result<NaiveGuard> {
        self.check_up()?;
        let started = Instant::now();
        let waiting = opts.wait != Wait::No;
        if let Some((owner, token, _)) = self.attempt(key, opts.ttl, claim, waiting).await? {
            return Ok(self.guard(key, owner, token, started, opts));
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
        if self.flaw != Flaw::Silent {
            dlock_core::trace::queued();
        }
        if self.flaw == Flaw::CancelLeavesHeld && claim.is_none() {
            // The bug: the polling runs in a detached task that outlives us.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (me, k) = (self.clone(), key.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    if let Some((owner, token, _)) = me.try_once(&k, opts.ttl) {
                        let _ = tx.send((owner, token, sent));
                        return;
                    }
                    tokio::time::sleep(POLL).await;
                }
            });
            return match rx.await {
                Ok((owner, token, sent)) => Ok(self.guard(key, owner, token, sent, opts)),
                Err(_) => Err(Error::Timeout {
                    key: key.as_str().to_owned(),
                }),
            };
        }
        loop {
            let sent = Instant::now();
            if let Some((owner, token, _)) = self.attempt(key, opts.ttl, claim, waiting).await? {
                return Ok(self.guard(key, owner, token, sent, opts));
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
    /// Set before the guard stops its monitor.
    stopped: Arc<std::sync::atomic::AtomicBool>,
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
        dlock_core::driver::check_ttl(BACKEND, ttl)?;
        let sent = Instant::now();
        self.lock
            .call(|| self.lock.extend_owner(&self.key, self.owner, ttl))
            .await??;
        let d = dlock_core::driver::Drift::DEFAULT.deadline(sent, ttl);
        *self.local_deadline.lock().unwrap_or_else(PoisonError::into_inner) = d;
        Ok(())
    }
    async fn release(mut self) -> Result<()> {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        self.monitor.abort();
        // Dropped before the reply, `Drop` releases in the background.
        let r = self
            .lock
            .call(|| self.lock.release_owner(&self.key, self.owner))
            .await;
        self.released = true;
        if self.lock.flaw != Flaw::LostNeverFires {
            self.trigger.fire();
        }
        let result = match r {
            Ok(r) => r,
            Err(Error::Unavailable { .. }) if self.lock.flaw == Flaw::ReleaseIgnoresLinkErrors => Ok(()),
            Err(e) => {
                // Unconfirmed: try again in the background, and say so.
                self.lock.release_in_background(self.key.clone(), self.owner);
                Err(e)
            }
        };
        if self.lock.flaw == Flaw::Silent {
            return result;
        }
        dlock_core::trace::release_result(BACKEND, &self.key, Some(self.token), result)
    }
}

impl Drop for NaiveGuard {
    fn drop(&mut self) {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        self.monitor.abort();
        if !self.released && !self.lock.crashed.load(Ordering::SeqCst) {
            self.lock.release_in_background(self.key.clone(), self.owner);
        }
        if self.lock.flaw != Flaw::LostNeverFires {
            self.trigger.fire();
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

    fn breaks_links(&self) -> bool {
        true
    }

    async fn linked_client(&self) -> Result<Linked<NaiveLock>> {
        let link = Link::in_process();
        Ok(Linked {
            lock: self.backend.client_over(&link),
            link,
        })
    }

    async fn unreachable_client(&self) -> Result<NaiveLock> {
        Ok(self.backend.client_of_nowhere())
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        self.backend.keys_in_use(namespace).await
    }
}
