//! # dlock-redis-protocol
//!
//! What dlock's two Redis drivers (`dlock-redis`, `dlock-redlock`) share,
//! so that neither depends on the other:
//!
//! - [`scripts`]: the key layout, the lock value and the Lua scripts;
//! - [`calls`]: each script as a call (its keys, arguments and reply);
//! - [`notices`]: release notices over pub/sub, waking waiters;
//! - (a guard's local deadline and watchdog are `dlock_core::driver`'s);
//! - [`outcome_of`]: what a release or extend script found, as the
//!   driver layer's `Outcome`;
//! - [`map_err`]: fred's errors as dlock's one [`Error`].
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod calls;
pub mod notices;
pub mod scripts;

use std::future::Future;
use std::time::Duration;

use dlock_core::driver::{Outcome, Refusal};
use dlock_core::{Error, Result};

/// What a release or extend script's reply (1, 0, -1) says: done, the
/// key was gone (the lock had expired), or someone else's value is there
/// (left alone).
///
/// # Errors
///
/// [`Error::Backend`] for any other number.
pub fn outcome_of(backend: &'static str, reply: i64) -> Result<Outcome> {
    match reply {
        1 => Ok(Ok(())),
        0 => Ok(Err(Refusal::Expired)),
        -1 => Ok(Err(Refusal::HeldByOther)),
        other => Err(Error::backend(
            backend,
            format!("unexpected script reply {other}"),
        )),
    }
}

/// Maps a fred error into dlock's [`Error`]: connection trouble is
/// [`Error::Unavailable`], configuration trouble [`Error::InvalidConfig`],
/// anything the server said [`Error::Backend`].
pub fn map_err(backend: &'static str, e: fred::error::Error) -> Error {
    use fred::error::ErrorKind as K;
    match e.kind() {
        K::IO | K::Timeout | K::Canceled | K::Routing | K::Cluster | K::Backpressure | K::Tls => {
            Error::unavailable(backend, e)
        }
        K::Config | K::Url | K::Auth => Error::InvalidConfig(format!("{backend}: {e}")),
        // fred reports "no connection to send this on" with kind Unknown.
        K::Unknown if is_connection_failure(e.details()) => Error::unavailable(backend, e),
        // A server that cannot serve now (still loading its data after a
        // restart, a script running, a replica, no master): try again later.
        _ if is_not_ready(e.details()) => Error::unavailable(backend, e),
        _ => Error::backend(backend, e),
    }
}

fn is_not_ready(details: &str) -> bool {
    [
        "LOADING",
        "BUSY",
        "READONLY",
        "MASTERDOWN",
        "TRYAGAIN",
        "CLUSTERDOWN",
    ]
    .iter()
    .any(|code| details.starts_with(code))
}

fn is_connection_failure(details: &str) -> bool {
    let d = details.to_ascii_lowercase();
    [
        "failed to route",
        "connection closed",
        "disconnected",
        "not connected",
        "canceled",
    ]
    .iter()
    .any(|m| d.contains(m))
}

/// Runs a request as a task of its own, so that only fred's own time-out
/// ends it: a caller that stops waiting (a cancelled acquire, a quorum
/// reached without this node, a bound of its own) lets go of the task, not
/// of fred's command. fred keeps a command queued while it reconnects and
/// writes it once the server is back unless its time-out marked it; a
/// command future dropped before that is never marked, so an acquire cut
/// while the server was away took its key when the server came back, for a
/// whole TTL, after its clean-up had given up. With the command kept to
/// the end, a clean-up's release sent after it is written after it, or
/// both are marked (the release's time-out runs out later). The command
/// is handed to fred in the caller's first poll, so nothing the caller
/// sends later overtakes it.
///
/// # Errors
///
/// fred's; a task that ended early (its runtime shut down) reads as
/// fred's `Canceled`.
///
/// # Panics
///
/// When `call` panics (the panic goes on in the caller).
pub async fn to_the_end<T: Send + 'static>(
    call: impl Future<Output = std::result::Result<T, fred::error::Error>> + Send + 'static,
) -> std::result::Result<T, fred::error::Error> {
    let mut call = Box::pin(call);
    // The first poll here, in the caller's order: fred takes the command
    // now, before anything the caller sends after it (a clean-up's release
    // must not overtake its acquire); only the wait moves to the task.
    if let std::task::Poll::Ready(done) = futures::poll!(call.as_mut()) {
        return done;
    }
    match tokio::spawn(call).await {
        Ok(done) => done,
        // The call's panic is the caller's.
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(fred::error::Error::new(
            fred::error::ErrorKind::Canceled,
            format!("the request's task ended early: {e}"),
        )),
    }
}

