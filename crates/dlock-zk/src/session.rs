//! A ZooKeeper session: the client, its state, and the signal that fires
//! when the session ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use dlock_core::driver::Drift;
use dlock_core::{Error, LostSignal, LostTrigger, Result};
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
    /// Wakes the heartbeat (on reconnection) and the guards (on news).
    news: Arc<tokio::sync::Notify>,
    timeout: Duration,
    pub(crate) request_timeout: Duration,
    /// The handle's: set when it is abandoned (then nothing more is sent).
    abandoned: Arc<AtomicBool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
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
        });
        let states = tokio::spawn(watch_states(client.state_watcher(), Arc::downgrade(&session)));
        // The heartbeat holds no client of its own: an abandoned handle must
        // drop its connection.
        drop(client);
        let heartbeat = tokio::spawn(heartbeat(Arc::downgrade(&session)));
        session
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend([states, heartbeat]);
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

    /// Resolves when the session's deadline has passed (it may have expired
    /// on the server), or it ended.
    pub(crate) async fn out_of_time(&self) {
        loop {
            if !self.alive() {
                return;
            }
            let at = self.deadline();
            if at <= Instant::now() {
                return;
            }
            let news = self.news.notified();
            // Re-read after arming: an answer in between moved the deadline.
            if self.deadline() != at {
                continue;
            }
            let ended = self.signal.clone();
            tokio::select! {
                () = tokio::time::sleep_until(at.into()) => {}
                () = news => {}
                () = ended.wait() => return,
            }
        }
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
