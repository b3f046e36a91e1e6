//! The reference clients themselves, run against our drivers: Apache
//! Curator's recipes (ZooKeeper), etcd's own Go recipes and redis-py's
//! `Lock` ([`python`]), as processes the interop tests drive line by line.
//!
//! The programs' sources live in this crate (`reference/curator/Contender.java`,
//! `reference/go/contender.go`); the first use in a test binary compiles
//! them with the machine's `javac` against Debian's Curator jars, and with
//! `go build` in GOPATH mode against Debian's etcd sources, offline, and
//! caches the result under the cargo target directory
//! (`target/reference-clients/`, keyed by the source and the toolchain).
//! Each program prints the version of the library it runs, which the kit
//! writes to the test run's output once per test binary
//! (`reference client: curator 5.4.0 (...)`).
//!
//! One process hosts many contenders, each named by the test and each with
//! its own session (a Curator client, an etcd session lease): separate
//! processes as far as the lock is concerned.
//!
//! ```no_run
//! # async fn demo() -> Result<(), dlock_testkit::reference::ReferenceError> {
//! use dlock_testkit::reference::{Ask, ReferenceClient};
//!
//! let curator = ReferenceClient::curator("127.0.0.1:2181", std::time::Duration::from_secs(4)).await?;
//! let c1 = curator.contender("c1");
//! let grant = c1.acquire(Ask::Write("/dlock/job")).await?; // InterProcessReadWriteLock
//! println!("czxid {} at {}", grant.token, grant.node);
//! c1.release().await?;
//! curator.close().await;
//! # Ok(()) }
//! ```
//!
//! Every reply is awaited with a deadline ([`REPLY_LIMIT`]); a program that
//! is missing, fails to build, exits or stays silent is a
//! [`ReferenceError`] that says which, and names the Debian package to
//! install when a tool is absent.
//!
//! [`Holds`] records who held what, on the test's clock, from the ours and
//! theirs alike, and checks the family's invariants; [`free_run`] runs
//! both kinds of contender against each other and returns its report.

mod build;
mod holds;
pub mod python;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;

pub use build::{Program, announce, missing};
pub use holds::{FreeRun, Holds, HoldsReport, Ours, Primitive, Span, free_run};

/// How long any one reply may take (a grant included: the tests' holds are
/// short).
pub const REPLY_LIMIT: Duration = Duration::from_secs(30);

/// Why a reference client could not be built, started or heard.
#[derive(Clone, PartialEq, Eq)]
pub struct ReferenceError(pub String);

impl fmt::Display for ReferenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// The sentence itself: `unwrap()` in a test shows it as it is.
impl fmt::Debug for ReferenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReferenceError {}

type Result<T> = std::result::Result<T, ReferenceError>;

