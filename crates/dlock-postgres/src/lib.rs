//! # dlock-postgres
//!
//! A [`dlock_core::Lock`] on PostgreSQL: a lease table, with fencing tokens.
//!
//! ```
//! use std::time::Duration;
//! use dlock_core::{AcquireOptions, Guard, Lock, LockKey};
//! use dlock_postgres::{PostgresConfig, PostgresLock};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock_core::Result<()> {
//! # // The test server of `cargo xtask test`, or a private one.
//! # let server = dlock_testkit::launcher::shared::postgres().await.expect("a test postgres");
//! # let url = server.addresses[0].clone();
//! // url = "postgres://app@127.0.0.1:5432/app"
//! let lock = PostgresLock::connect(PostgresConfig::from_url(url)).await?;
//! let key = LockKey::new("nightly-report")?;
//! let guard = lock.acquire(&key, AcquireOptions::default().ttl(Duration::from_secs(30))).await?;
//! let token = guard.token().expect("postgres gives fencing tokens");
//! assert_eq!(lock.holder(&key).await?.and_then(|h| h.token), Some(token.get()));
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## Design: a lease table, not advisory locks
//!
//! A session advisory lock lives as long as a connection: it has no TTL,
//! no token, and it breaks behind a pooler in transaction mode (PgBouncer),
//! where the next statement may run on another server connection. Here a
//! held lock is a **row**, and nothing about it lives in a connection (the
//! driver prepares its statements, so behind PgBouncer in transaction mode
//! it needs PgBouncer 1.21 or later with `max_prepared_statements` set):
//!
//! - **acquire** = one statement: insert the row, or take over one whose
//!   `lock_until` has passed (`INSERT ... ON CONFLICT (name) DO UPDATE ...
//!   WHERE lock_until <= now RETURNING fence`), on the server's clock
//!   (`clock_timestamp()`, in UTC);
//! - **token** = the row's `fence`, `max(fence + 1, server clock in µs)`: it
//!   increases with every grant, survives restarts (it is in the table),
//!   and keeps increasing after a failover to an asynchronous standby that
//!   missed the last grants, as long as the new primary's clock is not
//!   behind the old one's by more than the failover took (the Redis
//!   driver's hybrid clock);
//! - **release / extend** compare `locked_by` (unique per grant) and report
//!   done, expired ([`Error::Lost`](dlock_core::Error::Lost)) or held by
//!   another ([`Error::NotHeld`](dlock_core::Error::NotHeld)); a release
//!   sets `lock_until` to now (the row stays, and its fence) and `NOTIFY`s
//!   the table's channel;
//! - **rows**: one per name locked, kept after release; rows idle longer
//!   than a bound are deleted by [`PostgresLock::prune`] or, hourly, with
//!   [`PostgresConfig::prune_after`] (off by default). A pruned name's
//!   next token is still higher, by the clock term;
//! - **waiting**: `LISTEN` on the handle's acquire connection, and a
//!   jittered poll never longer than the holder's remaining TTL (behind a
//!   transaction pooler, where `LISTEN` does not work, waiting is only
//!   polled);
//! - **watchdog**: with `auto_extend`, renewal at `ttl / 3`, on a
//!   connection of its own (an acquire waiting on a row lock does not hold
//!   it up); the local deadline runs from the acquire's send time minus
//!   drift;
//! - **isolation**: every connection asks for `READ COMMITTED`, whatever
//!   the database or role sets, and a serialization failure or deadlock is
//!   answered by sending the statement again, never by an error;
//! - **a statement without an answer** within the request timeout is
//!   cancelled, and an acquire's answer is still awaited in the
//!   background, so a grant that commits late is released.
//!
//! The table ([`PostgresConfig::create_table_sql`]) is created at connect
//! if absent. Its first four columns are ShedLock's, so ShedLock's JDBC
//! provider (`usingDbTime()`) and dlock can share it and exclude each other;
//! a table ShedLock created gets the `fence` column at connect (`ALTER TABLE
//! ... ADD COLUMN IF NOT EXISTS fence BIGINT NOT NULL DEFAULT 0`, or that
//! statement in the error when `create_table` is off).
//!
//! ## Guarantees
//!
//! - [`Capabilities`](dlock_core::Capabilities): strict fencing, not FIFO,
//!   notified waiting; no read-write locks or semaphores yet.
//! - Exclusion holds while the one primary keeps its data (a synchronous
//!   standby keeps it across a failover; an asynchronous one may lose the
//!   last grants, so two clients may hold at once for up to a TTL: the
//!   token still increases, so a fenced resource refuses the older one).
//! - **TLS** (rustls, ring): `sslmode=require`, `verify-ca` or
//!   `verify-full` connect over TLS and verify the server's certificate
//!   chain and host name (all three; libpq's `require` verifies neither),
//!   against the system's CAs or the PEM file of `sslrootcert=PATH` (or
//!   [`PostgresConfig::ca_file`]). `prefer`, the default, and `disable`
//!   connect in the clear: no TLS connection is made without verifying it.
//!   A refused certificate, or a server without TLS under `require`, is
//!   [`Error::InvalidConfig`](dlock_core::Error::InvalidConfig). Client
//!   certificates (`sslcert`, `sslkey`) are not supported: such a URL is
//!   refused.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod config;
mod error;
mod guard;
mod lock;
mod protocol;

pub use config::PostgresConfig;
pub use guard::PostgresGuard;
pub use lock::PostgresLock;
pub use protocol::MIN_TTL;
