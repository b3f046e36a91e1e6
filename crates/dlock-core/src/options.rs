//! [`AcquireOptions`] and [`Wait`].

use std::time::Duration;

/// How long [`Lock::acquire`](crate::Lock::acquire) waits for a lock someone
/// else holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// One try: if the key is held, fail at once with
    /// [`Error::Timeout`](crate::Error::Timeout).
    No,
    /// Wait at most this long, then fail with
    /// [`Error::Timeout`](crate::Error::Timeout) (never earlier).
    For(Duration),
    /// Wait until granted (or the backend fails).
    Forever,
}

/// How to take a lock: its time to live, how long to wait, and whether to keep
/// it alive in the background.
///
/// `AcquireOptions::default()` is a 30 s TTL, [`Wait::Forever`] and
/// auto-extend on. Builders change one field each:
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{AcquireOptions, Wait};
///
/// let opts = AcquireOptions::default()
///     .ttl(Duration::from_secs(10))
///     .wait(Wait::For(Duration::from_secs(2)))
///     .auto_extend(false);
/// assert_eq!(opts.ttl, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireOptions {
    /// How long the backend keeps the lock without a renewal. This is the
    /// backstop when a holder dies: nobody else can take the key for up to
    /// this long. Drivers round it up to what their backend honours
    /// ([`Capabilities::min_ttl`](crate::Capabilities::min_ttl)); zero and
    /// more than [`AcquireOptions::MAX_TTL`] are refused.
    pub ttl: Duration,
    /// How long to wait when the key is held elsewhere.
    pub wait: Wait,
    /// Renew the lock at `ttl / 3` in the background until it is released or
    /// dropped; a renewal that cannot succeed before the guard's local deadline
    /// fires [`Guard::lost`](crate::Guard::lost).
    pub auto_extend: bool,
}

impl AcquireOptions {
    /// The default TTL: 30 seconds.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

    /// The longest TTL a lock accepts: a day. A longer one is almost
    /// certainly a unit mistake, and would keep a crashed holder's lock that
    /// long; every driver refuses it (and a TTL of zero) with
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig), on acquire and
    /// on [`Guard::extend`](crate::Guard::extend).
    pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

    /// The defaults: 30 s TTL, wait forever, auto-extend on.
    pub const fn new() -> Self {
        AcquireOptions {
            ttl: Self::DEFAULT_TTL,
            wait: Wait::Forever,
            auto_extend: true,
        }
    }

    /// Sets the time to live.
    #[must_use]
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long to wait.
    #[must_use]
    pub const fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Turns the background renewal on or off.
    #[must_use]
    pub const fn auto_extend(mut self, on: bool) -> Self {
        self.auto_extend = on;
        self
    }
}

impl Default for AcquireOptions {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_docs() {
        let o = AcquireOptions::default();
        assert_eq!(o.ttl, Duration::from_secs(30));
        assert_eq!(o.wait, Wait::Forever);
        assert!(o.auto_extend);
    }
}