/// What a contender asks its recipe for; the path is the lock's as the
/// reference client names it (Curator: the lock's directory, `/dlock/NAME`;
/// Go: the prefix without its trailing `/`, `dlock/NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask<'a> {
    /// Curator `InterProcessMutex`, Go `concurrency.Mutex`.
    Mutex(&'a str),
    /// Curator `InterProcessReadWriteLock.readLock()`, Go `RWMutex.RLock`.
    Read(&'a str),
    /// Curator `InterProcessReadWriteLock.writeLock()`, Go `RWMutex.Lock`.
    Write(&'a str),
    /// Curator `InterProcessSemaphoreV2` with this limit (one lease).
    Semaphore(&'a str, u32),
}

impl Ask<'_> {
    fn command(self) -> String {
        match self {
            Ask::Mutex(p) => format!("mutex {p}"),
            Ask::Read(p) => format!("read {p}"),
            Ask::Write(p) => format!("write {p}"),
            Ask::Semaphore(p, limit) => format!("sem {p} {limit}"),
        }
    }
}

/// Which reference client's own view of a lock to ask for
/// ([`Contender::holders`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View<'a> {
    /// The mutex's holder as the recipe decides it (Curator: the first of
    /// `getParticipantNodes()`; Go: the key `WithFirstCreate` finds).
    Mutex(&'a str),
    /// The read-write lock's holders by the recipe's own rule (Go: its
    /// `waitOnLastRev` query for each key; Curator: its predicates over the
    /// read and write locks' participants).
    ReadWrite(&'a str),
    /// Curator's semaphore: `getParticipantNodes()`, every lease (Curator
    /// does not tell a waiter's from a holder's).
    Semaphore(&'a str, u32),
}

/// A grant: the token the backend gave it (`czxid`, create revision) and
/// its node or key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The node's `czxid` (ZooKeeper) or the key's create revision (etcd).
    pub token: u64,
    /// The full path of the node, or the key.
    pub node: String,
}

/// One holder in a reference client's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// `mutex`, `read`, `write` or `permit`.
    pub role: String,
    /// Its node (full path) or key.
    pub node: String,
    /// Its `czxid` or create revision.
    pub token: u64,
}

/// One line a contender said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The recipe set out to wait for this node or key (Curator's semaphore:
    /// `leases=N`).
    Behind(String),
    /// It holds.
    Granted(Grant),
    /// It released.
    Released,
    /// A view's holders.
    Holders(Vec<Listed>),
    /// It failed.
    Error(String),
}

impl Reply {
    fn parse(line: &str) -> Reply {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let rest = rest.trim();
        match word {
            "behind" => Reply::Behind(rest.to_owned()),
            "released" => Reply::Released,
            "granted" => match rest.split_once(' ') {
                Some((token, node)) if token.parse::<u64>().is_ok() => Reply::Granted(Grant {
                    token: token.parse().unwrap_or_default(),
                    node: node.to_owned(),
                }),
                _ => Reply::Error(format!("a grant that does not parse: {line:?}")),
            },
            "holders" => {
                let listed = rest.split_whitespace().map(|h| {
                    let (role, rest) = h.split_once(':')?;
                    let (node, token) = rest.rsplit_once('@')?;
                    Some(Listed {
                        role: role.to_owned(),
                        node: node.to_owned(),
                        token: token.parse().ok()?,
                    })
                });
                match listed.collect::<Option<Vec<_>>>() {
                    Some(all) => Reply::Holders(all),
                    None => Reply::Error(format!("holders that do not parse: {line:?}")),
                }
            }
            "error" => Reply::Error(rest.to_owned()),
            _ => Reply::Error(format!("an unknown reply: {line:?}")),
        }
    }
}

/// A running reference program.
struct Process {
    name: &'static str,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    child: tokio::sync::Mutex<Child>,
    /// Lines not yet taken, by contender.
    inbox: Mutex<Inbox>,
    arrived: Notify,
    /// The last of its standard error, for messages.
    stderr: Arc<Mutex<String>>,
}

#[derive(Default)]
struct Inbox {
    lines: HashMap<String, VecDeque<String>>,
    /// The program's output ended (it exited).
    ended: bool,
}

impl Process {
    fn stderr_tail(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(PoisonError::into_inner);
        if tail.is_empty() {
            "nothing on its stderr".to_owned()
        } else {
            format!("its stderr ends: {}", tail.trim())
        }
    }

    /// The next line for `id`, within `limit`.
    async fn next(&self, id: &str, limit: Duration) -> Result<String> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let arrived = self.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            {
                let mut inbox = self.inbox.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(line) = inbox.lines.get_mut(id).and_then(VecDeque::pop_front) {
                    return Ok(line);
                }
                if inbox.ended {
                    return Err(ReferenceError(format!(
                        "the {} reference client exited before {id} answered; {}",
                        self.name,
                        self.stderr_tail()
                    )));
                }
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return Err(ReferenceError(format!(
                    "{} contender {id} did not answer within {limit:?}",
                    self.name
                )));
            }
        }
    }

    async fn send(&self, line: &str) -> Result<()> {
        let mut stdin = self.stdin.lock().await;
        let Some(stdin) = stdin.as_mut() else {
            return Err(ReferenceError(format!(
                "the {} reference client was closed",
                self.name
            )));
        };
        let sent = async {
            stdin.write_all(format!("{line}\n").as_bytes()).await?;
            stdin.flush().await
        };
        match tokio::time::timeout(REPLY_LIMIT, sent).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(ReferenceError(format!(
                "could not write to the {} reference client ({e}); {}",
                self.name,
                self.stderr_tail()
            ))),
            Err(_) => Err(ReferenceError(format!(
                "the {} reference client took no input for {REPLY_LIMIT:?}",
                self.name
            ))),
        }
    }
}

/// A running reference client program (one process, many contenders).
/// Dropping it kills the process (its sessions then expire); [`close`]
/// ends them first.
///
/// [`close`]: ReferenceClient::close
#[derive(Clone)]
pub struct ReferenceClient {
    process: Arc<Process>,
    version: Arc<str>,
}

impl fmt::Debug for ReferenceClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReferenceClient")
            .field("name", &self.process.name)
            .field("version", &self.version)
            .finish()
    }
}

impl ReferenceClient {
    /// Apache Curator's recipes against the ZooKeeper at `connect`
    /// (`host:port[,...]`), each contender a Curator client with this
    /// session timeout.
    ///
    /// # Errors
    ///
    /// A [`ReferenceError`] naming the Debian package when `javac` or
    /// Curator's jars are missing, or saying why the program did not build
    /// or start.
    pub async fn curator(connect: &str, session: Duration) -> Result<Self> {
        let program = build::built(Program::Curator).await?;
        let millis = session.as_millis().to_string();
        let mut cmd = Command::new(build::JAVA);
        cmd.args([
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:-UsePerfData",
            "-Xmx128m",
            "-cp",
            &build::curator_classpath(&program),
            "Contender",
            connect,
            &millis,
        ]);
        Self::start("Curator", cmd).await
    }

