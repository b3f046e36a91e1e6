//! Several names at once ([`Lock::acquire_all`]): all or nothing, in one
//! global order, lost with any part.

use std::time::Instant;

use dlock_core::{Error, Fencing, Guard, Lock, Wait};

use super::{Ctx, free};
use crate::LockFactory;
use crate::outcome::{Failure, ScenarioResult, Verdict, ensure, wait_until, within};

/// A set with one name held elsewhere is refused and leaves the other names
/// free; a waiting set holds its names in name order (the first while the
/// second is awaited: the global order that keeps crossed sets from
/// deadlocking) and is granted when the held name is released; the granted
/// set excludes others from every name, carries a token per name, and its
/// release frees them all.
pub async fn acquire_all_is_all_or_nothing<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b, c) = (ctx.client().await?, ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    let (k1, k2, k3) = (ctx.key("many-1"), ctx.key("many-2"), ctx.key("many-3"));
    let opts = ctx.opts(t.long_ttl);
    let held = b.acquire(&k2, opts).await?;
    match a
        .acquire_all(&[k3.clone(), k1.clone(), k2.clone()], opts.wait(Wait::No))
        .await
    {
        Err(Error::Timeout { key }) if key == k2.as_str() => {}
        other => {
            return Err(Failure(format!(
                "a set with a held name: expected a time-out on that name, got {:?}",
                other.map(|g| g.keys().map(|k| k.as_str().to_owned()).collect::<Vec<_>>())
            )));
        }
    }
    for k in [&k1, &k3] {
        ensure!(free(&c, k, opts).await?, "a refused set left {k} held");
    }
    {
        let set = [k2.clone(), k1.clone()];
        let waiting = a.acquire_all(&set, opts.wait(Wait::Forever));
        tokio::pin!(waiting);
        let first_held = wait_until(
            t.prompt,
            "the set's first name (in name order) to be held while its second is awaited",
            || async {
                Ok(match c.try_acquire(&k1, opts).await? {
                    Some(g) => {
                        g.release().await?;
                        false
                    }
                    None => true,
                })
            },
        );
        tokio::select! {
            r = &mut waiting => {
                return Err(Failure(format!(
                    "a set was granted while one of its names was held: {:?}",
                    r.map(|g| g.keys().map(|k| k.as_str().to_owned()).collect::<Vec<_>>())
                )));
            }
            r = first_held => r?,
        }
        held.release().await?;
        let both = within(t.prompt, "the set after its held name was released", &mut waiting).await??;
        let keys: Vec<&str> = both.keys().map(|k| k.as_str()).collect();
        ensure!(
            keys == [k1.as_str(), k2.as_str()],
            "the parts are not one per name in name order: {keys:?}"
        );
        if ctx.caps().fencing != Fencing::None {
            ensure!(
                both.tokens().all(|(_, t)| t.is_some()),
                "a part of a set carries no token on a fencing backend"
            );
        }
        ensure!(both.is_held(), "a granted set is not held");
        for k in [&k1, &k2] {
            ensure!(
                c.try_acquire(k, opts).await?.is_none(),
                "another client was granted {k}, a name of a held set"
            );
        }
        both.release().await?;
    }
    for k in [&k1, &k2] {
        ensure!(free(&c, k, opts).await?, "a released set left {k} held");
    }
    Ok(Verdict::Passed)
}

/// A set held without auto-extend is `lost()` at its TTL, is then no
/// longer held, and its names go to another client.
pub async fn acquire_all_is_lost_with_its_ttl<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    let keys = [ctx.key("many-lost-b"), ctx.key("many-lost-a")];
    let started = Instant::now();
    let g = a
        .acquire_all(&keys, ctx.opts(t.short_ttl).auto_extend(false))
        .await?;
    ensure!(g.is_held(), "a fresh set is not held");
    within(
        t.short_ttl + t.slack,
        "lost() of a set after its TTL",
        g.lost().wait(),
    )
    .await?;
    ensure!(!g.is_held(), "is_held() of a set is true after its lost() fired");
    let took = started.elapsed();
    ensure!(
        took >= t.short_ttl / 2,
        "a set's lost() fired after {took:?}, long before the {:?} TTL",
        t.short_ttl
    );
    let again = within(
        t.prompt,
        "the names of an expired set for another client",
        async { b.acquire_all(&keys, ctx.opts(t.long_ttl)).await },
    )
    .await??;
    again.release().await?;
    drop(g);
    Ok(Verdict::Passed)
}
