//! The protocol: the lease table, its statements, and their parsing. The
//! only file that talks to PostgreSQL.
//!
//! One row per name locked, in ShedLock's columns plus `fence` (see
//! [`PostgresConfig::create_table_sql`]); a released row stays (with its
//! fence) until a prune deletes it, long after its last grant. Every time
//! is the server's (`timezone('utc', clock_timestamp())`), never the
//! client's.
//!
//! - **acquire**: one statement, `INSERT ... ON CONFLICT (name) DO UPDATE
//!   ... WHERE lock_until <= now RETURNING fence`: a new row, or the take-over
//!   of an expired one, with the token `max(fence + 1, server clock in µs)`
//!   (a hybrid logical clock, as the Redis driver's: it keeps increasing
//!   when the row is older than the last grant, after a failover to an
//!   asynchronous standby that missed it, or after a prune deleted it).
//!   Refused, the same statement reads how long the holder has left.
//! - **release**: compare `locked_by` (our value, unique per grant) and set
//!   `lock_until` to now (the row stays: ShedLock's way, and the fence with
//!   it), then `pg_notify` the table's channel with the name.
//! - **extend**: compare `locked_by` and move `lock_until`, only while it
//!   is in the future (an expired grant is never revived).
//! - Both report done, expired (ours, past `lock_until`) or held by another.
//! - **prune**: delete the rows whose `lock_until` passed longer ago than a
//!   bound. The next grant of a pruned name starts from the clock term, so
//!   its token is still higher than the pruned fence unless the server's
//!   clock went back by more than the bound (the failover assumption).
//!
//! # Connections
//!
//! A handle has two connections, each opened when first needed and again
//! when lost: the **acquire** lane (acquires, the operator views, prunes,
//! and `LISTEN`) and the **guard** lane (extends and releases). A statement
//! waits on a row lock behind whoever holds the row (another acquire, a
//! `SELECT ... FOR UPDATE`, ShedLock) and a connection runs its statements
//! one after the other: with one connection, an acquire stuck on one name
//! held every renewal of every guard behind it, and guards whose TTL was
//! within a few request timeouts were lost although their rows were fine.
//! Renewals have their own connection instead. A release or an extend
//! stuck on its *own* row (someone holds it `FOR UPDATE`) still delays the
//! guard lane, for at most the request timeout (see below).
//!
//! Every connection pins `default_transaction_isolation` to `read
//! committed` (a startup option), whatever the database or the role sets:
//! under `repeatable read` or `serializable` the statements' re-check of a
//! row another transaction just changed becomes a serialization failure.
//! Where the option is refused (PgBouncer takes only the startup parameters
//! it tracks), the connection is made without it, and a statement that
//! loses a serialization failure or a deadlock (40001, 40P01: rolled back)
//! is sent again, [`CONFLICT_RETRIES`] times; an acquire that keeps losing
//! reports the name held, and a waiting acquire looks again.
//!
//! # A statement without an answer
//!
//! A statement that gets no answer within the request timeout may be stuck
//! behind a row lock or a synchronous standby, and may still commit later:
//! its connection is retired (the next request opens another), and the
//! server is asked to cancel it (a cancel request, as `psql`'s Ctrl-C).
//! Cancelling alone is not enough for an acquire: the request races the
//! statement, and a statement waiting for a synchronous standby has
//! already committed locally. So an acquire statement runs in a task of its
//! own, and when its caller stops waiting (a time-out, or the call
//! dropped), [`Conn::follow_up`] waits for its *answer* in the background:
//! granted, the grant nobody received is released at once; refused with an
//! `ERROR` (cancelled among them), nothing was committed. The clean-up
//! never concludes "nothing to clean" before the statement is known to have
//! ended. Only when no answer comes at all (the connection died, or none
//! within the TTL) is the outcome unknown: then the compare-owner release
//! is tried, as before; a backend that outlives its closed connection and
//! commits later holds the name for one TTL.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use dlock_core::driver::{Keeper, OnDrop, Outcome, Refusal, saturating_add};
use dlock_core::{Error, Result, Unreachable};
use futures::StreamExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::types::FromSql;
use tokio_postgres::{AsyncMessage, CancelToken, Client, NoTls, Statement};

use crate::config::{PostgresConfig, Tls, endpoint};
use crate::error::{BACKEND, is_conflict, map_err, odd_reply, refuses_startup_options, rolled_back, said};

/// The shortest TTL the driver honours.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// How many times a statement that lost a serialization failure or a
/// deadlock is sent again before the failure is reported.
const CONFLICT_RETRIES: u32 = 10;

/// How many rows one prune statement deletes at most.
const PRUNE_BATCH: u64 = 1000;

/// How often a handle with `prune_after` prunes (the first time at
/// connect).
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// The statements' text for one table.
struct Sql {
    acquire: String,
    release: String,
    extend: String,
    holder: String,
    in_use: String,
    prune: String,
}

