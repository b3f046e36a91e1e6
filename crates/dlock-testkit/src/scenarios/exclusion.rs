//! Mutual exclusion under contention, and how waiters are woken.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::{FenceGate, Guard, Lock};

use super::Ctx;
use crate::LockFactory;
use crate::history::{History, Op};
use crate::outcome::ensure;
use crate::outcome::{Failure, ScenarioResult, Verdict, within};

/// N clients x M rounds increment a non-atomic shared counter under the lock
/// (read, yield, write) and write it through a `FenceGate`: the final count is
/// exact and the history checker finds no overlap, no token regression and
/// no stale write.
pub async fn mutual_exclusion_counter<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    const CLIENTS: usize = 4;
    const ROUNDS: u64 = 6;
    let k = ctx.key("counter");
    let counter = Arc::new(AtomicU64::new(0));
    let gate = FenceGate::new();
    let history = History::new();
    let fences = ctx.caps().fences();
    let mut tasks = Vec::new();
    for id in 0..CLIENTS {
        let lock = ctx.client().await?;
        let (k, counter, gate, history, ctx) = (
            k.clone(),
            counter.clone(),
            gate.clone(),
            history.clone(),
            ctx.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                history.record(id, k.as_str(), Op::AcquireInvoke);
                let g = match lock.acquire(&k, ctx.opts(ctx.timing().long_ttl)).await {
                    Ok(g) => g,
                    Err(e) => {
                        let op = if e.is_timeout() {
                            Op::AcquireFail
                        } else {
                            Op::AcquireUnknown
                        };
                        history.record(id, k.as_str(), op);
                        return Err(Failure(format!("client {id}: acquire failed: {e}")));
                    }
                };
                history.record(id, k.as_str(), Op::AcquireOk(g.token()));
                let seen = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                if let Some(token) = g.token() {
                    let r = gate.write("counter", token, || {
                        history.record(
                            id,
                            "counter",
                            Op::Write {
                                token,
                                accepted: true,
                            },
                        );
                    });
                    if r.is_err() {
                        history.record(
                            id,
                            "counter",
                            Op::Write {
                                token,
                                accepted: false,
                            },
                        );
                    }
                }
                if !g.is_held() {
                    history.record(id, k.as_str(), Op::Lost);
                }
                history.record(id, k.as_str(), Op::Release);
                g.release()
                    .await
                    .map_err(|e| Failure(format!("client {id}: release failed: {e}")))?;
            }
            Ok::<(), Failure>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Failure(format!("a client task panicked: {e}")))??;
    }
    let report = history.check(true, fences);
    ensure!(report.is_ok(), "history check failed: {report}");
    let total = counter.load(Ordering::SeqCst);
    ensure!(
        total == CLIENTS as u64 * ROUNDS,
        "lost updates: counter is {total}, expected {}",
        CLIENTS as u64 * ROUNDS
    );
    if fences {
        ensure!(
            report.writes_rejected == 0,
            "a holder's fenced write was rejected: {report}"
        );
    }
    Ok(Verdict::Passed)
}

/// Twenty clients racing `try_acquire` on one key: exactly one wins.
pub async fn try_acquire_race<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    const CLIENTS: usize = 20;
    let k = ctx.key("race");
    let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let c = ctx.client().await?;
        let (k, barrier, ctx) = (k.clone(), barrier.clone(), ctx.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            c.try_acquire(&k, ctx.opts(ctx.timing().long_ttl)).await
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let r = within(ctx.timing().prompt, "a racing try_acquire", task)
            .await?
            .map_err(|e| Failure(format!("racer panicked: {e}")))?;
        winners.extend(r?);
    }
    let n = winners.len();
    for g in winners {
        g.release().await?;
    }
    ensure!(n == 1, "{n} of {CLIENTS} racing clients were granted the lock");
    Ok(Verdict::Passed)
}

/// A release wakes a waiter promptly: well before the holder's TTL would.
pub async fn release_wakes_waiter<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("wake");
    let t = ctx.timing();
    let ga = a.acquire(&k, ctx.opts(t.long_ttl)).await?;
    let waiter = {
        let (k, ctx) = (k.clone(), ctx.clone());
        tokio::spawn(async move { b.acquire(&k, ctx.opts(ctx.timing().long_ttl)).await })
    };
    ctx.await_contenders(&k, 2).await?;
    let released = Instant::now();
    ga.release().await?;
    let gb = within(t.prompt, "the waiter's grant after release", waiter)
        .await?
        .map_err(|e| Failure(format!("waiter task panicked: {e}")))??;
    let took = released.elapsed();
    ensure!(
        took < t.long_ttl / 2,
        "the waiter was granted after {took:?}: woken by expiry, not by the release"
    );
    gb.release().await?;
    Ok(Verdict::Passed)
}

/// Waiters are granted in the order they started waiting (FIFO backends only).
pub async fn fifo_waiters<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    if let Some(skipped) = ctx.skipped("fifo_waiters") {
        return Ok(skipped);
    }
    let k = ctx.key("fifo");
    let t = ctx.timing();
    let holder = ctx.client().await?;
    let g = holder.acquire(&k, ctx.opts(t.long_ttl)).await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let client = ctx.client().await?;
        let (k2, ctx2, order) = (k.clone(), ctx.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = client.acquire(&k2, ctx2.opts(ctx2.timing().long_ttl)).await?;
            order
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(i);
            g.release().await
        }));
        ensure!(
            ctx.await_contenders(&k, i + 2).await?,
            "a FIFO backend must report contenders (LockFactory::contenders)"
        );
    }
    g.release().await?;
    for task in tasks {
        within(t.prompt, "every waiter's turn", task)
            .await?
            .map_err(|e| Failure(format!("waiter panicked: {e}")))??;
    }
    let order = order
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    ensure!(
        order == [0, 1, 2, 3],
        "waiters were granted in order {order:?}, not [0, 1, 2, 3]"
    );
    Ok(Verdict::Passed)
}
