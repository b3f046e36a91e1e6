//! The scheduler under every task that keeps many guards at once (the
//! [`Keeper`](super::Keeper) of a lease backend's handle, a session
//! backend's guard watcher): an [`Inbox`] the guards post to, and the
//! [`Slots`] the task keeps them in, by when each must be looked at.
//!
//! A guard's arrival or departure is a message in the inbox, and the task
//! is woken only when it must act sooner than it would anyway: a new slot
//! due before the task's next look, a moved deadline, or an inbox grown to
//! [`COMPACT`] messages. The common case (a guard taken and released long
//! before the task must look at it) costs no wake-up at all: a released
//! guard's slot goes with the next look.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// The inbox size at which the task is told to look anyway (so released
/// guards' slots do not pile up while it sleeps); told once, as the inbox
/// reaches it.
pub const COMPACT: usize = 64;

/// What a kept thing tells its task.
pub enum Msg<E> {
    /// A new entry, under its id.
    Keep(u64, E),
    /// The entry of this id is no longer kept (its slot goes).
    Forget(u64),
    /// The entry's wake time moved: look at it again.
    Moved(u64),
}

impl<E> std::fmt::Debug for Msg<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Msg::Keep(id, _) => write!(f, "Keep({id})"),
            Msg::Forget(id) => write!(f, "Forget({id})"),
            Msg::Moved(id) => write!(f, "Moved({id})"),
        }
    }
}

/// What one kept thing must say to be scheduled.
pub trait Slot {
    /// When the task must look at it next.
    fn wake(&self) -> Instant;

    /// Nothing is left to keep (released, lost): it gets no slot.
    fn gone(&self) -> bool {
        false
    }
}

/// How [`Inbox::keep`] took an entry.
#[derive(Debug)]
pub enum Taken<E> {
    /// In the inbox of the running task (told when it must look sooner).
    Queued,
    /// In the inbox, and no task runs: the caller starts one.
    Start,
    /// The inbox is closed for good: the entry comes back.
    Closed(E),
}

/// The messages waiting for the task, and how to tell it to read them.
#[derive(Debug)]
pub struct Inbox<E> {
    state: Mutex<State<E>>,
    notify: tokio::sync::Notify,
    next_id: AtomicU64,
    /// How often the task was told to look (tests read it).
    told: AtomicU64,
}

#[derive(Debug)]
struct State<E> {
    msgs: Vec<Msg<E>>,
    /// A task reads this inbox.
    running: bool,
    /// Closed for good (no task will read it again).
    closed: bool,
    /// When the task will look without being told (`None`: only when told).
    looks_by: Option<Instant>,
}

impl<E> Default for Inbox<E> {
    fn default() -> Self {
        Inbox {
            state: Mutex::new(State {
                msgs: Vec::new(),
                running: false,
                closed: false,
                looks_by: None,
            }),
            notify: tokio::sync::Notify::new(),
            next_id: AtomicU64::new(0),
            told: AtomicU64::new(0),
        }
    }
}

impl<E> Inbox<E> {
    /// An inbox for a task started later (see [`Taken::Start`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// An inbox whose task runs already (started with it).
    pub fn running() -> Self {
        let inbox = Self::default();
        inbox.state().running = true;
        inbox
    }

    fn state(&self) -> MutexGuard<'_, State<E>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the task.
    pub fn tell(&self) {
        self.told.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }

    /// How often the task was told to look.
    pub fn told(&self) -> u64 {
        self.told.load(Ordering::Relaxed)
    }

    /// When the task will look next without being told.
    pub fn looks_by(&self) -> Option<Instant> {
        self.state().looks_by
    }

    /// How many messages wait.
    pub fn waiting(&self) -> usize {
        self.state().msgs.len()
    }

    /// A task reads this inbox.
    pub fn is_running(&self) -> bool {
        self.state().running
    }

    /// Resolves when the task is told to look (see [`tokio::sync::Notify`]).
    pub async fn told_to_look(&self) {
        self.notify.notified().await;
    }

