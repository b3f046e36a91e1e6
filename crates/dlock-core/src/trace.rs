//! What dlock reports through [`tracing`](https://docs.rs/tracing): one
//! target, one span, a fixed set of events, the same field names on every
//! backend. Without a subscriber, none of it costs more than a check of a
//! static flag.
//!
//! Every span and event has the target `dlock`, so
//! `RUST_LOG=dlock=debug` (with `tracing-subscriber`'s `EnvFilter`) shows
//! them all, and `RUST_LOG=dlock=info` only grants, releases and trouble.
//!
//! # The span
//!
//! | name | level | fields |
//! |---|---|---|
//! | `acquire` | INFO | `backend`, `key`, `claim` (`mutex`, `read`, `write`, `permits`), `ttl_ms`, `wait_ms` (absent: waits forever) |
//!
//! Every event of an acquire (below, marked *in the span*) happens inside
//! it and takes `backend` and `key` from it; every other event carries
//! them itself.
//!
//! # The events (their `message`)
//!
//! | message | level | fields | when |
//! |---|---|---|---|
//! | `queued` | DEBUG | (in the span) | the name is held: the acquire waits for it |
//! | `granted` | INFO | (in the span) `token` (absent where the backend gives none), `waited_ms` | the acquire returned a guard |
//! | `timed out` | INFO (DEBUG for a one-shot try) | (in the span) `waited_ms` | the wait ran out ([`Error::Timeout`]) |
//! | `acquire failed` | WARN | (in the span) `waited_ms`, `error` | any other error |
//! | `acquire cancelled` | DEBUG | (in the span) `waited_ms` | the acquire future was dropped |
//! | `renewal failed` | WARN | `backend`, `key`, `error` | a renewal by the keeper failed for a reason that is not a refusal (the network); it is retried until the local deadline (ZooKeeper's session heartbeat is the client library's and reports nothing) |
//! | `renewal failed` | WARN | `backend`, `session`, `error` | the same for a lease or session that many guards share (etcd) |
//! | `lost` | WARN | `backend`, `key`, `why` | the lock is, or may be, lost ([`Guard::lost`] fires) |
//! | `released` | INFO | `backend`, `key`, `token` | [`Guard::release`] gave the lock back |
//! | `release failed` | WARN | `backend`, `key`, `error` | a release was refused or could not be confirmed |
//! | `clean-up retried` | DEBUG | `what`, `error` | a background clean-up (the release of a dropped guard, a waiter's entry) failed once and is retried |
//! | `clean-up done after retries` | DEBUG | `what`, `failures` | it succeeded in the end |
//! | `clean-up given up` | WARN | `what`, `why` (and `failures`, `error` once it tried) | it stopped trying; the TTL, lease or session is the backstop |
//! | `no Tokio runtime to run a detached request in` | DEBUG | `what` | a request that would run detached (a revoke, an unsubscribe) could not; the lease or session is the backstop |
//!
//! `why` of `lost` is one of the [`why`] texts. Durations are whole
//! milliseconds (`*_ms`); `token` is the [`FencingToken`]'s number;
//! `error` is the [`Error`]'s `Display`, which never shows a credential.
//!
//! The core opens the span around every acquire (in
//! [`Lock::acquire_claim`](crate::Lock::acquire_claim), which every
//! acquire method goes through), so a driver never does; drivers emit the
//! events through the functions of this module ([`queued`], [`lost`],
//! ...), never with their own field names.
//!
//! ```
//! use dlock_core::{AcquireOptions, Guard, Lock, LockKey, MemLock};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> dlock_core::Result<()> {
//! // With a subscriber installed (tracing_subscriber::fmt().init() in an
//! // application), this prints an `acquire` span with a `granted` event in
//! // it, then `released`.
//! let lock = MemLock::new();
//! let guard = lock.acquire(&LockKey::new("jobs/nightly")?, AcquireOptions::default()).await?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::{AcquireOptions, Claim, Error, FencingToken, Guard, LockKey, Result, Wait};

/// The target of every span and event of dlock.
pub const TARGET: &str = "dlock";

