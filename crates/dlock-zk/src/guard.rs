//! [`ZkGuard`]: a held lock node.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, FencingToken, Guard, LockKey, LostSignal, LostTrigger, Result};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::lock::ZkLock;
use crate::recipe;
use crate::session::Session;

/// The guard of a ZooKeeper grant. Its token is its node's `czxid`.
///
/// `is_held()` is false while the session is disconnected (SUSPENDED) and
/// true again if it reconnects in time; `lost()` fires when the server may
/// have expired the session (one session timeout, minus drift, after the
/// send time of the last request it answered: before the server can grant
/// the lock to anyone else), when the session expires (LOST), when someone
/// else deletes the node, or, without auto-extend, when the guard's own TTL
/// runs out. When `lost()` fires and the session lives on, the guard deletes
/// its node in the background. Dropping the guard deletes its node in the
/// background.
#[must_use = "dropping the guard releases the lock (best effort)"]
pub struct ZkGuard {
    lock: ZkLock,
    key: LockKey,
    path: String,
    czxid: i64,
    session: Arc<Session>,
    lost: LostSignal,
    trigger: LostTrigger,
    /// The guard's own deadline, without auto-extend.
    deadline: Option<Arc<(Mutex<Instant>, Notify)>>,
    keeper: JoinHandle<()>,
    released: bool,
}

/// Resolves when the node at `path` is deleted (by anyone); pending while
/// the session cannot tell (the session's own signal covers expiry).
async fn node_deleted(session: &Session, path: &str) {
    loop {
        let Ok(client) = session.client() else {
            return std::future::pending().await;
        };
        let looked = client.check_and_watch_stat(path).await;
        // No client kept across the wait: an abandoned handle must drop its
        // connection (that is how a crash is simulated).
        drop(client);
        match looked {
            Ok((None, _)) => return,
            Ok((Some(_), watcher)) => {
                if watcher.changed().await.event_type == zookeeper_client::EventType::NodeDeleted {
                    return;
                }
            }
            Err(zookeeper_client::Error::NoNode) => return,
            // Connection trouble: look again shortly (the session signal
            // reports expiry).
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn local_deadline(sent: Instant, ttl: Duration) -> Instant {
    dlock_core::driver::Drift::DEFAULT.deadline(sent, ttl)
}

impl ZkGuard {
    pub(crate) fn new(
        lock: ZkLock,
        key: LockKey,
        path: String,
        czxid: i64,
        session: Arc<Session>,
        opts: AcquireOptions,
    ) -> Self {
        let (trigger, lost) = LostSignal::pair();
        let deadline = (!opts.auto_extend).then(|| {
            Arc::new((
                Mutex::new(local_deadline(Instant::now(), opts.ttl)),
                Notify::new(),
            ))
        });
        let keeper = {
            let (session_lost, trigger, deadline) = (session.lost(), trigger.clone(), deadline.clone());
            let (lock, session, path) = (lock.clone(), Arc::clone(&session), path.clone());
            tokio::spawn(async move {
                // Boxed, so the idle guard task itself stays small.
                let deleted = Box::pin(node_deleted(&session, &path));
                let out_of_time = Box::pin(session.out_of_time());
                let own_ttl = Box::pin(async {
                    let Some(deadline) = deadline else {
                        return std::future::pending().await;
                    };
                    loop {
                        let at = *deadline.0.lock().unwrap_or_else(PoisonError::into_inner);
                        tokio::select! {
                            () = deadline.1.notified() => {}
                            () = tokio::time::sleep_until(at.into()) => {
                                if *deadline.0.lock().unwrap_or_else(PoisonError::into_inner) <= Instant::now() {
                                    return;
                                }
                            }
                        }
                    }
                });
                let give_up = tokio::select! {
                    // Expired: the server deleted the node.
                    () = session_lost.wait() => false,
                    // Someone deleted the node.
                    () = deleted => false,
                    // The server may have expired the session and granted
                    // the lock to someone else; if the session survives,
                    // the node must go.
                    () = out_of_time => true,
                    // The guard's own TTL ran out: give the lock up.
                    () = own_ttl => true,
                };
                trigger.fire();
                if give_up {
                    lock.delete_in_background(&session, path);
                }
            })
        };
        ZkGuard {
            lock,
            key,
            path,
            czxid,
            session,
            lost,
            trigger,
            deadline,
            keeper,
            released: false,
        }
    }

    /// The lock node this guard holds (full path).
    pub fn node(&self) -> &str {
        &self.path
    }
}

impl std::fmt::Debug for ZkGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkGuard")
            .field("node", &self.path)
            .field("token", &self.czxid)
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard for ZkGuard {
    fn key(&self) -> &LockKey {
        &self.key
    }

    fn token(&self) -> Option<FencingToken> {
        u64::try_from(self.czxid).ok().map(FencingToken::new)
    }

    fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    fn is_held(&self) -> bool {
        let in_time = self
            .deadline
            .as_ref()
            .is_none_or(|d| Instant::now() < *d.0.lock().unwrap_or_else(PoisonError::into_inner));
        !self.lost.is_lost() && !self.lock.is_abandoned() && self.session.connected() && in_time
    }

    /// See [`Guard::extend`]. The node lives with the session, so this
    /// checks that the session and the node are still there and, for a guard
    /// without auto-extend, moves its own deadline to `ttl` from now.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the session expired or the node is gone (fires
    /// `lost()`); [`Error::Unavailable`] while disconnected.
    ///
    /// # Cancel safety
    ///
    /// Read-only until the deadline moves; safe to drop.
    async fn extend(&self, ttl: Duration) -> Result<()> {
        let lost = || Error::Lost {
            key: self.key.as_str().to_owned(),
        };
        if self.lost.is_lost() || !self.session.alive() {
            self.trigger.fire();
            return Err(lost());
        }
        let sent = Instant::now();
        let client = self.session.client()?;
        let timeout = self.lock.inner.config.request_timeout;
        // Through the leader first: a member cut off from it would answer
        // the read from what it last knew.
        recipe::bounded(timeout, client.sync(&self.path)).await?;
        self.session.answered(sent);
        let exists = recipe::bounded(timeout, client.check_stat(&self.path)).await?;
        if exists.is_none_or(|s| s.czxid != self.czxid) {
            self.trigger.fire();
            return Err(lost());
        }
        if let Some(d) = &self.deadline {
            if *d.0.lock().unwrap_or_else(PoisonError::into_inner) <= Instant::now() {
                return Err(lost());
            }
            *d.0.lock().unwrap_or_else(PoisonError::into_inner) = local_deadline(sent, ttl);
            d.1.notify_one();
        }
        Ok(())
    }

    /// See [`Guard::release`]: deletes the node.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the node was already gone (session expired, or
    /// the guard's TTL ran out); [`Error::Unavailable`] when ZooKeeper fails
    /// (the node goes with the session).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the guard, whose `Drop` deletes the node in
    /// the background.
    async fn release(mut self) -> Result<()> {
        self.keeper.abort();
        let client = self.session.client()?;
        let deleted = recipe::delete(&client, &self.path, self.lock.inner.config.request_timeout).await?;
        self.released = true;
        self.trigger.fire();
        if deleted {
            Ok(())
        } else {
            Err(Error::Lost {
                key: self.key.as_str().to_owned(),
            })
        }
    }
}

impl Drop for ZkGuard {
    fn drop(&mut self) {
        self.keeper.abort();
        if !self.released {
            self.lock
                .delete_in_background(&self.session, std::mem::take(&mut self.path));
        }
    }
}