impl Sql {
    fn new(table: &str) -> Self {
        let now = "timezone('utc', clock_timestamp())";
        Sql {
            acquire: format!(
                "WITH now AS (SELECT {now} AS at), \
                 granted AS ( \
                   INSERT INTO {table} AS l (name, lock_until, locked_at, locked_by, fence) \
                   SELECT $1, now.at + make_interval(secs => $2), now.at, $3, \
                          GREATEST(1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) FROM now \
                   ON CONFLICT (name) DO UPDATE \
                     SET lock_until = EXCLUDED.lock_until, locked_at = EXCLUDED.locked_at, \
                         locked_by = EXCLUDED.locked_by, fence = GREATEST(l.fence + 1, EXCLUDED.fence) \
                     WHERE l.lock_until <= EXCLUDED.locked_at \
                   RETURNING l.fence) \
                 SELECT (SELECT fence FROM granted), \
                        (SELECT extract(epoch FROM t.lock_until - now.at)::float8 FROM {table} t, now WHERE t.name = $1)"
            ),
            release: format!(
                "WITH now AS (SELECT {now} AS at), \
                 done AS (UPDATE {table} t SET lock_until = now.at FROM now \
                          WHERE t.name = $1 AND t.locked_by = $2 AND t.lock_until > now.at RETURNING 1), \
                 told AS (SELECT pg_notify($3, $1) FROM done) \
                 SELECT (SELECT count(*) FROM done)::int4, (SELECT count(*) FROM told)::int4, \
                        (SELECT (t.locked_by = $2)::int4 FROM {table} t WHERE t.name = $1), \
                        (SELECT (t.lock_until > now.at)::int4 FROM {table} t, now WHERE t.name = $1)"
            ),
            extend: format!(
                "WITH now AS (SELECT {now} AS at), \
                 done AS (UPDATE {table} t SET lock_until = now.at + make_interval(secs => $3) FROM now \
                          WHERE t.name = $1 AND t.locked_by = $2 AND t.lock_until > now.at RETURNING 1) \
                 SELECT (SELECT count(*) FROM done)::int4, 0::int4, \
                        (SELECT (t.locked_by = $2)::int4 FROM {table} t WHERE t.name = $1), \
                        (SELECT (t.lock_until > now.at)::int4 FROM {table} t, now WHERE t.name = $1)"
            ),
            holder: format!(
                "SELECT t.locked_by, extract(epoch FROM t.lock_until - {now})::float8, t.fence \
                 FROM {table} t WHERE t.name = $1 AND t.lock_until > {now}"
            ),
            in_use: format!(
                "SELECT t.name FROM {table} t WHERE starts_with(t.name, $1) AND t.lock_until > {now} ORDER BY t.name"
            ),
            // In batches: one short statement at a time on the acquire
            // lane, never one long scan that the request time-out cancels
            // (and that holds back the acquires queued behind it). The
            // outer condition is checked again on the row it deletes.
            prune: format!(
                "DELETE FROM {table} t WHERE t.ctid IN (SELECT ctid FROM {table} \
                 WHERE lock_until < {now} - make_interval(secs => $1) LIMIT {PRUNE_BATCH}) \
                 AND t.lock_until < {now} - make_interval(secs => $1)"
            ),
        }
    }
}

/// What an acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Granted, with this fencing token.
    Granted(u64),
    /// Held by someone else, for about this much longer.
    Held(Option<Duration>),
}

/// Who holds a name, as the table says.
pub(crate) struct Row {
    pub(crate) locked_by: String,
    pub(crate) remaining: Option<Duration>,
    pub(crate) fence: i64,
}

/// A handle's connections: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Acquires, operator views, prunes; `LISTEN`s for release notices.
    Acquire,
    /// Extends and releases.
    Guard,
}

/// One connection and its prepared statements; the task that drives the
/// connection hands release notices to the waiters.
struct Connection {
    client: Client,
    cancel: CancelToken,
    /// A cancel request was sent already (one per connection: several
    /// callers timing out together on one retired connection must not
    /// cancel whatever runs after the stuck statement, one by one).
    cancelled: std::sync::atomic::AtomicBool,
    acquire: Statement,
    release: Statement,
    extend: Statement,
    holder: Statement,
    in_use: Statement,
    task: JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An acquire statement running in a task of its own (see the module
/// docs): its answer, the row or the error.
type Running = JoinHandle<std::result::Result<tokio_postgres::Row, tokio_postgres::Error>>;

/// The waiters of one handle, by name: a release notice wakes those of
/// its name; a lost connection wakes everyone (they poll).
#[derive(Default)]
pub(crate) struct Waiters {
    names: Mutex<HashMap<String, (usize, Arc<Notify>)>>,
}

/// A registered waiter; dropping it unregisters.
pub(crate) struct Waiter {
    waiters: Arc<Waiters>,
    name: String,
    /// Notified (`notify_waiters`) on a release notice for the name.
    pub(crate) notify: Arc<Notify>,
}

impl Waiters {
    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<String, (usize, Arc<Notify>)>> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a waiter of `name`.
    pub(crate) fn wait_on(self: &Arc<Self>, name: &str) -> Waiter {
        let mut names = self.names();
        let entry = names
            .entry(name.to_owned())
            .or_insert_with(|| (0, Arc::default()));
        entry.0 += 1;
        Waiter {
            waiters: Arc::clone(self),
            name: name.to_owned(),
            notify: Arc::clone(&entry.1),
        }
    }

    fn wake(&self, name: &str) {
        if let Some((_, notify)) = self.names().get(name) {
            notify.notify_waiters();
        }
    }

    fn wake_all(&self) {
        for (_, notify) in self.names().values() {
            notify.notify_waiters();
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut names = self.waiters.names();
        if let Some(entry) = names.get_mut(&self.name) {
            entry.0 -= 1;
            if entry.0 == 0 {
                names.remove(&self.name);
            }
        }
    }
}

/// Drives a connection in its own task, handing release notices to the
/// waiters (if it listens for them); when it ends, every waiter looks
/// again (and polls).
fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    waiters: Option<Arc<Waiters>>,
) -> JoinHandle<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if let Some(w) = &waiters {
                        w.wake(n.payload());
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if let Some(w) = &waiters {
            w.wake_all();
        }
    })
}

