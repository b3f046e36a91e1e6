//! The safety run with each client in its own OS process.
//!
//! The parent ([`run`]) serves the shared resource (the fenced register and
//! its log) on a loopback port and records the history; each child
//! ([`client`]) holds its own connection to the lock backend and tells the
//! parent, one request at a time, what it is doing:
//!
//! ```text
//! child → parent          parent → child
//! HELLO <pid>             PLAN <id> <key> <ttl ms> <duration ms>
//! INVOKE                  OK
//! GRANT <token|->         OK
//! FAIL timeout|error      OK
//! READ <token|->          VALUE <n> | REFUSED
//! WRITE <token|-> <n>     ACCEPTED | REFUSED
//! RELEASE                 OK                   (then the child releases)
//! DONE <operations>       BYE
//! ```
//!
//! Each request waits for its answer, so the parent's clock brackets the
//! child's view: a grant is stamped after the child saw it, a release before
//! the child invokes it. The history checker therefore never blames the
//! driver for the message delay.
//!
//! The holder pause is a real one: on every `pause_every`-th grant of client
//! 0 the parent freezes the whole child process with `SIGSTOP` right after
//! serving its read (its runtime, its driver, its keep-alives all stop, as
//! in a GC pause or a stopped VM), keeps it frozen for `pause`, and thaws it
//! with `SIGCONT`; the child then writes with its old token.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, FenceGate, FencingToken, Guard, Lock, LockKey, Wait};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Command;

use super::{Resource, SafetyReport, finish};
use crate::history::{History, Op};

/// How a run with client processes goes.
#[derive(Debug, Clone)]
pub struct ProcessPlan {
    /// The number of client processes.
    pub clients: usize,
    /// How long the clients keep working.
    pub duration: Duration,
    /// The lock TTL (without auto-extend).
    pub ttl: Duration,
    /// Client 0 is frozen on every `pause_every`-th grant (0: never).
    pub pause_every: u32,
    /// How long a frozen client stays frozen: longer than the lock's TTL
    /// (for ZooKeeper, than the session timeout).
    pub pause: Duration,
    /// Whether the resource checks fencing tokens.
    pub fence: bool,
    /// The lock key.
    pub key: String,
}

/// The environment variable a child finds the parent's address in.
pub const PARENT_VAR: &str = "DLOCK_SAFETY_PARENT";

struct Shared {
    history: History,
    resource: Resource,
    plan: ProcessPlan,
    started: Instant,
    next_id: AtomicUsize,
    operations: AtomicUsize,
    pauses: AtomicUsize,
    accepted: AtomicU64,
    rejected: AtomicU64,
    faults: std::sync::Mutex<Vec<(Duration, String)>>,
}

