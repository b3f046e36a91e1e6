//! What a broken network must not do to a driver: the link scenarios, for
//! factories that [break links](crate::LockFactory::breaks_links) (skipped,
//! visibly, for the others).
//!
//! Each gets a client whose connections go through a [`Link`](crate::Link)
//! and slows, silences or resets it: an acquire cancelled while its request
//! or its reply is in flight, a backend that is gone, a release whose request
//! or reply is lost, renewals that go unanswered. Where a fault must hit a
//! request at a given point, the scenario does not guess the timing: it slows
//! the link and watches the server (through the factory's
//! [`residue`](crate::LockFactory::residue)) for the request's effect.

use std::time::{Duration, Instant};

use dlock_core::{Error, Guard, Lock, LockKey, LostSignal, Result, Wait};

use super::{Ctx, Timing};
use crate::LockFactory;
use crate::launcher::Fault;
use crate::link::Linked;
use crate::outcome::{Failure, ScenarioResult, Verdict, ensure, wait_until, within};

/// The delay each way on a slow link: long enough that the kit sees a
/// request's effect on the server before its reply is delivered (polling
/// every few milliseconds, then silencing the link), short enough for the
/// clients' own liveness checks (a ZooKeeper client with a 2 s session gives
/// a connection 600 ms to answer).
const DELAY: Duration = Duration::from_millis(150);

/// How often the kit looks at the server while it waits to cut a request.
const WATCH: Duration = Duration::from_millis(3);

/// How late `lost()` may fire after the latest the local deadline can be
/// (timers on a busy machine).
const LATE: Duration = Duration::from_millis(500);

/// A TTL that outlives a few requests that each wait out a driver's request
/// timeout, on a link that answers nothing.
fn hold_ttl(t: Timing) -> Duration {
    (t.short_ttl * 4).max(Duration::from_secs(15))
}

/// How long one request over a broken link may take to fail: the drivers'
/// connect and request timeouts are a few seconds.
fn bound(t: Timing) -> Duration {
    t.prompt
}

/// `r` must be `Error::Unavailable`; `Error::Lost` too where `lost` had
/// fired before the answer (a session backend whose session ran out while
/// the link was down says so truthfully).
fn unavailable<T: std::fmt::Debug>(
    what: &str,
    r: Result<T>,
    lost: Option<&LostSignal>,
) -> Result<(), Failure> {
    match r {
        Err(Error::Unavailable { .. }) => Ok(()),
        Err(Error::Lost { .. }) if lost.is_some_and(LostSignal::is_lost) => Ok(()),
        Err(e) => Err(Failure(format!("{what}: expected Error::Unavailable, got {e:?}"))),
        Ok(v) => Err(Failure(format!(
            "{what}: expected Error::Unavailable, got Ok({v:?}), an answer nobody could have given"
        ))),
    }
}

/// Whether `client` can take `key` at once (and gives it back).
async fn free<L: Lock>(ctx: &Ctx<impl LockFactory>, client: &L, key: &LockKey) -> Result<bool, Failure> {
    super::free(client, key, ctx.opts(ctx.timing().long_ttl)).await
}

/// `client` gets `key` within its `ttl` (plus the slack): a lock nobody
/// could release is freed by its TTL at the latest.
async fn freed_by_ttl<L: Lock>(
    ctx: &Ctx<impl LockFactory>,
    client: &L,
    key: &LockKey,
    ttl: Duration,
    what: &str,
) -> Result<(), Failure> {
    let last = ttl + ctx.timing().slack;
    within(
        last,
        &format!("{what} freed by its TTL after the link healed"),
        async {
            client
                .acquire(key, ctx.opts(ctx.timing().long_ttl).wait(Wait::For(last)))
                .await?
                .release()
                .await
        },
    )
    .await??;
    Ok(())
}

/// The scenario's end: whatever the client still cleans up in the
/// background it does over the link, so the link is kept until the
/// namespace is clean.
async fn passed_once_clean<F: LockFactory>(ctx: &Ctx<F>, link: crate::Link) -> ScenarioResult {
    ctx.await_clean().await?;
    drop(link);
    Ok(Verdict::Passed)
}

