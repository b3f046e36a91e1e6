//! [`Keeper`]: one task that keeps every guard of a client handle (its
//! local deadline, its renewals), instead of a task per guard.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::outcome::Outcome;
use super::schedule::{Inbox, Msg, Slot, Slots, Taken};
use super::time::saturating_add;
use super::validity::Validity;
use crate::Result;

/// A renewal request: sends one renewal and says how it ended.
pub type Renew = Box<dyn FnMut() -> Pin<Box<dyn Future<Output = Result<Outcome>> + Send>> + Send>;

/// The keeper of a client handle: one task, started with the first guard,
/// that fires each guard's `lost()` at its local deadline and, with
/// `auto_extend`, renews it at `ttl / 3` (counted from the last confirmed
/// send). A refusal fires `lost()` at once; a failure that is not a
/// refusal (the network) is retried until the deadline, bounded by it. A
/// guard costs a slot in a timer queue, not a task, and usually not even a
/// wake-up: the task is told about a new guard only when it is due before
/// the task's own next look, and a released guard (never renewed once
/// [`Kept::stop`] said so) leaves its slot with that next look. Renewals
/// that fall due together run concurrently. The task ends when the handle
/// and every guard are gone.
///
/// The task runs on the runtime of the first guard it keeps. If that
/// runtime shuts down while guards are kept (a runtime per worker, a test's
/// runtime), every guard the task kept, or was about to keep, fires
/// `lost()` at once (`why`: [`KEEPER_GONE`](crate::trace::why::KEEPER_GONE)),
/// and the next guard starts a new task on its own runtime.
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
#[derive(Debug)]
pub struct Keeper {
    shared: Arc<Shared>,
}

impl Default for Keeper {
    fn default() -> Self {
        Keeper {
            shared: Arc::new(Shared {
                inbox: Inbox::new(),
                users: AtomicUsize::new(1),
            }),
        }
    }
}

/// The last user (the handle or a guard) gone: the task ends.
impl Drop for Keeper {
    fn drop(&mut self) {
        self.shared.leave();
    }
}

/// What the handle, its guards and the task share.
#[derive(Debug)]
struct Shared {
    inbox: Inbox<Entry>,
    /// The handle and every live [`Kept`]; the task ends at zero.
    users: AtomicUsize,
}

impl Shared {
    /// One user fewer; the last one tells the task to end.
    fn leave(&self) {
        if self.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inbox.tell();
        }
    }
}

/// A guard's place in its [`Keeper`]. Dropping it (or [`stop`](Kept::stop))
/// takes the guard out: no more renewals, no `lost()` from the keeper.
#[derive(Debug)]
#[must_use = "dropping it stops keeping the guard"]
pub struct Kept {
    id: u64,
    stopped: Arc<AtomicBool>,
    shared: Arc<Shared>,
}

impl Kept {
    /// Stops keeping the guard (idempotent): no renewal is sent for it from
    /// now on, and its slot goes with the keeper's next look. A renewal
    /// already sent may still complete; its outcome is ignored.
    pub fn stop(&self) {
        if !self.stopped.swap(true, Ordering::SeqCst) {
            self.shared.inbox.post(Msg::Forget(self.id), false);
        }
    }

