//! The contention demo (`cargo xtask demo` runs it on every backend whose
//! server is up): several workers contend for a few keys, write a shared
//! record through a `FenceGate`, and one worker "pauses" (as in a GC pause)
//! past its TTL and then tries to write with its stale token. The history
//! checker reads each run; one table compares the backends.
//!
//! ```text
//! cargo run -p distlock --features full --example contention -- mem:// etcd://127.0.0.1:2379
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, AnyLock, FenceGate, FencingToken, Guard, Lock, LockKey, Wait};
use dlock_testkit::history::{Event, History, Op};

const WORKERS: usize = 6;
const ROUNDS: usize = 25;
const KEYS: [&str; 3] = ["orders", "invoices", "reports"];
const PAUSES: usize = 3;

struct Run {
    lock: AnyLock,
    gate: FenceGate,
    history: History,
    /// The "records" the locks protect: one counter per key.
    records: Arc<Mutex<HashMap<&'static str, u64>>>,
    /// Keeps this run's keys apart from other runs on shared servers.
    prefix: String,
}

/// One row of the table.
struct Row {
    backend: String,
    grants: usize,
    handoffs: usize,
    overlaps: usize,
    stale_rejected: usize,
    stale_accepted: usize,
    exact: bool,
    seconds: f64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    if urls.is_empty() {
        urls.push("mem://".to_owned());
    }
    let mut rows = Vec::new();
    let mut ok = true;
    for url in &urls {
        let lock = match distlock::connect_url(url).await {
            Ok(l) => l,
            Err(e) => {
                println!("{}: skipped ({e})", distlock::driver::redact_url(url));
                continue;
            }
        };
        match demo_one(url, lock).await {
            Ok(row) => {
                ok &= row.overlaps == 0 && row.stale_accepted == 0 && row.exact;
                rows.push(row);
            }
            Err(e) => {
                println!("{}: failed: {e}", distlock::driver::redact_url(url));
                ok = false;
            }
        }
    }
    println!();
    println!(
        "{WORKERS} workers x {ROUNDS} rounds on {} keys, plus 1 worker that pauses past its TTL {PAUSES} times",
        KEYS.len()
    );
    println!(
        "| backend | acquisitions | handoffs | overlapping holds | stale writes rejected | stale writes accepted | record exact | seconds |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {:.1} |",
            r.backend,
            r.grants,
            r.handoffs,
            r.overlaps,
            r.stale_rejected,
            r.stale_accepted,
            r.exact,
            r.seconds
        );
    }
    println!("checker: {}", if ok { "OK" } else { "VIOLATION" });
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

async fn demo_one(url: &str, lock: AnyLock) -> Result<Row, String> {
    let run = Arc::new(Run {
        lock,
        gate: FenceGate::new(),
        history: History::new(),
        records: Arc::default(),
        prefix: format!("demo-{:x}/", rand::random::<u32>()),
    });
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        tasks.push(tokio::spawn(worker(Arc::clone(&run), w)));
    }
    tasks.push(tokio::spawn(pausing_worker(Arc::clone(&run), WORKERS)));
    for t in tasks {
        t.await.map_err(|e| format!("a worker panicked: {e}"))??;
    }
    let caps = run.lock.capabilities();
    let report = run.history.check(true, caps.fences());
    let events = run.history.events();
    let records = run.records.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let accepted = count_accepted(&events);
    let exact = !caps.fences()
        || KEYS
            .iter()
            .all(|k| records.get(k).copied().unwrap_or(0) == accepted.get(*k).copied().unwrap_or(0));
    if !report.is_ok() {
        println!("{}: {report}", run.lock.backend());
    }
    Ok(Row {
        backend: format!("{} ({})", run.lock.backend(), distlock::driver::redact_url(url)),
        grants: report.grants,
        handoffs: handoffs(&events),
        overlaps: report.overlaps.len(),
        stale_rejected: report.writes_rejected,
        stale_accepted: report.stale_accepted.len(),
        exact,
        seconds: started.elapsed().as_secs_f64(),
    })
}