    /// etcd's Go recipes against `endpoints` (`http://host:port`), each
    /// contender an etcd client whose session lease has this TTL (whole
    /// seconds, at least 1).
    ///
    /// # Errors
    ///
    /// As [`curator`](Self::curator), for `go` and etcd's Go sources.
    pub async fn go_etcd(endpoints: &[String], session_ttl: Duration) -> Result<Self> {
        let program = build::built(Program::GoEtcd).await?;
        let mut cmd = Command::new(program.join("contender"));
        cmd.args([endpoints.join(","), session_ttl.as_secs().max(1).to_string()]);
        Self::start("etcd Go", cmd).await
    }

    async fn start(name: &'static str, mut cmd: Command) -> Result<Self> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            ReferenceError(format!(
                "the {name} reference client did not start: {e} ({cmd:?})"
            ))
        })?;
        let (Some(stdin), Some(stdout), Some(mut err)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ReferenceError(format!(
                "the {name} reference client has no pipes"
            )));
        };
        let stderr = Arc::new(Mutex::new(String::new()));
        let tail = Arc::clone(&stderr);
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                tail.push_str(&String::from_utf8_lossy(&buf[..n]));
                if tail.len() > 4096 {
                    let cut = tail.len() - 4096;
                    let cut = (cut..tail.len()).find(|&i| tail.is_char_boundary(i)).unwrap_or(0);
                    tail.replace_range(..cut, "");
                }
            }
        });
        let process = Arc::new(Process {
            name,
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            child: tokio::sync::Mutex::new(child),
            inbox: Mutex::default(),
            arrived: Notify::new(),
            stderr,
        });
        // The router: each line to its contender's inbox. It holds the
        // process weakly: a client dropped kills the program, which ends it.
        let weak = Arc::downgrade(&process);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            loop {
                let line = lines.next_line().await;
                let Some(process) = weak.upgrade() else { return };
                let mut inbox = process.inbox.lock().unwrap_or_else(PoisonError::into_inner);
                match line {
                    Ok(Some(line)) => {
                        let (id, rest) = line.split_once(' ').unwrap_or((&line, ""));
                        inbox
                            .lines
                            .entry(id.to_owned())
                            .or_default()
                            .push_back(rest.to_owned());
                    }
                    Ok(None) | Err(_) => inbox.ended = true,
                }
                let ended = inbox.ended;
                drop(inbox);
                process.arrived.notify_waiters();
                if ended {
                    return;
                }
            }
        });
        let version = process.next("version", REPLY_LIMIT).await?;
        process.next("ready", REPLY_LIMIT).await?;
        // Once per program and test binary, past the test harness's
        // capture (it takes only `print!`), so every run's log shows it.
        build::announce(name, &version);
        Ok(ReferenceClient {
            process,
            version: version.into(),
        })
    }

    /// The library and version the program runs, as it printed them (e.g.
    /// `curator 5.4.0 (zookeeper client 3.8.0, java 17.0.15)`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The contender named `id` (made on its first command, with its own
    /// session).
    pub fn contender(&self, id: &str) -> Contender {
        Contender {
            process: Arc::clone(&self.process),
            id: id.to_owned(),
        }
    }

    /// Ends the program: closes its input, so every contender closes its
    /// session (its nodes and keys go), and waits for it to exit (killing
    /// it after [`REPLY_LIMIT`]).
    pub async fn close(self) {
        self.process.stdin.lock().await.take();
        let mut child = self.process.child.lock().await;
        if tokio::time::timeout(REPLY_LIMIT, child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
    }
}

/// One contender of a [`ReferenceClient`]: its commands run in order.
#[derive(Clone)]
pub struct Contender {
    process: Arc<Process>,
    id: String,
}

impl fmt::Debug for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} contender {}", self.process.name, self.id)
    }
}

