//! The safety runner's fenced workload with the holder-pause nemesis.
//!
//! K clients loop: acquire → read a shared register → increment it through
//! the resource's fence → append to a log → release. One client now and then
//! *pauses* while holding (its task stops, as in a GC pause) past its TTL,
//! then wakes up and writes. With the fence (the resource admits a token on
//! every access, read or write, and refuses one lower than it has seen), no
//! stale write is accepted and no update is lost. Without it, the paused
//! holder overwrites newer holders' increments: lost updates, which the
//! report counts. Both directions are tested.
//!
//! Beside the holder pause, a [`Schedule`] of server faults runs on a
//! [`Faults`] target the backend's test provides: kill and restart a server
//! or member, freeze one with `SIGSTOP` (then `SIGCONT`), cut one client off
//! with the fault proxy (then heal). Each run records which fault ran when.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, FenceGate, FencingToken, Guard, Lock, LockKey, Wait};

use crate::LockFactory;
use crate::launcher::{Fault, FaultProxy, Member};

use crate::history::{History, Op, Report};

pub mod processes;

/// How a safety run goes.
#[derive(Debug, Clone, Copy)]
pub struct SafetyPlan {
    /// How long clients keep working.
    pub duration: Duration,
    /// The lock TTL (without auto-extend, so a pause really outlives it).
    pub ttl: Duration,
    /// Client 0 pauses on every `pause_every`-th grant (0: never).
    pub pause_every: u32,
    /// Whether the resource checks fencing tokens.
    pub fence: bool,
}

/// A server fault the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Kill a server or member (`SIGKILL`), restart it at heal.
    KillRestart,
    /// Freeze a server or member (`SIGSTOP`), thaw it at heal.
    Stop,
    /// Cut one client off with the fault proxy (blackhole), reconnect at heal.
    Partition,
    /// Redis only: take an RDB snapshot (`SAVE`) at inject; at heal, kill
    /// the server and restart it from that snapshot, which misses every
    /// grant made in between (as a restart from an older RDB, or from an
    /// `appendfsync everysec` AOF, would).
    SnapshotRestart,
}

/// What the nemesis acts on: the backend's servers and proxies.
pub trait Faults: Send + 'static {
    /// Injects a fault; returns a description (which member, which client).
    fn inject(&mut self, kind: FaultKind) -> impl Future<Output = Result<String, String>> + Send;
    /// Undoes the last fault.
    fn heal(&mut self) -> impl Future<Output = Result<String, String>> + Send;
}

/// No server faults (holder pauses only).
#[derive(Debug, Default)]
pub struct NoFaults;

impl Faults for NoFaults {
    async fn inject(&mut self, _: FaultKind) -> Result<String, String> {
        Ok("nothing".to_owned())
    }
    async fn heal(&mut self) -> Result<String, String> {
        Ok("nothing".to_owned())
    }
}

/// Faults on one member of a server topology (kill/restart, stop/resume)
/// and on one client's proxy (partition): what the drivers' safety runs use.
pub struct MemberFaults<S> {
    servers: S,
    members: fn(&mut S) -> &mut [Member],
    index: usize,
    proxy: FaultProxy,
    last: Option<FaultKind>,
}

impl<S> MemberFaults<S> {
    /// Faults on member `index` of `servers` (reached through `members`,
    /// e.g. `|r: &mut Redis| r.members()`) and on the client behind `proxy`.
    pub fn new(servers: S, members: fn(&mut S) -> &mut [Member], index: usize, proxy: FaultProxy) -> Self {
        MemberFaults {
            servers,
            members,
            index,
            proxy,
            last: None,
        }
    }
}

