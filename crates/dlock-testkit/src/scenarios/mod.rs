//! The conformance scenarios: plain `pub async fn`s over a [`Ctx`], run by
//! [`conformance_tests!`](crate::conformance_tests) as one test each.
//!
//! Every scenario works in its own random key namespace, waits on conditions
//! with deadlines (never "long enough" sleeps), scales its timings from the
//! backend's shortest TTL, and leaves nothing behind: the runner checks the
//! namespace after each one.
//!
//! By topic: `basics`, `exclusion`, `fencing`, `expiry`, `cleanup`, `links`, `multi`, `read_write`, `semaphore`, `trace` (all
//! re-exported here). The one list of scenarios, which makes both the test
//! functions and the runner's table, is `__with_scenarios!` in the runner.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{AcquireOptions, Capabilities, Error, Guard, Lock, LockKey, Wait};

use crate::LockFactory;
use crate::outcome::{Failure, wait_until};

mod basics;
mod cleanup;
mod exclusion;
mod expiry;
mod fencing;
mod links;
mod multi;
mod read_write;
mod semaphore;
mod trace;

pub use basics::*;
pub use cleanup::*;
pub use exclusion::*;
pub use expiry::*;
pub use fencing::*;
pub use links::*;
pub use multi::*;
pub use read_write::*;
pub use semaphore::*;
pub use trace::*;

/// Timings a scenario uses, scaled from the backend's shortest TTL with
/// generous bounds (the CI machine has 2 shared cores).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// A TTL short enough to wait out in a test.
    pub short_ttl: Duration,
    /// A TTL no scenario waits out: holds that must not expire use it.
    pub long_ttl: Duration,
    /// The slack allowed on top of a TTL for an expiry to be noticed.
    pub slack: Duration,
    /// The bound for "promptly" (a hand-off, a wake-up): well below `long_ttl`,
    /// so meeting it proves the wake did not come from an expiry.
    pub prompt: Duration,
}

impl Timing {
    /// Timings for a backend whose shortest honoured TTL is `min_ttl`.
    pub fn for_min_ttl(min_ttl: Duration) -> Self {
        let short_ttl = min_ttl.max(Duration::from_millis(400));
        let long_ttl = (short_ttl * 15).max(Duration::from_secs(60));
        Timing {
            short_ttl,
            long_ttl,
            slack: short_ttl + Duration::from_secs(5),
            prompt: long_ttl / 4,
        }
    }
}

struct CtxInner<F> {
    factory: F,
    namespace: String,
    caps: Capabilities,
    timing: Timing,
}

/// What a scenario gets: the factory, a fresh namespace, the backend's
/// capabilities and the timings. Cheap to clone.
pub struct Ctx<F> {
    inner: Arc<CtxInner<F>>,
}

