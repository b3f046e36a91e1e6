//! What a driver reports through `tracing` ([`dlock_core::trace`]).

use dlock_core::{Error, Guard, Lock, Wait};

use super::Ctx;
use crate::LockFactory;
use crate::outcome::{Failure, ScenarioResult, Verdict, ensure, wait_until, within};
use crate::trace::{Capture, Captured};

/// The driver reports a lock's life with dlock's names: an `acquire` span
/// (`backend`, `key`, `claim`, `ttl_ms`) around `granted` (with the grant's token, once),
/// `queued`, `timed out` and `acquire cancelled`; `released` with the token;
/// `lost` with one of the [`why`](dlock_core::trace::why) texts when a
/// guard without auto-extend runs out of its TTL.
pub async fn reports_through_tracing<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    let capture = Capture::start(ctx.namespace()).map_err(Failure)?;
    let (a, b) = (ctx.client().await?, ctx.client().await?);
    let backend = a.backend();
    let t = ctx.timing();
    let k = ctx.key("traced");
    let g = a.acquire(&k, ctx.opts(t.long_ttl)).await?;
    let token = g.token();
    let waited = b
        .acquire(&k, ctx.opts(t.long_ttl).wait(Wait::For(t.short_ttl)))
        .await;
    ensure!(
        matches!(waited, Err(Error::Timeout { .. })),
        "an acquire of a held key did not time out: {:?}",
        waited.map(|_| "granted")
    );
    let cancelled = tokio::time::timeout(
        t.short_ttl,
        b.acquire(&k, ctx.opts(t.long_ttl).wait(Wait::Forever)),
    )
    .await;
    ensure!(
        cancelled.is_err(),
        "an acquire of a held key ended: {:?}",
        cancelled.map(|r| r.map(|_| "granted"))
    );
    g.release().await?;

    let k2 = ctx.key("traced-lost");
    let g2 = a.acquire(&k2, ctx.opts(t.short_ttl).auto_extend(false)).await?;
    within(t.short_ttl + t.slack, "lost() after the TTL", g2.lost().wait()).await?;
    drop(g2);

    let one = |message: &'static str, key: &str| {
        let key = key.to_owned();
        let capture = &capture;
        move || {
            let key = key.clone();
            async move {
                Ok(capture
                    .events(message)
                    .into_iter()
                    .any(|e| e.field("key") == Some(key.as_str())))
            }
        }
    };
    for (message, key) in [
        ("granted", k.as_str()),
        ("queued", k.as_str()),
        ("timed out", k.as_str()),
        ("acquire cancelled", k.as_str()),
        ("released", k.as_str()),
        ("lost", k2.as_str()),
    ] {
        let found = wait_until(
            t.prompt,
            &format!("a `{message}` event for {key}"),
            one(message, key),
        )
        .await;
        if let Err(Failure(why)) = found {
            return Err(Failure(format!(
                "{why}; what was reported: {}",
                shown(&capture.all())
            )));
        }
    }
    let of = |message: &str, key: &str| -> Vec<Captured> {
        capture
            .events(message)
            .into_iter()
            .filter(|e| e.field("key") == Some(key))
            .collect()
    };
    let token_text = token.map(|t| t.get().to_string());
    for e in of("granted", k.as_str())
        .iter()
        .chain(&of("released", k.as_str()))
    {
        ensure!(e.field("backend") == Some(backend), "no backend={backend} in {e}");
        ensure!(
            e.field("token") == token_text.as_deref(),
            "the token reported is not the grant's ({token:?}): {e}"
        );
    }
    // One acquire, one span: a layer (AnyLock) must not trace it again.
    let granted = of("granted", k.as_str());
    ensure!(
        granted.len() == 1,
        "one grant of {k} was reported {} times: {}",
        granted.len(),
        shown(&granted)
    );
    for message in ["granted", "queued", "timed out", "acquire cancelled"] {
        for e in of(message, k.as_str()) {
            ensure!(e.field("claim") == Some("mutex"), "no claim=mutex in {e}");
            ensure!(
                e.field("span") == Some("acquire") && e.field("ttl_ms").is_some(),
                "`{message}` is not inside an `acquire` span with ttl_ms: {e}"
            );
            ensure!(e.field("backend") == Some(backend), "no backend={backend} in {e}");
        }
    }
    for e in of("timed out", k.as_str()) {
        let waited = e.field("waited_ms").and_then(|w| w.parse::<u128>().ok());
        ensure!(
            waited.is_some_and(|w| w + 5 >= t.short_ttl.as_millis()),
            "`timed out` does not say it waited the {:?} it did: {e}",
            t.short_ttl
        );
    }
    let whys = [
        dlock_core::trace::why::DEADLINE,
        dlock_core::trace::why::EXPIRED,
        dlock_core::trace::why::SESSION_ENDED,
        dlock_core::trace::why::SESSION_SILENT,
    ];
    for e in of("lost", k2.as_str()) {
        ensure!(e.field("backend") == Some(backend), "no backend={backend} in {e}");
        ensure!(
            e.field("why").is_some_and(|w| whys.contains(&w)),
            "`lost` does not say why with one of dlock_core::trace::why: {e}"
        );
    }
    ensure!(
        of("lost", k.as_str()).is_empty(),
        "a released lock was reported lost: {}",
        shown(&of("lost", k.as_str()))
    );
    Ok(Verdict::Passed)
}

fn shown(events: &[Captured]) -> String {
    if events.is_empty() {
        return "nothing".to_owned();
    }
    events
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