impl<S: Send + 'static> Faults for MemberFaults<S> {
    async fn inject(&mut self, kind: FaultKind) -> Result<String, String> {
        self.last = Some(kind);
        let index = self.index;
        let m = (self.members)(&mut self.servers)
            .get_mut(index)
            .ok_or_else(|| format!("no member {index}"))?;
        match kind {
            FaultKind::KillRestart => m.kill().map(|()| format!("killed {}", m.name())),
            FaultKind::Stop => m.pause().map(|()| format!("SIGSTOP to {}", m.name())),
            FaultKind::Partition => {
                self.proxy.set(Fault::Blackhole);
                Ok("the proxied client cut off".into())
            }
            FaultKind::SnapshotRestart => {
                let (addr, name) = (m.addr(), m.name().to_owned());
                return match crate::launcher::redis::command(addr, &["SAVE"]).await {
                    Ok(reply) if reply == "+OK" => Ok(format!("snapshot of {name}")),
                    Ok(reply) => Err(format!("SAVE on {name}: {reply}")),
                    Err(e) => Err(format!("SAVE on {name}: {e}")),
                };
            }
        }
        .map_err(|e| e.to_string())
    }

    async fn heal(&mut self) -> Result<String, String> {
        let index = self.index;
        let m = (self.members)(&mut self.servers)
            .get_mut(index)
            .ok_or_else(|| format!("no member {index}"))?;
        match self.last.take() {
            Some(FaultKind::KillRestart) => m.restart().await.map(|()| format!("restarted {}", m.name())),
            Some(FaultKind::Stop) => m.resume().map(|()| format!("SIGCONT to {}", m.name())),
            Some(FaultKind::Partition) => {
                self.proxy.set(Fault::None);
                Ok("the proxied client reconnected".into())
            }
            Some(FaultKind::SnapshotRestart) => {
                // Killed, so nothing newer is written: the restart loads the snapshot.
                match m.kill() {
                    Ok(()) => m
                        .restart()
                        .await
                        .map(|()| format!("{} restarted from the older snapshot", m.name())),
                    Err(e) => Err(e),
                }
            }
            None => Ok("nothing to heal".into()),
        }
        .map_err(|e| e.to_string())
    }
}

/// The holder-pause run on `clients` fresh clients of `factory`, on a
/// fresh key, with its [`residue`] measured, printed ([`publish`]) under `backend` / `run_name` / `claim`.
///
/// # Panics
///
/// If the factory cannot make a client (a test's setup failed).
pub async fn pause_run<F: LockFactory>(
    factory: &F,
    clients: usize,
    plan: SafetyPlan,
    (backend, run_name, claim): (&str, &str, &str),
) -> SafetyReport {
    let mut locks = Vec::new();
    for _ in 0..clients {
        locks.push(factory.client().await.expect("a client of the factory"));
    }
    let key = LockKey::new(format!("safety-{:x}", rand::random::<u64>())).expect("a valid key");
    let mut report = run(locks, &key, plan).await;
    // A paused holder's lock runs out by TTL (or session): allow for that.
    report.residue = Some(residue(factory, key.as_str(), plan.ttl * 4 + Duration::from_secs(20)).await);
    eprintln!("{}: {report}", factory.name());
    publish(backend, run_name, &report, claim);
    report
}

/// A run's length: `DLOCK_SAFETY_SECONDS` (set by `cargo xtask safety
/// --seconds S`), or `default_secs` (the short runs of `cargo xtask test`).
pub fn run_for(default_secs: u64) -> Duration {
    let secs = std::env::var("DLOCK_SAFETY_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_secs);
    Duration::from_secs(secs)
}

/// Prints a report in the line format `cargo xtask safety` collects into
/// `RELIABILITY.md`.
pub fn publish(backend: &str, run: &str, report: &SafetyReport, claim: &str) {
    publish_line(backend, run, claim, &report.to_string(), &report.faults);
}

/// As [`publish`], for a run that is not a [`SafetyReport`] (a scripted
/// scenario): its result in words and its faults with their times.
pub fn publish_line(backend: &str, run: &str, claim: &str, result: &str, faults: &[(Duration, String)]) {
    println!("SAFETY-REPORT|{backend}|{run}|{claim}|{result}");
    for (at, what) in faults {
        println!("SAFETY-FAULT|{backend}|{run}|{at:?}|{what}");
    }
}

/// When faults happen: after `calm`, each kind in turn for `fault`, then
/// `calm` again, until the run ends (and the last fault is healed).
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The faults, in turn.
    pub kinds: Vec<FaultKind>,
    /// Time between faults.
    pub calm: Duration,
    /// How long each fault lasts.
    pub fault: Duration,
}

