//! [`Keeper`]: one task that keeps every guard of a client handle (its
//! local deadline, its renewals), instead of a task per guard.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio_util::time::DelayQueue;

use crate::Result;
use crate::driver::{Outcome, Validity, saturating_add};

/// A renewal request: sends one renewal and says how it ended.
pub type Renew = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = Result<Outcome>> + Send>> + Send>;

/// The keeper of a client handle: one task, started with the first guard,
/// that fires each guard's `lost()` at its local deadline and, with
/// `auto_extend`, renews it at `ttl / 3` (counted from the last confirmed
/// send), exactly as [`keep`](crate::driver::keep) does for one guard. A
/// guard costs a slot in a timer queue, not a task; renewals that fall due
/// together run concurrently. The task ends when the handle and every
/// guard are gone.
///
/// The task runs on the runtime of the first guard it keeps: a handle
/// whose guards outlive that runtime must make them on a runtime that
/// lives as long as they do (the usual one runtime per process does).
///
/// ```
/// use std::time::{Duration, Instant};
/// use dlock_core::driver::{Drift, Keeper, Validity};
/// use dlock_core::LockKey;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let keeper = Keeper::new();
/// let ttl = Duration::from_secs(30);
/// let (validity, lost) = Validity::of_key("mine", &LockKey::new("k").unwrap(), Instant::now(), ttl, Drift::DEFAULT);
/// let kept = keeper.keep(validity, ttl, true, Instant::now(), Box::new(|| Box::pin(async { Ok(Ok(())) })), || false);
/// drop(kept); // the guard was released: its slot goes
/// assert!(!lost.is_lost());
/// # }
/// ```
#[derive(Debug, Default)]
pub struct Keeper {
    tx: Mutex<Option<mpsc::UnboundedSender<Msg>>>,
    next_id: std::sync::atomic::AtomicU64,
}

enum Msg {
    Keep(u64, Entry),
    Forget(u64),
    Moved(u64),
}

/// A guard's place in its [`Keeper`]. Dropping it (or [`stop`](Kept::stop))
/// takes the guard out: no more renewals, no `lost()` from the keeper.
#[derive(Debug)]
#[must_use = "dropping it stops keeping the guard"]
pub struct Kept {
    id: u64,
    stopped: Arc<AtomicBool>,
    tx: mpsc::UnboundedSender<Msg>,
}

impl Kept {
    /// Stops keeping the guard (idempotent): its slot goes at once. A
    /// renewal already sent may still complete; its outcome is ignored.
    pub fn stop(&self) {
        if !self.stopped.swap(true, Ordering::SeqCst) {
            // The task may be gone (its runtime ended): nothing to forget.
            let _ = self.tx.send(Msg::Forget(self.id));
        }
    }

