//! Nothing left behind: drops, cancelled acquires, a used namespace.

use std::time::Duration;

use dlock_core::{Error, Guard, Lock, Wait};

use super::{Ctx, free};
use crate::LockFactory;
use crate::outcome::ensure;
use crate::outcome::{Failure, ScenarioResult, Verdict, wait_until, within};

/// Dropping a guard releases the lock well before its TTL; a dropped or
/// released guard's `lost()` resolves at once (work that follows it stops
/// before another client can be granted the key).
pub async fn drop_releases<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("drop");
    let t = ctx.timing();
    // A guard before, and a look while it is held: a driver's background
    // machinery is up and has seen the guard when it is dropped.
    a.acquire(&ctx.key("drop-warm"), ctx.opts(t.long_ttl))
        .await?
        .release()
        .await?;
    let ga = a.acquire(&k, ctx.opts(t.long_ttl)).await?;
    ensure!(
        b.try_acquire(&k, ctx.opts(t.long_ttl)).await?.is_none(),
        "another client was granted a held key"
    );
    let dropped = ga.lost();
    drop(ga);
    within(t.prompt, "lost() of a dropped guard", dropped.wait()).await?;
    let gb = within(t.prompt, "a grant after the holder dropped its guard", async {
        b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::Forever)).await
    })
    .await??;
    let released = gb.lost();
    gb.release().await?;
    within(t.prompt, "lost() of a released guard", released.wait()).await?;
    Ok(Verdict::Passed)
}

/// A waiting acquire that is cancelled (its future dropped) leaves no ghost
/// waiter: after the holder releases, a third client gets the key promptly.
pub async fn cancelled_acquire_leaves_nothing<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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
    ensure!(
        free(&c, &k, ctx.opts(t.long_ttl)).await?,
        "after the holder released, the key was held: the cancelled acquire left a ghost"
    );
    // Acquires of free keys dropped after their first poll (the requests
    // handed to the client, no reply yet): each key is free again promptly,
    // long before its TTL (a clean-up that overtook its own request would
    // leave the key held). Cut on a worker of the runtime, as a task: what
    // the cut starts in the background there runs in the order the runtime
    // picks (the last task started first), not in the order it was started.
    let keys: Vec<_> = (0..8)
        .map(|i| ctx.key(&format!("cancel/first-poll/{i}")))
        .collect();
    let (cutter, cut, opts) = (a.clone(), keys.clone(), ctx.opts(t.long_ttl));
    tokio::spawn(async move {
        for k in &cut {
            let once = tokio::time::timeout(Duration::ZERO, cutter.acquire(k, opts)).await;
            if let Ok(granted) = once {
                // Granted in its first poll (an in-process backend).
                granted?.release().await?;
            }
            tokio::task::yield_now().await;
        }
        Ok::<(), Error>(())
    })
    .await
    .map_err(|e| Failure(format!("the task that cut the acquires: {e}")))??;
    for k in &keys {
        wait_until(
            t.prompt,
            &format!("{k} free after an acquire dropped after its first poll"),
            || free(&c, k, ctx.opts(t.long_ttl)),
        )
        .await?;
    }
    Ok(Verdict::Passed)
}

/// A mix of everything (grants, drops, cancelled waits, timeouts, expiries)
/// leaves nothing in the namespace.
pub async fn namespace_clean_after_use<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    for i in 0..4 {
        let k = ctx.key(&format!("mix/{i}"));
        let g = a.acquire(&k, ctx.opts(t.long_ttl)).await?;
        if i == 0 {
            // A residue that lists nothing would hide every leak from the kit.
            ensure!(
                !ctx.factory().residue(ctx.namespace()).await?.is_empty(),
                "the factory's residue() lists nothing while a lock is held: the kit could not see what a driver leaves behind"
            );
        }
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
