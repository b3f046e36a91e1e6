//! Counting semaphores ([`Lock::acquire_permits`]), on backends whose
//! [`Capabilities::semaphores`](dlock_core::Capabilities) is set.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use dlock_core::{Error, Guard, Lock, Wait};

use super::Ctx;
use super::read_write::refused;
use crate::LockFactory;
use crate::outcome::{Failure, ScenarioResult, Verdict, ensure, within};

/// `limit` permits hold together and one more is refused; a holder of two
/// counts twice; a released permit goes to the waiter; bad counts are
/// refused with a clear error.
pub async fn semaphore_admits_up_to_its_limit<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    const LIMIT: u32 = 3;
    let mut clients = Vec::new();
    for _ in 0..=LIMIT {
        clients.push(ctx.client().await?);
    }
    let t = ctx.timing();
    let k = ctx.key("sem");
    let opts = ctx.opts(t.long_ttl);
    let now = opts.wait(Wait::No);
    for (count, limit) in [(0, LIMIT), (LIMIT + 1, LIMIT), (1, 0)] {
        match clients[0].acquire_permits(&k, count, limit, opts).await {
            Err(Error::InvalidConfig(_)) => {}
            other => {
                return Err(Failure(format!(
                    "{count} of {limit} permits: expected InvalidConfig, got {:?}",
                    other.map(|g| g.token())
                )));
            }
        }
    }
    let mut held = Vec::new();
    for c in &clients[..LIMIT as usize] {
        held.push(
            within(
                t.prompt,
                "a permit within the limit",
                c.acquire_permits(&k, 1, LIMIT, now),
            )
            .await??,
        );
    }
    let last = &clients[LIMIT as usize];
    ensure!(
        refused(last.acquire_permits(&k, 1, LIMIT, now).await)?,
        "a permit beyond the limit of {LIMIT} was granted"
    );
    let tokens: Vec<_> = held.iter().map(Guard::token).collect();
    if ctx.caps().fences() {
        ensure!(
            tokens.iter().all(Option::is_some) && tokens.windows(2).all(|w| w[0] < w[1]),
            "permit tokens do not increase with each grant: {tokens:?}"
        );
    }
    {
        let waiting = last.acquire_permits(&k, 1, LIMIT, opts.wait(Wait::Forever));
        tokio::pin!(waiting);
        // The waiter is not granted while the limit is reached...
        if let Ok(r) = tokio::time::timeout(t.short_ttl, &mut waiting).await {
            return Err(Failure(format!(
                "a waiting permit was granted beyond the limit: {:?}",
                r.map(|g| g.token())
            )));
        }
        // ...and is when one is released.
        held.remove(0).release().await?;
        let got = within(t.prompt, "the waiting permit after a release", &mut waiting).await??;
        held.push(got);
    }
    for g in held {
        g.release().await?;
    }
    // Two permits count twice.
    let two = clients[0].acquire_permits(&k, 2, LIMIT, now).await?;
    ensure!(
        refused(clients[1].acquire_permits(&k, 2, LIMIT, now).await)?,
        "2 + 2 permits of {LIMIT} were granted"
    );
    let one = clients[1].acquire_permits(&k, 1, LIMIT, now).await?;
    two.release().await?;
    one.release().await?;
    Ok(Verdict::Passed)
}

/// Clients contending for a semaphore's permits never hold more than its
/// limit at once (each holder counts itself in and out around its hold).
pub async fn semaphore_never_over_admits<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    const LIMIT: u32 = 2;
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 8;
    let t = ctx.timing();
    let k = ctx.key("sem-load");
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    // Aborted when the scenario ends, whichever way.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let c = ctx.client().await?;
        let (k, inside, most) = (k.clone(), Arc::clone(&inside), Arc::clone(&most));
        let opts = ctx.opts(t.long_ttl);
        tasks.spawn(async move {
            for _ in 0..ROUNDS {
                let g = c.acquire_permits(&k, 1, LIMIT, opts).await?;
                let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await?;
            }
            Ok::<(), Error>(())
        });
    }
    within(t.prompt * 2, "the contending clients' rounds", async {
        while let Some(done) = tasks.join_next().await {
            done.map_err(|e| Failure(format!("a contending client panicked: {e}")))??;
        }
        Ok::<(), Failure>(())
    })
    .await??;
    let most = most.load(Ordering::SeqCst);
    ensure!(most <= LIMIT, "{most} permit holders at once, limit {LIMIT}");
    Ok(Verdict::Passed)
}

/// A permit held without auto-extend is lost at its TTL, and the permit
/// goes to a waiter.
pub async fn semaphore_expired_permit_passes_on<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    let k = ctx.key("sem-expiry");
    let started = std::time::Instant::now();
    let g = a
        .acquire_permits(&k, 1, 1, ctx.opts(t.short_ttl).auto_extend(false))
        .await?;
    let next = within(
        t.short_ttl + t.slack + t.prompt,
        "a permit after the holder's TTL",
        async {
            b.acquire_permits(&k, 1, 1, ctx.opts(t.long_ttl).wait(Wait::Forever))
                .await
        },
    )
    .await??;
    let took = started.elapsed();
    ensure!(
        took >= t.short_ttl / 2,
        "the permit passed on after {took:?}, long before the holder's {:?} TTL",
        t.short_ttl
    );
    within(t.slack, "lost() of the expired permit", g.lost().wait()).await?;
    ensure!(!g.is_held(), "the expired permit says it is held");
    drop(g);
    next.release().await?;
    Ok(Verdict::Passed)
}

/// A backend that does not offer a primitive says so with
/// [`Error::Unsupported`], naming it.
pub async fn unoffered_primitives_are_refused<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let a = ctx.client().await?;
    let t = ctx.timing();
    let k = ctx.key("unoffered");
    let opts = ctx.opts(t.long_ttl);
    let caps = ctx.caps();
    let check = |what: &str, r: dlock_core::Result<<F::Lock as Lock>::Guard>| match r {
        Err(Error::Unsupported { .. }) => Ok(()),
        other => Err(Failure(format!(
            "{what} on a backend that does not offer it: expected Unsupported, got {:?}",
            other.map(|g| g.token())
        ))),
    };
    if !caps.read_write {
        check("a read", a.acquire_read(&k, opts).await)?;
        check("a write", a.acquire_write(&k, opts).await)?;
    }
    if !caps.semaphores {
        check("a permit", a.acquire_permits(&k, 1, 2, opts).await)?;
    }
    Ok(Verdict::Passed)
}
