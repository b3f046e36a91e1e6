//! The conformance scenarios: plain `pub async fn`s over a [`Ctx`], run by
//! [`conformance_tests!`](crate::conformance_tests) as one test each.
//!
//! Every scenario works in its own random key namespace, waits on conditions
//! with deadlines (never "long enough" sleeps), scales its timings from the
//! backend's shortest TTL, and leaves nothing behind: the runner checks the
//! namespace after each one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Capabilities, Error, FenceGate, Guard, Lock, LockKey, Wait};

use crate::history::{History, Op};
use crate::outcome::{Failure, Outcome, Verdict, wait_until, within};
use crate::{LockFactory, ensure};

/// Timings a scenario uses, scaled from the backend's shortest TTL with
/// generous bounds (the CI machine has 2 shared cores).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// A TTL short enough to wait out in a test.
    pub short_ttl: Duration,
    /// A TTL no scenario waits out: holds that must not expire use it.
    pub long_ttl: Duration,
    /// The slack allowed on top of a TTL for an expiry to be noticed.
    pub slack: Duration,
    /// The bound for "promptly" (a hand-off, a wake-up): well below `long_ttl`,
    /// so meeting it proves the wake did not come from an expiry.
    pub prompt: Duration,
}

impl Timing {
    /// Timings for a backend whose shortest honoured TTL is `min_ttl`.
    pub fn for_min_ttl(min_ttl: Duration) -> Self {
        let short_ttl = min_ttl.max(Duration::from_millis(400));
        let long_ttl = (short_ttl * 15).max(Duration::from_secs(60));
        Timing {
            short_ttl,
            long_ttl,
            slack: short_ttl + Duration::from_secs(5),
            prompt: long_ttl / 4,
        }
    }
}

struct CtxInner<F> {
    factory: F,
    namespace: String,
    caps: Capabilities,
    timing: Timing,
}

/// What a scenario gets: the factory, a fresh namespace, the backend's
/// capabilities and the timings. Cheap to clone.
pub struct Ctx<F> {
    inner: Arc<CtxInner<F>>,
}

