//! [`EtcdGuard`]: a held lock key, its session, and the fenced write.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Error, FencingToken, Guard, LockKey, LostSignal, LostTrigger, Result};

use crate::error::BACKEND;
use crate::protocol::{self, Conn};
use crate::session::{Following, Session};
use dlock_core::driver::{Outcome, Refusal};
use dlock_core::trace::{self, why};

/// The guard of an etcd grant. Its token is its key's create revision.
///
/// `lost()` fires when the session's lease is, or may be, gone (see
/// [`EtcdLock`](crate::EtcdLock) for sessions). Dropping the guard deletes its key in the
/// background (best effort; the lease is the backstop).
#[must_use = "dropping the guard releases the lock (best effort)"]
pub struct EtcdGuard {
    conn: Arc<Conn>,
    key: LockKey,
    my_key: String,
    my_rev: i64,
    /// The lease the key is on, shared (auto-extend) or the guard's own.
    /// The key stays on it: it is never rewritten.
    session: Arc<Session>,
    lost: LostSignal,
    trigger: LostTrigger,
    watcher: Following,
    released: bool,
}

/// Reports `lost` (once) and fires the guard's signal.
fn lose(trigger: &LostTrigger, key: &LockKey, why: &'static str) {
    dlock_core::driver::lose(trigger, BACKEND, key, why);
}

impl EtcdGuard {
    pub(crate) fn new(
        conn: Arc<Conn>,
        key: LockKey,
        my_key: String,
        my_rev: i64,
        session: Arc<Session>,
    ) -> Self {
        let (trigger, lost) = LostSignal::pair();
        let watcher = session.follow(&trigger, &key);
        EtcdGuard {
            conn,
            key,
            my_key,
            my_rev,
            session,
            lost,
            trigger,
            watcher,
            released: false,
        }
    }

    /// The etcd key this guard holds: `{prefix}{name}/{lease:x}-{n:x}`, the lease in hex and a per-acquire number.
    pub fn etcd_key(&self) -> &str {
        &self.my_key
    }

    /// The lease the key is attached to (for its whole life).
    pub fn lease(&self) -> i64 {
        self.session.lease
    }

    /// Writes `value` at `key` in etcd **only if this guard still holds the
    /// lock**, in one transaction: `If create_revision(lock key) == token,
    /// Then Put(key, value)`. This is the fenced write for resources kept in
    /// etcd itself; `Ok(false)` means the lock was lost and nothing was
    /// written.
    ///
    /// ```no_run
    /// # async fn demo(guard: &dlock_etcd::EtcdGuard) -> dlock_core::Result<()> {
    /// if !guard.put_if_held("config/active", "v42").await? {
    ///     // Someone else holds the lock now: our write was refused.
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when etcd fails (the write
    /// may or may not have happened only if the reply was lost).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after sending may or may not write.
    pub async fn put_if_held(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<bool> {
        let timeout = self.conn.timeout;
        protocol::put_if_owner(
            &self.conn.client,
            &self.my_key,
            self.my_rev,
            key.as_ref(),
            value.as_ref(),
            timeout,
        )
        .await
    }

    fn refusal(&self, found: Outcome) -> Result<()> {
        found.map_err(|r| r.into_error(&self.key))
    }
}

impl std::fmt::Debug for EtcdGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdGuard")
            .field("key", &self.my_key)
            .field("token", &self.my_rev)
            .field("held", &self.is_held())
            .finish()
    }
}

impl Guard for EtcdGuard {
    fn key(&self) -> &LockKey {
        &self.key
    }

    fn token(&self) -> Option<FencingToken> {
        u64::try_from(self.my_rev).ok().map(FencingToken::new)
    }

    fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    fn is_held(&self) -> bool {
        !self.lost.is_lost() && !self.conn.is_abandoned() && self.session.is_alive()
    }