/// What a safety run found.
#[derive(Debug, Clone)]
pub struct SafetyReport {
    /// The history checker's verdict (overlaps, token order, stale writes).
    pub history: Report,
    /// Acquire attempts.
    pub operations: usize,
    /// Holder pauses injected.
    pub pauses: usize,
    /// Increments the resource accepted.
    pub accepted: u64,
    /// Increments refused by the fence.
    pub rejected: u64,
    /// The register's final value.
    pub register: u64,
    /// Increments lost: accepted but not in the register.
    pub lost_updates: u64,
    /// The longest overlap of two holds, in the clients' own view.
    pub longest_overlap: Duration,
    /// The faults injected and healed: (time since start, what).
    pub faults: Vec<(Duration, String)>,
    /// The longest time from a heal to the next grant (among heals that
    /// were followed by one).
    pub longest_gap_after_heal: Duration,
    /// Heals no grant followed before the run ended (the last heal of a
    /// run often is one; more would mean the backend did not recover).
    pub heals_without_grant: usize,
    /// What the backend still held for the run's key after the drain, if
    /// measured ([`residue`]).
    pub residue: Option<Residue>,
}

/// What a run left on the backend: the keys (nodes, waiter keys) still
/// there when the clients had drained, and how long until they were gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Residue {
    /// Left right after the drain (a lock given up by TTL, not release,
    /// stays until its TTL or session runs out).
    pub at_drain: Vec<String>,
    /// When the last of them was gone, after the drain; `None` if some were
    /// still there at the deadline.
    pub cleared_after: Option<Duration>,
    /// What was still there at the deadline.
    pub left: Vec<String>,
}

impl fmt::Display for Residue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "residue at drain {}", self.at_drain.len())?;
        match self.cleared_after {
            Some(_) if self.at_drain.is_empty() => Ok(()),
            Some(after) => write!(f, ", all gone after {after:?}"),
            None => write!(f, ", {} still left: {:?}", self.left.len(), self.left),
        }
    }
}

/// Measures what `factory`'s backend still holds under `namespace` (a run's
/// key) now, then waits until nothing is left or `within` has passed.
///
/// # Panics
///
/// If the backend cannot list its keys (the run's servers are gone).
pub async fn residue<F: LockFactory>(factory: &F, namespace: &str, within: Duration) -> Residue {
    let started = Instant::now();
    let list = async || {
        factory
            .residue(namespace)
            .await
            .unwrap_or_else(|e| panic!("listing the residue of {namespace:?}: {e}"))
    };
    let at_drain = list().await;
    let mut left = at_drain.clone();
    while !left.is_empty() && started.elapsed() < within {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = list().await;
    }
    Residue {
        at_drain,
        cleared_after: left.is_empty().then(|| started.elapsed()),
        left,
    }
}

impl SafetyReport {
    /// `true` when nothing unsafe happened: no stale write accepted, no
    /// update lost.
    pub fn is_safe(&self) -> bool {
        self.history.stale_accepted.is_empty() && self.lost_updates == 0
    }

    /// `true` when the residue was measured and was gone by its deadline.
    pub fn residue_cleared(&self) -> bool {
        self.residue.as_ref().is_some_and(|r| r.cleared_after.is_some())
    }
}

impl fmt::Display for SafetyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} operations, {} grants, {} holder pauses; overlapping holds {} (longest {:?}); \
             writes {} accepted / {} refused by the fence; stale writes accepted {}; lost updates {}; \
             faults {} (longest wait for a grant after a heal {:?})",
            self.operations,
            self.history.grants,
            self.pauses,
            self.history.overlaps.len(),
            self.longest_overlap,
            self.accepted,
            self.rejected,
            self.history.stale_accepted.len(),
            self.lost_updates,
            self.faults.len() / 2,
            self.longest_gap_after_heal
        )?;
        if self.heals_without_grant > 0 {
            // One line, not the log: a long run faults thousands of times
            // (the whole log is in `faults`, for whoever wants it).
            write!(
                f,
                "; {} heal(s) with no grant after them before the run ended",
                self.heals_without_grant
            )?;
            if let Some((at, what)) = self.faults.last() {
                write!(f, " (the last fault: {what} at {:.1}s)", at.as_secs_f64())?;
            }
        }
        match &self.residue {
            Some(r) => write!(f, "; {r}"),
            None => write!(f, "; residue not measured"),
        }
    }
}

