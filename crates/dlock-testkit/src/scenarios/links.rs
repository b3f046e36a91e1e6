//! What a broken network must not do to a driver: the link scenarios, for
//! factories that [break links](crate::LockFactory::breaks_links) (skipped,
//! visibly, for the others).
//!
//! Each gets a client whose connections go through a [`Link`](crate::Link)
//! and slows, silences or resets it: an acquire cancelled while its request
//! is in flight, a backend that is gone, a release whose request or reply is
//! lost, renewals that go unanswered.

use std::time::{Duration, Instant};

use dlock_core::{Error, Guard, Lock, Result, Wait};

use super::{Ctx, Timing};
use crate::LockFactory;
use crate::launcher::Fault;
use crate::link::Linked;
use crate::outcome::{Failure, Outcome, Verdict, ensure, wait_until, within};

/// The delay each way on a slow link.
const DELAY: Duration = Duration::from_millis(50);

/// How late `lost()` may fire after the latest the local deadline can be
/// (timers and a busy machine).
const LATE: Duration = Duration::from_millis(500);

/// Where the acquires of [`cancelled_acquire_in_flight_leaves_nothing`] are
/// cut, in eighths of a whole acquire over the slow link.
const CUTS: u32 = 8;

/// A TTL that outlives a few requests that each wait out a driver's request
/// timeout, on a link that answers nothing.
fn hold_ttl(t: Timing) -> Duration {
    (t.short_ttl * 4).max(Duration::from_secs(15))
}

/// `r` must be `Error::Unavailable`.
fn unavailable<T: std::fmt::Debug>(what: &str, r: Result<T>) -> Result<(), Failure> {
    match r {
        Err(Error::Unavailable { .. }) => Ok(()),
        Err(e) => Err(Failure(format!("{what}: expected Error::Unavailable, got {e:?}"))),
        Ok(v) => Err(Failure(format!(
            "{what}: expected Error::Unavailable, got Ok({v:?}), an answer nobody could have given"
        ))),
    }
}

/// Whether `client` can take `key` at once (and gives it back).
async fn free<L: Lock>(
    ctx: &Ctx<impl LockFactory>,
    client: &L,
    key: &dlock_core::LockKey,
) -> Result<bool, Failure> {
    Ok(
        match client.try_acquire(key, ctx.opts(ctx.timing().long_ttl)).await? {
            Some(g) => {
                g.release().await?;
                true
            }
            None => false,
        },
    )
}

/// An acquire of a *free* key cancelled while its request is in flight (a
/// slow link: the request may reach the server and be granted after the
/// caller gave up) leaves no lock held: each key is free again well before
/// its TTL.
pub async fn cancelled_acquire_in_flight_leaves_nothing<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let Linked { lock: a, link } = ctx.linked_client().await?;
    let b = ctx.client().await?;
    let t = ctx.timing();
    link.set(Fault::Delay(DELAY));
    // How long one whole acquire takes over this link (twice: the first may
    // open a session).
    let mut whole = Duration::MAX;
    for round in 0..2 {
        let k = ctx.key(&format!("in-flight/whole/{round}"));
        let sent = Instant::now();
        let g = a.acquire(&k, ctx.opts(t.long_ttl)).await?;
        whole = whole.min(sent.elapsed());
        g.release().await?;
    }
    let mut keys = Vec::new();
    let mut cancelled = 0;
    for i in 1..CUTS {
        let k = ctx.key(&format!("in-flight/{i}"));
        let cut = whole * i / CUTS;
        match tokio::time::timeout(cut, a.acquire(&k, ctx.opts(t.long_ttl))).await {
            Ok(granted) => granted?.release().await?,
            Err(_) => cancelled += 1,
        }
        keys.push((k, cut));
    }
    ensure!(
        cancelled * 2 >= CUTS - 1,
        "only {cancelled} of {} acquires were still in flight at their cut (a whole one took {whole:?})",
        CUTS - 1
    );
    // One more round trip over the link, behind whatever was in flight.
    let k = ctx.key("in-flight/after");
    a.acquire(&k, ctx.opts(t.long_ttl)).await?.release().await?;
    for (k, cut) in &keys {
        wait_until(
            t.prompt,
            &format!("{k} free again after an acquire cancelled {cut:?} in (a whole one took {whole:?})"),
            || free(&ctx, &b, k),
        )
        .await?;
    }
    ctx.await_clean().await?;
    drop(link);
    Ok(Verdict::Passed)
}