/// `options` (the URL's, if any) with `default_transaction_isolation`
/// pinned to `read committed` (the space escaped, as PostgreSQL splits
/// `options` on spaces; last one wins, so the pin comes last), and the
/// session's `TimeZone` to UTC: the statements write UTC wall-clock
/// `timestamp`s, which a `timestamptz` column would otherwise read in the
/// server's zone (hours apart between clients of different zones, and an
/// hour back at a daylight-saving change, which would let a held row be
/// taken over).
fn read_committed(options: Option<&str>) -> String {
    let pin = PINNED;
    match options.map(str::trim).filter(|o| !o.is_empty()) {
        Some(theirs) => format!("{theirs} {pin}"),
        None => pin.to_owned(),
    }
}

/// The session settings every connection starts with (see
/// [`read_committed`]).
const PINNED: &str = r"-c default_transaction_isolation=read\ committed -c TimeZone=UTC";

/// What a handle and its guards share: the two connections (each opened
/// again when it is lost), the statements, the waiters, the keeper, and
/// whether the handle was abandoned (then nothing more is sent: as if the
/// process had died).
pub(crate) struct Conn {
    config: PostgresConfig,
    /// With the isolation pinned ...
    pinned: tokio_postgres::Config,
    /// ... and without, for a pooler that refuses the startup option.
    plain: tokio_postgres::Config,
    /// The other end refused the pinned connection's startup option.
    pin_refused: AtomicBool,
    tls: Tls,
    sql: Sql,
    /// `host:port/database`, for messages.
    endpoint: String,
    acquires: tokio::sync::Mutex<Option<Arc<Connection>>>,
    guards: tokio::sync::Mutex<Option<Arc<Connection>>>,
    abandoned: AtomicBool,
    pub(crate) waiters: Arc<Waiters>,
    /// Keeps every guard of this handle, in one task.
    pub(crate) keeper: Keeper,
}

impl Conn {
    /// Checks the configuration and opens the first connection (creating
    /// the table if it is absent and allowed to, checking its columns);
    /// with `prune_after`, starts the hourly prune.
    pub(crate) async fn connect(config: &PostgresConfig) -> Result<Arc<Self>> {
        let (plain, tls) = config.to_tokio()?;
        let mut pinned = plain.clone();
        pinned.options(read_committed(plain.get_options()));
        let conn = Arc::new(Conn {
            tls,
            sql: Sql::new(&config.qualified_table()?),
            endpoint: endpoint(&plain),
            config: config.clone(),
            pinned,
            plain,
            pin_refused: AtomicBool::new(false),
            acquires: tokio::sync::Mutex::default(),
            guards: tokio::sync::Mutex::default(),
            abandoned: AtomicBool::new(false),
            waiters: Arc::default(),
            keeper: Keeper::new(),
        });
        conn.connection(Lane::Acquire).await?;
        if let Some(idle) = config.prune_after {
            Self::prune_hourly(Arc::downgrade(&conn), idle);
        }
        Ok(conn)
    }

    pub(crate) fn config(&self) -> &PostgresConfig {
        &self.config
    }