impl Contender {
    /// Its name.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Which reference client it runs in (`Curator`, `etcd Go`).
    pub fn client(&self) -> &'static str {
        self.process.name
    }

    fn err(&self, what: impl fmt::Display) -> ReferenceError {
        ReferenceError(format!("{} contender {}: {what}", self.process.name, self.id))
    }

    /// Its next reply, within [`REPLY_LIMIT`].
    ///
    /// # Errors
    ///
    /// When none comes in time, or the program exited.
    pub async fn reply(&self) -> Result<Reply> {
        let line = self.process.next(&self.id, REPLY_LIMIT).await?;
        Ok(Reply::parse(&line))
    }

    /// Asks for `what` and returns at once (see [`queued`](Self::queued)
    /// and [`granted`](Self::granted)).
    ///
    /// # Errors
    ///
    /// When the program cannot be written to.
    pub async fn start(&self, what: Ask<'_>) -> Result<()> {
        self.process
            .send(&format!("{} {}", self.id, what.command()))
            .await
    }

    /// Waits for the recipe to report that it waits, and returns what for
    /// (a node's name, a key, `leases=N`).
    ///
    /// # Errors
    ///
    /// When it was granted instead (the layouts disagree), failed, or said
    /// nothing in time.
    pub async fn queued(&self) -> Result<String> {
        match self.reply().await? {
            Reply::Behind(what) => Ok(what),
            Reply::Granted(g) => Err(self.err(format_args!(
                "granted ({} at {}) where it had to wait",
                g.token, g.node
            ))),
            other => Err(self.err(format_args!("expected to wait, said {other:?}"))),
        }
    }

    /// Waits for the grant, passing over reports of waiting.
    ///
    /// # Errors
    ///
    /// When it failed or no grant came in time.
    pub async fn granted(&self) -> Result<Grant> {
        loop {
            match self.reply().await? {
                Reply::Behind(_) => {}
                Reply::Granted(g) => return Ok(g),
                other => return Err(self.err(format_args!("expected a grant, said {other:?}"))),
            }
        }
    }

    /// The next reply, which must be the grant (no waiting on the way).
    ///
    /// # Errors
    ///
    /// When it waited, failed or said nothing in time.
    pub async fn granted_at_once(&self) -> Result<Grant> {
        match self.reply().await? {
            Reply::Granted(g) => Ok(g),
            other => Err(self.err(format_args!("expected a grant at once, said {other:?}"))),
        }
    }

    /// The next report of waiting, which must name `what` (it waits for
    /// that node or key now).
    ///
    /// # Errors
    ///
    /// When it was granted instead, waits for something else, failed, or
    /// said nothing in time.
    pub async fn behind(&self, what: &str) -> Result<()> {
        let found = self.queued().await?;
        if found == what || found.ends_with(&format!("/{what}")) || what.ends_with(&format!("/{found}")) {
            Ok(())
        } else {
            Err(self.err(format_args!("waits behind {found}, expected {what}")))
        }
    }

    /// [`start`](Self::start) and [`granted`](Self::granted).
    ///
    /// # Errors
    ///
    /// As those.
    pub async fn acquire(&self, what: Ask<'_>) -> Result<Grant> {
        self.start(what).await?;
        self.granted().await
    }

    /// Releases what it holds.
    ///
    /// # Errors
    ///
    /// When it failed or did not answer in time.
    pub async fn release(&self) -> Result<()> {
        self.process.send(&format!("{} release", self.id)).await?;
        match self.reply().await? {
            Reply::Released => Ok(()),
            other => Err(self.err(format_args!("expected released, said {other:?}"))),
        }
    }

    /// The reference client's own view of who holds ([`View`]).
    ///
    /// # Errors
    ///
    /// When it failed or did not answer in time.
    pub async fn holders(&self, view: View<'_>) -> Result<Vec<Listed>> {
        let ask = match view {
            View::Mutex(p) => format!("holders mutex {p}"),
            View::ReadWrite(p) => format!("holders rw {p}"),
            View::Semaphore(p, limit) => format!("holders sem {p} {limit}"),
        };
        self.process.send(&format!("{} {ask}", self.id)).await?;
        match self.reply().await? {
            Reply::Holders(all) => Ok(all),
            other => Err(self.err(format_args!("expected holders, said {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse() {
        assert_eq!(
            Reply::parse("granted 17 /dlock/x/_c_a-lock-0000000001"),
            Reply::Granted(Grant {
                token: 17,
                node: "/dlock/x/_c_a-lock-0000000001".to_owned()
            })
        );
        assert_eq!(
            Reply::parse("behind leases=3"),
            Reply::Behind("leases=3".to_owned())
        );
        assert_eq!(Reply::parse("released"), Reply::Released);
        assert_eq!(Reply::parse("holders "), Reply::Holders(Vec::new()));
        assert_eq!(
            Reply::parse("holders read:dlock/x/read/1@5 write:a@b@6"),
            Reply::Holders(vec![
                Listed {
                    role: "read".to_owned(),
                    node: "dlock/x/read/1".to_owned(),
                    token: 5
                },
                Listed {
                    role: "write".to_owned(),
                    node: "a@b".to_owned(),
                    token: 6
                }
            ])
        );
        assert!(matches!(Reply::parse("granted x y"), Reply::Error(_)));
        assert!(matches!(Reply::parse("holders nonsense"), Reply::Error(_)));
        assert_eq!(Reply::parse("error boom"), Reply::Error("boom".to_owned()));
    }
}
