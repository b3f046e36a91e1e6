//! A ZooKeeper session: the client, its state, and the signal that fires
//! when the session ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use dlock_core::driver::{Drift, Inbox, Msg, Slot, Slots, Taken, Validity, saturating_add};
use dlock_core::trace::why;
use dlock_core::{Error, LockKey, LostSignal, LostTrigger, Result};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::task::JoinHandle;
use zookeeper_client::{Client, SessionState};

use crate::config::ZkConfig;
use crate::error::BACKEND;
use crate::protocol;

/// The slack taken off the session timeout: a tenth of it (plus 2 ms). More
/// than the lock drift, because the server rounds session expiry to its
/// ticks and, in an ensemble, learns of a client's requests from its
/// follower only at the follower's next tick.
const SESSION_DRIFT: Drift = Drift::with_factor_tenth();

/// One session. Curator's words for its states: while disconnected the
/// session is SUSPENDED (`connected()` false: a holder cannot be sure it still
/// holds); when it expires it is LOST (`lost()` fires: the server deleted the
/// session's nodes).
///
/// The server may expire the session (and hand its locks on) one session
/// timeout after it last heard from us; the client library declares it
/// expired only at 7/5 of that. So the session also keeps its own deadline:
/// the send time of the last request the server answered (a heartbeat every
/// tenth of the timeout, and the driver's own requests), plus the timeout,
/// minus drift. Past it, a guard cannot know it still holds: it fires
/// `lost()` (Curator's advice: treat SUSPENDED as lost for locks).
pub(crate) struct Session {
    /// Taken out (and so dropped) when the handle is abandoned.
    client: Mutex<Option<Client>>,
    connected: Arc<AtomicBool>,
    lost: LostTrigger,
    signal: LostSignal,
    /// Send time of the last request the server answered.
    heard: Mutex<Instant>,
    /// Wakes the heartbeat (on reconnection).
    news: Arc<tokio::sync::Notify>,
    timeout: Duration,
    pub(crate) request_timeout: Duration,
    /// The handle's: set when it is abandoned (then nothing more is sent).
    abandoned: Arc<AtomicBool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The guards on this session, watched by one task.
    watched: Arc<Watched>,
}

impl Session {
    /// Connects a new session for a handle whose abandonment `abandoned`
    /// tells.
    pub(crate) async fn open(config: &ZkConfig, abandoned: Arc<AtomicBool>) -> Result<Arc<Self>> {
        let client = protocol::connect(config).await?;
        // The connect may have taken most of the session: the deadline
        // starts from a sync (through the leader) sent after it.
        let sent = Instant::now();
        protocol::sync(&client, config.request_timeout).await?;
        let (lost, signal) = LostSignal::pair();
        let connected = Arc::new(AtomicBool::new(true));
        let session = Arc::new(Session {
            timeout: client.session_timeout(),
            client: Mutex::new(Some(client.clone())),
            connected,
            lost,
            signal,
            heard: Mutex::new(sent),
            news: Arc::new(tokio::sync::Notify::new()),
            request_timeout: config.request_timeout,
            abandoned,
            tasks: Mutex::new(Vec::new()),
            watched: Arc::default(),
        });
        let states = tokio::spawn(watch_states(client.state_watcher(), Arc::downgrade(&session)));
        let guards = tokio::spawn(watch_guards(
            Arc::downgrade(&session),
            Arc::clone(&session.watched),
            session.lost(),
        ));
        // The heartbeat holds no client of its own: an abandoned handle must
        // drop its connection.
        drop(client);
        let heartbeat = tokio::spawn(heartbeat(Arc::downgrade(&session)));
        session
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend([states, heartbeat, guards]);
        Ok(session)
    }

    /// The server answered a request sent at `sent`.
    pub(crate) fn answered(&self, sent: Instant) {
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        if sent > *heard {
            *heard = sent;
        }
    }

    /// Until when the server cannot have expired this session: the send time
    /// of the last answered request, plus the timeout, minus drift.
    pub(crate) fn deadline(&self) -> Instant {
        let heard = *self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        SESSION_DRIFT.deadline(heard, self.timeout)
    }