impl<F> Clone for Ctx<F> {
    fn clone(&self) -> Self {
        Ctx {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<F: LockFactory> Ctx<F> {
    /// A context in a new random namespace. Asks one client for the backend's
    /// capabilities.
    ///
    /// # Errors
    ///
    /// A [`Failure`] if no client can be made.
    pub async fn new(factory: F) -> Result<Self, Failure> {
        let probe = factory.client().await?;
        let caps = probe.capabilities();
        drop(probe);
        let namespace = format!("dlock-kit-{:016x}/", rand::random::<u64>());
        Ok(Ctx {
            inner: Arc::new(CtxInner {
                factory,
                namespace,
                caps,
                timing: Timing::for_min_ttl(caps.min_ttl),
            }),
        })
    }

    /// The factory.
    pub fn factory(&self) -> &F {
        &self.inner.factory
    }

    /// This scenario's key namespace (a prefix of every key it uses).
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The backend's capabilities.
    pub fn caps(&self) -> Capabilities {
        self.inner.caps
    }

    /// The scenario timings.
    pub fn timing(&self) -> Timing {
        self.inner.timing
    }

    /// A key in this scenario's namespace.
    ///
    /// # Panics
    ///
    /// If `name` makes an invalid key (a bug in the scenario, not the driver).
    pub fn key(&self, name: &str) -> LockKey {
        LockKey::new(format!("{}{name}", self.inner.namespace)).expect("scenario keys are valid")
    }

    /// A new independent client.
    ///
    /// # Errors
    ///
    /// A [`Failure`] if the factory cannot make one.
    pub async fn client(&self) -> Result<F::Lock, Failure> {
        Ok(self.inner.factory.client().await?)
    }

    /// Options with this TTL, waiting at most [`Timing::prompt`].
    pub fn opts(&self, ttl: Duration) -> AcquireOptions {
        AcquireOptions::default()
            .ttl(ttl)
            .wait(Wait::For(self.inner.timing.prompt))
    }

    /// Waits until the backend reports exactly `n` contenders for `key`, when
    /// it can tell; returns `false` at once when it cannot.
    ///
    /// # Errors
    ///
    /// A [`Failure`] if the count does not reach `n` within [`Timing::prompt`].
    pub async fn await_contenders(&self, key: &LockKey, n: usize) -> Result<bool, Failure> {
        if self.inner.factory.contenders(key).await?.is_none() {
            return Ok(false);
        }
        wait_until(
            self.inner.timing.prompt,
            &format!("{n} contenders on {key}"),
            || async { Ok(self.inner.factory.contenders(key).await? == Some(n)) },
        )
        .await?;
        Ok(true)
    }

    /// Waits until nothing is left in the namespace.
    ///
    /// # Errors
    ///
    /// A [`Failure`] listing what is left after [`Timing::slack`].
    pub async fn await_clean(&self) -> Result<(), Failure> {
        let ns = self.namespace();
        let r = wait_until(self.timing().slack, "an empty namespace", || async {
            Ok(self.inner.factory.residue(ns).await?.is_empty())
        })
        .await;
        match r {
            Ok(()) => Ok(()),
            Err(_) => Err(Failure(format!(
                "left behind in {ns}: {:?}",
                self.inner.factory.residue(ns).await?
            ))),
        }
    }
}

fn lost_or_not_held(e: &Error) -> bool {
    matches!(e, Error::Lost { .. } | Error::NotHeld { .. })
}

/// Acquire, release, acquire again: the second grant's token is higher (or
/// both are `None` where the backend does not fence).
pub async fn acquire_release_reacquire<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let c = ctx.client().await?;
    let k = ctx.key("basic");
    let opts = ctx.opts(ctx.timing().long_ttl);
    let g1 = c.acquire(&k, opts).await?;
    ensure!(g1.key() == &k, "guard key {:?} is not {k:?}", g1.key());
    ensure!(g1.is_held(), "a fresh guard is not held");
    let t1 = g1.token();
    g1.release().await?;
    let g2 = c.acquire(&k, opts).await?;
    let t2 = g2.token();
    g2.release().await?;
    if ctx.caps().fences() {
        ensure!(
            t1.is_some() && t2 > t1,
            "tokens did not increase on re-acquire: {t1:?} then {t2:?}"
        );
    } else {
        ensure!(
            t1.is_none() && t2.is_none(),
            "a non-fencing backend handed out tokens {t1:?}, {t2:?}"
        );
    }
    Ok(Verdict::Passed)
}

/// `try_acquire` is `None` while another client holds the key and `Some` once
/// it is free.
pub async fn try_acquire_held_and_free<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("try");
    let opts = ctx.opts(ctx.timing().long_ttl);
    let ga = a.try_acquire(&k, opts).await?;
    let Some(ga) = ga else {
        return Err(Failure("try_acquire on a free key returned None".into()));
    };
    ensure!(
        b.try_acquire(&k, opts).await?.is_none(),
        "try_acquire granted a held key to a second client"
    );
    ensure!(
        a.try_acquire(&k, opts).await?.is_none(),
        "try_acquire granted a held key to its own client again"
    );
    ga.release().await?;
    let gb = b.try_acquire(&k, opts).await?;
    ensure!(gb.is_some(), "try_acquire after release returned None");
    if let Some(gb) = gb {
        gb.release().await?;
    }
    Ok(Verdict::Passed)
}

/// A bounded wait on a held key ends in `Error::Timeout`, not earlier than
/// asked, and leaves the holder holding.
pub async fn acquire_wait_times_out<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("timeout");
    let t = ctx.timing();
    let ga = a.acquire(&k, ctx.opts(t.long_ttl)).await?;
    let wait = t.short_ttl;
    let started = Instant::now();
    let r = within(wait + t.slack, "the bounded acquire to return", async {
        b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::For(wait))).await
    })
    .await?;
    let took = started.elapsed();
    match r {
        Err(Error::Timeout { .. }) => {}
        Err(e) => return Err(Failure(format!("expected Timeout, got {e:?}"))),
        Ok(_) => return Err(Failure("a held key was granted to a waiter".into())),
    }
    ensure!(
        took >= wait,
        "Timeout came after {took:?}, earlier than the {wait:?} asked"
    );
    ensure!(
        ga.is_held(),
        "the holder lost its lock while another client waited"
    );
    ensure!(
        b.try_acquire(&k, ctx.opts(t.long_ttl)).await?.is_none(),
        "the key is free after the timeout"
    );
    ga.release().await?;
    // The timed-out waiter left nothing: a fresh client gets the key at once.
    let g = b.try_acquire(&k, ctx.opts(t.long_ttl)).await?;
    ensure!(g.is_some(), "the key is not free after the holder released");
    if let Some(g) = g {
        g.release().await?;
    }
    Ok(Verdict::Passed)
}

