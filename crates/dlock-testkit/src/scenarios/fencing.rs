//! Fencing tokens: increasing across clients, and a stale write refused.

use dlock_core::{FenceGate, Guard, Lock, Wait};

use super::Ctx;
use crate::LockFactory;
use crate::history::{History, Op};
use crate::outcome::ensure;
use crate::outcome::{Failure, ScenarioResult, Verdict, within};

/// Grants taken in turn by three clients carry strictly increasing tokens.
pub async fn tokens_increase_across_clients<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    if let Some(skipped) = ctx.skipped("tokens_increase_across_clients") {
        return Ok(skipped);
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

/// After a newer holder wrote through the fence, the expired holder's write
/// is rejected.
pub async fn fenced_stale_write_rejected<F: LockFactory>(ctx: Ctx<F>) -> ScenarioResult {
    if let Some(skipped) = ctx.skipped("fenced_stale_write_rejected") {
        return Ok(skipped);
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
