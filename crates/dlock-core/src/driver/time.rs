//! Deadlines from user input that never overflow an [`Instant`], and the
//! drift taken off every grant.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// The slack subtracted from a TTL before a client trusts a grant for it:
/// `ttl * factor + fixed`. It covers the rate difference of the client's and
/// the server's clocks and the scheduling delay of the task that acts on
/// the deadline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Drift {
    factor: f64,
    fixed: Duration,
}

impl Drift {
    /// `ttl * 0.01 + 2 ms`, the clock-drift allowance of the Redlock paper;
    /// every driver's default.
    pub const DEFAULT: Drift = Drift {
        factor: 0.01,
        fixed: Duration::from_millis(2),
    };

    /// No drift at all: for a backend in the client's own process, which
    /// reads the same clock (the in-process driver), so a local deadline is
    /// the backend's own.
    pub const NONE: Drift = Drift {
        factor: 0.0,
        fixed: Duration::ZERO,
    };

    /// `ttl / 10 + 2 ms`: for session timeouts, which the server rounds to
    /// its ticks.
    pub const fn with_factor_tenth() -> Self {
        Drift {
            factor: 0.1,
            fixed: Duration::from_millis(2),
        }
    }

    /// A drift of `ttl * factor + fixed`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] unless `0 <= factor < 1` (a factor of 1 or
    /// more leaves no time to hold the lock).
    pub fn new(factor: f64, fixed: Duration) -> Result<Self> {
        if !(0.0..1.0).contains(&factor) {
            return Err(Error::InvalidConfig(format!(
                "the drift factor must be at least 0 and below 1, not {factor}"
            )));
        }
        Ok(Drift { factor, fixed })
    }

    /// The drift for a grant of `ttl`.
    pub fn of(&self, ttl: Duration) -> Duration {
        Duration::try_from_secs_f64(ttl.as_secs_f64() * self.factor)
            .unwrap_or(ttl)
            .saturating_add(self.fixed)
    }

    /// The local deadline of a grant of `ttl` whose request was sent at
    /// `sent`: `sent + ttl - drift`, never before `sent`, never overflowing.
    /// A TTL beyond [`FAR_FUTURE`] counts as [`FAR_FUTURE`].
    pub fn deadline(&self, sent: Instant, ttl: Duration) -> Instant {
        let ttl = ttl.min(FAR_FUTURE);
        let end = saturating_add(sent, ttl);
        end.checked_sub(self.of(ttl))
            .filter(|&d| d >= sent)
            .unwrap_or(sent)
    }
}

impl Default for Drift {
    fn default() -> Self {
        Drift::DEFAULT
    }
}

/// How far ahead a deadline may lie: about a century. Longer waits and TTLs
/// are cut to it (nobody can tell the difference), so that every deadline,
/// and every timer built on it (Tokio rounds deadlines up), fits in an
/// [`Instant`].
pub const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `start + d`, with `d` cut to [`FAR_FUTURE`]: a wait or TTL that large
/// means "no deadline", never a panic.
pub fn saturating_add(start: Instant, d: Duration) -> Instant {
    let d = d.min(FAR_FUTURE);
    start.checked_add(d).unwrap_or(start)
}

/// When an acquire started at `started` must give up: `None` for
/// [`Wait::Forever`](crate::Wait::Forever); [`Wait::No`](crate::Wait::No) is
/// `started` itself (one attempt).
pub fn wait_deadline(wait: crate::Wait, started: Instant) -> Option<Instant> {
    match wait {
        crate::Wait::No => Some(started),
        crate::Wait::For(d) => Some(saturating_add(started, d)),
        crate::Wait::Forever => None,
    }
}

/// Runs a wait in line, `waiting`, for as long as `wait` allows from
/// `started`: `Some` of its output, or `None` when the wait ran out first
/// (the caller gives its place in line back and reports
/// [`Error::Timeout`]). [`Wait::Forever`](crate::Wait::Forever) waits as
/// long as `waiting` takes; [`Wait::No`](crate::Wait::No) allows no wait
/// (`waiting` is polled once: done at once, it still counts).
///
/// # Cancel safety
///
/// As `waiting`'s: dropping this drops it.
pub async fn within_wait<F: Future>(wait: crate::Wait, started: Instant, waiting: F) -> Option<F::Output> {
    match wait_deadline(wait, started) {
        None => Some(waiting.await),
        Some(at) => tokio::time::timeout_at(at.into(), waiting).await.ok(),
    }
}

/// The slack subtracted from a TTL when a client computes how long it may
/// still trust a grant: `ttl * 0.01 + 2 ms`, the clock-drift allowance of the
/// Redlock paper, used by every driver for its local deadline.
pub fn drift(ttl: Duration) -> Duration {
    Drift::DEFAULT.of(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_never_overflow_and_never_precede_the_send() {
        let now = Instant::now();
        let far = Drift::DEFAULT.deadline(now, Duration::MAX);
        assert!(far > now + Duration::from_secs(3600 * 24 * 365));
        assert_eq!(Drift::DEFAULT.deadline(now, Duration::ZERO), now);
        assert_eq!(Drift::DEFAULT.deadline(now, Duration::from_millis(1)), now);
        assert_eq!(
            Drift::DEFAULT.deadline(now, Duration::from_secs(10)),
            now + Duration::from_secs(10) - Duration::from_millis(102)
        );
        assert!(saturating_add(now, Duration::MAX) > now);
        assert_eq!(saturating_add(now, Duration::MAX), now + FAR_FUTURE);
        assert_eq!(
            wait_deadline(crate::Wait::For(Duration::MAX), now),
            Some(saturating_add(now, Duration::MAX))
        );
        assert_eq!(wait_deadline(crate::Wait::Forever, now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_in_line_ends_when_the_callers_wait_does() {
        use crate::Wait;
        let started = Instant::now();
        let paused = tokio::time::Instant::now();
        let never = std::future::pending::<()>;
        assert_eq!(within_wait(Wait::No, started, never()).await, None);
        assert_eq!(within_wait(Wait::No, started, async { 1 }).await, Some(1));
        let waited = within_wait(Wait::For(Duration::from_secs(5)), started, never()).await;
        assert_eq!(waited, None);
        assert!(paused.elapsed() >= Duration::from_secs(5));
        let late = tokio::time::sleep(Duration::from_secs(3600));
        assert_eq!(within_wait(Wait::Forever, started, late).await, Some(()));
        let huge = within_wait(Wait::For(Duration::MAX), Instant::now(), async { 2 }).await;
        assert_eq!(huge, Some(2));
    }

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(drift(Duration::from_secs(10)), Duration::from_millis(102));
    }

    #[test]
    fn drift_factors_are_checked() {
        for bad in [-0.1, 1.0, 2.0, f64::NAN, f64::INFINITY] {
            assert!(
                matches!(Drift::new(bad, Duration::ZERO), Err(Error::InvalidConfig(_))),
                "{bad}"
            );
        }
        let d = Drift::new(0.1, Duration::from_millis(5)).unwrap();
        assert_eq!(d.of(Duration::from_secs(1)), Duration::from_millis(105));
    }
}