/// A duration as whole milliseconds for `PX` / `PEXPIRE`, at least 1 and
/// at most [`FAR_FUTURE`](dlock_core::driver::FAR_FUTURE) (a century: what
/// Redis takes, and no one can tell the difference).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.min(dlock_core::driver::FAR_FUTURE).as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<T>(f: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(f)
    }

    #[test]
    fn a_call_done_in_its_first_poll_answers_there_and_a_pending_one_is_kept_to_its_end() {
        block_on(async {
            assert_eq!(
                to_the_end(async { Ok::<_, fred::error::Error>(7) })
                    .await
                    .unwrap(),
                7
            );
            // Pending first: the rest runs in a task, which goes on after
            // the caller stops waiting.
            let (tx, rx) = tokio::sync::oneshot::channel();
            let mut call = Box::pin(to_the_end(async move {
                tokio::task::yield_now().await;
                let _ = tx.send(());
                Ok::<_, fred::error::Error>(())
            }));
            assert!(
                futures::poll!(call.as_mut()).is_pending(),
                "the call was done in its first poll"
            );
            drop(call);
            tokio::time::timeout(std::time::Duration::from_secs(10), rx)
                .await
                .expect("the kept call ran to its end")
                .expect("it said so");
        });
    }

    #[test]
    #[should_panic(expected = "the call's own panic")]
    fn a_kept_calls_panic_is_the_callers() {
        block_on(async {
            let _ = to_the_end(async {
                tokio::task::yield_now().await;
                if true {
                    panic!("the call's own panic");
                }
                Ok::<(), fred::error::Error>(())
            })
            .await;
        });
    }

    #[test]
    fn fred_errors_map_by_what_the_caller_can_do() {
        use fred::error::{Error as F, ErrorKind as K};
        let map = |kind: &K, details: &str| map_err("redis", F::new(kind.clone(), details.to_owned()));
        for (kind, details) in [
            (K::IO, "broken pipe"),
            (K::Timeout, "timed out"),
            (K::Canceled, ""),
            (K::Unknown, "Failed to route command"),
            (K::Unknown, "LOADING Redis is loading the dataset in memory"),
            (K::Unknown, "BUSY Redis is busy running a script"),
            (
                K::Unknown,
                "READONLY You can't write against a read only replica.",
            ),
            (K::Unknown, "MASTERDOWN Link with MASTER is down"),
        ] {
            assert!(
                matches!(map(&kind, details), Error::Unavailable { .. }),
                "{kind:?} {details}"
            );
        }
        for kind in [K::Config, K::Url, K::Auth] {
            assert!(matches!(map(&kind, "x"), Error::InvalidConfig(_)), "{kind:?}");
        }
        for (kind, details) in [(K::Unknown, "ERR unknown command"), (K::Parse, "bad reply")] {
            assert!(
                matches!(map(&kind, details), Error::Backend { .. }),
                "{kind:?} {details}"
            );
        }
    }

    /// Each driver's errors name it (`dlock-redis` and `dlock-redlock`
    /// call this with their own name).
    #[test]
    fn fred_errors_name_the_driver() {
        use fred::error::{Error as F, ErrorKind as K};
        for backend in ["redis", "redlock"] {
            match map_err(backend, F::new(K::IO, "connection reset")) {
                Error::Unavailable { backend: named, .. } => assert_eq!(named, backend),
                other => panic!("{other:?}"),
            }
            match map_err(backend, F::new(K::Unknown, "ERR odd reply")) {
                Error::Backend { backend: named, .. } => assert_eq!(named, backend),
                other => panic!("{other:?}"),
            }
            match map_err(backend, F::new(K::Url, "bad url")) {
                Error::InvalidConfig(why) => assert!(why.starts_with(backend), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }
}

/// The examples of this crate's README, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