impl<F> Clone for Ctx<F> {
    fn clone(&self) -> Self {
        Ctx {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<F: LockFactory> Ctx<F> {
    /// A context in a new random namespace. Asks one client for the backend's
    /// capabilities.
    ///
    /// # Errors
    ///
    /// A [`Failure`] if no client can be made.
    pub async fn new(factory: F) -> Result<Self, Failure> {
        let probe = factory.client().await?;
        let caps = probe.capabilities();
        drop(probe);
        let namespace = format!("dlock-kit-{:016x}/", rand::random::<u64>());
        Ok(Ctx {
            inner: Arc::new(CtxInner {
                factory,
                namespace,
                caps,
                timing: Timing::for_min_ttl(caps.min_ttl),
            }),
        })
    }

    /// The factory.
    pub fn factory(&self) -> &F {
        &self.inner.factory
    }

    /// This scenario's key namespace (a prefix of every key it uses).
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// The backend's capabilities.
    pub fn caps(&self) -> Capabilities {
        self.inner.caps
    }

    /// The scenario timings.
    pub fn timing(&self) -> Timing {
        self.inner.timing
    }

    /// A key in this scenario's namespace.
    ///
    /// # Panics
    ///
    /// If `name` makes an invalid key (a bug in the scenario, not the driver).
    pub fn key(&self, name: &str) -> LockKey {
        LockKey::new(format!("{}{name}", self.inner.namespace)).expect("scenario keys are valid")
    }

    /// A new independent client.
    ///
    /// # Errors
    ///
    /// A [`Failure`] if the factory cannot make one.
    pub async fn client(&self) -> Result<F::Lock, Failure> {
        Ok(self.inner.factory.client().await?)
    }

    /// `Some(Verdict::Skipped(why))` when the scenario `name` does not apply
    /// to this backend ([`skip_reason`]), so a scenario
    /// called directly skips itself as the runner would skip it.
    pub fn skipped(&self, name: &str) -> Option<crate::Verdict> {
        skip_reason(name, self.inner.caps, self.inner.factory.breaks_links()).map(crate::Verdict::Skipped)
    }

    /// A new independent client over a link the scenario breaks.
    ///
    /// # Errors
    ///
    /// A [`Failure`] if the factory cannot make one.
    pub async fn linked_client(&self) -> Result<crate::Linked<F::Lock>, Failure> {
        Ok(self.inner.factory.linked_client().await?)
    }

    /// Options with this TTL, waiting at most [`Timing::prompt`].
    pub fn opts(&self, ttl: Duration) -> AcquireOptions {
        AcquireOptions::default()
            .ttl(ttl)
            .wait(Wait::For(self.inner.timing.prompt))
    }

    /// Waits until the backend reports exactly `n` contenders for `key`, when
    /// it can tell; returns `false` at once when it cannot.
    ///
    /// # Errors
    ///
    /// A [`Failure`] if the count does not reach `n` within [`Timing::prompt`].
    pub async fn await_contenders(&self, key: &LockKey, n: usize) -> Result<bool, Failure> {
        if self.inner.factory.contenders(key).await?.is_none() {
            return Ok(false);
        }
        wait_until(
            self.inner.timing.prompt,
            &format!("{n} contenders on {key}"),
            || async { Ok(self.inner.factory.contenders(key).await? == Some(n)) },
        )
        .await?;
        Ok(true)
    }

    /// Waits until nothing is left in the namespace.
    ///
    /// # Errors
    ///
    /// A [`Failure`] listing what is left after [`Timing::slack`].
    pub async fn await_clean(&self) -> Result<(), Failure> {
        let ns = self.namespace();
        let r = wait_until(self.timing().slack, "an empty namespace", || async {
            Ok(self.inner.factory.residue(ns).await?.is_empty())
        })
        .await;
        match r {
            Ok(()) => Ok(()),
            Err(_) => Err(Failure(format!(
                "left behind in {ns}: {:?}",
                self.inner.factory.residue(ns).await?
            ))),
        }
    }
}

/// Whether `client` can take `key` at once with `opts` (and gives it back
/// at once).
pub(super) async fn free<L: Lock>(client: &L, key: &LockKey, opts: AcquireOptions) -> Result<bool, Failure> {
    Ok(match client.try_acquire(key, opts).await? {
        Some(g) => {
            g.release().await?;
            true
        }
        None => false,
    })
}

pub(super) fn lost_or_not_held(e: &Error) -> bool {
    matches!(e, Error::Lost { .. } | Error::NotHeld { .. })
}

/// The scenarios that need a [`Link`](crate::Link): skipped for factories
/// that break no links.
pub const LINK_SCENARIOS: [&str; 5] = [
    "cancelled_acquire_in_flight_leaves_nothing",
    "unreachable_backend_is_unavailable",
    "failed_release_is_not_ok",
    "dead_link_fires_lost_in_time",
    "cancelled_on_a_dead_link_is_not_replayed",
];

/// Why the scenario `name` does not apply to a backend with `caps` (whose
/// factory does or does not [break links](LockFactory::breaks_links)), or
/// `None` when it applies. The one place where skips are decided: the runner
/// asks it before running a scenario, and the generated
/// `declared_skips_match_the_backend` test compares it with the skips a
/// driver declares.
pub fn skip_reason(name: &str, caps: Capabilities, breaks_links: bool) -> Option<&'static str> {
    match name {
        "fifo_waiters" if !caps.fifo => Some("the backend does not promise FIFO"),
        "tokens_increase_across_clients" | "fenced_stale_write_rejected" if !caps.fences() => {
            Some("the backend gives no fencing tokens")
        }
        n if n.starts_with("read_write_") && !caps.read_write => {
            Some("the backend offers no read-write locks")
        }
        n if n.starts_with("semaphore_") && !caps.semaphores => Some("the backend offers no semaphores"),
        "unoffered_primitives_are_refused" if caps.read_write && caps.semaphores => {
            Some("the backend offers every primitive")
        }
        n if !breaks_links && LINK_SCENARIOS.contains(&n) => Some(
            "the factory breaks no links (an in-process backend, or a client that finds its servers itself)",
        ),
        _ => None,
    }
}