/// N clients x M rounds increment a non-atomic shared counter under the lock
/// (read, yield, write) and write it through a `FenceGate`: the final count is
/// exact and the history checker finds no overlap, no token regression and
/// no stale write.
pub async fn mutual_exclusion_counter<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
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

/// Grants taken in turn by three clients carry strictly increasing tokens.
pub async fn tokens_increase_across_clients<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    if !ctx.caps().fences() {
        return Ok(Verdict::Skipped("the backend gives no fencing tokens"));
    }
    let clients = [ctx.client().await?, ctx.client().await?, ctx.client().await?];
    let k = ctx.key("tokens");
    let mut last = None;
    for round in 0..9 {
        let g = clients[round % 3]
            .acquire(&k, ctx.opts(ctx.timing().long_ttl))
            .await?;
        let t = g.token();
        ensure!(
            t.is_some() && t > last,
            "grant {round}: token {t:?} is not above the previous {last:?}"
        );
        last = t;
        g.release().await?;
    }
    Ok(Verdict::Passed)
}

/// A holder whose lock expired cannot release or extend it once another
/// client holds the key; the new holder keeps it.
pub async fn expired_holder_cannot_release<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b, c) = (ctx.client().await?, ctx.client().await?, ctx.client().await?);
    let k = ctx.key("expired");
    let t = ctx.timing();
    let ga = a.acquire(&k, ctx.opts(t.short_ttl).auto_extend(false)).await?;
    let gb = within(t.short_ttl + t.slack, "a grant after the holder's TTL", async {
        b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::Forever)).await
    })
    .await??;
    match ga.extend(t.long_ttl).await {
        Err(e) if lost_or_not_held(&e) => {}
        other => {
            return Err(Failure(format!(
                "extend by an expired holder: expected Lost/NotHeld, got {other:?}"
            )));
        }
    }
    match ga.release().await {
        Err(e) if lost_or_not_held(&e) => {}
        other => {
            return Err(Failure(format!(
                "release by an expired holder: expected Lost/NotHeld, got {other:?}"
            )));
        }
    }
    ensure!(
        gb.is_held(),
        "the new holder lost its lock to the old holder's release"
    );
    ensure!(
        c.try_acquire(&k, ctx.opts(t.long_ttl)).await?.is_none(),
        "the new holder's lock was deleted by the old holder"
    );
    gb.extend(t.long_ttl).await?;
    gb.release().await?;
    Ok(Verdict::Passed)
}

