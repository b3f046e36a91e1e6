//! # dlock-testkit
//!
//! The conformance kit every dlock driver runs, and the tools it needs:
//!
//! - [`LockFactory`]: how the kit gets independent clients of a driver and
//!   injects faults; [`MemFactory`] for the in-process driver.
//! - [`scenarios`]: the contract, one `pub async fn` per property, and
//!   [`conformance_tests!`] to expand them into one test each.
//! - [`link`]: a client's link to its backend, which the kit slows down,
//!   silences, resets and heals (built on [`launcher::FaultProxy`]).
//! - [`history`]: a recorder and checker of concurrent histories (overlapping
//!   holds, token order, stale fenced writes).
//! - [`broken`]: deliberately broken drivers the kit must catch.
//! - [`workload`]: clients contending under faults, recorded for the checker.
//! - [`safety`]: the fenced register workload with the holder-pause nemesis.
//! - [`launcher`]: real `redis-server`, etcd, ZooKeeper and PostgreSQL processes on free
//!   loopback ports, plus a TCP fault proxy.
//! - [`reference`](mod@reference): the reference clients themselves (Apache Curator, etcd's
//!   Go recipes) as processes the interop tests drive, and a record of who
//!   held what, theirs and ours, with its checker.
//! - [`trace`]: a `tracing` subscriber that keeps dlock's events for a
//!   test (`reports_through_tracing` checks every driver's with it).
//!
//! # The contract a driver implements
//!
//! A driver's handle implements [`dlock_core::Lock`] with `backend`,
//! `capabilities`, `abandon` (as if the process died), `holders` where the
//! backend can list them, and **one acquire**, `grant`, which receives a
//! [`Claim`](dlock_core::Claim) (a mutex, a read, a write, or `count` of
//! `limit` permits) and maps it to the backend's layout. Every public
//! acquire method (`acquire`, `try_acquire`, `acquire_read`,
//! `acquire_write`, `acquire_permits`, `acquire_claim`, `acquire_all`,
//! `with_lock`) is provided by the trait: it refuses a claim the
//! capabilities leave out ([`Error::Unsupported`](dlock_core::Error::Unsupported)),
//! a TTL of zero or above the maximum and impossible permit counts, and
//! traces the acquire, once, before the driver's `grant` runs. A driver
//! emits only the events inside its protocol (`trace::queued`, `lost`,
//! `release_result`). [`AnyLock`](dlock_core::AnyLock) forwards `grant`, so
//! every driver is usable behind dynamic dispatch with nothing more.
//!
//! A complete driver that offers mutexes only (its "server" is a
//! [`MemLock`](dlock_core::MemLock), standing for the network):
//!
//! ```
//! use std::time::Duration;
//!
//! use dlock_core::{
//!     AcquireOptions, AnyLock, Capabilities, Claim, Error, Fencing, Guard, Lock, LockKey, MemGuard,
//!     MemLock, Result, Waiting,
//! };
//!
//! #[derive(Clone)]
//! struct FooLock {
//!     server: MemLock,
//! }
//!
//! impl Lock for FooLock {
//!     type Guard = MemGuard;
//!
//!     fn backend(&self) -> &'static str {
//!         "foo"
//!     }
//!
//!     fn capabilities(&self) -> Capabilities {
//!         // Strict tokens, FIFO, notified waiters, a 10 ms shortest TTL;
//!         // neither read-write locks nor semaphores.
//!         Capabilities::new(Fencing::Strict, true, Waiting::Notified, Duration::from_millis(10))
//!     }
//!
//!     // As if the process died: nothing released, the TTL frees its locks.
//!     async fn abandon(&self) {
//!         self.server.abandon().await
//!     }
//!
//!     /// The one acquire: the claim is one the capabilities offer.
//!     async fn grant(&self, key: &LockKey, claim: Claim, opts: AcquireOptions) -> Result<MemGuard> {
//!         match claim {
//!             // The driver's own protocol would go here.
//!             Claim::Mutex => self.server.grant(key, claim, opts).await,
//!             other => Err(other.unsupported(self.backend())),
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! let foo = FooLock { server: MemLock::new() };
//! let key = LockKey::new("jobs/nightly")?;
//! // Provided: checked and traced by the core, granted by `grant`.
//! let guard = foo.acquire(&key, AcquireOptions::default()).await?;
//! assert!(foo.try_acquire(&key, AcquireOptions::default()).await?.is_none());
//! guard.release().await?;
//! // Refused by the core, before `grant` runs: the capabilities say no.
//! let refused = foo.acquire_read(&key, AcquireOptions::default()).await;
//! assert!(matches!(refused, Err(Error::Unsupported { .. })));
//! // The same driver behind dynamic dispatch, for nothing more.
//! let any = AnyLock::new(foo);
//! any.acquire(&key, AcquireOptions::default()).await?.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Testing a driver with the kit
//!
//! A driver crate (say `dlock-foo`, whose `FooLock` implements
//! [`dlock_core::Lock`]) needs two dev-dependencies and one test file. No
//! `tokio` is needed for the generated tests: the macro brings its own.
//!
//! ```toml
//! [dev-dependencies]
//! dlock-core = "0.1"
//! dlock-testkit = "0.1"
//! ```
//!
//! `tests/conformance.rs` holds the factory and the macro call (our drivers
//! keep the factory in `tests/common/mod.rs`, shared by their other test
//! files). The factory
//! below starts a private server and **owns** it: the launcher's handle lives
//! in the factory (behind an `Arc`), so the server stops when the test that
//! made the factory ends, and no scenario can outlive its server.
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//!
//! use dlock_core::{Lock, Result};
//! use dlock_testkit::launcher::Redis;
//! use dlock_testkit::link::nowhere;
//! use dlock_testkit::{Link, Linked, LockFactory};
//! # type FooLock = dlock_core::MemLock;
//! # async fn connect(_server: SocketAddr) -> Result<FooLock> { Ok(FooLock::new()) }
//!
//! /// Clients of one private server, which it owns.
//! struct FooFactory {
//!     _server: Arc<Redis>,
//!     addr: SocketAddr,
//!     admin: FooLock,
//! }
//!
//! impl LockFactory for FooFactory {
//!     type Lock = FooLock;
//!
//!     fn name(&self) -> String {
//!         format!("foo {}", self.addr)
//!     }
//!     // Independent: its own connections, as another process would have.
//!     async fn client(&self) -> Result<FooLock> {
//!         connect(self.addr).await
//!     }
//!     // The names the backend still keeps under `namespace`.
//!     async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
//!         self.admin.keys_in_use(namespace).await
//!     }
//!     // A network driver offers links to break.
//!     fn breaks_links(&self) -> bool {
//!         true
//!     }
//!     async fn linked_client(&self) -> Result<Linked<FooLock>> {
//!         let link = Link::to(&[self.addr]).await?;
//!         let lock = connect(link.addrs()[0]).await?;
//!         Ok(Linked { lock, link })
//!     }
//!     async fn unreachable_client(&self) -> Result<FooLock> {
//!         connect(nowhere(1)?[0]).await
//!     }
//! }
//!
//! async fn factory() -> FooFactory {
//!     let server = Redis::start().await.expect("a redis-server");
//!     let addr = server.addrs()[0];
//!     let admin = connect(addr).await.expect("a client");
//!     FooFactory { _server: Arc::new(server), addr, admin }
//! }
//!
//! // FooLock promises no FIFO order.
//! dlock_testkit::conformance_tests!(factory, skip: [fifo_waiters]);
//! # fn main() {}
//! ```
//!
//! `cargo test --test conformance` then runs one test per scenario
//! (`cargo test -- --list` names them), the skipped ones show as *ignored*,
//! and `conformance::declared_skips_match_the_backend` checks the skip list.
//!
//! ## What each factory method must do, and how the kit checks it
//!
//! | method | must | checked by |
//! |---|---|---|
//! | `client` | return an independent client (own connections, own session) | the exclusion scenarios: two clients sharing a session would share its locks |
//! | `abandon` | silence the client without releasing anything | `expiry_frees_vanished_holder`: the lock must come free by its TTL (no sooner than half of it), not by a release |
//! | `residue` | list what the backend keeps under the namespace: lock keys, nodes, waiter entries | after every scenario the namespace must empty within the slack; `namespace_clean_after_use` fails if it lists nothing while a lock is held |
//! | `contenders` | count holder plus waiters of a key (FIFO backends must) | `fifo_waiters` queues waiters by it |
//! | `breaks_links` | say `true` wherever every connection the client makes can be put behind a link (every network driver we ship but a Redis Cluster client, which finds the other masters itself) | the link scenarios run only then; otherwise their skips must be declared, so they show as ignored |
//! | `linked_client` | a client whose every connection (all nodes, all endpoints) crosses a [`Link`] | a client that bypasses its link keeps renewing and fails `dead_link_fires_lost_in_time` |
//! | `unreachable_client` | a client of closed ports ([`link::nowhere`]) | `unreachable_backend_is_unavailable` expects `Error::Unavailable` from connecting or from the first requests |
//!
//! ## A new driver's author's view
//!
//! `dlock-postgres` was written against this kit and `dlock_core::driver`
//! as an outside author would, to find what the next author needs. What
//! was there and was enough:
//!
//! - **`dlock_core::driver`** for everything that is not the protocol:
//!   `Validity` (the local deadline from the send time minus drift, and
//!   `lost()`), `Keeper` (renewal of every guard of a handle in one task),
//!   `clean_up_in_background` (a release that failed or was cancelled is
//!   retried until the TTL makes it moot), `within_wait` and
//!   `wait_deadline` (a wait bounded by the caller's `Wait`, with no
//!   `Instant + Duration` overflow), `Outcome` / `Refusal` (the three
//!   answers of a release or extend, mapped to one error each),
//!   `redact_url` and `dlock_core::trace`. With them the driver's own code
//!   is its statements, their parsing and the waiting (`protocol.rs`).
//! - **The factory** ([`LockFactory`]): five methods and the link ones,
//!   with [`Link::to`] in front of the one server. All link scenarios ran
//!   unchanged.
//! - **Safety runs**: [`safety::pause_run`] and [`safety::run_with_faults`]
//!   take any `Lock` and a schedule of [`Fault`]s on launcher
//!   [`launcher::Member`]s, so the driver's `tests/safety.rs` is set-up only.
//!
//! What was missing or awkward, and what changed so the next author does
//! not meet it:
//!
//! - **The owner value's host part** was a private function in each
//!   driver: it is `dlock_core::driver::host_name` now, shared by all.
//! - **A server that will not run as root** (PostgreSQL, under CI's root):
//!   the launcher's members can run as another user, in a directory it
//!   owns, and a restart that meets the killed server's last children is
//!   retried. [`launcher::Postgres::start_tls`] makes a TLS-only server
//!   with a fresh CA, so a driver's TLS can be tested against a real one.
//! - **The family safety runs** (a semaphore and a read-write lock after
//!   the mutex run) are one function, [`safety::family_runs`], instead of
//!   a loop copied into each driver's test.
//! - **`residue` on a lease table**: the rows stay after a release
//!   (ShedLock's way, and the fence lives in them), so "what the backend
//!   keeps" had to be read as what still holds or waits: the factory lists
//!   the rows whose lease has not run out. A driver that keeps records by
//!   design should do the same; the kit's namespace check then still
//!   catches a lease that outlives its release.
//!
//! Still awkward, left for later:
//!
//! - Every driver writes its own **waiter registry** (a map from a name to
//!   a `Notify`, woken by a pub/sub message, a watch or a `NOTIFY`, and all
//!   woken when the connection drops). A generic one in `dlock_core::driver`
//!   would remove about 60 lines per driver.
//!
//! Since done, in `dlock_core::driver`:
//!
//! - **The guard** of a lease-based driver (Redis, Redlock, PostgreSQL)
//!   keeps its grant in a `driver::Lease` (deadline, keeper slot, extend,
//!   release and drop bookkeeping); `guard.rs` holds only what is the
//!   backend's own.
//! - **The owner value** has one writer and parser: `driver::owner_value`
//!   (`dlock1 <nonce> <host> <pid> <unix ms>`, unique per grant, for the
//!   backends that compare it) and `driver::owner_detail` (`<host> <pid>
//!   <unix ms>`, beside a key or node that already names the grant), read
//!   back by `driver::Owner`.
//! - **The renewal engine**: every guard's deadline and renewals (the
//!   lease backends' and `MemLock`'s) run on `driver::Keeper`, and
//!   ZooKeeper's guard watcher on the same scheduler
//!   (`driver::Inbox`, `driver::Slots`).
//!
//! A driver reports through `tracing` with the functions of
//! [`dlock_core::trace`] (`queued`, `lost`, `release_result`; the core
//! opens the `acquire` span around its `grant`); `reports_through_tracing` installs the kit's
//! [`trace`] subscriber as the process's global one, so a conformance test
//! binary must not install another.
//!
//! The kit's own tests (`tests/broken.rs`) run every scenario on
//! [`broken::NaiveLock`] with each planted [`broken::Flaw`] and assert that
//! the scenario meant for it catches it; `tests/mem.rs` is the shortest
//! complete example.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod broken;
mod factory;
pub mod history;
pub mod launcher;
pub mod link;
mod outcome;
pub mod reference;
mod runner;
pub mod safety;
pub mod scenarios;
pub mod trace;
pub mod workload;

pub use factory::{LockFactory, MemFactory};
pub use launcher::Fault;
pub use link::{Link, Linked};
pub use outcome::{Failure, ScenarioResult, Verdict, wait_until, within};
#[doc(hidden)]
pub use runner::__block_on;
pub use runner::{
    Report, SCENARIO_LIMIT, Scenario, ScenarioFuture, all_scenarios, check_declared_skips, run_all, run_one,
    run_scenario_test, skipped_scenarios,
};
pub use scenarios::{LINK_SCENARIOS, skip_reason};

/// The `tokio` the generated tests run on, so a driver's test crate need not
/// name it (implementation detail of [`conformance_tests!`]).
#[doc(hidden)]
pub use tokio as __tokio;

/// The examples of this crate's README, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