    /// The guard's deadline moved (a manual extend was confirmed: call it
    /// after [`Validity::renewed`]); the keeper looks at it again now, so a
    /// deadline moved *earlier* is kept too.
    pub fn moved(&self) {
        if !self.stopped.load(Ordering::SeqCst) {
            self.shared.inbox.post(Msg::Moved(self.id), true);
        }
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.stop();
        self.shared.leave();
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

/// An entry dropped while its guard still counts on it (not released, not
/// lost, its handle not abandoned) was dropped with the task that kept it:
/// a runtime shut down under the task, with the entry in its slots, in a
/// renewal, or still in the inbox. Nothing will renew it or watch its
/// deadline any more, so its guard is told now. (Every other way an entry
/// ends, it is gone first.)
impl Drop for Entry {
    fn drop(&mut self) {
        if !self.gone() {
            self.validity.lose(crate::trace::why::KEEPER_GONE);
        }
    }
}

impl Slot for Entry {
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

    /// Keeps a guard whose grant or last renewal was sent at `sent`: fires
    /// `validity`'s `lost()` at its local deadline; with `auto_extend`,
    /// calls `renew` at `ttl / 3` from the last confirmed send. Nothing
    /// more once `abandoned()` turns true (the handle was abandoned: a
    /// crash, as seen by the server). Call it inside a Tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (like `tokio::spawn`), when it must start the
    /// task.
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
        let entry = Entry {
            validity,
            ttl,
            auto_extend,
            next_renewal: saturating_add(sent, ttl / 3),
            renew,
            stopped: Arc::clone(&stopped),
            abandoned: Box::new(abandoned),
        };
        let wake = entry.wake();
        let (id, taken) = self.shared.inbox.keep(entry, wake);
        match taken {
            Taken::Queued => {}
            // The first guard, or the task's runtime went away: a new task
            // (it reads the inbox first). A task dropped unpolled (no
            // runtime: `spawn` panics; a runtime shutting down) drops its
            // marker too, which says no task runs.
            Taken::Start => drop(tokio::spawn(run(Running(Arc::clone(&self.shared))))),
            // The keeper's inbox is never closed for good.
            Taken::Closed(entry) => drop(entry),
        }
        self.shared.users.fetch_add(1, Ordering::AcqRel);
        Kept {
            id,
            stopped,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The longest the task sleeps before it looks again.
const LONGEST_SLEEP: Duration = Duration::from_secs(30 * 24 * 3600);

type Renewing = Pin<Box<dyn Future<Output = Option<(u64, Entry)>> + Send>>;

/// Marks the task gone when it ends or its runtime drops it.
struct Running(Arc<Shared>);

impl Drop for Running {
    fn drop(&mut self) {
        // Guards not yet read fire `lost()` as their entries go (outside
        // the inbox's lock: a lost signal runs its watchers).
        drop(self.0.inbox.ended(false));
    }
}

/// The keeper's task.
async fn run(running: Running) {
    let shared = &running.0;
    let mut slots = Slots::default();
    let mut renewing: FuturesUnordered<Renewing> = FuturesUnordered::new();
    loop {
        slots.apply(shared.inbox.read());
        let now = Instant::now();
        while let Some((id, entry)) = slots.due(now) {
            if let Some(renewal) = on_due(id, entry, &mut slots) {
                renewing.push(renewal);
            }
        }
        if shared.users.load(Ordering::Acquire) == 0 {
            // Every guard is gone, so is every slot's reason to be.
            drop(slots.drain());
            if renewing.is_empty() {
                return;
            }
        }
        let next = slots.next_wake();
        if !shared.inbox.sleep_until(next) {
            continue;
        }
        let sleep = next.map(|at| at.min(saturating_add(Instant::now(), LONGEST_SLEEP)));
        tokio::select! {
            () = shared.inbox.told_to_look() => {}
            () = tokio::time::sleep_until(sleep.unwrap_or(now).into()), if sleep.is_some() => {}
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
fn on_due(id: u64, entry: Entry, slots: &mut Slots<Entry>) -> Option<Renewing> {
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
    use crate::driver::schedule::COMPACT;
    use crate::driver::{Drift, Refusal};
    use std::sync::atomic::AtomicU32;

    /// A renewal the server always confirms.
    fn ok() -> Renew {
        Box::new(|| Box::pin(async { Ok(Ok(())) }))
    }

    /// The same, counting itself in `n`.
    fn counted(n: Arc<AtomicU32>) -> Renew {
        Box::new(move || {
            n.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(Ok(())) })
        })
    }

    /// `keeper` keeps `v` (granted now for `ttl`), renewed by `renew`, on
    /// a handle never abandoned.
    fn keep_now(keeper: &Keeper, v: Arc<Validity>, ttl: Duration, auto_extend: bool, renew: Renew) -> Kept {
        keeper.keep(v, ttl, auto_extend, Instant::now(), renew, || false)
    }

    fn validity(ttl: Duration) -> (Arc<Validity>, crate::LostSignal) {
        Validity::of_key(
            "test",
            &LockKey::new("k").unwrap(),
            Instant::now(),
            ttl,
            Drift::DEFAULT,
        )
    }

    /// The keeper's task started on a runtime that then shuts down: the
    /// guards it kept (and one made on a live runtime meanwhile, waiting in
    /// the inbox) fire `lost()` at once, with their TTLs far away; the next
    /// guard starts a new task on its own runtime and is renewed.
    #[test]
    fn guards_are_lost_when_their_keepers_runtime_goes() {
        let live = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let keeper = Keeper::new();
        let ttl = Duration::from_secs(60);
        let renewals = Arc::new(AtomicU32::new(0));
        // The guard's side keeps its validity, as a driver's guard does.
        let keep = |keeper: &Keeper, ttl: Duration| {
            let (v, lost) = validity(ttl);
            let n = Arc::clone(&renewals);
            let kept = keep_now(keeper, Arc::clone(&v), ttl, true, counted(n));
            (kept, lost, v)
        };
        let short_lived = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // The task starts on the short-lived runtime and reads its inbox.
        let first = short_lived.block_on(async {
            let first = keep(&keeper, ttl);
            tokio::task::yield_now().await;
            first
        });
        // Made on the live runtime: the task (not running now) has it in
        // its inbox.
        let second = live.block_on(async { keep(&keeper, ttl) });
        drop(short_lived);
        for (_, lost, _) in [&first, &second] {
            assert!(lost.is_lost(), "a guard of a task whose runtime went is not lost");
        }
        // A later guard gets a task on its own runtime, and is renewed.
        live.block_on(async {
            let short = Duration::from_millis(300);
            let (third, lost, _validity) = keep(&keeper, short);
            let before = renewals.load(Ordering::SeqCst);
            tokio::time::timeout(Duration::from_secs(30), async {
                while renewals.load(Ordering::SeqCst) < before + 2 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await
            .expect("the later guard was not renewed");
            assert!(!lost.is_lost());
            drop(third);
        });
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
            kept.push(keep_now(&keeper, v, ttl, true, counted(n)));
            signals.push(lost);
        }
        let (refused, refused_lost) = validity(ttl);
        let _kept_refused = keep_now(
            &keeper,
            refused,
            ttl,
            true,
            Box::new(|| Box::pin(async { Ok(Err(Refusal::HeldByOther)) })),
        );
        let (short, short_lost) = validity(ttl);
        let _kept_short = keep_now(&keeper, short, ttl, false, ok());
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

    /// Waits until the task sleeps until at least 10 s from now.
    async fn asleep(keeper: &Keeper) {
        let until = Instant::now() + Duration::from_secs(10);
        while keeper
            .shared
            .inbox
            .looks_by()
            .is_none_or(|at| at < Instant::now() + Duration::from_secs(10))
        {
            assert!(Instant::now() < until, "the task never went to sleep");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Guards taken and released long before their first renewal cost
    /// the task no wake-up each: it is told about a new guard only when
    /// that guard is due before the task's next look, and about released
    /// ones once per [`COMPACT`] messages. A guard due sooner is still
    /// told at once (it is renewed in time).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn short_holds_do_not_wake_the_keeper_each() {
        let keeper = Keeper::new();
        let long = Duration::from_secs(60);
        let keep = |ttl: Duration, renewals: Arc<AtomicU32>| {
            let (v, lost) = validity(ttl);
            (keep_now(&keeper, v, ttl, true, counted(renewals)), lost)
        };
        let none = Arc::new(AtomicU32::new(0));
        let _first = keep(long, Arc::clone(&none));
        // The task read the first guard and sleeps until its renewal.
        asleep(&keeper).await;
        let told = keeper.shared.inbox.told();
        for _ in 0..1000 {
            drop(keep(long, Arc::clone(&none)));
        }
        let woken = keeper.shared.inbox.told() - told;
        assert!(
            woken <= 2 * 1000 / COMPACT as u64 + 1,
            "told {woken} times for 1000 short holds"
        );
        // What piled up is read, and the task sleeps again.
        asleep(&keeper).await;
        assert!(keeper.shared.inbox.waiting() < COMPACT);
        // Due before the task's next look: told, and renewed in time.
        let renewals = Arc::new(AtomicU32::new(0));
        let (_short, lost) = keep(Duration::from_millis(300), Arc::clone(&renewals));
        let until = Instant::now() + Duration::from_secs(10);
        while renewals.load(Ordering::SeqCst) < 3 {
            assert!(
                Instant::now() < until && !lost.is_lost(),
                "the short guard was not kept"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(none.load(Ordering::SeqCst), 0);
    }

    /// A keep outside a runtime panics (it cannot start the task) and
    /// leaves the keeper as it was: the next keep, inside one, is kept.
    #[test]
    fn a_keep_that_could_not_start_the_task_leaves_no_trace() {
        let keeper = Keeper::new();
        let ttl = Duration::from_millis(300);
        let outside = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (v, _lost) = validity(ttl);
            keep_now(&keeper, v, ttl, false, ok())
        }));
        assert!(outside.is_err(), "kept outside a runtime");
        assert!(!keeper.shared.inbox.is_running());
        assert_eq!(keeper.shared.users.load(Ordering::SeqCst), 1);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (v, lost) = validity(ttl);
            let _kept = keep_now(&keeper, v, ttl, false, ok());
            tokio::time::timeout(Duration::from_secs(10), lost.wait())
                .await
                .expect("lost() at the deadline: a task keeps the guard");
        });
    }

    /// The task ends when the handle and every guard are gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_task_ends_with_its_last_user() {
        let tasks = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
        let before = tasks();
        let keeper = Keeper::new();
        let (v, _lost) = validity(Duration::from_secs(60));
        let kept = keep_now(&keeper, v, Duration::from_secs(60), true, ok());
        assert_eq!(tasks(), before + 1);
        drop(keeper);
        tokio::task::yield_now().await;
        assert_eq!(tasks(), before + 1, "the task ended with a guard still kept");
        drop(kept);
        let until = Instant::now() + Duration::from_secs(10);
        while tasks() > before {
            assert!(Instant::now() < until, "the task outlived its last user");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A guard of a century's TTL (auto-extended or not) is kept like any
    /// other: the timer, which takes nothing beyond about two years, does
    /// not panic, and the task goes on keeping the others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn huge_ttls_do_not_stop_the_keeper() {
        let keeper = Keeper::new();
        // Kept first: if a huge entry killed the task, nobody would lose it.
        let ttl = Duration::from_millis(300);
        let (v, lost) = validity(ttl);
        let _short = keep_now(&keeper, Arc::clone(&v), ttl, false, ok());
        let mut kept = Vec::new();
        for auto_extend in [true, false] {
            let (v, huge_lost) = validity(Duration::MAX);
            kept.push(keep_now(&keeper, v, Duration::MAX, auto_extend, ok()));
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
        let kept = keep_now(&keeper, Arc::clone(&v), Duration::from_secs(60), false, ok());
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
