//! The basics: acquire, release, try, a wait that times out, bad keys, many keys, huge durations.

use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey, Wait};

use super::{Ctx, free};
use crate::LockFactory;
use crate::outcome::ensure;
use crate::outcome::{Failure, ScenarioResult, Verdict, within};

/// Acquire, release, acquire again: the second grant's token is higher (or
/// both are `None` where the backend does not fence).
pub async fn acquire_release_reacquire<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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

/// [`Lock::holders`] names a mutex's holder to another client, with the
/// grant's token, and nobody once it is released; a backend whose
/// capabilities do not list holders answers [`Error::Unsupported`].
pub async fn holders_name_the_grant<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let k = ctx.key("holders");
    let t = ctx.timing();
    if !ctx.caps().lists_holders {
        let listed = b.holders(&k).await;
        ensure!(
            matches!(listed, Err(Error::Unsupported { .. })),
            "a backend that does not list holders answered {listed:?}"
        );
        return Ok(Verdict::Passed);
    }
    ensure!(b.holders(&k).await?.is_empty(), "a free name has holders");
    let g = a.acquire(&k, ctx.opts(t.long_ttl)).await?;
    let listed = b.holders(&k).await?;
    ensure!(
        listed.len() == 1 && listed[0].role == dlock_core::Role::Mutex,
        "one mutex grant listed as {listed:?}"
    );
    ensure!(
        listed[0].token == g.token().map(dlock_core::FencingToken::get),
        "the holder's token is not the guard's {:?}: {listed:?}",
        g.token()
    );
    ensure!(
        listed[0].remaining.is_none_or(|r| r <= t.long_ttl),
        "a holder with more left than its TTL {:?}: {listed:?}",
        t.long_ttl
    );
    // The same holder (what is left of its lease moves between two reads).
    let first = b.holder(&k).await?;
    let who = |h: &dlock_core::Holder| (h.role, h.id.clone(), h.detail.clone(), h.token);
    ensure!(
        first.as_ref().map(who) == listed.first().map(who),
        "holder() {first:?} is not the first of {listed:?}"
    );
    g.release().await?;
    crate::outcome::wait_until(t.prompt, "no holders after the release", || async {
        Ok(b.holders(&k).await?.is_empty())
    })
    .await?;
    Ok(Verdict::Passed)
}

/// [`Lock::keys_in_use`] lists the names held under a prefix (a mutex, a
/// read, a permit, as the backend offers them), as the names the caller
/// gave (no key prefix, no layout), each once, to another client, and no
/// name outside the prefix (not even the one the prefix's directory is
/// named after); and none of them once they are released. A backend that
/// cannot list answers [`Error::Unsupported`].
pub async fn keys_in_use_names_what_is_held<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let (t, caps) = (ctx.timing(), ctx.caps());
    let prefix = ctx.key("in-use/").as_str().to_owned();
    let (parent, beside) = (ctx.key("in-use"), ctx.key("in-used"));
    let (mutex, read, permit) = (ctx.key("in-use/m"), ctx.key("in-use/r"), ctx.key("in-use/s"));
    let fresh = match b.keys_in_use(&prefix).await {
        Err(Error::Unsupported { .. }) => {
            return Ok(Verdict::Skipped("the backend cannot list the names in use"));
        }
        listed => listed?,
    };
    ensure!(
        fresh.is_empty(),
        "names in use under a fresh prefix {prefix:?}: {fresh:?}"
    );
    let opts = ctx.opts(t.long_ttl);
    let mut held = vec![
        a.acquire(&parent, opts).await?,
        a.acquire(&beside, opts).await?,
        a.acquire(&mutex, opts).await?,
    ];
    let mut expected = vec![mutex.as_str()];
    if caps.read_write {
        held.push(a.acquire_read(&read, opts).await?);
        expected.push(read.as_str());
    }
    if caps.semaphores {
        held.push(a.acquire_permits(&permit, 1, 2, opts).await?);
        expected.push(permit.as_str());
    }
    let listed = b.keys_in_use(&prefix).await?;
    ensure!(
        listed == expected,
        "keys_in_use({prefix:?}) listed {listed:?} while {expected:?} were held"
    );
    for g in held {
        g.release().await?;
    }
    crate::outcome::wait_until(t.prompt, "no names in use after the releases", || async {
        Ok(b.keys_in_use(&prefix).await?.is_empty())
    })
    .await?;
    Ok(Verdict::Passed)
}