    /// The guard's deadline moved (a manual extend was confirmed: call it
    /// after [`Validity::renewed`]); the keeper looks at it again now, so a
    /// deadline moved *earlier* is kept too.
    pub fn moved(&self) {
        if !self.stopped.load(Ordering::SeqCst) {
            let _ = self.tx.send(Msg::Moved(self.id));
        }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Entry {
    validity: Arc<Validity>,
    ttl: Duration,
    auto_extend: bool,
    next_renewal: Instant,
    renew: Renew,
    stopped: Arc<AtomicBool>,
    abandoned: Box<dyn Fn() -> bool + Send>,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Entry {
    fn gone(&self) -> bool {
        self.stopped.load(Ordering::SeqCst) || (self.abandoned)() || self.validity.is_lost()
    }

    /// When the keeper must look at it next.
    fn wake(&self) -> Instant {
        let deadline = self.validity.deadline();
        if self.auto_extend {
            deadline.min(self.next_renewal)
        } else {
            deadline
        }
    }
}

impl Keeper {
    /// A keeper; its task starts with the first guard.
    pub fn new() -> Self {
        Keeper::default()
    }

    /// Keeps a guard: see [`keep`](crate::driver::keep) for the arguments
    /// (`stopped` there is `abandoned` here: the handle was abandoned).
    /// Call it inside a Tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (like `tokio::spawn`).
    pub fn keep(
        &self,
        validity: Arc<Validity>,
        ttl: Duration,
        auto_extend: bool,
        sent: Instant,
        renew: Renew,
        abandoned: impl Fn() -> bool + Send + 'static,
    ) -> Kept {
        let stopped = Arc::new(AtomicBool::new(false));
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let entry = Entry {
            validity,
            ttl,
            auto_extend,
            next_renewal: saturating_add(sent, ttl / 3),
            renew,
            stopped: Arc::clone(&stopped),
            abandoned: Box::new(abandoned),
        };
        let mut msg = Msg::Keep(id, entry);
        let mut tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = tx.as_ref() {
            match sender.send(msg) {
                Ok(()) => {
                    return Kept {
                        id,
                        stopped,
                        tx: sender.clone(),
                    };
                }
                // The task ended (its runtime went away): start another.
                Err(mpsc::error::SendError(back)) => msg = back,
            }
        }
        let (sender, rx) = mpsc::unbounded_channel();
        // The receiver is alive until the task ends, and the task has not started.
        let _ = sender.send(msg);
        drop(tokio::spawn(run(rx)));
        *tx = Some(sender.clone());
        Kept {
            id,
            stopped,
            tx: sender,
        }
    }
}

/// The longest an entry sleeps in the queue before it is looked at again.
const LONGEST_SLEEP: Duration = Duration::from_secs(30 * 24 * 3600);

type Renewing = Pin<Box<dyn Future<Output = Option<(u64, Entry)>> + Send>>;

/// The timer queue and where each guard's slot is in it.
#[derive(Default)]
struct Slots {
    queue: DelayQueue<(u64, Entry)>,
    keys: std::collections::HashMap<u64, tokio_util::time::delay_queue::Key>,
}

impl Slots {
    fn schedule(&mut self, id: u64, entry: Entry) {
        if entry.gone() {
            return;
        }
        // The timer queue takes nothing beyond about two years (it panics):
        // a later wake is a look at it again in a month.
        let at = entry.wake().min(saturating_add(Instant::now(), LONGEST_SLEEP));
        let key = self.queue.insert_at((id, entry), at.into());
        self.keys.insert(id, key);
    }

    /// Looks at a queued entry again (mid-renewal, it is rescheduled
    /// with a fresh wake time anyway).
    fn moved(&mut self, id: u64) {
        if let Some(key) = self.keys.remove(&id) {
            let (id, entry) = self.queue.remove(&key).into_inner();
            self.schedule(id, entry);
        }
    }

    fn forget(&mut self, id: u64) {
        if let Some(key) = self.keys.remove(&id) {
            // Every key in `keys` is in the queue (taken out when it expires).
            drop(self.queue.remove(&key));
        }
    }
}

/// The keeper's task.
async fn run(mut rx: mpsc::UnboundedReceiver<Msg>) {
    let mut slots = Slots::default();
    let mut renewing: FuturesUnordered<Renewing> = FuturesUnordered::new();
    let mut open = true;
    loop {
        if !open && slots.queue.is_empty() && renewing.is_empty() {
            return;
        }
        tokio::select! {
            msg = rx.recv(), if open => match msg {
                Some(Msg::Keep(id, entry)) => slots.schedule(id, entry),
                Some(Msg::Forget(id)) => slots.forget(id),
                Some(Msg::Moved(id)) => slots.moved(id),
                None => open = false,
            },
            Some(due) = slots.queue.next(), if !slots.queue.is_empty() => {
                let (id, entry) = due.into_inner();
                slots.keys.remove(&id);
                if let Some(renewal) = on_due(id, entry, &mut slots) {
                    renewing.push(renewal);
                }
            }
            Some(done) = renewing.next(), if !renewing.is_empty() => {
                if let Some((id, entry)) = done {
                    slots.schedule(id, entry);
                }
            }
        }
    }
}

/// An entry's time came: it is lost (deadline), renewed (a future to run),
/// or looked at again later (a manual extend moved the deadline).
fn on_due(id: u64, entry: Entry, slots: &mut Slots) -> Option<Renewing> {
    if entry.gone() {
        return None;
    }
    let now = Instant::now();
    if entry.validity.deadline() <= now {
        entry.validity.lose(crate::trace::why::DEADLINE);
        return None;
    }
    if !(entry.auto_extend && entry.next_renewal <= now) {
        slots.schedule(id, entry);
        return None;
    }
    Some(Box::pin(async move { renew(entry).await.map(|e| (id, e)) }))
}

/// One renewal of `entry`, bounded by its deadline; the entry back unless
/// it is done with.
async fn renew(mut entry: Entry) -> Option<Entry> {
    let validity = Arc::clone(&entry.validity);
    let deadline = validity.deadline();
    // A manual extend may hold the permit: wait for it no longer than the deadline.
    let Ok(permit) = tokio::time::timeout_at(deadline.into(), validity.renewal()).await else {
        return Some(entry);
    };
    // Released, or lost to a refused extend, while it waited.
    if entry.gone() {
        return None;
    }
    let sent = Instant::now();
    let deadline = validity.deadline();
    let outcome = tokio::time::timeout_at(deadline.into(), (entry.renew)()).await;
    if entry.stopped.load(Ordering::SeqCst) {
        // Released meanwhile: whatever the server said is not a loss.
        return None;
    }
    let ttl = entry.ttl;
    match outcome {
        Ok(Ok(Ok(()))) => {
            validity.renewed(sent, ttl);
            entry.next_renewal = saturating_add(sent, ttl / 3);
        }
        Ok(Ok(Err(refusal))) => {
            validity.lose(refusal.why());
            return None;
        }
        Err(_) => {
            validity.lose(crate::trace::why::DEADLINE);
            return None;
        }
        // Not a refusal (a network failure): again soon, until the deadline.
        Ok(Err(e)) => {
            validity.renewal_failed(&e);
            entry.next_renewal = saturating_add(Instant::now(), (ttl / 20).max(Duration::from_millis(5)));
        }
    }
    drop(permit);
    Some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LockKey;
    use crate::driver::{Drift, Refusal};
    use std::sync::atomic::AtomicU32;

    fn validity(ttl: Duration) -> (Arc<Validity>, crate::LostSignal) {
        Validity::of_key(
            "test",
            &LockKey::new("k").unwrap(),
            Instant::now(),
            ttl,
            Drift::DEFAULT,
        )
    }

    /// Many guards, one task: every guard is renewed at a third of its
    /// TTL and none is lost; a refused renewal loses only its own guard;
    /// a guard without auto-extend is lost at its deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_task_keeps_many_guards_each_by_its_own_rules() {
        let keeper = Keeper::new();
        let ttl = Duration::from_millis(300);
        let tasks_before = tokio::runtime::Handle::current().metrics().num_alive_tasks();
        let renewals = Arc::new(AtomicU32::new(0));
        let mut kept = Vec::new();
        let mut signals = Vec::new();
        for _ in 0..50 {
            let (v, lost) = validity(ttl);
            let n = Arc::clone(&renewals);
            kept.push(keeper.keep(
                v,
                ttl,
                true,
                Instant::now(),
                Box::new(move || {
                    n.fetch_add(1, Ordering::SeqCst);
                    Box::pin(async { Ok(Ok(())) })
                }),
                || false,
            ));
            signals.push(lost);
        }
        let (refused, refused_lost) = validity(ttl);
        let _kept_refused = keeper.keep(
            refused,
            ttl,
            true,
            Instant::now(),
            Box::new(|| Box::pin(async { Ok(Err(Refusal::HeldByOther)) })),
            || false,
        );
        let (short, short_lost) = validity(ttl);
        let _kept_short = keeper.keep(
            short,
            ttl,
            false,
            Instant::now(),
            Box::new(|| Box::pin(async { Ok(Ok(())) })),
            || false,
        );
        assert!(
            tokio::runtime::Handle::current().metrics().num_alive_tasks() <= tasks_before + 1,
            "more than one task for 52 guards"
        );
        tokio::time::timeout(Duration::from_secs(10), refused_lost.wait())
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), short_lost.wait())
            .await
            .unwrap();
        // Three TTLs: every auto-extended guard was renewed all along.
        let until = Instant::now() + ttl * 3;
        while Instant::now() < until {
            assert!(
                signals.iter().all(|s| !s.is_lost()),
                "an auto-extended guard was lost"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(renewals.load(Ordering::SeqCst) >= 50 * 3, "{renewals:?}");
        // Released guards are not renewed any more.
        drop(kept);
        tokio::time::sleep(ttl).await;
        let after = renewals.load(Ordering::SeqCst);
        tokio::time::sleep(ttl).await;
        assert_eq!(renewals.load(Ordering::SeqCst), after);
    }

    /// A guard of a century's TTL (auto-extended or not) is kept like any
    /// other: the queue, which takes nothing beyond about two years, does
    /// not panic, and the task goes on keeping the others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn huge_ttls_do_not_stop_the_keeper() {
        let keeper = Keeper::new();
        // Kept first: if a huge entry killed the task, nobody would lose it.
        let ttl = Duration::from_millis(300);
        let (v, lost) = validity(ttl);
        let _short = keeper.keep(
            Arc::clone(&v),
            ttl,
            false,
            Instant::now(),
            Box::new(|| Box::pin(async { Ok(Ok(())) })),
            || false,
        );
        let mut kept = Vec::new();
        for auto_extend in [true, false] {
            let (v, huge_lost) = validity(Duration::MAX);
            kept.push(keeper.keep(
                v,
                Duration::MAX,
                auto_extend,
                Instant::now(),
                Box::new(|| Box::pin(async { Ok(Ok(())) })),
                || false,
            ));
            assert!(!huge_lost.is_lost());
        }
        tokio::time::timeout(Duration::from_secs(10), lost.wait())
            .await
            .expect("the keeper still keeps the short guard");
        // Lost by the keeper at its deadline, not by a dead task dropping it.
        assert_eq!(v.why(), Some(crate::trace::why::DEADLINE));
    }

    /// An extend that moves the deadline earlier is kept: lost() fires at
    /// the new deadline, not at the old one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deadline_moved_earlier_is_kept() {
        let keeper = Keeper::new();
        let (v, lost) = validity(Duration::from_secs(60));
        let kept = keeper.keep(
            Arc::clone(&v),
            Duration::from_secs(60),
            false,
            Instant::now(),
            Box::new(|| Box::pin(async { Ok(Ok(())) })),
            || false,
        );
        v.renewed(Instant::now(), Duration::from_millis(200));
        kept.moved();
        tokio::time::timeout(Duration::from_secs(10), lost.wait())
            .await
            .expect("lost() at the moved deadline");
        assert_eq!(v.why(), Some(crate::trace::why::DEADLINE));
    }

    /// Renewals that fail without a refusal are retried, and the guard is
    /// lost at its local deadline, not before.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failing_renewals_lose_the_guard_at_its_deadline() {
        let keeper = Keeper::new();
        let ttl = Duration::from_millis(300);
        let sent = Instant::now();
        let (v, lost) = validity(ttl);
        let deadline = v.deadline();
        let _kept = keeper.keep(
            Arc::clone(&v),
            ttl,
            true,
            sent,
            Box::new(|| Box::pin(async { Err(crate::Error::unavailable("test", "down")) })),
            || false,
        );
        tokio::time::timeout(Duration::from_secs(10), lost.wait())
            .await
            .unwrap();
        assert!(Instant::now() >= deadline);
        assert_eq!(v.why(), Some(crate::trace::why::DEADLINE));
    }
}