/// A backend that is not there, or that went away, gives
/// `Error::Unavailable` from `acquire`, `try_acquire`, `extend` and
/// `release` — never `Ok(None)` (a held key), `Timeout` (a wait that ran
/// out) or `Ok(())` (a release that happened). The lock nobody could release
/// is free by its TTL at the latest once the link heals.
pub async fn unreachable_backend_is_unavailable<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let t = ctx.timing();
    let bound = t.slack;
    let k = ctx.key("unreachable/free");
    let nowhere = within(
        bound,
        "connecting to a backend that is not there",
        ctx.factory().unreachable_client(),
    )
    .await?;
    match nowhere {
        Err(e) => unavailable("connecting to a backend that is not there", Err::<(), _>(e))?,
        Ok(c) => {
            let r = within(bound, "try_acquire on a backend that is not there", async {
                c.try_acquire(&k, ctx.opts(t.long_ttl)).await.map(|g| g.is_some())
            })
            .await?;
            unavailable("try_acquire on a backend that is not there", r)?;
            let wait = Wait::For(t.short_ttl);
            let r = within(
                bound + t.short_ttl,
                "acquire on a backend that is not there",
                async {
                    c.acquire(&k, ctx.opts(t.long_ttl).wait(wait))
                        .await
                        .map(|g| g.token())
                },
            )
            .await?;
            unavailable("acquire on a backend that is not there", r)?;
        }
    }

    let Linked { lock: a, link } = ctx.linked_client().await?;
    let hold = hold_ttl(t);
    let held = ctx.key("unreachable/held");
    let g = a.acquire(&held, ctx.opts(hold).auto_extend(false)).await?;
    link.set(Fault::Reset);
    let r = within(bound, "extend over a reset link", g.extend(hold)).await?;
    unavailable("extend over a reset link", r)?;
    let r = within(bound, "release over a reset link", g.release()).await?;
    unavailable("release over a reset link", r)?;
    let r = within(bound, "try_acquire over a reset link", async {
        a.try_acquire(&k, ctx.opts(t.long_ttl)).await.map(|g| g.is_some())
    })
    .await?;
    unavailable("try_acquire over a reset link", r)?;
    let r = within(bound + t.short_ttl, "acquire over a reset link", async {
        a.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::For(t.short_ttl)))
            .await
            .map(|g| g.token())
    })
    .await?;
    unavailable("acquire over a reset link", r)?;
    link.heal();
    let b = ctx.client().await?;
    let last = hold + t.slack;
    within(last, "the unreleased lock freed by its TTL", async {
        b.acquire(&held, ctx.opts(t.long_ttl).wait(Wait::For(last)))
            .await?
            .release()
            .await
    })
    .await??;
    // Whatever the client still cleans up in the background, it does over
    // the link: keep it until the namespace is clean.
    ctx.await_clean().await?;
    drop(link);
    Ok(Verdict::Passed)
}

/// A release whose request or reply is lost (a link that goes silent before
/// or during it) is never reported as `Ok(())` unless the lock is really
/// gone; once the link heals, the key is free within its TTL at the latest.
pub async fn failed_release_is_not_ok<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let Linked { lock: a, link } = ctx.linked_client().await?;
    let b = ctx.client().await?;
    let t = ctx.timing();
    let hold = hold_ttl(t);
    for (i, round) in ["silent before the release", "silent during the release"]
        .into_iter()
        .enumerate()
    {
        let k = ctx.key(&format!("release/{i}"));
        link.heal();
        let g = a.acquire(&k, ctx.opts(hold).auto_extend(false)).await?;
        let r = if i == 0 {
            link.set(Fault::Blackhole);
            within(t.slack, "a release over a silent link", g.release()).await?
        } else {
            // The request is on its way (or there) when the link goes
            // silent: its reply is lost.
            link.set(Fault::Delay(DELAY));
            let release = g.release();
            tokio::pin!(release);
            let early = tokio::select! {
                r = &mut release => Some(r),
                () = tokio::time::sleep(DELAY * 3 / 2) => None,
            };
            match early {
                Some(r) => r,
                None => {
                    link.set(Fault::Blackhole);
                    within(t.slack, "a release over a link gone silent", release).await?
                }
            }
        };
        match r {
            Ok(()) => ensure!(
                free(&ctx, &b, &k).await?,
                "{round}: release returned Ok(()) but the key is still held"
            ),
            Err(e @ (Error::Lost { .. } | Error::NotHeld { .. })) => {
                return Err(Failure(format!(
                    "{round}: a release by the holder, within its TTL, answered {e:?}"
                )));
            }
            Err(_) => {}
        }
        link.heal();
        let last = hold + t.slack;
        within(
            last,
            &format!("{round}: the key freed by its TTL after the link healed"),
            async {
                b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::For(last)))
                    .await?
                    .release()
                    .await
            },
        )
        .await??;
    }
    ctx.await_clean().await?;
    drop(link);
    Ok(Verdict::Passed)
}

/// Renewals over a link that answers nothing fire `lost()` no later than
/// the local deadline — at the latest one TTL after the link went silent,
/// since no renewal sent after that is answered — and `is_held()` is false
/// from then on.
pub async fn dead_link_fires_lost_in_time<F: LockFactory>(ctx: Ctx<F>) -> Outcome {
    let Linked { lock: a, link } = ctx.linked_client().await?;
    let t = ctx.timing();
    let ttl = t.short_ttl;
    let k = ctx.key("dead-link");
    let g = a.acquire(&k, ctx.opts(ttl)).await?;
    let silent = Instant::now();
    link.set(Fault::Blackhole);
    let latest = silent + ttl;
    within(
        ttl + LATE,
        "lost() after renewals over a silent link",
        g.lost().wait(),
    )
    .await?;
    ensure!(!g.is_held(), "lost() fired but is_held() is still true");
    tokio::time::sleep_until(latest.into()).await;
    ensure!(
        !g.is_held(),
        "is_held() still true one TTL ({ttl:?}) after the link went silent"
    );
    drop(g);
    link.heal();
    ctx.await_clean().await?;
    drop(link);
    Ok(Verdict::Passed)
}
