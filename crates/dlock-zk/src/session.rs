//! A ZooKeeper session: the client, its state, and the signal that fires
//! when the session ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use dlock_core::{Error, LostSignal, LostTrigger, Result};
use tokio::task::JoinHandle;
use zookeeper_client::{Client, SessionState};

use crate::config::ZkConfig;
use crate::lock::{BACKEND, map_err};

/// One session. Curator's words for its states: while disconnected the
/// session is SUSPENDED (`connected()` false: a holder cannot be sure it still
/// holds); when it expires it is LOST (`lost()` fires: the server deleted the
/// session's nodes).
pub(crate) struct Session {
    /// Taken out (and so dropped) when the handle is abandoned.
    client: Mutex<Option<Client>>,
    connected: Arc<AtomicBool>,
    lost: LostTrigger,
    signal: LostSignal,
    task: JoinHandle<()>,
}

impl Session {
    /// Connects a new session.
    pub(crate) async fn open(config: &ZkConfig) -> Result<Arc<Self>> {
        let mut connector = Client::connector()
            .with_session_timeout(config.session_timeout)
            .with_connection_timeout(config.connect_timeout)
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
        let (lost, signal) = LostSignal::pair();
        let connected = Arc::new(AtomicBool::new(true));
        let mut states = client.state_watcher();
        let (flag, trigger) = (Arc::clone(&connected), lost.clone());
        let task = tokio::spawn(async move {
            loop {
                match states.changed().await {
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                        flag.store(true, Ordering::SeqCst)
                    }
                    SessionState::Disconnected => flag.store(false, Ordering::SeqCst),
                    // Expired, closed, auth failed: terminal.
                    _ => {
                        flag.store(false, Ordering::SeqCst);
                        trigger.fire();
                        return;
                    }
                }
            }
        });
        Ok(Arc::new(Session {
            client: Mutex::new(Some(client)),
            connected,
            lost,
            signal,
            task,
        }))
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

    /// `true` while connected (not SUSPENDED) and not expired.
    pub(crate) fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst) && !self.lost.is_fired()
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
        self.task.abort();
    }
}
