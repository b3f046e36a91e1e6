//! [`PostgresLock`]: connecting, acquiring, waiting, and the operator views.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dlock_core::driver::{OnDrop, saturating_add};
use dlock_core::{
    AcquireOptions, Capabilities, Error, Fencing, FencingToken, Lock, LockKey, Result, Wait, Waiting,
};

use crate::config::PostgresConfig;
use crate::error::BACKEND;
use crate::guard::{PostgresGuard, release_in_background};
use crate::protocol::{Conn, Found, MIN_TTL, new_value};

/// The fallback poll while waiting, jittered between half and all of this,
/// and never longer than the holder's remaining TTL.
const POLL: Duration = Duration::from_millis(150);

/// A lock backend on one PostgreSQL database: a lease table.
///
/// Cheap to clone: clones share one connection (statements pipelined on
/// it, release notices arriving on it), opened again when it is lost. See
/// the [crate docs](crate) for the protocol.
#[derive(Clone)]
pub struct PostgresLock {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Arc<Conn>,
    host: String,
}

/// Who holds a name, for operators: see [`PostgresLock::holder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The row's `locked_by`: `dlock1 <nonce> <host> <pid> <unix ms>` when
    /// dlock wrote it (ShedLock writes its host name).
    pub locked_by: String,
    /// How much longer the grant lives.
    pub remaining: Option<Duration>,
    /// The row's fence: the latest grant's token.
    pub fence: i64,
}

impl Holder {
    /// When the holder acquired, if dlock wrote the row (wall clock;
    /// display only).
    pub fn since(&self) -> Option<SystemTime> {
        let ms: u64 = self.locked_by.split(' ').nth(4)?.parse().ok()?;
        UNIX_EPOCH.checked_add(Duration::from_millis(ms))
    }
}

impl PostgresLock {
    /// Connects, creating the lock table if it is absent (and
    /// [`create_table`](PostgresConfig::create_table) allows).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for a bad URL, table name or timeout, a
    ///   database that does not exist, refused credentials, or a missing
    ///   table that may not be created;
    /// - [`Error::Unavailable`] if the server cannot be reached within
    ///   `connect_timeout`;
    /// - [`Error::Backend`] if the table cannot be created (no permission:
    ///   the message has the statement to run instead).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the half-open connection.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use dlock_postgres::{PostgresConfig, PostgresLock};
    ///
    /// # async fn demo() -> dlock_core::Result<()> {
    /// let lock = PostgresLock::connect(PostgresConfig::from_url("postgres://app@127.0.0.1/app")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: PostgresConfig) -> Result<Self> {
        let conn = Conn::connect(&config)
            .await
            .map_err(|e| e.at(&dlock_core::driver::endpoint_of(&config.url)))?;
        Ok(PostgresLock {
            inner: Arc::new(Inner {
                conn: Arc::new(conn),
                host: dlock_core::driver::host_name(),
            }),
        })
    }

    /// The configuration this handle was connected with.
    pub fn config(&self) -> &PostgresConfig {
        self.inner.conn.config()
    }

    /// Who holds `key` and for how much longer; `None` if nobody does.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when PostgreSQL fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    pub async fn holder(&self, key: &LockKey) -> Result<Option<Holder>> {
        Ok(self.inner.conn.holder(key.as_str()).await?.map(|r| Holder {
            locked_by: r.locked_by,
            remaining: r.remaining,
            fence: r.fence,
        }))
    }

    /// The names held now that start with `prefix`, sorted.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when PostgreSQL fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    pub async fn keys_in_use(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.conn.in_use(prefix).await
    }

    /// Drops the connection without releasing anything, as if this process
    /// had died: the keeper stops, guards' drops release nothing, and the
    /// rows expire by their TTL. For tests and for shutdown paths that must
    /// not block.
    ///
    /// # Cancel safety
    ///
    /// The handle is marked abandoned at once.
    pub async fn abandon(&self) {
        self.inner.conn.abandon().await;
    }

    fn is_abandoned(&self) -> bool {
        self.inner.conn.is_abandoned()
    }

    /// One attempt. If the call is dropped or fails without a definite
    /// answer, a compare-owner release follows in the background, so a
    /// grant nobody receives does not outlive the call.
    async fn attempt(&self, key: &LockKey, ttl: Duration) -> Result<(Found, Arc<str>, Instant)> {
        let value: Arc<str> = new_value(&self.inner.host).into();
        let cleanup = OnDrop::new((), |()| {
            release_in_background(
                &self.inner.conn,
                key.as_str().into(),
                Arc::clone(&value),
                saturating_add(Instant::now(), ttl),
            );
        });
        let sent = Instant::now();
        let found = self.inner.conn.acquire(key.as_str(), &value, ttl).await?;
        cleanup.disarm();
        Ok((found, value, sent))
    }

    async fn take(&self, key: &LockKey, opts: AcquireOptions) -> Result<PostgresGuard> {
        if self.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this PostgresLock was abandoned"));
        }
        let started = Instant::now();
        let ttl = opts.ttl.max(MIN_TTL);
        let deadline = dlock_core::driver::wait_deadline(opts.wait, started);
        let timeout = || Error::Timeout {
            key: key.as_str().to_owned(),
        };
        // Registered before the first attempt: a release between the
        // attempt and the wait is not missed.
        let waiting = self.inner.conn.waiters.wait_on(key.as_str());
        let mut queued = false;
        loop {
            let notified = waiting.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let left = match self.attempt(key, ttl).await? {
                (Found::Granted(token), value, sent) => {
                    return Ok(PostgresGuard::new(
                        Arc::clone(&self.inner.conn),
                        key.clone(),
                        value,
                        FencingToken::new(token),
                        ttl,
                        sent,
                        opts,
                    ));
                }
                (Found::Held(left), _, _) => left,
            };
            let now = Instant::now();
            if opts.wait == Wait::No || deadline.is_some_and(|d| now >= d) {
                return Err(timeout());
            }
            if !queued {
                dlock_core::trace::queued();
                queued = true;
            }
            let mut wake = saturating_add(now, jittered(left));
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }
}

fn jittered(bound: Option<Duration>) -> Duration {
    let poll = POLL / 2 + POLL.mul_f64(rand::random::<f64>() / 2.0);
    match bound {
        // Wake right after the holder's TTL runs out.
        Some(left) => poll.min(left.saturating_add(Duration::from_millis(1))),
        None => poll,
    }
}

impl std::fmt::Debug for PostgresLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLock")
            .field("config", self.config())
            .field("abandoned", &self.is_abandoned())
            .finish()
    }
}

impl Lock for PostgresLock {
    type Guard = PostgresGuard;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, false, Waiting::Notified, MIN_TTL)
    }

    /// See [`Lock::acquire`]: one statement per attempt (an insert, or the
    /// take-over of an expired row); a waiter is woken by the release's
    /// `NOTIFY`, polling (jittered, at most the holder's remaining TTL) as a
    /// fallback.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the wait runs out; [`Error::Unavailable`]
    /// when PostgreSQL cannot be reached or does not answer within the
    /// request timeout; [`Error::Backend`] when it answers oddly.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call sends a compare-owner release for an
    /// attempt whose answer it did not see.
    async fn acquire(&self, key: &LockKey, opts: AcquireOptions) -> Result<PostgresGuard> {
        dlock_core::trace::acquire(BACKEND, key, &opts, self.take(key, opts)).await
    }
}
