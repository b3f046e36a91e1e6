//! The protocol: the lease table, its statements, and their parsing. The
//! only file that talks to PostgreSQL.
//!
//! One row per name that was ever held, in ShedLock's columns plus `fence`
//! (see [`PostgresConfig::create_table_sql`]). Every time is the server's
//! (`timezone('utc', clock_timestamp())`), never the client's.
//!
//! - **acquire**: one statement, `INSERT ... ON CONFLICT (name) DO UPDATE
//!   ... WHERE lock_until <= now RETURNING fence`: a new row, or the take-over
//!   of an expired one, with the token `max(fence + 1, server clock in µs)`
//!   (a hybrid logical clock, as the Redis driver's: it keeps increasing
//!   when the row is older than the last grant, after a failover to an
//!   asynchronous standby that missed it). Refused, the same statement
//!   reads how long the holder has left.
//! - **release**: compare `locked_by` (our value, unique per grant) and set
//!   `lock_until` to now (the row stays: ShedLock's way, and the fence with
//!   it), then `pg_notify` the table's channel with the name.
//! - **extend**: compare `locked_by` and move `lock_until`, only while it
//!   is in the future (an expired grant is never revived).
//! - Both report done, expired (ours, past `lock_until`) or held by another.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::driver::{Keeper, Outcome, Refusal};
use dlock_core::{Error, Result};
use futures::StreamExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, NoTls, Statement};

use crate::config::{PostgresConfig, Tls};
use crate::error::{BACKEND, describe, map_err};

/// The shortest TTL the driver honours.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The statements' text for one table.
struct Sql {
    acquire: String,
    release: String,
    extend: String,
    holder: String,
    in_use: String,
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

/// One connection and its prepared statements; the task that drives the
/// connection hands release notices to the waiters.
struct Session {
    client: Client,
    acquire: Statement,
    release: Statement,
    extend: Statement,
    holder: Statement,
    in_use: Statement,
    task: JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The waiters of one handle, by name: a release notice wakes those of
/// its name; a lost connection wakes everyone (they poll).
#[derive(Default)]
pub(crate) struct Waiters {
    names: Mutex<HashMap<String, (usize, Arc<Notify>)>>,
}

/// A registered waiter; dropping it unregisters.
pub(crate) struct Waiting {
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
    pub(crate) fn wait_on(self: &Arc<Self>, name: &str) -> Waiting {
        let mut names = self.names();
        let entry = names
            .entry(name.to_owned())
            .or_insert_with(|| (0, Arc::default()));
        entry.0 += 1;
        Waiting {
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

impl Drop for Waiting {
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
/// waiters; when it ends, every waiter looks again (and polls).
fn drive<S, T>(mut connection: tokio_postgres::Connection<S, T>, waiters: Arc<Waiters>) -> JoinHandle<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => waiters.wake(n.payload()),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        waiters.wake_all();
    })
}

/// What a handle and its guards share: the connection (opened again when
/// it is lost), the statements, the waiters, the keeper, and whether the
/// handle was abandoned (then nothing more is sent: as if the process had
/// died).
pub(crate) struct Conn {
    config: PostgresConfig,
    pg: tokio_postgres::Config,
    tls: Tls,
    sql: Sql,
    session: tokio::sync::Mutex<Option<Arc<Session>>>,
    abandoned: AtomicBool,
    pub(crate) waiters: Arc<Waiters>,
    /// Keeps every guard of this handle, in one task.
    pub(crate) keeper: Keeper,
}

impl Conn {
    /// Checks the configuration and opens the first connection (creating
    /// the table if it is absent and allowed to).
    pub(crate) async fn connect(config: &PostgresConfig) -> Result<Self> {
        let (pg, tls) = config.to_tokio()?;
        let conn = Conn {
            tls,
            sql: Sql::new(&config.qualified_table()?),
            config: config.clone(),
            pg,
            session: tokio::sync::Mutex::default(),
            abandoned: AtomicBool::new(false),
            waiters: Arc::default(),
            keeper: Keeper::new(),
        };
        conn.session().await?;
        Ok(conn)
    }

    pub(crate) fn config(&self) -> &PostgresConfig {
        &self.config
    }

    pub(crate) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// Marks the handle abandoned and drops the connection.
    pub(crate) async fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        self.session.lock().await.take();
    }

    /// The live session, or a new one.
    async fn session(&self) -> Result<Arc<Session>> {
        if self.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this PostgresLock was abandoned"));
        }
        let mut current = self.session.lock().await;
        // Again under the lock: an abandon between the two must not be
        // followed by a new connection.
        if self.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this PostgresLock was abandoned"));
        }
        if let Some(s) = current.as_ref().filter(|s| !s.client.is_closed()) {
            return Ok(Arc::clone(s));
        }
        current.take();
        let opened = tokio::time::timeout(self.config.connect_timeout, self.open())
            .await
            .map_err(|_| {
                Error::unavailable(
                    BACKEND,
                    format!("no connection within {:?}", self.config.connect_timeout),
                )
            })??;
        let opened = Arc::new(opened);
        *current = Some(Arc::clone(&opened));
        Ok(opened)
    }