/// An extend after expiry is refused and does not bring the lock back.
pub async fn extend_after_expiry_refused<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("extend");
    let t = ctx.timing();
    let ga = a.acquire(&k, ctx.opts(t.short_ttl).auto_extend(false)).await?;
    within(t.short_ttl + t.slack, "lost() after the TTL", ga.lost().wait()).await?;
    // Make sure the backend itself has let go before extending.
    wait_until(t.slack, "the key to be free", || async {
        Ok(ctx.factory().residue(ctx.namespace()).await?.is_empty())
    })
    .await?;
    match ga.extend(t.long_ttl).await {
        Err(e) if lost_or_not_held(&e) => {}
        other => {
            return Err(Failure(format!(
                "extend after expiry: expected Lost/NotHeld, got {other:?}"
            )));
        }
    }
    ensure!(!ga.is_held(), "is_held() is true after a refused extend");
    let gb = b.try_acquire(&k, ctx.opts(t.long_ttl)).await?;
    ensure!(
        gb.is_some(),
        "the key is held after an extend of an expired lock: the extend resurrected it"
    );
    drop(ga);
    if let Some(gb) = gb {
        gb.release().await?;
    }
    Ok(Verdict::Passed)
}

/// A holder that vanishes without releasing (crash) frees the key when its
/// TTL runs out.
pub async fn expiry_frees_vanished_holder<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("vanish");
    let t = ctx.timing();
    let ga = a.acquire(&k, ctx.opts(t.short_ttl)).await?;
    ctx.factory().crash(&a).await;
    drop(ga);
    let gb = within(
        t.short_ttl + t.slack,
        "a grant after the vanished holder's TTL",
        async { b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::Forever)).await },
    )
    .await??;
    gb.release().await?;
    Ok(Verdict::Passed)
}

/// Without auto-extend, `lost()` fires when the TTL runs out and `is_held()`
/// turns false.
pub async fn lost_fires_on_expiry<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let a = ctx.client().await?;
    let k = ctx.key("lost");
    let t = ctx.timing();
    let started = Instant::now();
    let g = a.acquire(&k, ctx.opts(t.short_ttl).auto_extend(false)).await?;
    ensure!(
        g.is_held() && !g.lost().is_lost(),
        "a fresh guard is already lost"
    );
    within(t.short_ttl + t.slack, "lost() after the TTL", g.lost().wait()).await?;
    ensure!(!g.is_held(), "is_held() is true after lost() fired");
    ensure!(g.lost().is_lost(), "a fired lost signal says it is not lost");
    let took = started.elapsed();
    ensure!(
        took >= t.short_ttl / 2,
        "lost() fired after {took:?}, long before the {:?} TTL",
        t.short_ttl
    );
    drop(g);
    Ok(Verdict::Passed)
}

/// With auto-extend, a short-TTL lock is kept for several TTLs.
pub async fn auto_extend_keeps_lock<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("watchdog");
    let t = ctx.timing();
    let g = a.acquire(&k, ctx.opts(t.short_ttl)).await?;
    let until = Instant::now() + t.short_ttl * 3;
    while Instant::now() < until {
        ensure!(
            g.is_held() && !g.lost().is_lost(),
            "the auto-extended lock was lost"
        );
        ensure!(
            b.try_acquire(&k, ctx.opts(t.long_ttl)).await?.is_none(),
            "the auto-extended lock was granted to another client"
        );
        tokio::time::sleep(t.short_ttl / 4).await;
    }
    g.release().await?;
    let gb = b.try_acquire(&k, ctx.opts(t.long_ttl)).await?;
    ensure!(gb.is_some(), "the key is held after release");
    if let Some(gb) = gb {
        gb.release().await?;
    }
    Ok(Verdict::Passed)
}

/// A release wakes a waiter promptly: well before the holder's TTL would.
pub async fn release_wakes_waiter<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
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

/// Dropping a guard releases the lock well before its TTL.
pub async fn drop_releases<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("drop");
    let t = ctx.timing();
    let ga = a.acquire(&k, ctx.opts(t.long_ttl)).await?;
    drop(ga);
    let gb = within(t.prompt, "a grant after the holder dropped its guard", async {
        b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::Forever)).await
    })
    .await??;
    gb.release().await?;
    Ok(Verdict::Passed)
}