    pub(crate) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// Marks the handle abandoned and drops the connections.
    pub(crate) async fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.acquires.lock().await.take();
        self.guards.lock().await.take();
    }

    fn lane(&self, lane: Lane) -> &tokio::sync::Mutex<Option<Arc<Connection>>> {
        match lane {
            Lane::Acquire => &self.acquires,
            Lane::Guard => &self.guards,
        }
    }

    fn abandoned_error() -> Error {
        Error::unavailable(BACKEND, "this PostgresLock was abandoned")
    }

    /// The time-out of a statement without an answer.
    fn no_answer(&self) -> Error {
        Error::unavailable(
            BACKEND,
            Unreachable::because(
                &self.endpoint,
                format!("no answer within {:?}", self.config.request_timeout),
            ),
        )
    }

    /// The lane's live connection, or a new one.
    async fn connection(&self, lane: Lane) -> Result<Arc<Connection>> {
        if self.is_abandoned() {
            return Err(Self::abandoned_error());
        }
        let mut current = self.lane(lane).lock().await;
        // Again under the lock: an abandon between the two must not be
        // followed by a new connection.
        if self.is_abandoned() {
            return Err(Self::abandoned_error());
        }
        if let Some(s) = current.as_ref().filter(|s| !s.client.is_closed()) {
            return Ok(Arc::clone(s));
        }
        current.take();
        let opened = tokio::time::timeout(self.config.connect_timeout, self.open(lane))
            .await
            .map_err(|_| {
                Error::unavailable(
                    BACKEND,
                    Unreachable::because(
                        &self.endpoint,
                        format!("no connection within {:?}", self.config.connect_timeout),
                    ),
                )
            })??;
        let opened = Arc::new(opened);
        *current = Some(Arc::clone(&opened));
        Ok(opened)
    }

    /// Takes `s` out of its lane if it is still the lane's connection (the
    /// next request opens another), and asks the server to cancel what it
    /// is running.
    async fn retire(&self, lane: Lane, s: &Arc<Connection>) {
        self.cancel(s);
        let mut current = self.lane(lane).lock().await;
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, s)) {
            current.take();
        }
    }

    /// Sends a cancel request for what `s` is running, in the background,
    /// within the connect timeout. The server says nothing back: whether
    /// the statement ended is learnt from its own answer. (Statements
    /// queued behind it on `s` may be cancelled instead; each of their
    /// callers sees an error and tries again as for any other.)
    fn cancel(&self, s: &Connection) {
        if self.is_abandoned() || s.cancelled.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let (token, tls, within) = (s.cancel.clone(), self.tls.clone(), self.config.connect_timeout);
        dlock_core::driver::spawn_detached("postgres: cancel a statement without an answer", async move {
            let sent = async {
                match tls {
                    Tls::Off => token.cancel_query(NoTls).await,
                    Tls::Verified(tls) => token.cancel_query(tls).await,
                }
            };
            // A cancel that cannot be sent changes nothing: the statement
            // is followed to its answer either way.
            let _ = tokio::time::timeout(within, sent).await;
        });
    }

    async fn open(&self, lane: Lane) -> Result<Connection> {
        let listen = lane == Lane::Acquire;
        let client = self.client(listen).await;
        let (client, task) = client.map_err(|e| map_err(e, &self.endpoint))?;
        let failed = |e| map_err(e, &self.endpoint);
        if listen {
            self.ensure_table(&client).await?;
            client
                .batch_execute(&format!("LISTEN \"{}\"", self.config.channel()))
                .await
                .map_err(failed)?;
        }
        let (acquire, release, extend, holder, in_use) = futures::try_join!(
            client.prepare(&self.sql.acquire),
            client.prepare(&self.sql.release),
            client.prepare(&self.sql.extend),
            client.prepare(&self.sql.holder),
            client.prepare(&self.sql.in_use),
        )
        .map_err(failed)?;
        Ok(Connection {
            cancel: client.cancel_token(),
            cancelled: std::sync::atomic::AtomicBool::new(false),
            acquire,
            release,
            extend,
            holder,
            in_use,
            client,
            task,
        })
    }

    /// A connection, with the isolation pinned unless the other end
    /// refused that once.
    async fn client(
        &self,
        listen: bool,
    ) -> std::result::Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
        if !self.pin_refused.load(Ordering::SeqCst) {
            match self.client_with(&self.pinned, listen).await {
                Err(e) if refuses_startup_options(&e) => self.pin_refused.store(true, Ordering::SeqCst),
                other => return other,
            }
        }
        self.client_with(&self.plain, listen).await
    }

    async fn client_with(
        &self,
        pg: &tokio_postgres::Config,
        listen: bool,
    ) -> std::result::Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
        let waiters = listen.then(|| Arc::clone(&self.waiters));
        Ok(match &self.tls {
            Tls::Off => {
                let (client, connection) = pg.connect(NoTls).await?;
                (client, drive(connection, waiters))
            }
            Tls::Verified(tls) => {
                let (client, connection) = pg.connect(tls.clone()).await?;
                (client, drive(connection, waiters))
            }
        })
    }

    /// Creates the lock table if it is absent (and allowed to), checks the
    /// types of its columns, and adds the `fence` column to a table
    /// ShedLock created.
    async fn ensure_table(&self, client: &Client) -> Result<()> {
        let table = self.config.qualified_table()?;
        let failed = |e| map_err(e, &self.endpoint);
        let exists = client
            .query_one("SELECT to_regclass($1)::text", &[&table])
            .await
            .map_err(failed)?;
        let exists: Option<String> = self.read(&exists, 0)?;
        let (statement, what) = match exists {
            None => (self.config.create_table_sql()?, "create the lock table"),
            Some(_) => {
                // pg_attribute, not information_schema: it shows every
                // column, whatever the role's rights on them.
                let rows = client
                    .query(
                        "SELECT a.attname::text, a.atttypid::regtype::text, format_type(a.atttypid, a.atttypmod) \
                         FROM pg_attribute a \
                         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
                        &[&table],
                    )
                    .await
                    .map_err(failed)?;
                let columns = rows
                    .iter()
                    .map(|r| Ok((self.read(r, 0)?, self.read(r, 1)?, self.read(r, 2)?)))
                    .collect::<Result<Vec<(String, String, String)>>>()?;
                if check_columns(&table, &columns)? {
                    return Ok(());
                }
                (
                    format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS fence BIGINT NOT NULL DEFAULT 0"),
                    "add the fence column to the lock table",
                )
            }
        };
        if !self.config.create_table {
            return Err(Error::InvalidConfig(format!(
                "postgres: cannot {what} {table} (create_table is off); run:\n{statement}"
            )));
        }
        match client.batch_execute(&statement).await {
            Ok(()) => Ok(()),
            // Another client created it at the same moment (CREATE TABLE
            // IF NOT EXISTS is not safe under concurrency).
            Err(e)
                if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION)
                    || e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_TABLE) =>
            {
                Ok(())
            }
            Err(e) => Err(Error::backend(
                BACKEND,
                format!(
                    "at {}: cannot {what} {table}: {}; run instead:\n{statement}",
                    self.endpoint,
                    said(&e)
                ),
            )),
        }
    }

    /// Column `i` of `row`, or an [`Error::Backend`] if it is not a `T`.
    fn read<'a, T: FromSql<'a>>(&self, row: &'a tokio_postgres::Row, i: usize) -> Result<T> {
        row.try_get(i).map_err(|e| odd_reply(e, &self.endpoint))
    }

    /// `request` on the lane's connection within the request timeout, sent
    /// again when it lost a serialization failure or a deadlock. Without
    /// an answer in time, the connection is retired and its statement
    /// cancelled.
    async fn run<T, F, Fut>(&self, lane: Lane, mut request: F) -> Result<T>
    where
        F: FnMut(Arc<Connection>) -> Fut,
        Fut: Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    {
        let mut conflicts = 0;
        loop {
            let s = self.connection(lane).await?;
            match tokio::time::timeout(self.config.request_timeout, request(Arc::clone(&s))).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) if is_conflict(&e) && conflicts < CONFLICT_RETRIES => {
                    conflicts += 1;
                    after_conflict(conflicts).await;
                }
                Ok(Err(e)) => return Err(map_err(e, &self.endpoint)),
                Err(_) => {
                    self.retire(lane, &s).await;
                    return Err(self.no_answer());
                }
            }
        }
    }

    /// One acquire: the statement, sent again when it lost a serialization
    /// failure or a deadlock; [`Found::Held`] if it kept losing (a waiting
    /// caller looks again). Returns what it found and when the statement
    /// that found it was sent.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        name: &str,
        value: &Arc<str>,
        ttl: Duration,
    ) -> Result<(Found, Instant)> {
        let mut conflicts = 0;
        loop {
            let sent = Instant::now();
            match self.acquire_once(name, value, ttl).await? {
                Some(found) => return Ok((found, sent)),
                None if conflicts < CONFLICT_RETRIES => {
                    conflicts += 1;
                    after_conflict(conflicts).await;
                }
                None => return Ok((Found::Held(None), sent)),
            }
        }
    }

    /// One acquire statement, in a task of its own; `None` if it lost a
    /// conflict (it was rolled back). If this call ends before the answer
    /// is read (a time-out, or the call dropped), [`Conn::follow_up`] reads
    /// it.
    async fn acquire_once(
        self: &Arc<Self>,
        name: &str,
        value: &Arc<str>,
        ttl: Duration,
    ) -> Result<Option<Found>> {
        let s = self.connection(Lane::Acquire).await?;
        let secs = seconds(ttl);
        let statement: Running = tokio::spawn({
            let (s, name, value) = (Arc::clone(&s), name.to_owned(), value.to_string());
            async move { s.client.query_one(&s.acquire, &[&name, &secs, &value]).await }
        });
        let mut unread = OnDrop::new((statement, false), {
            let (conn, s, name, value) = (
                Arc::clone(self),
                Arc::clone(&s),
                name.to_owned(),
                Arc::clone(value),
            );
            move |(statement, cancelled)| conn.follow_up(statement, s, cancelled, name, value, ttl)
        });
        let answer = match tokio::time::timeout(self.config.request_timeout, &mut unread.state_mut().0).await
        {
            Ok(answer) => answer,
            Err(_) => {
                // Stuck behind a row lock or a synchronous standby, maybe:
                // cancelled, and followed (`unread` drops here) to its
                // answer.
                unread.state_mut().1 = true;
                self.retire(Lane::Acquire, &s).await;
                return Err(self.no_answer());
            }
        };
        drop(unread.disarm());
        let row = match answer {
            Ok(Ok(row)) => row,
            Ok(Err(e)) if is_conflict(&e) => return Ok(None),
            Ok(Err(e)) => {
                // Anything but an `ERROR` (a `FATAL`, a lost connection)
                // leaves the outcome unknown.
                if !rolled_back(&e) {
                    self.release_in_background(
                        name.into(),
                        Arc::clone(value),
                        saturating_add(Instant::now(), ttl),
                    );
                }
                return Err(map_err(e, &self.endpoint));
            }
            Err(gone) => {
                // The task panicked or its runtime is ending: the outcome
                // is unknown.
                self.release_in_background(
                    name.into(),
                    Arc::clone(value),
                    saturating_add(Instant::now(), ttl),
                );
                return Err(Error::unavailable(
                    BACKEND,
                    Unreachable::new(&self.endpoint, format!("the acquire's task ended: {gone}")),
                ));
            }
        };
        match self.found(name, &row) {
            Ok(found) => Ok(Some(found)),
            Err(e) => {
                // A reply not understood may be a grant.
                self.release_in_background(
                    name.into(),
                    Arc::clone(value),
                    saturating_add(Instant::now(), ttl),
                );
                Err(e)
            }
        }
    }

    /// Reads an acquire's reply.
    fn found(&self, name: &str, row: &tokio_postgres::Row) -> Result<Found> {
        let token: Option<i64> = self.read(row, 0)?;
        let left: Option<f64> = self.read(row, 1)?;
        match token {
            Some(t) => u64::try_from(t)
                .ok()
                .filter(|&t| t > 0)
                .map(Found::Granted)
                .ok_or_else(|| Error::backend(BACKEND, format!("the fence of {name:?} is {t}, not a token"))),
            None => Ok(Found::Held(
                left.and_then(|l| Duration::try_from_secs_f64(l).ok()),
            )),
        }
    }

    /// Follows, in the background, an acquire statement (on connection `s`)
    /// whose caller stopped waiting for its answer, to that answer: if it
    /// granted (or its reply cannot be read), the grant nobody received is
    /// released; if the server refused it with an `ERROR`, nothing was
    /// committed. Unless the statement was `cancelled` already, it is
    /// cancelled (and `s` retired) if no answer comes within the request
    /// timeout. With no answer within the TTL, or a connection lost before
    /// it, the outcome is unknown: the compare-owner release is tried (see
    /// the module docs).
    fn follow_up(
        self: Arc<Self>,
        mut statement: Running,
        s: Arc<Connection>,
        cancelled: bool,
        name: String,
        value: Arc<str>,
        ttl: Duration,
    ) {
        let what = format!("postgres: follow the acquire of {name} to its answer");
        dlock_core::driver::spawn_detached(&what, async move {
            let started = Instant::now();
            let mut answer = tokio::time::timeout(self.config.request_timeout, &mut statement).await;
            if answer.is_err() {
                if !cancelled {
                    self.retire(Lane::Acquire, &s).await;
                }
                let until = saturating_add(started, ttl.max(self.config.request_timeout));
                answer = tokio::time::timeout_at(until.into(), &mut statement).await;
            }
            let granted = match answer {
                Ok(Ok(Ok(row))) => !matches!(self.found(&name, &row), Ok(Found::Held(_))),
                Ok(Ok(Err(e))) => !rolled_back(&e),
                Ok(Err(_)) | Err(_) => {
                    // No answer: the connection goes (once nothing else
                    // uses it), and the release is tried in case.
                    statement.abort();
                    true
                }
            };
            drop(s);
            if granted {
                self.release_in_background(name.into(), value, saturating_add(Instant::now(), ttl));
            }
        });
    }

    /// The compare-owner release, announced to waiters.
    pub(crate) async fn release(&self, name: &str, value: &str) -> Result<Outcome> {
        let channel = self.config.channel();
        let row = self
            .run(Lane::Guard, |s| {
                let channel = &channel;
                async move { s.client.query_one(&s.release, &[&name, &value, channel]).await }
            })
            .await?;
        outcome(self.read(&row, 0)?, self.read(&row, 2)?, self.read(&row, 3)?)
    }

    /// The compare-owner extend.
    pub(crate) async fn extend(&self, name: &str, value: &str, ttl: Duration) -> Result<Outcome> {
        let secs = seconds(ttl);
        let row = self
            .run(Lane::Guard, |s| async move {
                s.client.query_one(&s.extend, &[&name, &value, &secs]).await
            })
            .await?;
        outcome(self.read(&row, 0)?, self.read(&row, 2)?, self.read(&row, 3)?)
    }

    /// Who holds `name` now, if anyone.
    pub(crate) async fn holder(&self, name: &str) -> Result<Option<Row>> {
        let row = self
            .run(Lane::Acquire, |s| async move {
                s.client.query_opt(&s.holder, &[&name]).await
            })
            .await?;
        let Some(r) = row else { return Ok(None) };
        Ok(Some(Row {
            locked_by: self.read(&r, 0)?,
            remaining: self
                .read::<Option<f64>>(&r, 1)?
                .and_then(|l| Duration::try_from_secs_f64(l).ok()),
            fence: self.read(&r, 2)?,
        }))
    }

    /// The names held now that start with `prefix`, sorted.
    pub(crate) async fn in_use(&self, prefix: &str) -> Result<Vec<String>> {
        let rows = self
            .run(Lane::Acquire, |s| async move {
                s.client.query(&s.in_use, &[&prefix]).await
            })
            .await?;
        rows.iter().map(|r| self.read(r, 0)).collect()
    }

    /// Deletes the rows whose `lock_until` passed more than `idle` ago, in
    /// batches of [`PRUNE_BATCH`]; returns how many.
    pub(crate) async fn prune(&self, idle: Duration) -> Result<u64> {
        let secs = seconds(idle);
        let sql = &self.sql.prune;
        let mut deleted = 0;
        loop {
            let batch = self
                .run(
                    Lane::Acquire,
                    |s| async move { s.client.execute(sql, &[&secs]).await },
                )
                .await?;
            deleted += batch;
            if batch < PRUNE_BATCH {
                return Ok(deleted);
            }
        }
    }

    /// Prunes rows idle longer than `idle` now and then every
    /// [`PRUNE_EVERY`], while the handle lives; each prune retried as a
    /// clean-up, and logged if it gives up.
    fn prune_hourly(conn: Weak<Self>, idle: Duration) {
        dlock_core::driver::spawn_detached("postgres: prune", async move {
            loop {
                match conn.upgrade() {
                    Some(c) if !c.is_abandoned() => drop(c),
                    _ => return,
                }
                let (attempt, gone) = (conn.clone(), conn.clone());
                dlock_core::driver::clean_up_in_background(
                    format!("postgres: prune rows idle over {idle:?}"),
                    Some(saturating_add(Instant::now(), PRUNE_EVERY / 2)),
                    move || gone.upgrade().is_none_or(|c| c.is_abandoned()),
                    move || {
                        let conn = attempt.upgrade();
                        async move {
                            match conn {
                                Some(c) => c.prune(idle).await.map(drop),
                                None => Ok(()),
                            }
                        }
                    },
                );
                tokio::time::sleep(PRUNE_EVERY).await;
            }
        });
    }

    /// Releases in the background (drops, failed releases, acquires whose
    /// answer nobody received), retrying until `until` (past it the row
    /// expires on its own).
    pub(crate) fn release_in_background(self: &Arc<Self>, name: Arc<str>, value: Arc<str>, until: Instant) {
        if self.is_abandoned() {
            return;
        }
        let (conn, gone) = (Arc::clone(self), Arc::clone(self));
        dlock_core::driver::clean_up_in_background(
            format!("postgres: release {name}"),
            Some(until),
            move || gone.is_abandoned(),
            move || {
                let (conn, name, value) = (Arc::clone(&conn), Arc::clone(&name), Arc::clone(&value));
                async move { conn.release(&name, &value).await.map(drop) }
            },
        );
    }
}