    async fn open(&self) -> Result<Session> {
        let waiters = Arc::clone(&self.waiters);
        let (client, task) = match &self.tls {
            Tls::Off => {
                let (client, connection) = self.pg.connect(NoTls).await.map_err(map_err)?;
                (client, drive(connection, waiters))
            }
            Tls::Verified(tls) => {
                let (client, connection) = self.pg.connect(tls.clone()).await.map_err(map_err)?;
                (client, drive(connection, waiters))
            }
        };
        self.ensure_table(&client).await?;
        client
            .batch_execute(&format!("LISTEN \"{}\"", self.config.channel()))
            .await
            .map_err(map_err)?;
        let (acquire, release, extend, holder, in_use) = futures::try_join!(
            client.prepare(&self.sql.acquire),
            client.prepare(&self.sql.release),
            client.prepare(&self.sql.extend),
            client.prepare(&self.sql.holder),
            client.prepare(&self.sql.in_use),
        )
        .map_err(map_err)?;
        Ok(Session {
            acquire,
            release,
            extend,
            holder,
            in_use,
            client,
            task,
        })
    }

    /// Creates the lock table if it is absent (and allowed to), and adds
    /// the `fence` column to a table ShedLock created.
    async fn ensure_table(&self, client: &Client) -> Result<()> {
        let table = self.config.qualified_table()?;
        let exists: Option<String> = client
            .query_one("SELECT to_regclass($1)::text", &[&table])
            .await
            .map_err(map_err)?
            .get(0);
        let (statement, what) = match exists {
            None => (self.config.create_table_sql()?, "create the lock table"),
            Some(_) => {
                let fence: i64 = client
                    .query_one(
                        "SELECT count(*) FROM information_schema.columns \
                         WHERE table_schema = $1 AND table_name = $2 AND column_name = 'fence'",
                        &[&self.config.schema, &self.config.table],
                    )
                    .await
                    .map_err(map_err)?
                    .get(0);
                if fence > 0 {
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
                    "cannot {what} {table}: {}; run instead:\n{statement}",
                    describe(&e)
                ),
            )),
        }
    }

    /// The live session, and `request` run on it within the request
    /// timeout (the session's own opening is bounded by the connect
    /// timeout).
    async fn bounded<T>(
        &self,
        request: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        let timeout = self.config.request_timeout;
        match tokio::time::timeout(timeout, request).await {
            Ok(r) => r.map_err(map_err),
            Err(_) => {
                // A connection that did not answer in time is not trusted
                // again (half-open, or stuck behind a row lock): the next
                // call opens a new one.
                self.session.lock().await.take();
                Err(Error::unavailable(
                    BACKEND,
                    format!("no answer from postgres within {timeout:?}"),
                ))
            }
        }
    }

    /// One acquire attempt.
    pub(crate) async fn acquire(&self, name: &str, value: &str, ttl: Duration) -> Result<Found> {
        let secs = seconds(ttl);
        let s = self.session().await?;
        let row = self
            .bounded(s.client.query_one(&s.acquire, &[&name, &secs, &value]))
            .await?;
        let (token, left): (Option<i64>, Option<f64>) = (row.get(0), row.get(1));
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

    /// The compare-owner release, announced to waiters.
    pub(crate) async fn release(&self, name: &str, value: &str) -> Result<Outcome> {
        let channel = self.config.channel();
        let s = self.session().await?;
        let row = self
            .bounded(s.client.query_one(&s.release, &[&name, &value, &channel]))
            .await?;
        outcome(row.get(0), row.get(2), row.get(3))
    }

    /// The compare-owner extend.
    pub(crate) async fn extend(&self, name: &str, value: &str, ttl: Duration) -> Result<Outcome> {
        let secs = seconds(ttl);
        let s = self.session().await?;
        let row = self
            .bounded(s.client.query_one(&s.extend, &[&name, &value, &secs]))
            .await?;
        outcome(row.get(0), row.get(2), row.get(3))
    }

    /// Who holds `name` now, if anyone.
    pub(crate) async fn holder(&self, name: &str) -> Result<Option<Row>> {
        let s = self.session().await?;
        let row = self.bounded(s.client.query_opt(&s.holder, &[&name])).await?;
        Ok(row.map(|r| Row {
            locked_by: r.get(0),
            remaining: r
                .get::<_, Option<f64>>(1)
                .and_then(|l| Duration::try_from_secs_f64(l).ok()),
            fence: r.get(2),
        }))
    }

    /// The names held now that start with `prefix`, sorted.
    pub(crate) async fn in_use(&self, prefix: &str) -> Result<Vec<String>> {
        let s = self.session().await?;
        let rows = self.bounded(s.client.query(&s.in_use, &[&prefix])).await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}

/// A TTL as the seconds `make_interval` takes (cut to the driver's far
/// future: no overflow on huge durations).
fn seconds(ttl: Duration) -> f64 {
    ttl.min(dlock_core::driver::FAR_FUTURE).as_secs_f64()
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

/// A fresh owner value: `dlock1 <128-bit nonce> <host> <pid> <unix ms>`,
/// unique per grant (what release and extend compare), telling an operator
/// who holds.
pub(crate) fn new_value(host: &str) -> String {
    let nonce: u128 = rand::random();
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("dlock1 {nonce:032x} {host} {} {since}", std::process::id())
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
    fn huge_ttls_are_cut_and_values_are_unique() {
        assert!(seconds(Duration::MAX).is_finite());
        assert_ne!(new_value("h"), new_value("h"));
    }
}