/// Whether the backend keeps anything for `key` (its lock entry, a node, a
/// contender key): a residue entry that names the key, whole or followed by
/// `/` (drivers list their entries with or without their own key prefix).
async fn on_server<F: LockFactory>(ctx: &Ctx<F>, key: &LockKey) -> Result<bool, Failure> {
    let name = key.as_str();
    Ok(ctx.factory().residue(ctx.namespace()).await?.iter().any(|entry| {
        entry.match_indices(name).any(|(at, _)| {
            let rest = &entry[at + name.len()..];
            rest.is_empty() || rest.starts_with('/')
        })
    }))
}

/// Polls `cond` every [`WATCH`] until it holds: the kit's eye on the server
/// while a request is on its way (a tight poll, so it sees the effect well
/// within [`DELAY`] of it).
async fn watch_for<Fut>(limit: Duration, what: &str, mut cond: impl FnMut() -> Fut) -> Result<(), Failure>
where
    Fut: std::future::Future<Output = Result<bool, Failure>>,
{
    let deadline = dlock_core::driver::saturating_add(Instant::now(), limit);
    while !cond().await? {
        if Instant::now() >= deadline {
            return Err(Failure(format!("{what} did not happen within {limit:?}")));
        }
        tokio::time::sleep(WATCH).await;
    }
    Ok(())
}

/// An acquire of a *free* key cancelled while its request is in flight
/// (before the server saw it), and one cancelled after the server granted it
/// but before the reply arrived, leave no lock held: each key is free again
/// well before its TTL.
pub async fn cancelled_acquire_in_flight_leaves_nothing<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    if let Some(skipped) = ctx.skipped("cancelled_acquire_in_flight_leaves_nothing") {
        return Ok(skipped);
    }
    let Linked { lock: a, link } = ctx.linked_client().await?;
    let b = ctx.client().await?;
    let t = ctx.timing();
    // Open whatever the client opens lazily (a session) before slowing down.
    let warm = ctx.key("in-flight/warm");
    a.acquire(&warm, ctx.opts(t.long_ttl)).await?.release().await?;
    link.set(Fault::Delay(DELAY));
    let mut keys = Vec::new();
    let mut after_grant = 0;
    for i in 0..6 {
        let k = ctx.key(&format!("in-flight/{i}"));
        // Two cut before the server sees the request, four after it granted.
        let before_grant = i < 2;
        let granted_what = format!("{k} granted on the server");
        let beaten = {
            let acquire = a.acquire(&k, ctx.opts(t.long_ttl));
            tokio::pin!(acquire);
            let cut = async {
                if before_grant {
                    tokio::time::sleep(DELAY / 2).await;
                    Ok::<(), Failure>(())
                } else {
                    watch_for(t.prompt, &granted_what, || on_server(&ctx, &k)).await?;
                    // The grant's reply is on the slow link: lose it, so
                    // the caller cannot have heard of the grant.
                    link.set(Fault::Blackhole);
                    Ok::<(), Failure>(())
                }
            };
            tokio::select! {
                granted = &mut acquire => Some(granted?),
                r = cut => { r?; None }
            }
        };
        // Cut (the future is dropped): back to the slow link for the next.
        link.set(Fault::Delay(DELAY));
        if let Some(g) = beaten {
            // The reply beat the cut (a very busy machine): nothing cut.
            g.release().await?;
            continue;
        }
        after_grant += usize::from(!before_grant);
        keys.push((
            k,
            if before_grant {
                "before the server saw it"
            } else {
                "after the server granted it"
            },
        ));
    }
    ensure!(
        after_grant > 0,
        "no acquire could be cut between its grant and its reply ({DELAY:?} of delay each way)"
    );
    link.heal();
    for (k, when) in &keys {
        wait_until(
            t.prompt,
            &format!("{k} free again after an acquire cancelled {when}"),
            || free(&ctx, &b, k),
        )
        .await?;
    }
    // A request still on its way must not take the key afterwards.
    passed_once_clean(&ctx, link).await
}