/// The handle's connection, as its guards' leases see it.
impl dlock_core::driver::LeaseHome for Conn {
    const BACKEND: &'static str = BACKEND;

    fn keeper(&self) -> &Keeper {
        &self.keeper
    }

    fn is_abandoned(&self) -> bool {
        Conn::is_abandoned(self)
    }
}

/// A short jittered pause before a statement that lost a conflict is sent
/// again, longer with each loss, so that the losers do not collide again.
async fn after_conflict(losses: u32) {
    let ms = u64::from(losses.min(10)) * (1 + rand::random::<u64>() % 5);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// The lock table's columns and the types the driver reads them as: the
/// type names PostgreSQL gives (`regtype`), and the one to change to.
const COLUMNS: [(&str, &[&str], &str); 5] = [
    ("name", TEXT, "text"),
    ("lock_until", TIMESTAMP, "timestamp"),
    ("locked_at", TIMESTAMP, "timestamp"),
    ("locked_by", TEXT, "text"),
    ("fence", &["bigint"], "bigint"),
];
const TEXT: &[&str] = &["text", "character varying", "character", "citext"];
const TIMESTAMP: &[&str] = &["timestamp without time zone", "timestamp with time zone"];

/// Checks a lock table's `(column, type, type as declared)` list: `true`
/// if every column is there with a type the driver reads, `false` if only
/// `fence` is missing (a table ShedLock created).
///
/// # Errors
///
/// [`Error::InvalidConfig`] for another column missing, or a column of
/// another type (a `fence` that is not `bigint` cannot hold a token),
/// saying what to run.
fn check_columns(table: &str, columns: &[(String, String, String)]) -> Result<bool> {
    let mut fence = true;
    for (column, accepted, fix) in COLUMNS {
        match columns.iter().find(|(name, _, _)| name == column) {
            None if column == "fence" => fence = false,
            None => {
                return Err(Error::InvalidConfig(format!(
                    "postgres: the lock table {table} has no column {column}: it is not a lock table \
                     (PostgresConfig::create_table_sql gives the statement of one)"
                )));
            }
            Some((_, ty, declared)) if !accepted.contains(&ty.as_str()) => {
                // A default of the old type (`'0'` on a text fence) would not
                // cast: it goes first, and the fence gets its own back.
                let default = if column == "fence" {
                    ", ALTER COLUMN fence SET DEFAULT 0"
                } else {
                    ""
                };
                return Err(Error::InvalidConfig(format!(
                    "postgres: the lock table {table} has column {column} of type {declared}, not {fix}; run:\n\
                     ALTER TABLE {table} ALTER COLUMN {column} DROP DEFAULT, \
                     ALTER COLUMN {column} TYPE {fix} USING {column}::{fix}{default}"
                )));
            }
            // A timestamp rounded to whole or tenths of seconds moves
            // `lock_until` down and `locked_at` up by up to half of its
            // step: a competitor could take a row that much early, more
            // than a grant's drift allows. ShedLock's `TIMESTAMP(3)` is fine.
            Some((_, ty, declared)) if ty.starts_with("timestamp") && coarse(declared) => {
                return Err(Error::InvalidConfig(format!(
                    "postgres: the lock table {table} has column {column} of type {declared}, which rounds \
                     to less than milliseconds; run:\nALTER TABLE {table} ALTER COLUMN {column} TYPE {ty}"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(fence)
}

/// Whether a declared timestamp type keeps fewer than 3 fractional digits
/// (`timestamp(0)`, `(1)`, `(2)`).
fn coarse(declared: &str) -> bool {
    ["(0)", "(1)", "(2)"].iter().any(|p| declared.contains(p))
}

/// A duration as the seconds `make_interval` takes (cut to the driver's
/// far future: no overflow on huge durations).
fn seconds(d: Duration) -> f64 {
    d.min(dlock_core::driver::FAR_FUTURE).as_secs_f64()
}

/// A release's or an extend's outcome from (done, ours, live).
fn outcome(done: i32, ours: Option<i32>, live: Option<i32>) -> Result<Outcome> {
    Ok(match (done, ours, live) {
        (1, _, _) => Ok(()),
        (0, Some(0), Some(1)) => Err(Refusal::HeldByOther),
        (0, _, _) => Err(Refusal::Expired),
        (n, _, _) => return Err(Error::backend(BACKEND, format!("{n} rows changed for one name"))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_read_as_the_three_answers() {
        assert_eq!(outcome(1, Some(1), Some(0)).unwrap(), Ok(()));
        assert_eq!(outcome(0, Some(0), Some(1)).unwrap(), Err(Refusal::HeldByOther));
        assert_eq!(outcome(0, Some(1), Some(0)).unwrap(), Err(Refusal::Expired));
        assert_eq!(outcome(0, Some(0), Some(0)).unwrap(), Err(Refusal::Expired));
        assert_eq!(outcome(0, None, None).unwrap(), Err(Refusal::Expired));
        assert!(outcome(2, None, None).is_err());
    }

    #[test]
    fn huge_ttls_are_cut() {
        assert!(seconds(Duration::MAX).is_finite());
    }

    #[test]
    fn the_isolation_is_pinned_after_the_urls_own_options() {
        let pin = r"-c default_transaction_isolation=read\ committed -c TimeZone=UTC";
        assert_eq!(read_committed(None), pin);
        assert_eq!(read_committed(Some("  ")), pin);
        assert_eq!(
            read_committed(Some("-c search_path=locks")),
            format!("-c search_path=locks {pin}")
        );
    }

    #[test]
    fn lock_tables_are_checked_column_by_column() {
        let t = r#""public"."locks""#;
        let table = |fence: Option<&str>| {
            let mut columns: Vec<(String, String, String)> = [
                ("name", "character varying", "character varying(64)"),
                (
                    "lock_until",
                    "timestamp without time zone",
                    "timestamp(3) without time zone",
                ),
                (
                    "locked_at",
                    "timestamp with time zone",
                    "timestamp with time zone",
                ),
                ("locked_by", "text", "text"),
            ]
            .iter()
            .map(|(n, t, d)| ((*n).to_owned(), (*t).to_owned(), (*d).to_owned()))
            .collect();
            if let Some(ty) = fence {
                columns.push(("fence".to_owned(), ty.to_owned(), ty.to_owned()));
            }
            columns
        };
        assert!(check_columns(t, &table(Some("bigint"))).unwrap());
        // ShedLock's table: the fence column is added.
        assert!(!check_columns(t, &table(None)).unwrap());
        for ty in ["integer", "text", "numeric"] {
            let e = check_columns(t, &table(Some(ty))).unwrap_err();
            assert!(
                matches!(&e, Error::InvalidConfig(m)
                    if m.contains(&format!("column fence of type {ty}, not bigint"))
                        && m.contains(r#"ALTER TABLE "public"."locks" ALTER COLUMN fence DROP DEFAULT, ALTER COLUMN fence TYPE bigint"#)),
                "{e}"
            );
        }
        // A timestamp kept to whole seconds is refused, naming the fix.
        let mut coarse = table(Some("bigint"));
        coarse[1].2 = "timestamp(0) without time zone".to_owned();
        let e = check_columns(t, &coarse).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidConfig(m)
                if m.contains("lock_until of type timestamp(0) without time zone")
                    && m.contains("ALTER COLUMN lock_until TYPE timestamp without time zone")),
            "{e}"
        );
        let mut no_name = table(Some("bigint"));
        no_name.remove(0);
        assert!(
            matches!(check_columns(t, &no_name), Err(Error::InvalidConfig(m)) if m.contains("no column name"))
        );
        let mut odd = table(Some("bigint"));
        odd[3].1 = "integer".to_owned();
        assert!(matches!(check_columns(t, &odd), Err(Error::InvalidConfig(m)) if m.contains("locked_by")));
    }
}