    /// See [`Guard::extend`]. On a shared session the lease is kept alive
    /// anyway: this checks that the session and the key are still there. A
    /// guard with a lease of its own (no auto-extend) has that lease held
    /// for `ttl` from now: a keep-alive now (the lease has its whole TTL
    /// again), then as many more as reach `ttl` (a `ttl` longer than the
    /// lease's), or, for a shorter one, a revoke at the new deadline (see
    /// [`EtcdLock`](crate::EtcdLock)); then a check that the key is still
    /// ours. The key itself is not written: it keeps its revisions, and its
    /// place among Go's `RWMutex` contenders.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the lease or key is gone (fires `lost()`);
    /// [`Error::Unavailable`] when etcd fails.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the lease refreshed at the server and
    /// the guard's deadline where it was; the lock stays held either way.
    async fn extend(&self, ttl: Duration) -> Result<()> {
        dlock_core::driver::check_ttl(BACKEND, ttl)?;
        if self.conn.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this EtcdLock was abandoned"));
        }
        let (client, timeout, session) = (&self.conn.client, self.conn.timeout, &self.session);
        let gone = || session.validity().why().unwrap_or(why::SESSION_ENDED);
        if !session.is_alive() {
            lose(&self.trigger, &self.key, gone());
            return Err(Error::Lost {
                key: self.key.as_str().to_owned(),
            });
        }
        let held = if session.shared {
            Ok(())
        } else {
            session.hold_for(ttl).await?
        };
        let found = match held {
            Err(refusal) => Err(refusal),
            // The deadline passed (and the lease was revoked) meanwhile.
            Ok(()) if !session.is_alive() => Err(Refusal::Expired),
            Ok(()) if protocol::still_ours(client, &self.my_key, self.my_rev, timeout).await? => Ok(()),
            Ok(()) => Err(Refusal::Expired),
        };
        if let Err(refusal) = found {
            lose(&self.trigger, &self.key, refusal.why());
        }
        self.refusal(found)
    }

    /// See [`Guard::release`]: deletes the key if it still has our create
    /// revision.
    ///
    /// # Errors
    ///
    /// [`Error::Lost`] when the key was already gone (lease expired or
    /// revoked); [`Error::Unavailable`] when etcd fails (the lease frees it).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the guard, whose `Drop` deletes the key in
    /// the background.
    async fn release(mut self) -> Result<()> {
        if self.conn.is_abandoned() {
            self.released = true;
            return Err(Error::unavailable(BACKEND, "this EtcdLock was abandoned"));
        }
        // On an error, Drop keeps trying in the background.
        let found =
            match protocol::resign(&self.conn.client, &self.my_key, self.my_rev, self.conn.timeout).await {
                Ok(found) => found,
                Err(e) => return trace::release_result(BACKEND, &self.key, self.token(), Err(e)),
            };
        self.released = true;
        self.trigger.fire();
        trace::release_result(BACKEND, &self.key, self.token(), self.refusal(found))
    }
}

impl Drop for EtcdGuard {
    fn drop(&mut self) {
        self.watcher.stop();
        if !self.released {
            resign_in_background(
                &self.conn,
                std::mem::take(&mut self.my_key),
                Some(self.my_rev),
                &self.session,
            );
        }
    }
}

/// Deletes a contender key in the background (for drops, failed releases
/// and failed clean-ups of timed-out or cancelled acquires), by create
/// revision, or by lease when the revision is not known; retrying until it
/// is gone or its lease is: a key left behind on a lease kept alive would
/// block the lock for good.
pub(crate) fn resign_in_background(
    conn: &Arc<Conn>,
    my_key: String,
    my_rev: Option<i64>,
    session: &Arc<Session>,
) {
    if conn.is_abandoned() {
        return;
    }
    // The session is held until the key is gone: its own drop (a single
    // revoke) must not be the only try.
    let (lease, session, gone_conn, conn) = (
        session.lease,
        Arc::clone(session),
        Arc::clone(conn),
        Arc::clone(conn),
    );
    dlock_core::driver::clean_up_in_background(
        format!("etcd: delete {my_key}"),
        None,
        move || gone_conn.is_abandoned() || !session.is_alive(),
        move || {
            let (conn, my_key) = (Arc::clone(&conn), my_key.clone());
            async move {
                let (client, timeout) = (&conn.client, conn.timeout);
                match my_rev {
                    Some(rev) => protocol::resign(client, &my_key, rev, timeout).await.map(drop),
                    None => protocol::resign_by_lease(client, &my_key, lease, timeout)
                        .await
                        .map(drop),
                }
            }
        },
    );
}
