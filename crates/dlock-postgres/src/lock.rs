//! [`PostgresLock`]: connecting, acquiring, waiting, and the operator views.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::driver::saturating_add;
use dlock_core::{
    AcquireOptions, Capabilities, Claim, Error, Fencing, FencingToken, Holder, Lock, LockKey, Result, Wait,
    Waiting,
};

use crate::config::PostgresConfig;
use crate::error::BACKEND;
use crate::guard::PostgresGuard;
use crate::protocol::{Conn, Found, MIN_TTL};

/// The fallback poll while waiting, jittered between half and all of this,
/// and never longer than the holder's remaining TTL.
const POLL: Duration = Duration::from_millis(150);

/// A lock backend on one PostgreSQL database: a lease table.
///
/// Cheap to clone: clones share two connections, each opened again when
/// it is lost: one for acquires and the operator views (release notices
/// arrive on it), one for the guards' extends and releases (so that an
/// acquire waiting on a row lock does not hold up the renewals). See the
/// [crate docs](crate) for the protocol.
#[derive(Clone)]
pub struct PostgresLock {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Arc<Conn>,
    host: String,
}

impl PostgresLock {
    /// Connects, creating the lock table if it is absent (and
    /// [`create_table`](PostgresConfig::create_table) allows).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for a bad URL, table name or timeout, a
    ///   database that does not exist, refused credentials, a missing
    ///   table that may not be created, or a lock table whose columns are
    ///   not of the types the driver reads (a `fence` that is not `bigint`:
    ///   the message says which column, which type, and what to run);
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
        // Its errors name the endpoint (`host:port/database`).
        let conn = Conn::connect(&config).await?;
        Ok(PostgresLock {
            inner: Arc::new(Inner {
                conn,
                host: dlock_core::driver::host_name(),
            }),
        })
    }

    /// The configuration this handle was connected with.
    pub fn config(&self) -> &PostgresConfig {
        self.inner.conn.config()
    }

    /// Deletes the rows of names nobody has held for longer than `idle`
    /// (whose `lock_until` passed more than `idle` ago); returns how many.
    /// What [`PostgresConfig::prune_after`] does hourly.
    ///
    /// A released row stays in the table, with its fence, so the table
    /// has one row per name ever locked. A pruned name's next grant starts
    /// a new row, and its token is still higher than the pruned one: a
    /// token is `max(fence + 1, server clock in µs)`, and the clock term
    /// has passed the old fence unless the server's clock went back by more
    /// than `idle` since (the assumption a failover makes already). So keep
    /// `idle` well above any clock step you expect: a day is a good bound;
    /// `Duration::ZERO` (every row not held now) is for tests.
    ///
    /// The statement scans the table (it has no index on `lock_until`).
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when PostgreSQL cannot be reached or does not
    /// answer within the request timeout; [`Error::Backend`] when it refuses
    /// (a role without the `DELETE` right on the table).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not leave the rows deleted; either
    /// way nothing held is touched.
    pub async fn prune(&self, idle: Duration) -> Result<u64> {
        self.inner.conn.prune(idle).await
    }

    fn is_abandoned(&self) -> bool {
        self.inner.conn.is_abandoned()
    }

    /// One attempt. If the call is dropped or times out before the
    /// statement's answer is read, the answer is followed in the
    /// background and a grant nobody received is released (see the
    /// protocol's docs).
    async fn attempt(&self, key: &LockKey, ttl: Duration) -> Result<(Found, Arc<str>, Instant)> {
        let value: Arc<str> = dlock_core::driver::owner_value(&self.inner.host).into();
        let (found, sent) = self.inner.conn.acquire(key.as_str(), &value, ttl).await?;
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
        Capabilities::new(Fencing::Strict, false, Waiting::Notified, MIN_TTL).with_holders()
    }

    /// See [`Lock::abandon`].
    /// Drops the connections without releasing anything, as if this process
    /// had died: the keeper stops, guards' drops release nothing, and the
    /// rows expire by their TTL. For tests and for shutdown paths that must
    /// not block.
    ///
    /// # Cancel safety
    ///
    /// The handle is marked abandoned at once.
    async fn abandon(&self) {
        self.inner.conn.abandon().await;
    }

    /// See [`Lock::keys_in_use`]: the names held now.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when PostgreSQL fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    async fn keys_in_use(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(dlock_core::driver::names(self.inner.conn.in_use(prefix).await?))
    }

    /// See [`Lock::holders`]: the holder of the name's row while its
    /// lease runs (at most one: mutexes only). `id` is
    /// `schema.table/name`, `detail` the row's `locked_by` (`dlock1 <nonce>
    /// <host> <pid> <unix ms>` when dlock wrote it; ShedLock writes its host
    /// name), `token` its fence (`None` for a row ShedLock inserted, whose
    /// fence is 0; ShedLock leaves the fence alone, so a row it re-locks
    /// after dlock shows dlock's last token), `remaining` what is left of
    /// its lease.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when PostgreSQL fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    async fn holders(&self, key: &LockKey) -> Result<Vec<Holder>> {
        let config = self.config();
        let found = self.inner.conn.holder(key.as_str()).await?;
        Ok(found
            .into_iter()
            .map(|row| Holder {
                role: dlock_core::Role::Mutex,
                id: format!("{}.{}/{}", config.schema, config.table, key.as_str()),
                since: dlock_core::driver::Owner::from_value(row.locked_by.trim_end())
                    .and_then(|o| o.since()),
                detail: row.locked_by,
                // A row ShedLock inserted has no token (fence 0).
                token: u64::try_from(row.fence).ok().filter(|&t| t > 0),
                remaining: row.remaining,
            })
            .collect())
    }

    /// See [`Lock::grant`]: mutexes only ([`Claim::Mutex`]; the others are
    /// refused with [`Error::Unsupported`] before this is called). One
    /// statement per attempt (an insert, or the take-over of an expired
    /// row); a waiter is woken by the release's `NOTIFY`, polling
    /// (jittered, at most the holder's remaining TTL) as a fallback.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the wait runs out; [`Error::Unavailable`]
    /// when PostgreSQL cannot be reached or does not answer within the
    /// request timeout; [`Error::Backend`] when it answers oddly;
    /// [`Error::InvalidConfig`] when a new connection finds the table's
    /// columns of other types. Every message names the endpoint and, for
    /// what the server said, its message and SQLSTATE. A serialization
    /// failure or a deadlock (`REPEATABLE READ` or `SERIALIZABLE` set on
    /// the database or role, where the driver cannot pin `READ COMMITTED`)
    /// is not an error: the attempt is made again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the answer of an attempt the dropped call did not see
    /// is awaited in the background, and a grant is released.
    async fn grant(&self, key: &LockKey, claim: Claim, opts: AcquireOptions) -> Result<PostgresGuard> {
        match claim {
            Claim::Mutex => self.take(key, opts).await,
            other => Err(other.unsupported(BACKEND)),
        }
    }
}