/// A waiting acquire that is cancelled (its future dropped) leaves no ghost
/// waiter: after the holder releases, a third client gets the key promptly.
pub async fn cancelled_acquire_leaves_nothing<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b, c) = (ctx.client().await?, ctx.client().await?, ctx.client().await?);
    let k = ctx.key("cancel");
    let t = ctx.timing();
    let ga = a.acquire(&k, ctx.opts(t.long_ttl)).await?;
    let observable = ctx.factory().contenders(&k).await?.is_some();
    {
        let waiting = b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::Forever));
        tokio::pin!(waiting);
        // Let the waiter queue, then drop it. Where the backend cannot show
        // its queue, keep the waiter waiting for a while instead.
        let queued = async {
            if observable {
                ctx.await_contenders(&k, 2).await.map(drop)
            } else {
                tokio::time::sleep(t.short_ttl).await;
                Ok(())
            }
        };
        tokio::select! {
            r = &mut waiting => return Err(Failure(format!("a held key was granted to a waiter: {:?}", r.map(|g| g.token())))),
            r = queued => r?,
        }
    }
    ga.release().await?;
    // A ghost of the cancelled waiter would take the key now. Where the queue
    // is visible, it must empty; elsewhere, give a ghost time to show itself.
    if observable {
        ctx.await_contenders(&k, 0).await?;
    } else {
        tokio::time::sleep(t.short_ttl).await;
    }
    let gc = c.try_acquire(&k, ctx.opts(t.long_ttl)).await?;
    ensure!(
        gc.is_some(),
        "after the holder released, the key was held: the cancelled acquire left a ghost"
    );
    if let Some(gc) = gc {
        gc.release().await?;
    }
    Ok(Verdict::Passed)
}

/// Waiters are granted in the order they started waiting (FIFO backends only).
pub async fn fifo_waiters<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    if !ctx.caps().fifo {
        return Ok(Verdict::Skipped("the backend does not promise FIFO"));
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

/// Locks on different keys do not affect each other.
pub async fn many_keys_independent<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    let mut held = Vec::new();
    for i in 0..16 {
        held.push(
            a.acquire(&ctx.key(&format!("many/a{i}")), ctx.opts(t.long_ttl))
                .await?,
        );
    }
    let mut others = Vec::new();
    for i in 0..16 {
        ensure!(
            b.try_acquire(&ctx.key(&format!("many/a{i}")), ctx.opts(t.long_ttl))
                .await?
                .is_none(),
            "key a{i} held by one client was granted to another"
        );
        let g = b
            .try_acquire(&ctx.key(&format!("many/b{i}")), ctx.opts(t.long_ttl))
            .await?;
        ensure!(g.is_some(), "key b{i} was not free although nobody held it");
        others.extend(g);
    }
    ensure!(
        held.iter().all(|g| g.is_held()),
        "a lock was lost while other keys were taken"
    );
    for g in held.into_iter().chain(others) {
        g.release().await?;
    }
    Ok(Verdict::Passed)
}

