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
use crate::error::{BACKEND, map_err};

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
    request_timeout: Duration,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Session {
    /// Connects a new session.
    pub(crate) async fn open(config: &ZkConfig) -> Result<Arc<Self>> {
        let mut connector = Client::connector()
            .with_session_timeout(config.session_timeout)
            // Also how long the library waits for a silent server before it
            // reconnects: at most 3/10 of the session, so a short outage
            // (detected, one failed attempt, reconnected) heals before the
            // session's own deadline at 9/10.
            .with_connection_timeout(config.connect_timeout.min(config.session_timeout * 3 / 10))
            // Dropping the last handle must not close the session: a crash is
            // simulated that way (`abandon`), and a closed session would look
            // like a clean release to everyone else.
            .with_detached();
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        let client =
            match tokio::time::timeout(config.connect_timeout, connector.connect(&config.connect)).await {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    return Err(match map_err(e) {
                        Error::Backend { source, .. } => Error::Unavailable {
                            backend: BACKEND,
                            source,
                        },
                        other => other,
                    });
                }
                Err(_) => {
                    return Err(Error::unavailable(
                        BACKEND,
                        format!(
                            "no zookeeper server of {:?} answered within {:?}",
                            config.connect, config.connect_timeout
                        ),
                    ));
                }
            };
        // The connect may have taken most of the session: the deadline
        // starts from a sync (through the leader) sent after it.
        let sent = Instant::now();
        match tokio::time::timeout(config.request_timeout, client.sync("/")).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(map_err(e)),
            Err(_) => {
                return Err(Error::unavailable(
                    BACKEND,
                    "zookeeper did not answer a sync after connecting",
                ));
            }
        }
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
        self.client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
        let answered = tokio::time::timeout(timeout.min(period * 5), client.sync("/"))
            .await
            .is_ok_and(|r| r.is_ok());
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