/// Runs the workload with `plan.clients` child processes, each made by
/// `spawn(parent_address)`: a command that runs [`client`] with the
/// backend's client, and finds the parent's address in [`PARENT_VAR`]
/// (already set on the command). Waits for every child to finish.
///
/// # Errors
///
/// If the loopback listener cannot be opened, a child cannot be started,
/// does not finish within the run plus a minute, or exits with a failure
/// (the error carries its stderr).
pub async fn run(plan: ProcessPlan, spawn: impl Fn(SocketAddr) -> Command) -> Result<SafetyReport, String> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| format!("cannot listen on loopback: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let shared = Arc::new(Shared {
        history: History::new(),
        resource: Resource {
            gate: FenceGate::new(),
            fence: plan.fence,
            register: AtomicU64::new(0),
            log: std::sync::Mutex::default(),
        },
        plan: plan.clone(),
        started: Instant::now(),
        next_id: AtomicUsize::new(0),
        operations: AtomicUsize::new(0),
        pauses: AtomicUsize::new(0),
        accepted: AtomicU64::new(0),
        rejected: AtomicU64::new(0),
        faults: std::sync::Mutex::default(),
    });
    let mut children = Vec::new();
    for _ in 0..plan.clients {
        let mut cmd = spawn(addr);
        cmd.env(PARENT_VAR, addr.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        children.push(
            cmd.spawn()
                .map_err(|e| format!("cannot start a client process: {e}"))?,
        );
    }
    let accept = {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let mut conversations = Vec::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    break;
                };
                conversations.push(tokio::spawn(serve(Arc::clone(&shared), stream)));
            }
            conversations
        })
    };
    let deadline = plan.duration + Duration::from_secs(60);
    let mut failures = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        match tokio::time::timeout(deadline, child.wait_with_output()).await {
            Ok(Ok(out)) if out.status.success() => {}
            Ok(Ok(out)) => failures.push(format!(
                "client process {i} exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )),
            Ok(Err(e)) => failures.push(format!("client process {i}: {e}")),
            Err(_) => failures.push(format!("client process {i} still running after {deadline:?}")),
        }
    }
    accept.abort();
    if !failures.is_empty() {
        return Err(failures.join("\n"));
    }
    let finished = shared.next_id.load(Ordering::SeqCst);
    if finished != plan.clients {
        return Err(format!(
            "{finished} of {} client processes reached the parent",
            plan.clients
        ));
    }
    let mut faults = std::mem::take(&mut *shared.faults.lock().unwrap_or_else(|e| e.into_inner()));
    faults.sort_by_key(|(at, _)| *at);
    let heals: Vec<Duration> = faults
        .iter()
        .filter(|(_, what)| what.starts_with("heal"))
        .map(|(at, _)| *at)
        .collect();
    Ok(finish(
        &shared.history,
        plan.fence,
        &shared.resource,
        [
            shared.operations.load(Ordering::SeqCst),
            shared.pauses.load(Ordering::SeqCst),
        ],
        [
            shared.accepted.load(Ordering::SeqCst),
            shared.rejected.load(Ordering::SeqCst),
        ],
        faults,
        &heals,
    ))
}

fn parse_token(s: Option<&str>) -> Result<Option<FencingToken>, String> {
    match s {
        Some("-") => Ok(None),
        Some(t) => t
            .parse::<u64>()
            .map(|t| Some(FencingToken::new(t)))
            .map_err(|e| format!("bad token {t:?}: {e}")),
        None => Err("missing token".into()),
    }
}

fn signal(pid: i32, sig: Signal) {
    let _ = kill(Pid::from_raw(pid), sig);
}