/// `try_acquire` is `None` while another client holds the key and `Some` once
/// it is free.
pub async fn try_acquire_held_and_free<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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
    ensure!(
        free(&b, &k, opts).await?,
        "try_acquire after release returned None"
    );
    Ok(Verdict::Passed)
}

/// A bounded wait on a held key ends in `Error::Timeout`, not earlier than
/// asked, and leaves the holder holding.
pub async fn acquire_wait_times_out<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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
    ensure!(
        free(&b, &k, ctx.opts(t.long_ttl)).await?,
        "the key is not free after the holder released"
    );
    Ok(Verdict::Passed)
}

/// Invalid keys are refused with `Error::InvalidKey`; the longest valid key and
/// keys with unusual characters either work or are refused the same way,
/// never with a panic or another error.
pub async fn invalid_keys_rejected<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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

/// Locks on different keys do not affect each other.
pub async fn many_keys_independent<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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

/// Waits and TTLs too large for the clock (`Duration::MAX`) never panic: a
/// wait that large means "no deadline"; a TTL of zero or more than
/// [`AcquireOptions::MAX_TTL`](dlock_core::AcquireOptions::MAX_TTL) is
/// refused with [`Error::InvalidConfig`], on acquire and on extend, and
/// leaves nothing held; the longest TTL allowed is granted and its guard
/// behaves.
pub async fn huge_durations_are_safe<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
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
    for bad in [
        Duration::ZERO,
        Duration::MAX,
        AcquireOptions::MAX_TTL + Duration::from_millis(1),
    ] {
        match g.extend(bad).await {
            Err(Error::InvalidConfig(_)) => {}
            other => {
                return Err(Failure(format!(
                    "extend({bad:?}) gave {other:?}, not InvalidConfig"
                )));
            }
        }
        ensure!(g.is_held(), "a refused extend({bad:?}) ended the hold");
        let free = ctx.key(&format!("bad-ttl-{}", bad.as_millis()));
        match a.acquire(&free, ctx.opts(bad).wait(Wait::No)).await {
            Err(Error::InvalidConfig(_)) => {}
            Err(e) => return Err(Failure(format!("a TTL of {bad:?} gave {e:?}, not InvalidConfig"))),
            Ok(_) => return Err(Failure(format!("a TTL of {bad:?} was granted, not refused"))),
        }
        // Refused before anything was written: the name is free.
        b.try_acquire(&free, ctx.opts(t.long_ttl))
            .await?
            .ok_or_else(|| Failure(format!("{free} held after a refused TTL of {bad:?}")))?
            .release()
            .await?;
    }
    g.release().await?;
    for auto_extend in [true, false] {
        let k = ctx.key(&format!("huge-ttl-{auto_extend}"));
        let g = a
            .acquire(&k, ctx.opts(AcquireOptions::MAX_TTL).auto_extend(auto_extend))
            .await?;
        ensure!(g.is_held(), "a grant with the longest TTL is not held");
        g.extend(AcquireOptions::MAX_TTL).await?;
        // Whatever watches this client's guards still watches the
        // others: a short one beside the long one is lost in time.
        let short = a
            .acquire(
                &ctx.key(&format!("beside-huge-{auto_extend}")),
                ctx.opts(t.short_ttl).auto_extend(false),
            )
            .await?;
        within(
            t.short_ttl + t.slack,
            "lost() of a short guard beside a long one",
            short.lost().wait(),
        )
        .await?;
        drop(short);
        g.release().await?;
    }
    Ok(Verdict::Passed)
}