/// A release whose request is lost (the link silent before it) or whose
/// reply is lost (silent once the server has done it) is never reported as
/// `Ok(())` unless the lock is really gone, nor as `NotHeld`; once the link
/// heals, the key is free within its TTL at the latest.
pub async fn failed_release_is_not_ok<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    if let Some(skipped) = ctx.skipped("failed_release_is_not_ok") {
        return Ok(skipped);
    }
    let Linked { lock: a, link } = ctx.linked_client().await?;
    let b = ctx.client().await?;
    let t = ctx.timing();
    let hold = hold_ttl(t);
    for (i, round) in ["the request is lost", "the reply is lost"]
        .into_iter()
        .enumerate()
    {
        let k = ctx.key(&format!("release/{i}"));
        link.heal();
        let g = a.acquire(&k, ctx.opts(hold).auto_extend(false)).await?;
        let r = if i == 0 {
            link.set(Fault::Blackhole);
            within(bound(t), "a release over a silent link", g.release()).await?
        } else {
            link.set(Fault::Delay(DELAY));
            let release = g.release();
            tokio::pin!(release);
            let released_what = format!("{k} released on the server");
            let done_on_server = watch_for(t.prompt, &released_what, || async {
                Ok(!on_server(&ctx, &k).await?)
            });
            let early = tokio::select! {
                r = &mut release => Some(r),
                r = done_on_server => { r?; None }
            };
            match early {
                Some(r) => r,
                None => {
                    // The reply is in the slow link's hands: it is lost.
                    link.set(Fault::Blackhole);
                    within(bound(t), "a release whose reply is lost", release).await?
                }
            }
        };
        match r {
            Ok(()) => ensure!(
                free(&ctx, &b, &k).await?,
                "{round}: release returned Ok(()) but the key is still held"
            ),
            Err(e @ Error::NotHeld { .. }) => {
                return Err(Failure(format!(
                    "{round}: a release by the holder, within its TTL, answered {e:?}"
                )));
            }
            Err(_) => {}
        }
        link.heal();
        freed_by_ttl(&ctx, &b, &k, hold, &format!("{round}: the key")).await?;
    }
    passed_once_clean(&ctx, link).await
}

/// A backend that is not there, or that went away, gives
/// `Error::Unavailable` from `acquire`, `try_acquire`, `extend` and
/// `release` — never `Ok(None)` (a held key), `Timeout` (a wait that ran
/// out) or `Ok(())` (a release that happened). The lock nobody could release
/// is free by its TTL at the latest once the link heals.
pub async fn unreachable_backend_is_unavailable<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    if let Some(skipped) = ctx.skipped("unreachable_backend_is_unavailable") {
        return Ok(skipped);
    }
    let t = ctx.timing();
    let k = ctx.key("unreachable/free");
    let wait = Wait::For(t.short_ttl);
    let nowhere = within(
        bound(t),
        "connecting to a backend that is not there",
        ctx.factory().unreachable_client(),
    )
    .await?;
    match nowhere {
        Err(e) => unavailable("connecting to a backend that is not there", Err::<(), _>(e), None)?,
        Ok(c) => {
            let r = within(bound(t), "try_acquire on a backend that is not there", async {
                c.try_acquire(&k, ctx.opts(t.long_ttl)).await.map(|g| g.is_some())
            })
            .await?;
            unavailable("try_acquire on a backend that is not there", r, None)?;
            let r = within(
                bound(t) + t.short_ttl,
                "acquire on a backend that is not there",
                async {
                    c.acquire(&k, ctx.opts(t.long_ttl).wait(wait))
                        .await
                        .map(|g| g.token())
                },
            )
            .await?;
            unavailable("acquire on a backend that is not there", r, None)?;
        }
    }

    let Linked { lock: a, link } = ctx.linked_client().await?;
    let hold = hold_ttl(t);
    let held = ctx.key("unreachable/held");
    let g = a.acquire(&held, ctx.opts(hold).auto_extend(false)).await?;
    let lost = g.lost();
    link.set(Fault::Reset);
    let r = within(bound(t), "extend over a reset link", g.extend(hold)).await?;
    unavailable("extend over a reset link", r, Some(&lost))?;
    let r = within(bound(t), "release over a reset link", g.release()).await?;
    unavailable("release over a reset link", r, Some(&lost))?;
    let r = within(bound(t), "try_acquire over a reset link", async {
        a.try_acquire(&k, ctx.opts(t.long_ttl)).await.map(|g| g.is_some())
    })
    .await?;
    unavailable("try_acquire over a reset link", r, None)?;
    let r = within(bound(t) + t.short_ttl, "acquire over a reset link", async {
        a.acquire(&k, ctx.opts(t.long_ttl).wait(wait))
            .await
            .map(|g| g.token())
    })
    .await?;
    unavailable("acquire over a reset link", r, None)?;
    link.heal();
    let b = ctx.client().await?;
    freed_by_ttl(&ctx, &b, &held, hold, "the unreleased lock").await?;
    passed_once_clean(&ctx, link).await
}

