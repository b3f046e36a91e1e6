//! `cargo xtask demo`: several workers contend for a few keys, write a shared
//! record through a `FenceGate`, and one worker "pauses" (as in a GC pause)
//! past its TTL and then tries to write with its stale token. The history
//! checker reads the whole run and the report says what it found.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, AnyLock, FenceGate, Guard, Lock, LockKey, MemLock, Wait};
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
}

/// `cargo xtask demo`.
pub async fn run() -> Result<(), String> {
    // Backends the demo can reach. Drivers join this list as they land.
    let backends: Vec<(&str, AnyLock)> = vec![("mem (in-process MemLock)", AnyLock::new(MemLock::new()))];
    let mut ok = true;
    for (name, lock) in backends {
        ok &= demo_one(name, lock).await?;
    }
    if ok {
        Ok(())
    } else {
        Err("the history checker found a violation".to_owned())
    }
}

async fn demo_one(name: &str, lock: AnyLock) -> Result<bool, String> {
    let run = Arc::new(Run {
        lock,
        gate: FenceGate::new(),
        history: History::new(),
        records: Arc::default(),
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
    let elapsed = started.elapsed();
    let caps = run.lock.capabilities();
    let report = run.history.check(true, caps.fences());
    let events = run.history.events();
    let records = run.records.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let accepted_per_key = count_accepted(&events);
    println!("dlock demo: backend {name}");
    println!(
        "  {WORKERS} workers x {ROUNDS} rounds on {} keys, plus 1 worker that pauses past its TTL {PAUSES} times ({elapsed:.2?})",
        KEYS.len()
    );
    println!("  acquisitions:            {}", report.grants);
    println!("  handoffs between workers: {}", handoffs(&events));
    println!("  overlapping holds found: {}", report.overlaps.len());
    println!(
        "  fenced writes:           {} accepted, {} stale writes rejected",
        report.writes_accepted, report.writes_rejected
    );
    println!("  stale writes accepted:   {}", report.stale_accepted.len());
    let mut exact = true;
    for key in KEYS {
        let value = records.get(key).copied().unwrap_or(0);
        let writes = accepted_per_key.get(key).copied().unwrap_or(0);
        exact &= value == writes;
        println!("  record {key:<9} = {value:>3} (accepted writes: {writes})");
    }
    let verdict = report.is_ok() && exact;
    println!("  checker: {}", if verdict { "OK" } else { "VIOLATION" });
    if !report.is_ok() {
        println!("  {report}");
    }
    Ok(verdict)
}

async fn worker(run: Arc<Run>, id: usize) -> Result<(), String> {
    let opts = AcquireOptions::default()
        .ttl(Duration::from_secs(5))
        .wait(Wait::For(Duration::from_secs(30)));
    for round in 0..ROUNDS {
        let name = KEYS[(id + round) % KEYS.len()];
        let key = LockKey::new(name).map_err(|e| e.to_string())?;
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
    let key = LockKey::new("orders").map_err(|e| e.to_string())?;
    for _ in 0..PAUSES {
        run.history.record(id, "orders", Op::AcquireInvoke);
        let sent = Instant::now();
        let guard = run
            .lock
            .acquire(&key, opts)
            .await
            .map_err(|e| format!("pausing worker: {e}"))?;
        run.history.record(id, "orders", Op::AcquireOk(guard.token()));
        // The grant could be trusted until the local deadline: the acquire's
        // send time plus the TTL minus the drift allowance.
        let valid_until = (sent + ttl).checked_sub(dlock_core::drift(ttl)).unwrap_or(sent);
        // The "GC pause": the lock expires meanwhile and others take it.
        guard.lost().await;
        run.history.record_at(valid_until, id, "orders", Op::Lost);
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
async fn write(run: &Run, id: usize, name: &'static str, token: Option<dlock_core::FencingToken>) {
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
        if let Op::AcquireOk(_) = e.op {
            if last
                .insert(e.key.as_str(), e.client)
                .is_some_and(|prev| prev != e.client)
            {
                n += 1;
            }
        }
    }
    n
}