/// Invalid keys are refused with `Error::InvalidKey`; the longest valid key and
/// keys with unusual characters either work or are refused the same way,
/// never with a panic or another error.
pub async fn invalid_keys_rejected<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    for bad in ["", "nul\0byte", "new\nline", &"k".repeat(LockKey::MAX_LEN + 1)] {
        match LockKey::new(bad) {
            Err(Error::InvalidKey { .. }) => {}
            other => {
                return Err(Failure(format!(
                    "key {bad:?}: expected InvalidKey, got {other:?}"
                )));
            }
        }
    }
    let c = ctx.client().await?;
    let ns = ctx.namespace();
    let long = format!("{ns}{}", "é".repeat((LockKey::MAX_LEN - ns.len()) / 2));
    let odd = [
        long,
        format!("{ns}sp ace"),
        format!("{ns}slash/and/more"),
        format!("{ns}{{hash}}*?[x]"),
        format!("{ns}ünï✓"),
        format!("{ns}."),
        format!("{ns}.."),
        format!("{ns}trailing/"),
    ];
    for name in odd {
        let key = LockKey::new(&name)
            .map_err(|e| Failure(format!("valid key {name:?} refused by LockKey: {e}")))?;
        match c.try_acquire(&key, ctx.opts(ctx.timing().long_ttl)).await {
            Ok(Some(g)) => {
                ensure!(g.key() == &key, "the guard's key differs from the one asked");
                g.release().await?;
            }
            Err(Error::InvalidKey { .. }) => {}
            Ok(None) => {
                return Err(Failure(format!(
                    "key {name:?} reported held although nobody holds it"
                )));
            }
            Err(e) => {
                return Err(Failure(format!(
                    "key {name:?}: expected a grant or InvalidKey, got {e:?}"
                )));
            }
        }
    }
    Ok(Verdict::Passed)
}

/// After a newer holder wrote through the fence, the expired holder's write
/// is rejected.
pub async fn fenced_stale_write_rejected<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    if !ctx.caps().fences() {
        return Ok(Verdict::Skipped("the backend gives no fencing tokens"));
    }
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("fenced");
    let t = ctx.timing();
    let gate = FenceGate::new();
    let history = History::new();
    let write = |client: usize, token| {
        let accepted = gate
            .write("record", token, || {
                history.record(
                    client,
                    "record",
                    Op::Write {
                        token,
                        accepted: true,
                    },
                )
            })
            .is_ok();
        if !accepted {
            history.record(
                client,
                "record",
                Op::Write {
                    token,
                    accepted: false,
                },
            );
        }
        accepted
    };
    let ga = a.acquire(&k, ctx.opts(t.short_ttl).auto_extend(false)).await?;
    let ta = ga
        .token()
        .ok_or_else(|| Failure("no token on a fencing backend".into()))?;
    ensure!(write(0, ta), "the first holder's write was rejected");
    // The first holder "pauses" past its TTL; the second takes over and writes.
    let gb = within(
        t.short_ttl + t.slack,
        "a grant after the first holder's TTL",
        async { b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::Forever)).await },
    )
    .await??;
    let tb = gb
        .token()
        .ok_or_else(|| Failure("no token on a fencing backend".into()))?;
    ensure!(write(1, tb), "the new holder's write was rejected");
    // The first holder wakes up and writes with its old token.
    let stale_accepted = write(0, ta);
    let report = history.check(false, true);
    ensure!(
        !stale_accepted && report.is_ok(),
        "the stale holder's write (token {ta}) was accepted after token {tb}: {report}"
    );
    drop(ga);
    gb.release().await?;
    Ok(Verdict::Passed)
}

/// `with_lock` drops the closure's future and returns `Error::Lost` when the
/// lock is lost while it runs.
pub async fn with_lock_cancels_on_loss<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let a = ctx.client().await?;
    let k = ctx.key("scoped");
    let t = ctx.timing();
    let (started, dropped) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (s, d) = (started.clone(), dropped.clone());
    let r = within(
        t.short_ttl + t.slack,
        "with_lock to return after the loss",
        a.with_lock(
            &k,
            ctx.opts(t.short_ttl).auto_extend(false),
            move |_held| async move {
                let _flag = SetOnDrop(d);
                s.store(true, Ordering::SeqCst);
                std::future::pending::<()>().await;
            },
        ),
    )
    .await?;
    ensure!(
        matches!(r, Err(Error::Lost { .. })),
        "with_lock returned {r:?}, expected Err(Lost)"
    );
    ensure!(started.load(Ordering::SeqCst), "the closure never ran");
    ensure!(
        dropped.load(Ordering::SeqCst),
        "the closure's future was not dropped"
    );
    // And the happy path returns the closure's value.
    let v = a
        .with_lock(&k, ctx.opts(t.long_ttl), |held| async move {
            held.key().as_str().len()
        })
        .await?;
    ensure!(v == k.as_str().len(), "with_lock returned {v}");
    Ok(Verdict::Passed)
}

