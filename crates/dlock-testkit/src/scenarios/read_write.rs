//! Read-write locks ([`Lock::acquire_read`], [`Lock::acquire_write`]), on
//! backends whose [`Capabilities::read_write`](dlock_core::Capabilities) is
//! set.

use dlock_core::{Error, Guard, Lock, Wait};

use super::Ctx;
use crate::LockFactory;
use crate::outcome::{Failure, ScenarioResult, Verdict, ensure, wait_until, within};

/// Readers hold together; a writer excludes readers and writers; tokens:
/// every grant takes the next number of the name, so a read's token lies
/// between the writes before and after it.
pub async fn read_write_readers_share_writers_exclude<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b, c) = (ctx.client().await?, ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    let k = ctx.key("rw");
    let opts = ctx.opts(t.long_ttl);
    let now = opts.wait(Wait::No);
    let w1 = c.acquire_write(&k, opts).await?;
    ensure!(
        refused(a.acquire_read(&k, now).await)?,
        "a read was granted while a write held"
    );
    ensure!(
        refused(b.acquire_write(&k, now).await)?,
        "a second write was granted while a write held"
    );
    let t1 = w1.token();
    w1.release().await?;
    let r1 = a.acquire_read(&k, now).await?;
    let r2 = within(
        t.prompt,
        "a second read beside the first",
        b.acquire_read(&k, now),
    )
    .await??;
    ensure!(r1.is_held() && r2.is_held(), "two readers do not both hold");
    ensure!(
        refused(c.acquire_write(&k, now).await)?,
        "a write was granted while reads held"
    );
    let (tr1, tr2) = (r1.token(), r2.token());
    r1.release().await?;
    ensure!(
        refused(c.acquire_write(&k, now).await)?,
        "a write was granted while a read still held"
    );
    r2.release().await?;
    let w2 = within(t.prompt, "a write after the reads", c.acquire_write(&k, opts)).await??;
    if ctx.caps().fences() {
        let all = [t1, tr1, tr2, w2.token()];
        ensure!(
            all.iter().all(Option::is_some),
            "a read-write grant carries no token on a fencing backend: {all:?}"
        );
        ensure!(
            t1 < tr1 && t1 < tr2 && tr1.max(tr2) < w2.token(),
            "read tokens do not lie between the writes around them: write {t1:?}, reads {tr1:?} {tr2:?}, write {:?}",
            w2.token()
        );
    }
    w2.release().await?;
    Ok(Verdict::Passed)
}

/// A writer waiting behind a reader is not starved: readers that come
/// after it wait too, and it is granted when the reader leaves.
pub async fn read_write_waiting_writer_not_starved<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b, c) = (ctx.client().await?, ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    let k = ctx.key("rw-starve");
    let opts = ctx.opts(t.long_ttl);
    let now = opts.wait(Wait::No);
    let r1 = a.acquire_read(&k, opts).await?;
    let writer = b.acquire_write(&k, opts.wait(Wait::Forever));
    tokio::pin!(writer);
    let later_readers_wait = wait_until(
        t.prompt,
        "a later reader to wait for the waiting writer",
        || async {
            Ok(match c.acquire_read(&k, now).await {
                Ok(g) => {
                    g.release().await?;
                    false
                }
                Err(Error::Timeout { .. }) => true,
                Err(e) => return Err(e.into()),
            })
        },
    );
    tokio::select! {
        r = &mut writer => {
            return Err(Failure(format!(
                "a write was granted while a read held: {:?}",
                r.map(|g| g.token())
            )));
        }
        r = later_readers_wait => r?,
    }
    r1.release().await?;
    let w = within(t.prompt, "the waiting write after the read left", &mut writer).await??;
    ensure!(
        refused(c.acquire_read(&k, now).await)?,
        "a read was granted while the write held"
    );
    w.release().await?;
    let r = within(t.prompt, "a read after the write left", c.acquire_read(&k, opts)).await??;
    r.release().await?;
    Ok(Verdict::Passed)
}

/// A read held without auto-extend is lost at its TTL, and a writer
/// waiting for it is granted then.
pub async fn read_write_expired_reader_lets_the_writer_in<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let t = ctx.timing();
    let k = ctx.key("rw-expiry");
    let started = std::time::Instant::now();
    let r = a
        .acquire_read(&k, ctx.opts(t.short_ttl).auto_extend(false))
        .await?;
    let w = within(
        t.short_ttl + t.slack + t.prompt,
        "a write after the read's TTL",
        async {
            b.acquire_write(&k, ctx.opts(t.long_ttl).wait(Wait::Forever))
                .await
        },
    )
    .await??;
    let took = started.elapsed();
    ensure!(
        took >= t.short_ttl / 2,
        "a write was granted after {took:?}, long before the holder's {:?} TTL",
        t.short_ttl
    );
    within(t.slack, "lost() of the expired read", r.lost().wait()).await?;
    ensure!(!r.is_held(), "the expired read says it is held");
    drop(r);
    w.release().await?;
    Ok(Verdict::Passed)
}

/// `Err(Timeout)` is a refusal; a grant is not; anything else fails the
/// scenario.
pub(crate) fn refused<G: Guard>(r: dlock_core::Result<G>) -> Result<bool, Failure> {
    match r {
        Ok(g) => {
            drop(g);
            Ok(false)
        }
        Err(Error::Timeout { .. }) => Ok(true),
        Err(e) => Err(e.into()),
    }
}