/// The resource: a register and its log, behind a fence (or not).
struct Resource {
    gate: FenceGate,
    fence: bool,
    register: AtomicU64,
    log: Mutex<Vec<(usize, u64)>>,
}

impl Resource {
    /// A read; with the fence, the token is admitted first.
    fn read(&self, token: Option<FencingToken>) -> Option<u64> {
        if self.fence {
            let token = token?;
            self.gate
                .write("register", token, || self.register.load(Ordering::SeqCst))
                .ok()
        } else {
            Some(self.register.load(Ordering::SeqCst))
        }
    }

    /// A write of `value`; `Some(accepted)`.
    fn write(&self, history: &History, client: usize, token: Option<FencingToken>, value: u64) -> bool {
        let apply = || {
            self.register.store(value, Ordering::SeqCst);
            self.log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((client, value));
        };
        match (self.fence, token) {
            (true, Some(token)) => {
                let accepted = self
                    .gate
                    .write("register", token, || {
                        apply();
                        history.record(
                            client,
                            "register",
                            Op::Write {
                                token,
                                accepted: true,
                            },
                        );
                    })
                    .is_ok();
                if !accepted {
                    history.record(
                        client,
                        "register",
                        Op::Write {
                            token,
                            accepted: false,
                        },
                    );
                }
                accepted
            }
            (true, None) => false,
            (false, _) => {
                apply();
                true
            }
        }
    }
}

/// Runs the fenced workload on `clients` (independent clients of one
/// backend) for `plan.duration`, then drains. Client 0 is the one that
/// pauses. No server faults.
pub async fn run<L: Lock>(clients: Vec<L>, key: &LockKey, plan: SafetyPlan) -> SafetyReport {
    let schedule = Schedule {
        kinds: Vec::new(),
        calm: plan.duration,
        fault: Duration::ZERO,
    };
    run_with_faults(clients, key, plan, NoFaults, schedule).await.0
}