/// Renewals over a link that answers nothing fire `lost()` no later than
/// the local deadline — at the latest one TTL after the link went silent,
/// since no renewal sent after that is answered — and `is_held()` is false
/// from that deadline on.
pub async fn dead_link_fires_lost_in_time<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    if let Some(skipped) = ctx.skipped("dead_link_fires_lost_in_time") {
        return Ok(skipped);
    }
    let Linked { lock: a, link } = ctx.linked_client().await?;
    let t = ctx.timing();
    let ttl = t.short_ttl;
    let k = ctx.key("dead-link");
    let g = a.acquire(&k, ctx.opts(ttl)).await?;
    // No renewal sent from now on is answered, so the local deadline is at
    // most one TTL away.
    link.set(Fault::Blackhole);
    let silent = Instant::now();
    let latest = dlock_core::driver::saturating_add(silent, ttl);
    tokio::time::sleep_until(latest.into()).await;
    ensure!(
        !g.is_held(),
        "is_held() still true one TTL ({ttl:?}) after the link went silent"
    );
    within(
        LATE,
        "lost() by the local deadline, renewals unanswered",
        g.lost().wait(),
    )
    .await?;
    ensure!(!g.is_held(), "lost() fired but is_held() is true");
    drop(g);
    link.heal();
    passed_once_clean(&ctx, link).await
}

/// Requests cancelled while the backend is out of reach are not sent once
/// it is back: a `try_acquire` or an `acquire` dropped on a reset link,
/// before the driver's own request timeout, must not take its key when the
/// client reconnects (a client that queues requests while it reconnects and
/// writes them later takes a lock nobody holds, until its TTL).
pub async fn cancelled_on_a_dead_link_is_not_replayed<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    if let Some(skipped) = ctx.skipped("cancelled_on_a_dead_link_is_not_replayed") {
        return Ok(skipped);
    }
    let Linked { lock: a, link } = ctx.linked_client().await?;
    let b = ctx.client().await?;
    let t = ctx.timing();
    // Open whatever the client opens lazily (a session) before the reset.
    let probe = ctx.key("replay/probe");
    a.acquire(&probe, ctx.opts(t.long_ttl)).await?.release().await?;
    link.set(Fault::Reset);
    // One request that runs its course, so the client has seen the reset.
    let r = within(bound(t), "try_acquire over a reset link", async {
        a.try_acquire(&probe, ctx.opts(t.long_ttl))
            .await
            .map(|g| g.is_some())
    })
    .await?;
    unavailable("try_acquire over a reset link", r, None)?;
    let mut keys = Vec::new();
    for (i, cut) in [1u64, 5, 20].into_iter().enumerate() {
        let cut = Duration::from_millis(cut);
        let k = ctx.key(&format!("replay/try/{i}"));
        let _ = tokio::time::timeout(cut, a.try_acquire(&k, ctx.opts(t.long_ttl))).await;
        keys.push(k);
        let k = ctx.key(&format!("replay/acquire/{i}"));
        let _ = tokio::time::timeout(cut, a.acquire(&k, ctx.opts(t.long_ttl))).await;
        keys.push(k);
    }
    link.heal();
    // The client is back once it can take a key again; a request it kept
    // back would have gone out by then (on the same connection, first).
    wait_until(t.prompt, "the client back after the link healed", || async {
        match a.try_acquire(&probe, ctx.opts(t.long_ttl)).await {
            Ok(Some(g)) => {
                // Back: whatever the release says (it is freed by its TTL).
                let _ = g.release().await;
                Ok(true)
            }
            // Not back yet (a session that ended while the link was down
            // says Lost).
            Ok(None) | Err(Error::Unavailable { .. } | Error::Lost { .. }) => Ok(false),
            Err(e) => Err(Failure(format!("try_acquire after the link healed: {e:?}"))),
        }
    })
    .await?;
    // A clean-up of the cancelled call may still be on its way (it retries
    // with pauses): each key is free within the slack, far below the
    // `long_ttl` a request sent late and left alone would hold it for.
    for k in &keys {
        wait_until(
            t.slack,
            &format!("{k} free after the link healed (a request cancelled while the backend was out of reach was sent once it was back, and nothing gave it back)"),
            || free(&ctx, &b, k),
        )
        .await?;
    }
    passed_once_clean(&ctx, link).await
}