async fn worker(run: Arc<Run>, id: usize) -> Result<(), String> {
    let opts = AcquireOptions::default()
        .ttl(Duration::from_secs(5))
        .wait(Wait::For(Duration::from_secs(30)));
    for round in 0..ROUNDS {
        let name = KEYS[(id + round) % KEYS.len()];
        let key = LockKey::new(format!("{}{name}", run.prefix)).map_err(|e| e.to_string())?;
        run.history.record(id, name, Op::AcquireInvoke);
        let guard = match run.lock.acquire(&key, opts).await {
            Ok(g) => g,
            Err(e) => {
                run.history.record(id, name, Op::AcquireFail);
                return Err(format!("worker {id}: {e}"));
            }
        };
        run.history.record(id, name, Op::AcquireOk(guard.token()));
        write(&run, id, name, guard.token()).await;
        run.history.record(id, name, Op::Release);
        guard
            .release()
            .await
            .map_err(|e| format!("worker {id}: release: {e}"))?;
    }
    Ok(())
}

/// Takes "orders" with a short TTL and no auto-extend, stalls past the TTL
/// while the others carry on, then writes with its now stale token.
async fn pausing_worker(run: Arc<Run>, id: usize) -> Result<(), String> {
    let ttl = Duration::from_millis(40);
    let opts = AcquireOptions::default()
        .ttl(ttl)
        .auto_extend(false)
        .wait(Wait::For(Duration::from_secs(30)));
    let key = LockKey::new(format!("{}orders", run.prefix)).map_err(|e| e.to_string())?;
    for _ in 0..PAUSES {
        run.history.record(id, "orders", Op::AcquireInvoke);
        let guard = run
            .lock
            .acquire(&key, opts)
            .await
            .map_err(|e| format!("pausing worker: {e}"))?;
        run.history.record(id, "orders", Op::AcquireOk(guard.token()));
        // The "GC pause": the lock expires meanwhile and others take it. The
        // hold ends, in the history, when the guard last said it was valid
        // (its local deadline: send time + TTL - drift).
        let mut last_valid = Instant::now();
        while guard.is_held() {
            last_valid = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        run.history.record_at(last_valid, id, "orders", Op::Lost);
        guard.lost().await;
        let resumed = run.history.events().len();
        // Give the others a chance to take "orders" and write it (bounded:
        // once they are done, nobody will).
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline
            && !run.history.events()[resumed..].iter().any(|e| {
                e.key == "orders" && e.client != id && matches!(e.op, Op::Write { accepted: true, .. })
            })
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // It wakes up unaware and writes with the old token: the fence refuses.
        write(&run, id, "orders", guard.token()).await;
        drop(guard);
    }
    Ok(())
}

/// A read-modify-write of the record, admitted by the fence. The resource
/// does the check and the update in one step, as `UPDATE ... SET v = v + 1
/// WHERE fence <= $token` would.
async fn write(run: &Run, id: usize, name: &'static str, token: Option<FencingToken>) {
    tokio::task::yield_now().await;
    let increment = || {
        *run.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(name)
            .or_default() += 1
    };
    let Some(token) = token else {
        increment();
        return;
    };
    let accepted = run
        .gate
        .write(name, token, || {
            increment();
            run.history.record(
                id,
                name,
                Op::Write {
                    token,
                    accepted: true,
                },
            );
        })
        .is_ok();
    if !accepted {
        run.history.record(
            id,
            name,
            Op::Write {
                token,
                accepted: false,
            },
        );
    }
}

fn count_accepted(events: &[Event]) -> HashMap<String, u64> {
    let mut n = HashMap::new();
    for e in events {
        if matches!(e.op, Op::Write { accepted: true, .. }) {
            *n.entry(e.key.clone()).or_default() += 1;
        }
    }
    n
}

/// Consecutive grants of one key that went to different workers.
fn handoffs(events: &[Event]) -> usize {
    let mut last: HashMap<&str, usize> = HashMap::new();
    let mut n = 0;
    for e in events {
        if let Op::AcquireOk(_) = e.op
            && last
                .insert(e.key.as_str(), e.client)
                .is_some_and(|prev| prev != e.client)
        {
            n += 1;
        }
    }
    n
}