/// As [`run`], with a nemesis injecting `schedule`'s faults into `faults`
/// meanwhile. Returns the report and the fault target (so its servers are
/// dropped by the caller, after the run).
pub async fn run_with_faults<L: Lock, F: Faults>(
    clients: Vec<L>,
    key: &LockKey,
    plan: SafetyPlan,
    faults: F,
    schedule: Schedule,
) -> (SafetyReport, F) {
    let history = History::new();
    let started = Instant::now();
    let resource = Arc::new(Resource {
        gate: FenceGate::new(),
        fence: plan.fence,
        register: AtomicU64::new(0),
        log: Mutex::default(),
    });
    let stop = Instant::now() + plan.duration;
    let mut tasks = Vec::new();
    for (id, lock) in clients.into_iter().enumerate() {
        let (key, history, resource) = (key.clone(), history.clone(), Arc::clone(&resource));
        tasks.push(tokio::spawn(async move {
            let (mut ops, mut pauses, mut accepted, mut rejected, mut grants) =
                (0usize, 0usize, 0u64, 0u64, 0u32);
            let opts = AcquireOptions::default()
                .ttl(plan.ttl)
                .auto_extend(false)
                .wait(Wait::For(plan.ttl * 4));
            while Instant::now() < stop {
                ops += 1;
                history.record(id, key.as_str(), Op::AcquireInvoke);
                let guard = match lock.acquire(&key, opts).await {
                    Ok(g) => g,
                    Err(e) => {
                        let op = if e.is_timeout() {
                            Op::AcquireFail
                        } else {
                            Op::AcquireUnknown
                        };
                        history.record(id, key.as_str(), op);
                        continue;
                    }
                };
                grants += 1;
                history.record(id, key.as_str(), Op::AcquireOk(guard.token()));
                let token = guard.token();
                let Some(seen) = resource.read(token) else {
                    history.record(id, key.as_str(), Op::Release);
                    let _ = guard.release().await;
                    continue;
                };
                if id == 0 && plan.pause_every > 0 && grants % plan.pause_every == 0 {
                    // The GC pause: nothing runs until well past the TTL.
                    pauses += 1;
                    let mut last_valid = Instant::now();
                    while guard.is_held() {
                        last_valid = Instant::now();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    history.record_at(last_valid, id, key.as_str(), Op::Lost);
                    tokio::time::sleep(plan.ttl).await;
                } else {
                    tokio::task::yield_now().await;
                }
                if resource.write(&history, id, token, seen + 1) {
                    accepted += 1;
                } else {
                    rejected += 1;
                }
                history.record(id, key.as_str(), Op::Release);
                let _ = guard.release().await;
            }
            (ops, pauses, accepted, rejected)
        }));
    }
    let nemesis = spawn_nemesis(faults, schedule, started, stop);
    let (mut operations, mut pauses, mut accepted, mut rejected) = (0, 0, 0, 0);
    for t in tasks {
        if let Ok((o, p, a, r)) = t.await {
            operations += o;
            pauses += p;
            accepted += a;
            rejected += r;
        }
    }
    let (faults, fault_log, heals) = match nemesis.await {
        Ok(done) => done,
        Err(e) => panic!("the nemesis task failed: {e}"),
    };
    let report = finish(
        &history,
        plan.fence,
        &resource,
        [operations, pauses],
        [accepted, rejected],
        fault_log,
        &heals,
    );
    (report, faults)
}

/// The nemesis: after `calm`, each of `schedule`'s faults in turn for
/// `fault`, healed, until `stop` (no fault starts that could not be healed
/// by then). Returns the target, the log and when each heal was.
#[allow(clippy::type_complexity)]
fn spawn_nemesis<F: Faults>(
    mut faults: F,
    schedule: Schedule,
    started: Instant,
    stop: Instant,
) -> tokio::task::JoinHandle<(F, Vec<(Duration, String)>, Vec<Duration>)> {
    tokio::spawn(async move {
        let mut log = Vec::new();
        let mut heals = Vec::new();
        for kind in schedule.kinds.iter().cycle() {
            if Instant::now() + schedule.calm + schedule.fault >= stop || schedule.kinds.is_empty() {
                break;
            }
            tokio::time::sleep(schedule.calm).await;
            let what = faults
                .inject(*kind)
                .await
                .unwrap_or_else(|e| format!("{kind:?} failed: {e}"));
            log.push((started.elapsed(), format!("inject {kind:?}: {what}")));
            tokio::time::sleep(schedule.fault).await;
            let what = faults
                .heal()
                .await
                .unwrap_or_else(|e| format!("heal failed: {e}"));
            heals.push(started.elapsed());
            log.push((started.elapsed(), format!("heal: {what}")));
        }
        (faults, log, heals)
    })
}

/// What a family run exercises: a semaphore's count, or a read-write
/// lock's exclusion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyWorkload {
    /// Every client takes one permit of `limit`.
    Semaphore {
        /// The semaphore's limit.
        limit: u32,
    },
    /// Clients read, and now and then (one in four) write.
    ReadWrite,
}

/// What a family run found: the invariant's violations, counted from the
/// clients' own view of when they held (from the grant's reply to the
/// last moment `is_held()` was true).
#[derive(Debug, Clone)]
pub struct FamilyReport {
    /// The workload.
    pub workload: FamilyWorkload,
    /// Acquire attempts.
    pub operations: usize,
    /// Grants held for a while: reads and writes, or permits (a grant
    /// that came back already past its local deadline counts as lost only).
    pub grants: usize,
    /// Of them, writes (a read-write run).
    pub writes: usize,
    /// Holds that ended by `is_held()` turning false (the guard gave up
    /// before the hold was over: a fault).
    pub lost: usize,
    /// The most holders at once: permits, or readers.
    pub most_at_once: usize,
    /// Moments the invariant broke: more than `limit` permits, a writer
    /// beside another writer or a reader.
    pub violations: usize,
    /// The first violations, described.
    pub first_violations: Vec<String>,
    /// The faults injected and healed: (time since start, what).
    pub faults: Vec<(Duration, String)>,
}

impl FamilyReport {
    /// `true` when the invariant never broke.
    pub fn is_safe(&self) -> bool {
        self.violations == 0
    }
}