/// The reasons a `lost` event gives (its `why` field).
pub mod why {
    /// No renewal was confirmed before the local deadline (the backend did
    /// not answer, or a guard without auto-extend ran out of its TTL).
    pub const DEADLINE: &str = "the local deadline passed without a confirmed renewal";
    /// A renewal (or an extend) found the grant expired.
    pub const EXPIRED: &str = "the backend says the grant expired";
    /// A renewal (or an extend) found another holder.
    pub const HELD_BY_OTHER: &str = "another client holds the name now";
    /// The lease or session the grant lived on ended.
    pub const SESSION_ENDED: &str = "the lease or session ended";
    /// The lock's entry was deleted by someone else.
    pub const DELETED: &str = "the lock's entry was deleted by someone else";
    /// No server answered within the session timeout: the server may have
    /// expired the session.
    pub const SESSION_SILENT: &str = "no reply within the session timeout: the session may have expired";
    /// The task that renewed the guard ended with its runtime (shut down
    /// while the guard was held): nothing renews it any more.
    pub const KEEPER_GONE: &str = "the task that renewed it ended (its runtime shut down)";
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs a driver's grant inside the `acquire` span and reports how it
/// ended (`granted`, `timed out`, `acquire failed` or, if the future is
/// dropped first, `acquire cancelled`). [`Lock::acquire_claim`](crate::Lock::acquire_claim)
/// wraps every acquire in it, so it is also where a TTL of zero or more
/// than [`AcquireOptions::MAX_TTL`](crate::AcquireOptions::MAX_TTL) is
/// refused ([`driver::check_ttl`](crate::driver::check_ttl)) before
/// `request` runs.
pub(crate) fn acquire<G, F>(
    backend: &'static str,
    key: &LockKey,
    claim: Claim,
    opts: &AcquireOptions,
    request: F,
) -> impl Future<Output = Result<G>> + Send + use<G, F>
where
    G: Guard,
    F: Future<Output = Result<G>> + Send,
{
    let one_shot = opts.wait == Wait::No;
    let wait_ms = match opts.wait {
        Wait::No => Some(0),
        Wait::For(d) => Some(ms(d)),
        Wait::Forever => None,
    };
    let span = tracing::info_span!(
        target: "dlock",
        "acquire",
        backend,
        key = key.as_str(),
        claim = claim.kind(),
        ttl_ms = ms(opts.ttl),
        wait_ms
    );
    let bad_ttl = crate::driver::check_ttl(backend, opts.ttl).err();
    async move {
        if let Some(e) = bad_ttl {
            tracing::warn!(target: "dlock", waited_ms = 0, error = %e, "acquire failed");
            return Err(e);
        }
        let started = Instant::now();
        let cancelled = crate::driver::OnDrop::new(started, |started: Instant| {
            tracing::debug!(target: "dlock", waited_ms = ms(started.elapsed()), "acquire cancelled");
        });
        let out = request.await;
        cancelled.disarm();
        let waited_ms = ms(started.elapsed());
        match &out {
            Ok(guard) => {
                let token = guard.token().map(FencingToken::get);
                tracing::info!(target: "dlock", token, waited_ms, "granted");
            }
            // A one-shot try finding the name held is routine: DEBUG.
            Err(Error::Timeout { .. }) if one_shot => {
                tracing::debug!(target: "dlock", waited_ms, "timed out")
            }
            Err(Error::Timeout { .. }) => tracing::info!(target: "dlock", waited_ms, "timed out"),
            Err(e) => tracing::warn!(target: "dlock", waited_ms, error = %e, "acquire failed"),
        }
        out
    }
    .instrument(span)
}

/// `queued`: the name is held and the acquire waits for it. Call it in a
/// driver's [`Lock::grant`](crate::Lock::grant), once per acquire, when the first attempt is refused and a
/// wait begins.
pub fn queued() {
    tracing::debug!(target: "dlock", "queued");
}

/// `renewal failed`: a renewal failed for a reason that is not a refusal;
/// it will be retried until the local deadline.
pub fn renewal_failed(backend: &'static str, key: &str, error: &Error) {
    tracing::warn!(target: "dlock", backend, key, error = %error, "renewal failed");
}

/// `renewal failed` for a lease or session many guards share, named by
/// `session` (its id) instead of a key.
pub fn session_renewal_failed(backend: &'static str, session: &str, error: &str) {
    tracing::warn!(target: "dlock", backend, session, error, "renewal failed");
}

/// `lost`, with one of the [`why`] texts.
pub fn lost(backend: &'static str, key: &str, why: &str) {
    // Never part of whatever acquire happens to be running (MemLock notices
    // one holder's expiry inside another client's acquire).
    tracing::warn!(target: "dlock", parent: None, backend, key, why, "lost");
}

/// `released`: a release gave the lock back.
pub fn released(backend: &'static str, key: &str, token: Option<FencingToken>) {
    let token = token.map(FencingToken::get);
    tracing::info!(target: "dlock", backend, key, token, "released");
}

/// `release failed`: a release was refused, or could not be confirmed.
pub fn release_failed(backend: &'static str, key: &str, error: &Error) {
    tracing::warn!(target: "dlock", backend, key, error = %error, "release failed");
}

/// Reports a release's result (`released` or `release failed`) and returns
/// it: the one line every guard's `release` ends with.
pub fn release_result(
    backend: &'static str,
    key: &LockKey,
    token: Option<FencingToken>,
    result: Result<()>,
) -> Result<()> {
    match &result {
        Ok(()) => released(backend, key.as_str(), token),
        Err(e) => release_failed(backend, key.as_str(), e),
    }
    result
}