/// One child's conversation.
async fn serve(shared: Arc<Shared>, stream: TcpStream) -> Result<(), String> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let (mut id, mut pid, mut grants) = (usize::MAX, 0i32, 0u32);
    let key = shared.plan.key.clone();
    let h = &shared.history;
    while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
        let mut words = line.split_whitespace();
        let reply = match words.next() {
            Some("HELLO") => {
                pid = words
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or("HELLO without a pid")?;
                id = shared.next_id.fetch_add(1, Ordering::SeqCst);
                format!(
                    "PLAN {id} {key} {} {}",
                    shared.plan.ttl.as_millis(),
                    shared.plan.duration.as_millis()
                )
            }
            Some("INVOKE") => {
                h.record(id, &key, Op::AcquireInvoke);
                "OK".into()
            }
            Some("GRANT") => {
                grants += 1;
                h.record(id, &key, Op::AcquireOk(parse_token(words.next())?));
                "OK".into()
            }
            Some("FAIL") => {
                let op = if words.next() == Some("timeout") {
                    Op::AcquireFail
                } else {
                    Op::AcquireUnknown
                };
                h.record(id, &key, op);
                "OK".into()
            }
            Some("READ") => {
                let token = parse_token(words.next())?;
                let value = shared.resource.read(token);
                let pause = value.is_some()
                    && id == 0
                    && shared.plan.pause_every > 0
                    && grants % shared.plan.pause_every == 0;
                if pause {
                    // Frozen while holding, between its read and its write.
                    signal(pid, Signal::SIGSTOP);
                    h.record(id, &key, Op::Lost);
                    shared.pauses.fetch_add(1, Ordering::SeqCst);
                    let at = shared.started.elapsed();
                    tokio::time::sleep(shared.plan.pause).await;
                    let mut faults = shared.faults.lock().unwrap_or_else(|e| e.into_inner());
                    faults.push((at, format!("inject SIGSTOP to client process 0 (pid {pid})")));
                    faults.push((shared.started.elapsed(), "heal: SIGCONT".to_owned()));
                }
                let reply = value.map_or_else(|| "REFUSED".to_owned(), |v| format!("VALUE {v}"));
                write
                    .write_all(format!("{reply}\n").as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
                if pause {
                    signal(pid, Signal::SIGCONT);
                }
                continue;
            }
            Some("WRITE") => {
                let token = parse_token(words.next())?;
                let value: u64 = words
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("WRITE without a value")?;
                if shared.resource.write(h, id, token, value) {
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    "ACCEPTED".into()
                } else {
                    shared.rejected.fetch_add(1, Ordering::SeqCst);
                    "REFUSED".into()
                }
            }
            Some("RELEASE") => {
                h.record(id, &key, Op::Release);
                "OK".into()
            }
            Some("DONE") => {
                let ops: usize = words.next().and_then(|o| o.parse().ok()).unwrap_or(0);
                shared.operations.fetch_add(ops, Ordering::SeqCst);
                "BYE".into()
            }
            other => return Err(format!("unknown request {other:?}")),
        };
        write
            .write_all(format!("{reply}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The child's side: talks to the parent at `parent` (from [`PARENT_VAR`])
/// and loops acquire → read → write → release on `lock` until the plan's
/// duration is over.
///
/// # Errors
///
/// If the parent cannot be reached or answers out of protocol. Lock errors
/// are reported to the parent, not returned.
pub async fn client<L: Lock>(lock: L, parent: SocketAddr) -> Result<(), String> {
    let stream = TcpStream::connect(parent)
        .await
        .map_err(|e| format!("cannot reach the parent at {parent}: {e}"))?;
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut ask = async move |request: String| -> Result<String, String> {
        write
            .write_all(format!("{request}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        lines
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the parent hung up".to_owned())
    };
    let plan = ask(format!("HELLO {}", std::process::id())).await?;
    let words: Vec<&str> = plan.split_whitespace().collect();
    let [_, _, key, ttl, duration] = words[..] else {
        return Err(format!("bad plan {plan:?}"));
    };
    let ms = |s: &str| {
        s.parse()
            .map(Duration::from_millis)
            .map_err(|e| format!("{s:?}: {e}"))
    };
    let key = LockKey::new(key).map_err(|e| e.to_string())?;
    let (ttl, duration) = (ms(ttl)?, ms(duration)?);
    let opts = AcquireOptions::default()
        .ttl(ttl)
        .auto_extend(false)
        .wait(Wait::For(ttl * 4));
    let show = |t: Option<FencingToken>| t.map_or_else(|| "-".to_owned(), |t| t.get().to_string());
    let stop = Instant::now() + duration;
    let mut operations = 0usize;
    while Instant::now() < stop {
        operations += 1;
        ask("INVOKE".into()).await?;
        let guard = match lock.acquire(&key, opts).await {
            Ok(g) => g,
            Err(e) => {
                let kind = if e.is_timeout() { "timeout" } else { "error" };
                ask(format!("FAIL {kind}")).await?;
                if !e.is_timeout() {
                    // A backend error (a session being replaced, say):
                    // back off a little rather than spin.
                    tokio::time::sleep(ttl / 4).await;
                }
                continue;
            }
        };
        let token = show(guard.token());
        ask(format!("GRANT {token}")).await?;
        let read = ask(format!("READ {token}")).await?;
        if let Some(value) = read.strip_prefix("VALUE ") {
            let value: u64 = value.parse().map_err(|e| format!("bad value {value:?}: {e}"))?;
            ask(format!("WRITE {token} {}", value + 1)).await?;
        }
        ask("RELEASE".into()).await?;
        let _ = guard.release().await;
    }
    ask(format!("DONE {operations}")).await?;
    Ok(())
}