    /// A handle on the client for one call.
    pub(crate) fn client(&self) -> Result<Client> {
        let mut client = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        // Abandoned: the connection goes at the first use after (the
        // heartbeat's, within a tenth of the session), whichever session
        // this is (one opened in a race with `abandon`, one a guard keeps).
        if self.is_abandoned() {
            client.take();
        }
        client
            .clone()
            .ok_or_else(|| Error::unavailable(BACKEND, "this ZkLock was abandoned"))
    }

    /// The negotiated session timeout.
    pub(crate) fn timeout(&self) -> Option<std::time::Duration> {
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Client::session_timeout)
    }

    /// `true` while connected (not SUSPENDED), not expired, and within the
    /// session's [`deadline`](Self::deadline).
    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst) && !self.lost.is_fired() && Instant::now() < self.deadline()
    }

    /// `true` until the session ended.
    pub(crate) fn alive(&self) -> bool {
        !self.lost.is_fired()
    }

    /// Fires when the session has ended (expired, closed).
    pub(crate) fn lost(&self) -> LostSignal {
        self.signal.clone()
    }

    /// Whether the handle was abandoned.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// Drops this handle's client without closing the session, as a crash.
    pub(crate) fn abandon(&self) {
        self.client.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

impl Session {
    /// Watches a guard's node until [`Watching`] is dropped: its `trigger`
    /// fires (reporting `lost` for `key`) when the session ends, when its
    /// deadline passes (then the node is deleted if the session lives on),
    /// when someone deletes the node (watched from [`WATCH_AFTER`] after
    /// now on), or when `own_ttl` runs out (the node is deleted). At once
    /// if the session already ended or is out of time.
    pub(crate) fn watch(
        self: &Arc<Self>,
        trigger: &LostTrigger,
        key: &LockKey,
        path: Arc<str>,
        own_ttl: Option<Arc<Validity>>,
    ) -> Watching {
        let watched = Arc::clone(&self.watched);
        let stopped = Arc::new(AtomicBool::new(false));
        let entry = Entry {
            stopped: Arc::clone(&stopped),
            trigger: trigger.clone(),
            key: key.clone(),
            path,
            own_ttl,
            watch_at: saturating_add(Instant::now(), WATCH_AFTER),
            watching: false,
        };
        // Out of time: lost at once (the inbox is closed once the session
        // ended), and given no slot (`id` is `None`: its drop must not
        // touch another guard's slot).
        let (id, lost) = match self.out_of_time() {
            Some(why) => (None, Some((entry, why))),
            None => {
                let wake = entry.wake();
                match watched.inbox.keep(entry, wake) {
                    (_, Taken::Closed(entry)) => (None, Some((entry, why::SESSION_ENDED))),
                    (id, Taken::Queued | Taken::Start) => (Some(id), None),
                }
            }
        };
        if let Some((entry, why)) = lost {
            let give_up = why != why::SESSION_ENDED;
            entry.lose(why);
            if give_up && self.alive() {
                delete_in_background(self, entry.path.to_string());
            }
        }
        Watching { watched, id, stopped }
    }

    /// Why a guard of this session cannot be watched now: the session
    /// ended, or its deadline passed.
    fn out_of_time(&self) -> Option<&'static str> {
        if !self.alive() {
            Some(why::SESSION_ENDED)
        } else if Instant::now() >= self.deadline() {
            Some(why::SESSION_SILENT)
        } else {
            None
        }
    }
}

/// How long a guard holds before its node is watched (for someone else
/// deleting it): a short hold (most holds) sends no request for it; a
/// deletion is noticed at most that much later.
pub(crate) const WATCH_AFTER: Duration = Duration::from_millis(50);

/// The guards on one session, watched by one task on the core's
/// scheduler: the task is told only when it must act before its next look
/// (as the core's `Keeper` is), so a guard released within
/// [`WATCH_AFTER`] costs it no wake-up.
pub(crate) struct Watched {
    inbox: Inbox<Entry>,
}

impl Default for Watched {
    fn default() -> Self {
        // The task starts with the session.
        Watched {
            inbox: Inbox::running(),
        }
    }
}