    /// Puts a new entry in, due at `wake`, under a fresh id; tells the
    /// task when it must look before it would anyway. With no task running
    /// and the inbox not closed, the caller must start one ([`Taken::Start`]:
    /// it reads the inbox first).
    pub fn keep(&self, entry: E, wake: Instant) -> (u64, Taken<E>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state();
        if state.closed {
            return (id, Taken::Closed(entry));
        }
        state.msgs.push(Msg::Keep(id, entry));
        if !state.running {
            state.running = true;
            state.looks_by = Some(Instant::now());
            return (id, Taken::Start);
        }
        if state.looks_by.is_none_or(|at| wake < at) || state.msgs.len() == COMPACT {
            state.looks_by = Some(Instant::now());
            drop(state);
            self.tell();
        }
        (id, Taken::Queued)
    }

    /// Puts `msg` in; tells the task when `urgent` or the inbox is full.
    /// Nothing when no task runs (its slots went with it).
    pub fn post(&self, msg: Msg<E>, urgent: bool) {
        let mut state = self.state();
        if !state.running {
            return;
        }
        state.msgs.push(msg);
        if urgent || state.msgs.len() == COMPACT {
            state.looks_by = Some(Instant::now());
            drop(state);
            self.tell();
        }
    }

    /// The task takes what waits.
    pub fn read(&self) -> Vec<Msg<E>> {
        std::mem::take(&mut self.state().msgs)
    }

    /// The task is about to sleep until `next` (`None`: until told):
    /// `false` when messages came meanwhile (read them first).
    pub fn sleep_until(&self, next: Option<Instant>) -> bool {
        let mut state = self.state();
        if !state.msgs.is_empty() {
            return false;
        }
        state.looks_by = next;
        true
    }

    /// The task ended (however: call it from a drop guard): no task runs,
    /// and what waited is returned (entries the task never read). `for_good`
    /// closes the inbox: a later [`keep`](Self::keep) gets its entry back.
    pub fn ended(&self, for_good: bool) -> Vec<Msg<E>> {
        let mut state = self.state();
        state.running = false;
        state.closed |= for_good;
        state.looks_by = None;
        std::mem::take(&mut state.msgs)
    }
}

/// The entries a task keeps, and when each must be looked at: a heap of
/// wake times (an entry rescheduled or forgotten leaves a stale one behind,
/// skipped when it comes up and swept when stale ones outnumber the live).
#[derive(Debug)]
pub struct Slots<E> {
    entries: HashMap<u64, (Instant, E)>,
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl<E> Default for Slots<E> {
    fn default() -> Self {
        Slots {
            entries: HashMap::new(),
            heap: BinaryHeap::new(),
        }
    }
}

impl<E: Slot> Slots<E> {
    /// Applies what the inbox said.
    pub fn apply(&mut self, msgs: Vec<Msg<E>>) {
        for msg in msgs {
            match msg {
                Msg::Keep(id, entry) => self.schedule(id, entry),
                Msg::Forget(id) => drop(self.take(id)),
                Msg::Moved(id) => {
                    if let Some(entry) = self.take(id) {
                        self.schedule(id, entry);
                    }
                }
            }
        }
    }

    /// Keeps `entry` until its wake time.
    pub fn schedule(&mut self, id: u64, entry: E) {
        if entry.gone() {
            return;
        }
        let at = entry.wake();
        self.entries.insert(id, (at, entry));
        self.heap.push(Reverse((at, id)));
        if self.heap.len() > 2 * self.entries.len() + COMPACT {
            self.heap = self
                .entries
                .iter()
                .map(|(id, (at, _))| Reverse((*at, *id)))
                .collect();
        }
    }

    /// The entry of `id`, out of its slot.
    pub fn take(&mut self, id: u64) -> Option<E> {
        self.entries.remove(&id).map(|(_, entry)| entry)
    }

    /// The earliest live wake time, stale ones dropped on the way.
    pub fn next_wake(&mut self) -> Option<Instant> {
        while let Some(&Reverse((at, id))) = self.heap.peek() {
            if self.entries.get(&id).is_some_and(|(live, _)| *live == at) {
                return Some(at);
            }
            self.heap.pop();
        }
        None
    }

    /// The first entry due by `now`, out of its slot.
    pub fn due(&mut self, now: Instant) -> Option<(u64, E)> {
        let at = self.next_wake()?;
        if at > now {
            return None;
        }
        let Reverse((_, id)) = self.heap.pop()?;
        self.take(id).map(|entry| (id, entry))
    }

    /// No entry is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry, out of its slot.
    pub fn drain(&mut self) -> impl Iterator<Item = E> + use<E> {
        self.heap.clear();
        std::mem::take(&mut self.entries).into_values().map(|(_, e)| e)
    }
}
