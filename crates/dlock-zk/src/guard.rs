//! [`ZkGuard`]: a held lock node.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::driver::{Drift, Validity};
use dlock_core::{AcquireOptions, Error, FencingToken, Guard, LockKey, LostSignal, LostTrigger, Result};

use crate::error::BACKEND;
use crate::protocol;
use crate::session::{Session, Watching, delete_in_background};
use dlock_core::trace::{self, why};

/// The guard of a ZooKeeper grant. Its token is its node's `czxid`.
///
/// `is_held()` is false while the session is disconnected (SUSPENDED) and
/// true again if it reconnects in time; `lost()` fires when the server may
/// have expired the session (one session timeout, minus drift, after the
/// send time of the last request it answered: before the server can grant
/// the lock to anyone else), when the session expires (LOST), when someone
/// else deletes the node (noticed from 50 ms after the grant on), or, without auto-extend, when the guard's own TTL
/// runs out. When `lost()` fires and the session lives on, the guard deletes
/// its node in the background. Dropping the guard deletes its node in the
/// background.
#[must_use = "dropping the guard releases the lock (best effort)"]
pub struct ZkGuard {
    key: LockKey,
    path: Arc<str>,
    czxid: i64,
    pub(crate) session: Arc<Session>,
    lost: LostSignal,
    trigger: LostTrigger,
    /// The guard's own TTL, without auto-extend (the session's deadline
    /// is the session's).
    own_ttl: Option<Arc<Validity>>,
    /// Its place among the session's watched guards.
    watching: Watching,
    /// A semaphore grant of several permits: the other leases (one node
    /// per permit, as Curator takes them), each watched as the first is.
    more: Vec<More>,
    released: bool,
}

struct More {
    path: Arc<str>,
    czxid: i64,
    watching: Watching,
}

impl ZkGuard {
    pub(crate) fn new(
        key: LockKey,
        path: String,
        czxid: i64,
        session: Arc<Session>,
        opts: AcquireOptions,
    ) -> Self {
        let (trigger, lost) = LostSignal::pair();
        let own_ttl = (!opts.auto_extend).then(|| Validity::new(Instant::now(), opts.ttl, Drift::DEFAULT).0);
        let path: Arc<str> = path.into();
        let watching = session.watch(&trigger, &key, Arc::clone(&path), own_ttl.clone());
        ZkGuard {
            key,
            path,
            czxid,
            session,
            lost,
            trigger,
            own_ttl,
            watching,
            more: Vec::new(),
            released: false,
        }
    }

    /// The same grant holds these nodes too (a semaphore's further
    /// permits): each is watched as the first is, and released with it.
    pub(crate) fn with_more(mut self, nodes: Vec<(String, i64)>) -> Self {
        for (path, czxid) in nodes {
            let path: Arc<str> = path.into();
            let watching =
                self.session
                    .watch(&self.trigger, &self.key, Arc::clone(&path), self.own_ttl.clone());
            self.more.push(More {
                path,
                czxid,
                watching,
            });
        }
        self
    }

    /// Every node this guard holds: the first, then a semaphore grant's
    /// further leases.
    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        std::iter::once(&*self.path).chain(self.more.iter().map(|m| &*m.path))
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
        let in_time = self.own_ttl.as_ref().is_none_or(|v| v.is_valid());
        !self.lost.is_lost() && !self.session.is_abandoned() && self.session.connected() && in_time
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
        dlock_core::driver::check_ttl(BACKEND, ttl)?;
        let lost = || Error::Lost {
            key: self.key.as_str().to_owned(),
        };
        if self.lost.is_lost() || !self.session.alive() {
            lose(&self.trigger, &self.key, why::SESSION_ENDED);
            return Err(lost());
        }
        let sent = Instant::now();
        let client = self.session.client()?;
        // One renewal of the guard's own TTL at a time (a racing one could
        // leave the later deadline of the earlier send).
        let _permit = match &self.own_ttl {
            Some(v) => Some(v.renewal().await),
            None => None,
        };
        let mut ours =
            protocol::still_ours(&client, &self.path, self.czxid, self.session.request_timeout).await?;
        for m in &self.more {
            ours =
                ours && protocol::still_ours(&client, &m.path, m.czxid, self.session.request_timeout).await?;
        }
        // The sync went through the leader: the session was heard then.
        self.session.answered(sent);
        if !ours {
            lose(&self.trigger, &self.key, why::DELETED);
            return Err(lost());
        }
        if let Some(v) = &self.own_ttl {
            if !v.is_valid() {
                return Err(lost());
            }
            v.renewed(sent, ttl);
            self.watching.moved();
            for m in &self.more {
                m.watching.moved();
            }
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
        // Our own delete is no loss.
        self.watching.stop();
        for m in &self.more {
            m.watching.stop();
        }
        let result = self.delete_node().await;
        trace::release_result(BACKEND, &self.key, self.token(), result)
    }
}

impl ZkGuard {
    async fn delete_node(&mut self) -> Result<()> {
        let client = self.session.client()?;
        let timeout = self.session.request_timeout;
        if !self.released {
            let deleted = protocol::delete(&client, &self.path, timeout).await?;
            self.released = true;
            self.trigger.fire();
            deleted.map_err(|r| r.into_error(&self.key))?;
        }
        // Further leases; one that fails is left to `Drop`, with the rest.
        while let Some(m) = self.more.last() {
            let deleted = protocol::delete(&client, &m.path, timeout).await?;
            self.more.pop();
            deleted.map_err(|r| r.into_error(&self.key))?;
        }
        Ok(())
    }
}

/// Reports `lost` (once) and fires the guard's signal.
fn lose(trigger: &LostTrigger, key: &LockKey, why: &'static str) {
    dlock_core::driver::lose(trigger, BACKEND, key, why);
}

impl Drop for ZkGuard {
    fn drop(&mut self) {
        // Its slot in the session's task goes with the task's next look;
        // the signal fires now.
        self.watching.stop();
        for m in &self.more {
            m.watching.stop();
        }
        self.trigger.fire();
        if !self.released {
            delete_in_background(&self.session, self.path.to_string());
        }
        for m in self.more.drain(..) {
            delete_in_background(&self.session, m.path.to_string());
        }
    }
}