struct Entry {
    /// Set by the guard before it deletes its node (a release): its
    /// deletion is then no loss.
    stopped: Arc<AtomicBool>,
    trigger: LostTrigger,
    key: LockKey,
    path: Arc<str>,
    own_ttl: Option<Arc<Validity>>,
    watch_at: Instant,
    /// Its node's deletion watch was started.
    watching: bool,
}

impl Slot for Entry {
    fn wake(&self) -> Instant {
        let ttl = self.own_ttl.as_ref().map(|v| v.deadline());
        match (self.watching, ttl) {
            (false, Some(t)) => t.min(self.watch_at),
            (false, None) => self.watch_at,
            (true, Some(t)) => t,
            (true, None) => saturating_add(Instant::now(), LONGEST_SLEEP),
        }
    }
}

impl Entry {
    fn lose(&self, why: &'static str) {
        if !self.stopped.load(Ordering::SeqCst) {
            dlock_core::driver::lose(&self.trigger, BACKEND, &self.key, why);
        }
    }
}

/// A guard's place among its session's watched guards; dropping it
/// leaves (the slot goes with the task's next look).
pub(crate) struct Watching {
    watched: Arc<Watched>,
    /// Its slot (`None`: lost at once, never kept).
    id: Option<u64>,
    stopped: Arc<AtomicBool>,
}

impl Watching {
    /// No longer watched (idempotent): call it before the guard deletes
    /// its node, so that the deletion is not taken for a loss.
    pub(crate) fn stop(&self) {
        if !self.stopped.swap(true, Ordering::SeqCst)
            && let Some(id) = self.id
        {
            self.watched.inbox.post(Msg::Forget(id), false);
        }
    }