/// Twenty clients racing `try_acquire` on one key: exactly one wins.
pub async fn try_acquire_race<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
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

/// An extend before expiry moves the deadline: the lock outlives its first TTL.
pub async fn extend_keeps_lock<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("extend-ok");
    let t = ctx.timing();
    let g = a.acquire(&k, ctx.opts(t.short_ttl).auto_extend(false)).await?;
    g.extend(t.long_ttl).await?;
    tokio::time::sleep(t.short_ttl * 2).await;
    ensure!(
        g.is_held() && !g.lost().is_lost(),
        "an extended lock was lost at its first TTL"
    );
    ensure!(
        b.try_acquire(&k, ctx.opts(t.long_ttl)).await?.is_none(),
        "an extended lock was granted to another client"
    );
    g.release().await?;
    Ok(Verdict::Passed)
}

/// A mix of everything (grants, drops, cancelled waits, timeouts, expiries)
/// leaves nothing in the namespace.
pub async fn namespace_clean_after_use<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    for i in 0..4 {
        let k = ctx.key(&format!("mix/{i}"));
        let g = a.acquire(&k, ctx.opts(t.long_ttl)).await?;
        let r = b
            .acquire(
                &k,
                ctx.opts(t.long_ttl).wait(Wait::For(Duration::from_millis(50))),
            )
            .await;
        ensure!(
            r.as_ref().is_err_and(Error::is_timeout),
            "expected Timeout, got {:?}",
            r.map(|g| g.token())
        );
        let _ = tokio::time::timeout(Duration::from_millis(20), b.acquire(&k, ctx.opts(t.long_ttl))).await;
        if i % 2 == 0 {
            g.release().await?;
        } else {
            drop(g);
        }
    }
    let g = a
        .acquire(&ctx.key("mix/expiring"), ctx.opts(t.short_ttl).auto_extend(false))
        .await?;
    within(t.short_ttl + t.slack, "lost() after the TTL", g.lost().wait()).await?;
    drop(g);
    ctx.await_clean().await?;
    Ok(Verdict::Passed)
}

/// Waits and TTLs too large for the clock (`Duration::MAX`) never panic: a
/// wait that large means "no deadline"; a TTL that large is granted or
/// refused with an error, and its guard behaves.
pub async fn huge_durations_are_safe<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    let k = ctx.key("huge");
    let g = a
        .acquire(&k, ctx.opts(t.long_ttl).wait(Wait::For(Duration::MAX)))
        .await?;
    // A huge wait on a held key waits (cancelled here), it does not panic.
    let waited = tokio::time::timeout(
        t.slack.min(Duration::from_millis(300)),
        b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::For(Duration::MAX))),
    )
    .await;
    ensure!(waited.is_err(), "a held key was granted to a waiter");
    g.release().await?;
    for auto_extend in [true, false] {
        let k = ctx.key(&format!("huge-ttl-{auto_extend}"));
        match a
            .acquire(&k, ctx.opts(Duration::MAX).auto_extend(auto_extend))
            .await
        {
            Ok(g) => {
                ensure!(g.is_held(), "a grant with a huge TTL is not held");
                g.extend(Duration::MAX).await.or_else(|e| match e {
                    Error::InvalidConfig(_) | Error::Backend { .. } => Ok(()),
                    e => Err(e),
                })?;
                g.release().await?;
            }
            Err(Error::InvalidConfig(_) | Error::Backend { .. }) => {}
            Err(e) => return Err(Failure(format!("a huge TTL failed oddly: {e:?}"))),
        }
    }
    Ok(Verdict::Passed)
}