impl fmt::Display for FamilyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.workload {
            FamilyWorkload::Semaphore { limit } => write!(
                f,
                "{} operations, {} grants of 1 of {limit} permits; most holders at once {}; \
                 over the limit {} times; holds cut short by a loss {}; faults {}",
                self.operations,
                self.grants,
                self.most_at_once,
                self.violations,
                self.lost,
                self.faults.len() / 2
            )?,
            FamilyWorkload::ReadWrite => write!(
                f,
                "{} operations, {} grants ({} writes); most readers at once {}; \
                 a writer beside another holder {} times; holds cut short by a loss {}; faults {}",
                self.operations,
                self.grants,
                self.writes,
                self.most_at_once,
                self.violations,
                self.lost,
                self.faults.len() / 2
            )?,
        }
        if let Some(first) = self.first_violations.first() {
            write!(f, "; first: {first}")?;
        }
        Ok(())
    }
}

/// One hold in a family run, as its client saw it.
#[derive(Debug, Clone, Copy)]
struct Span {
    client: usize,
    write: bool,
    from: Instant,
    to: Instant,
}

/// Counts the moments `spans` break `workload`'s invariant.
fn check_spans(workload: FamilyWorkload, spans: &[Span], started: Instant) -> (usize, usize, Vec<String>) {
    // Ends before starts at the same instant: a hold that ended when
    // another began did not overlap it.
    let mut events: Vec<(Instant, bool, &Span)> = spans
        .iter()
        .flat_map(|s| [(s.from, true, s), (s.to, false, s)])
        .collect();
    events.sort_by_key(|(at, start, _)| (*at, *start));
    let (mut readers, mut writers, mut most, mut violations) = (0usize, 0usize, 0usize, 0usize);
    let mut first = Vec::new();
    for (at, start, span) in events {
        match (start, span.write) {
            (true, true) => writers += 1,
            (true, false) => readers += 1,
            (false, true) => writers = writers.saturating_sub(1),
            (false, false) => readers = readers.saturating_sub(1),
        }
        if !start {
            continue;
        }
        most = most.max(readers);
        let broken = match workload {
            FamilyWorkload::Semaphore { limit } => readers > limit as usize,
            FamilyWorkload::ReadWrite => writers > 1 || (writers == 1 && readers > 0),
        };
        if broken {
            violations += 1;
            if first.len() < 3 {
                first.push(format!(
                    "at {:?}, client {} {} with {readers} other holder(s) and {writers} writer(s) holding",
                    at.duration_since(started),
                    span.client,
                    if span.write { "wrote" } else { "held" }
                ));
            }
        }
    }
    (most, violations, first)
}

/// A family run: `clients` loop on `key` (one permit of a semaphore, or a
/// read-write lock's reads and writes) for `plan.duration`, each hold a few
/// milliseconds, while the nemesis injects `schedule`'s faults into
/// `faults`. `plan.pause_every` and `plan.fence` are not used. Returns the
/// report and the fault target (dropped by the caller, after the run).
pub async fn run_family_with_faults<L: Lock, F: Faults>(
    clients: Vec<L>,
    key: &LockKey,
    workload: FamilyWorkload,
    plan: SafetyPlan,
    faults: F,
    schedule: Schedule,
) -> (FamilyReport, F) {
    let started = Instant::now();
    let stop = started + plan.duration;
    let mut tasks = Vec::new();
    for (id, lock) in clients.into_iter().enumerate() {
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ops, mut lost, mut spans) = (0usize, 0usize, Vec::new());
            let opts = AcquireOptions::default()
                .ttl(plan.ttl)
                .auto_extend(false)
                .wait(Wait::For(plan.ttl * 4));
            while Instant::now() < stop {
                ops += 1;
                let write = workload == FamilyWorkload::ReadWrite && rand::random::<u8>() < 64;
                let taken = match workload {
                    FamilyWorkload::Semaphore { limit } => lock.acquire_permits(&key, 1, limit, opts).await,
                    FamilyWorkload::ReadWrite if write => lock.acquire_write(&key, opts).await,
                    FamilyWorkload::ReadWrite => lock.acquire_read(&key, opts).await,
                };
                let Ok(guard) = taken else { continue };
                let from = Instant::now();
                let hold = Duration::from_millis(rand::random_range(2..20));
                let mut to = from;
                while to.duration_since(from) < hold {
                    if !guard.is_held() {
                        lost += 1;
                        break;
                    }
                    to = Instant::now();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                // A grant already past its local deadline when it came back
                // was never held: it is a loss, not a hold.
                if to > from {
                    spans.push(Span {
                        client: id,
                        write,
                        from,
                        to,
                    });
                }
                let _ = guard.release().await;
            }
            (ops, lost, spans)
        }));
    }
    let nemesis = spawn_nemesis(faults, schedule, started, stop);
    let (mut operations, mut lost, mut spans) = (0, 0, Vec::new());
    for t in tasks {
        if let Ok((o, l, s)) = t.await {
            operations += o;
            lost += l;
            spans.extend(s);
        }
    }
    let (faults, fault_log, _) = match nemesis.await {
        Ok(done) => done,
        Err(e) => panic!("the nemesis task failed: {e}"),
    };
    let (most_at_once, violations, first_violations) = check_spans(workload, &spans, started);
    let report = FamilyReport {
        workload,
        operations,
        grants: spans.len(),
        writes: spans.iter().filter(|s| s.write).count(),
        lost,
        most_at_once,
        violations,
        first_violations,
        faults: fault_log,
    };
    (report, faults)
}