    /// The guard's own deadline moved (a confirmed extend): the task looks
    /// again now, so a deadline moved earlier is kept too.
    pub(crate) fn moved(&self) {
        if !self.stopped.load(Ordering::SeqCst)
            && let Some(id) = self.id
        {
            self.watched.inbox.post(Msg::Moved(id), true);
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The longest the guards' task sleeps before it looks again.
const LONGEST_SLEEP: Duration = Duration::from_secs(30 * 24 * 3600);

type Deletion = Pin<Box<dyn Future<Output = u64> + Send>>;

/// The guards' task: one per session. Fires every guard when the session
/// ends or runs out of time; a guard when its node is deleted or its own
/// TTL runs out. Holds the session weakly (it ends with it).
async fn watch_guards(session: Weak<Session>, watched: Arc<Watched>, ended: LostSignal) {
    let mut task = Ending {
        watched,
        session: session.clone(),
        slots: Slots::default(),
    };
    let (watched, slots) = (Arc::clone(&task.watched), &mut task.slots);
    let mut deletions: FuturesUnordered<Deletion> = FuturesUnordered::new();
    loop {
        let Some(s) = session.upgrade() else {
            return;
        };
        slots.apply(watched.inbox.read());
        if !s.alive() {
            // `Ending` fires every guard.
            return;
        }
        let now = Instant::now();
        let in_time = now < s.deadline();
        if !in_time {
            // The server may have expired the session and granted the
            // locks elsewhere: every node must go, if the session lives on.
            // (Until it is heard from again, a new guard is fired at once.)
            for entry in slots.drain() {
                entry.lose(why::SESSION_SILENT);
                delete_in_background(&s, entry.path.to_string());
            }
        }
        while let Some((id, mut entry)) = slots.due(now) {
            if entry.own_ttl.as_ref().is_some_and(|v| v.deadline() <= now) {
                entry.lose(why::DEADLINE);
                delete_in_background(&s, entry.path.to_string());
                continue;
            }
            if !entry.watching && entry.watch_at <= now {
                entry.watching = true;
                let (session, path) = (session.clone(), Arc::clone(&entry.path));
                deletions.push(Box::pin(async move {
                    let client = || session.upgrade().and_then(|s| s.client().ok());
                    crate::protocol::node_deleted(client, &path).await;
                    id
                }));
            }
            slots.schedule(id, entry);
        }
        // No guard: nothing to look at until one comes (a guard that comes
        // while the session is out of time is lost at once).
        let next = (!slots.is_empty()).then(|| {
            let next = if in_time {
                s.deadline()
            } else {
                // Heard from again? Look every tenth of the session.
                saturating_add(now, (s.timeout / 10).max(Duration::from_millis(20)))
            };
            slots.next_wake().map_or(next, |at| at.min(next))
        });
        drop(s);
        if !watched.inbox.sleep_until(next) {
            continue;
        }
        tokio::select! {
            () = watched.inbox.told_to_look() => {}
            () = tokio::time::sleep_until(next.unwrap_or(now).into()), if next.is_some() => {}
            () = ended.wait() => {}
            Some(id) = deletions.next(), if !deletions.is_empty() => {
                if let Some(entry) = slots.take(id) {
                    entry.lose(why::DELETED);
                }
            }
        }
    }
}

/// The guards' task's state. However the task ends (the session ended or
/// went, a panic, its runtime shutting down), this fires every guard it
/// watched or was told of, marks the session's guards as no longer
/// watched (a new one is lost at once), and ends the session, so its
/// handle opens another: nobody would otherwise tell those guards.
struct Ending {
    watched: Arc<Watched>,
    session: Weak<Session>,
    slots: Slots<Entry>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        // The session ends before any guard is told: an acquire made the
        // instant a guard reads lost opens a new session, not this one.
        if let Some(session) = self.session.upgrade() {
            session.lost.fire();
        }
        self.slots.apply(self.watched.inbox.ended(true));
        for entry in self.slots.drain() {
            entry.lose(why::SESSION_ENDED);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
    }
}

/// Follows the client's session states: SUSPENDED while disconnected, LOST
/// (the signal fires) when terminal; a reconnection wakes the heartbeat.
async fn watch_states(mut states: zookeeper_client::StateWatcher, session: Weak<Session>) {
    loop {
        let state = states.changed().await;
        let Some(session) = session.upgrade() else {
            return;
        };
        match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                session.connected.store(true, Ordering::SeqCst);
                session.news.notify_waiters();
            }
            SessionState::Disconnected => session.connected.store(false, Ordering::SeqCst),
            // Expired, closed, auth failed: terminal.
            _ => {
                session.connected.store(false, Ordering::SeqCst);
                session.lost.fire();
                session.news.notify_waiters();
                return;
            }
        }
    }
}

/// One cheap read every tenth of the session timeout (and at once after a
/// reconnection), so the session's deadline follows the server's view.
async fn heartbeat(session: Weak<Session>) {
    loop {
        let (client, period, timeout) = {
            let Some(s) = session.upgrade() else {
                return;
            };
            if !s.alive() {
                return;
            }
            let Ok(client) = s.client() else {
                return;
            };
            (
                client,
                (s.timeout / 10).max(Duration::from_millis(20)),
                s.request_timeout,
            )
        };
        let news = match session.upgrade() {
            Some(s) => Arc::clone(&s.news),
            None => return,
        };
        // Armed before the request: a reconnection during it is not missed.
        let reconnected = news.notified();
        let sent = Instant::now();
        // `sync` goes through the leader: a follower cut off from it cannot
        // answer, so an answer means the ensemble still hears us.
        let answered = protocol::sync(&client, timeout.min(period * 5)).await.is_ok();
        drop(client);
        let Some(s) = session.upgrade() else {
            return;
        };
        if answered {
            s.answered(sent);
        }
        drop(s);
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = reconnected => {}
        }
    }
}

/// Deletes a node in the background (drops, failed or timed-out clean-ups,
/// a guard that ran out of time), retrying until it is gone or the session
/// ended.
pub(crate) fn delete_in_background(session: &Arc<Session>, path: String) {
    if session.is_abandoned() {
        return;
    }
    let timeout = session.request_timeout;
    let (session, gone_session) = (Arc::clone(session), Arc::clone(session));
    dlock_core::driver::clean_up_in_background(
        format!("zookeeper: delete {path}"),
        None,
        move || gone_session.is_abandoned() || !gone_session.alive(),
        move || {
            let (session, path) = (Arc::clone(&session), path.clone());
            async move {
                protocol::delete(&session.client()?, &path, timeout)
                    .await
                    .map(drop)
            }
        },
    );
}
