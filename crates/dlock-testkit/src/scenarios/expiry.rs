//! TTLs: what expiry takes away, what renewal keeps, and `lost()`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dlock_core::{Error, Guard, Lock, Wait};

use super::{Ctx, free, lost_or_not_held};
use crate::LockFactory;
use crate::outcome::ensure;
use crate::outcome::{Failure, ScenarioResult, Verdict, wait_until, within};

/// A holder whose lock expired cannot release or extend it once another
/// client holds the key; the new holder keeps it.
pub async fn expired_holder_cannot_release<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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
pub async fn extend_after_expiry_refused<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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
    ensure!(
        free(&b, &k, ctx.opts(t.long_ttl)).await?,
        "the key is held after an extend of an expired lock: the extend resurrected it"
    );
    drop(ga);
    Ok(Verdict::Passed)
}

/// A holder that vanishes without releasing (crash) frees the key when its
/// TTL runs out.
pub async fn expiry_frees_vanished_holder<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("vanish");
    let t = ctx.timing();
    let sent = Instant::now();
    let ga = a.acquire(&k, ctx.opts(t.short_ttl)).await?;
    ctx.factory().abandon(&a).await;
    drop(ga);
    let gb = within(
        t.short_ttl + t.slack,
        "a grant after the vanished holder's TTL",
        async { b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::Forever)).await },
    )
    .await??;
    let after = sent.elapsed();
    gb.release().await?;
    // Freed by its TTL, not by a release the vanished client still sent.
    ensure!(
        after >= t.short_ttl / 2,
        "the vanished holder's lock was granted again after {after:?}, before its TTL of {:?} could run out: abandon() released it",
        t.short_ttl
    );
    Ok(Verdict::Passed)
}

/// Without auto-extend, `lost()` fires when the TTL runs out and `is_held()`
/// turns false.
pub async fn lost_fires_on_expiry<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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
pub async fn auto_extend_keeps_lock<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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
    ensure!(
        free(&b, &k, ctx.opts(t.long_ttl)).await?,
        "the key is held after release"
    );
    Ok(Verdict::Passed)
}

/// An extend before expiry moves the deadline: the lock outlives its first TTL.
pub async fn extend_keeps_lock<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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

/// `with_lock` drops the closure's future and returns `Error::Lost` when the
/// lock is lost while it runs.
pub async fn with_lock_cancels_on_loss<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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

/// An extend to a *shorter* TTL is kept: `lost()` fires by the new
/// deadline, not at the old one (`extend` resets the TTL to `ttl` from now).
pub async fn extend_to_a_shorter_ttl_is_kept<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let a = ctx.client().await?;
    let k = ctx.key("shortened");
    let t = ctx.timing();
    let g = a.acquire(&k, ctx.opts(t.long_ttl).auto_extend(false)).await?;
    g.extend(t.short_ttl).await?;
    within(
        t.short_ttl + t.slack,
        &format!(
            "lost() after an extend from {:?} to {:?}",
            t.long_ttl, t.short_ttl
        ),
        g.lost().wait(),
    )
    .await?;
    ensure!(!g.is_held(), "is_held() is true after lost() fired");
    drop(g);
    Ok(Verdict::Passed)
}

/// The task that renews a client's guards runs on some runtime; when that
/// runtime shuts down (a runtime per worker, a test's runtime), every guard
/// it kept is told (its `lost()` fires within its TTL) unless something
/// else still renews it, whether it was made on that runtime or on one that
/// lives on; a guard is never left neither renewed nor told. Later guards
/// of the same handle, made on a live runtime, are renewed.
pub async fn lost_fires_when_the_renewing_runtime_goes<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    let opts = ctx.opts(t.short_ttl);
    let (k1, k2, k3) = (ctx.key("runtime-1"), ctx.key("runtime-2"), ctx.key("runtime-3"));
    // The client's first guard, made on a runtime of its own: whatever
    // renews the client's guards starts there.
    let short_lived = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(format!("a runtime: {e}")))?;
    let (a1, key1) = (a.clone(), k1.clone());
    let (short_lived, g1) = tokio::task::spawn_blocking(move || {
        let g1 = short_lived.block_on(async move {
            let g = a1.acquire(&key1, opts).await;
            // Let whatever the grant started run once.
            tokio::task::yield_now().await;
            g
        });
        (short_lived, g1)
    })
    .await
    .map_err(|e| Failure(format!("the other runtime's thread: {e}")))?;
    let g1 = g1?;
    // A guard made on this (live) runtime, kept with the first.
    let g2 = a.acquire(&k2, opts).await?;
    tokio::task::spawn_blocking(move || drop(short_lived))
        .await
        .map_err(|e| Failure(format!("the other runtime's thread: {e}")))?;
    // Each guard is either told (`lost()`) or still renewed; never
    // neither. Past twice its TTL, one that is not lost must be held.
    let past = Instant::now() + t.short_ttl * 2;
    for (g, k, which) in [(&g1, &k1, "made on it"), (&g2, &k2, "made on a live runtime")] {
        let told = tokio::time::timeout_at(past.into(), g.lost().wait())
            .await
            .is_ok();
        if !told {
            ensure!(
                g.is_held() && b.try_acquire(k, ctx.opts(t.long_ttl)).await?.is_none(),
                "a guard {which}, after the runtime renewing it went, was neither renewed nor told \
                 (lost() did not fire)"
            );
        }
    }
    drop((g1, g2));
    // The names come free (their TTL at the latest) ...
    for k in [&k1, &k2] {
        wait_until(t.short_ttl + t.slack, &format!("{k} free again"), || async {
            Ok(match b.try_acquire(k, ctx.opts(t.long_ttl)).await? {
                Some(g) => {
                    g.release().await?;
                    true
                }
                None => false,
            })
        })
        .await?;
    }
    // ... and a later guard of the same handle is renewed past its TTL.
    let g3 = a.acquire(&k3, opts).await?;
    let until = Instant::now() + t.short_ttl * 3;
    while Instant::now() < until {
        ensure!(
            g3.is_held() && !g3.lost().is_lost(),
            "a guard made after the renewing runtime went was not renewed"
        );
        tokio::time::sleep(t.short_ttl / 4).await;
    }
    g3.release().await?;
    Ok(Verdict::Passed)
}