/// The two family runs a driver's fault test makes after its mutex run,
/// on the same fault target: one permit of a semaphore of 2, then a
/// read-write lock, each `run_for(15)` long on fresh clients from
/// `clients`, each starting with other faults of `schedule` (a short run
/// has room for two), each published under `backend`. Returns the reports
/// and the fault target.
pub async fn family_runs<L: Lock, F: Faults>(
    backend: &str,
    mut clients: impl AsyncFnMut() -> Vec<L>,
    plan: SafetyPlan,
    mut faults: F,
    schedule: &Schedule,
) -> (Vec<FamilyReport>, F) {
    let mut reports = Vec::new();
    for (i, (workload, run)) in [
        (
            FamilyWorkload::Semaphore { limit: 2 },
            "semaphore of 2, member kill/stop, client partition",
        ),
        (
            FamilyWorkload::ReadWrite,
            "read-write lock, member kill/stop, client partition",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let key = LockKey::new(format!("family-{i}")).expect("a valid key");
        let short = SafetyPlan {
            duration: run_for(15),
            ..plan
        };
        // Kill/restart and stop, then partition and kill/restart.
        let mut turn = schedule.clone();
        turn.kinds.rotate_left(2 * i);
        let (found, back) =
            run_family_with_faults(clients().await, &key, workload, short, faults, turn).await;
        faults = back;
        eprintln!("{backend} {run}: {found}");
        publish_family(backend, run, &found, "never more than the limit; a writer alone");
        reports.push(found);
    }
    (reports, faults)
}

/// As [`publish`], for a family run.
pub fn publish_family(backend: &str, run: &str, report: &FamilyReport, claim: &str) {
    publish_line(backend, run, claim, &report.to_string(), &report.faults);
}

/// The report of a run from its history, resource and counts.
fn finish(
    history: &History,
    fence: bool,
    resource: &Resource,
    [operations, pauses]: [usize; 2],
    [accepted, rejected]: [u64; 2],
    fault_log: Vec<(Duration, String)>,
    heals: &[Duration],
) -> SafetyReport {
    let events = history.events();
    let grants_at: Vec<Duration> = events
        .iter()
        .filter(|e| matches!(e.op, Op::AcquireOk(_)))
        .map(|e| e.at)
        .collect();
    let gaps: Vec<Option<Duration>> = heals
        .iter()
        .map(|&h| grants_at.iter().find(|&&g| g >= h).map(|&g| g - h))
        .collect();
    let longest_gap_after_heal = gaps.iter().flatten().max().copied().unwrap_or_default();
    let heals_without_grant = gaps.iter().filter(|g| g.is_none()).count();
    let report = history.check(true, fence);
    let longest_overlap = report
        .overlaps
        .iter()
        .map(|(a, b)| {
            a.to.unwrap_or(b.from)
                .saturating_sub(b.from)
                .min(b.to.unwrap_or(Duration::MAX).saturating_sub(b.from))
        })
        .max()
        .unwrap_or_default();
    let register = resource.register.load(Ordering::SeqCst);
    SafetyReport {
        history: report,
        operations,
        pauses,
        accepted,
        rejected,
        register,
        lost_updates: accepted.saturating_sub(register),
        longest_overlap,
        faults: fault_log,
        longest_gap_after_heal,
        heals_without_grant,
        residue: None,
    }
}
