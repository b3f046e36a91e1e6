//! **The driver-author API.** What every driver needs and must not write
//! again: applications never need this module.
//!
//! - [`Drift`]: the slack taken off a TTL before a client trusts a grant,
//!   and [`Drift::deadline`], the one formula for a local deadline
//!   (`sent + ttl - drift`, measured from when the request that granted or
//!   renewed was *sent*).
//! - [`saturating_add`] and [`wait_deadline`]: deadlines from user input that
//!   never overflow an [`Instant`]; [`within_wait`], a wait in line bounded
//!   by the caller's [`Wait`](crate::Wait).
//! - [`Refusal`]: the server's two ways of saying no to a release or an
//!   extend, and their one mapping to [`Error`].
//! - [`Validity`] and [`keep`]: a guard's local deadline and lost signal,
//!   and the keeper task that fires `lost()` at the deadline or renews
//!   before it; [`Keeper`], the same for every guard of a client handle in
//!   one task (a guard costs a slot, not a task).
//! - [`acquire_all`]: what `Lock::acquire_all` does by default, for a
//!   driver that overrides it and falls back to it.
//! - [`clean_up_in_background`]: the one detached clean-up (release on drop,
//!   a contender entry left by a cancelled or timed-out acquire), with one
//!   retry policy; [`spawn_detached`] for a single detached request (a
//!   revoke, an unsubscribe); [`OnDrop`], the armed drop guard that starts
//!   one when a call ends early.
//!
//! This module is public so that drivers outside this workspace can keep
//! the contract the same way; it is versioned with the crate like the rest
//! of the API.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use crate::keeper::{Keeper, Kept, Renew};
pub use crate::multi::acquire_all;
use crate::{Error, LockKey, LostSignal, LostTrigger, Result};

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

/// Checks a TTL asked of `backend` (on acquire or extend): more than zero
/// and at most [`AcquireOptions::MAX_TTL`](crate::AcquireOptions::MAX_TTL).
/// Every acquire is checked by [`Lock::acquire_claim`](crate::Lock::acquire_claim);
/// a driver calls this at the top of its [`Guard::extend`](crate::Guard::extend).
///
/// A zero TTL would become the backend's shortest lease renewed hundreds of
/// times a second, and lost at random under load; a TTL of years would keep
/// a crashed holder's lock that long.
///
/// # Errors
///
/// [`Error::InvalidConfig`] naming the backend and the TTL otherwise.
pub fn check_ttl(backend: &'static str, ttl: Duration) -> Result<()> {
    let max = crate::AcquireOptions::MAX_TTL;
    if ttl.is_zero() {
        return Err(Error::InvalidConfig(format!(
            "{backend}: a lock's TTL must be more than zero (it is how long the lock outlives a crashed holder)"
        )));
    }
    if ttl > max {
        return Err(Error::InvalidConfig(format!(
            "{backend}: a TTL of {ttl:?} is more than the {}h allowed (a crashed holder's lock would be kept that long)",
            max.as_secs() / 3600
        )));
    }
    Ok(())
}

/// When a holder acquired, read from the detail the etcd and ZooKeeper
/// drivers write (`host pid unix-ms`, perhaps followed by more): for the
/// operator views' [`Holder::since`](crate::Holder::since), display only.
/// `None` for any other detail.
pub fn since_of_detail(detail: &str) -> Option<std::time::SystemTime> {
    let ms: u64 = detail.split(' ').nth(2)?.parse().ok()?;
    std::time::SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// Checks a semaphore request: `1 <= count <= limit`.
///
/// # Errors
///
/// [`Error::InvalidConfig`] naming the numbers otherwise.
pub fn check_permits(count: u32, limit: u32) -> Result<()> {
    if count == 0 || count > limit {
        return Err(Error::InvalidConfig(format!(
            "a semaphore's permits: asked for {count} of {limit}, need 1 to {limit} (and a limit of at least 1)"
        )));
    }
    Ok(())
}

/// A server's refusal of a release or an extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Our grant is gone (expired, its lease or session ended).
    Expired,
    /// Someone else holds the name now.
    HeldByOther,
}

impl Refusal {
    /// The `why` of the `lost` event this refusal causes.
    pub fn why(self) -> &'static str {
        match self {
            Refusal::Expired => crate::trace::why::EXPIRED,
            Refusal::HeldByOther => crate::trace::why::HELD_BY_OTHER,
        }
    }

    /// The error a caller sees: [`Error::Lost`] for [`Refusal::Expired`],
    /// [`Error::NotHeld`] for [`Refusal::HeldByOther`].
    pub fn into_error(self, key: &LockKey) -> Error {
        let key = key.as_str().to_owned();
        match self {
            Refusal::Expired => Error::Lost { key },
            Refusal::HeldByOther => Error::NotHeld { key },
        }
    }
}

/// What a release or an extend came to: done, or refused.
pub type Outcome = std::result::Result<(), Refusal>;

/// A guard's validity: its local deadline and its lost trigger, shared by
/// the guard and its keeper task.
///
/// Renewals are serialized ([`Validity::renewal`]): with two renewals in
/// flight at once (a manual `extend` racing the keeper), the client could not
/// tell which the server applied last, and a last-writer-wins deadline could
/// outlive the server's TTL.
#[derive(Debug)]
pub struct Validity {
    deadline: Mutex<Instant>,
    moved: tokio::sync::Notify,
    lost: LostTrigger,
    drift: Drift,
    renewing: tokio::sync::Mutex<()>,
    /// The backend and key named in `lost` and `renewal failed` events
    /// (none for a session's validity, which many guards share).
    subject: Option<(&'static str, LockKey)>,
    why: std::sync::OnceLock<&'static str>,
}

impl Validity {
    /// A validity ending at `drift.deadline(sent, ttl)`, and its signal.
    ///
    /// For a session or lease that many guards share: a loss records its
    /// reason ([`why`](Self::why)) but reports nothing; each guard reports
    /// its own `lost` event. A guard's own validity is [`of_key`](Self::of_key).
    pub fn new(sent: Instant, ttl: Duration, drift: Drift) -> (Arc<Self>, LostSignal) {
        Self::build(None, sent, ttl, drift)
    }

    /// The validity of one guard of `backend` on `key`: [`lose`](Self::lose)
    /// and the [`keep`]er report `lost` and `renewal failed` events
    /// ([`trace`](crate::trace)) naming them.
    pub fn of_key(
        backend: &'static str,
        key: &LockKey,
        sent: Instant,
        ttl: Duration,
        drift: Drift,
    ) -> (Arc<Self>, LostSignal) {
        Self::build(Some((backend, key.clone())), sent, ttl, drift)
    }

    fn build(
        subject: Option<(&'static str, LockKey)>,
        sent: Instant,
        ttl: Duration,
        drift: Drift,
    ) -> (Arc<Self>, LostSignal) {
        let (trigger, signal) = LostSignal::pair();
        let validity = Validity {
            deadline: Mutex::new(drift.deadline(sent, ttl)),
            moved: tokio::sync::Notify::new(),
            lost: trigger,
            drift,
            renewing: tokio::sync::Mutex::new(()),
            subject,
            why: std::sync::OnceLock::new(),
        };
        (Arc::new(validity), signal)
    }

    /// The current local deadline.
    pub fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The drift this validity takes off every grant.
    pub fn drift(&self) -> Drift {
        self.drift
    }

    /// `true` while the deadline is ahead and the signal has not fired.
    pub fn is_valid(&self) -> bool {
        !self.lost.is_fired() && Instant::now() < self.deadline()
    }

    /// Waits for the right to send a renewal; hold the permit until its
    /// reply is in (or the attempt is abandoned).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing.
    pub async fn renewal(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.renewing.lock().await
    }

    /// A renewal sent at `sent` for `ttl` was confirmed (call it while
    /// holding the [`renewal`](Self::renewal) permit). Ignored once lost.
    pub fn renewed(&self, sent: Instant, ttl: Duration) {
        if self.lost.is_fired() {
            return;
        }
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) = self.drift.deadline(sent, ttl);
        self.moved.notify_one();
    }

    /// Fires the lost signal (idempotent) without a reason: the guard was
    /// released or dropped, nothing was lost. For a loss, call
    /// [`lose`](Self::lose).
    pub fn fire_lost(&self) {
        self.lost.fire();
        self.moved.notify_one();
    }

    /// The lock is, or may be, lost for `why` (one of
    /// [`trace::why`](crate::trace::why)): records the reason, reports the
    /// `lost` event (once, and only with a subject: [`of_key`](Self::of_key)),
    /// then fires the signal. Ignored once the signal fired.
    pub fn lose(&self, why: &'static str) {
        if self.lost.is_fired() {
            return;
        }
        if self.why.set(why).is_ok()
            && let Some((backend, key)) = &self.subject
        {
            crate::trace::lost(backend, key.as_str(), why);
        }
        self.fire_lost();
    }

    /// Why the lock was lost, once [`lose`](Self::lose) said so.
    pub fn why(&self) -> Option<&'static str> {
        self.why.get().copied()
    }

    /// Reports a renewal that failed without a refusal (`renewal failed`),
    /// when this validity has a subject.
    pub fn renewal_failed(&self, error: &Error) {
        if let Some((backend, key)) = &self.subject {
            crate::trace::renewal_failed(backend, key.as_str(), error);
        }
    }

    /// `true` once the lost signal fired.
    pub fn is_lost(&self) -> bool {
        self.lost.is_fired()
    }

    /// Resolves once the deadline has passed (following renewals that move
    /// it) or the signal fired. It does not fire the signal itself.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn ran_out(&self) {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            let at = self.deadline();
            if self.is_lost() || at <= Instant::now() {
                return;
            }
            tokio::select! {
                () = moved => {}
                () = tokio::time::sleep_until(at.into()) => {}
            }
        }
    }
}

/// The keeper task of a guard: fires `lost()` when the local deadline
/// passes; with `auto_extend`, calls `renew` at `ttl / 3` (counted from the
/// last confirmed send). A refusal fires `lost()` at once; a failure that is
/// not a refusal (the network) is retried until the deadline, bounded by it.
/// Ends quietly when `stopped()` turns true (the handle was abandoned).
pub async fn keep<R, Fut>(
    validity: Arc<Validity>,
    ttl: Duration,
    auto_extend: bool,
    sent: Instant,
    mut renew: R,
    stopped: impl Fn() -> bool,
) where
    R: FnMut() -> Fut,
    Fut: Future<Output = Result<Outcome>>,
{
    let mut next_renewal = saturating_add(sent, ttl / 3);
    loop {
        if stopped() || validity.is_lost() {
            return;
        }
        let deadline = validity.deadline();
        tokio::select! {
            () = tokio::time::sleep_until(deadline.into()) => {
                if validity.deadline() <= Instant::now() {
                    validity.lose(crate::trace::why::DEADLINE);
                    return;
                }
            }
            () = tokio::time::sleep_until(next_renewal.into()), if auto_extend => {
                // A manual extend may hold the permit: wait for it no
                // longer than the deadline.
                let Ok(permit) = tokio::time::timeout_at(deadline.into(), validity.renewal()).await else {
                    if validity.deadline() <= Instant::now() {
                        validity.lose(crate::trace::why::DEADLINE);
                        return;
                    }
                    continue;
                };
                let sent = Instant::now();
                let deadline = validity.deadline();
                // Boxed: inline, the client library's command future made
                // every idle keeper task several KiB (one per held guard).
                match tokio::time::timeout_at(deadline.into(), Box::pin(renew())).await {
                    Ok(Ok(Ok(()))) => {
                        validity.renewed(sent, ttl);
                        next_renewal = saturating_add(sent, ttl / 3);
                    }
                    Ok(Ok(Err(refusal))) => {
                        validity.lose(refusal.why());
                        return;
                    }
                    Err(_) => {
                        validity.lose(crate::trace::why::DEADLINE);
                        return;
                    }
                    // Not a refusal (a network failure): again soon, until the deadline.
                    Ok(Err(e)) => {
                        validity.renewal_failed(&e);
                        next_renewal = saturating_add(Instant::now(), (ttl / 20).max(Duration::from_millis(5)));
                    }
                }
                drop(permit);
            }
            () = validity.moved.notified() => {}
        }
    }
}

/// The lock on `key` is, or may be, lost for `why` (one of
/// [`trace::why`](crate::trace::why)): reports the `lost` event, unless the
/// signal already fired (a release, an earlier loss), then fires `trigger`.
/// For guards whose signal is not a [`Validity`]'s (session backends).
pub fn lose(trigger: &LostTrigger, backend: &'static str, key: &LockKey, why: &'static str) {
    // Only the caller that fires first reports (a keeper and an extend may
    // race to the same loss).
    if trigger.fire_first() {
        crate::trace::lost(backend, key.as_str(), why);
    }
}

/// The first pause between clean-up attempts; it doubles up to
/// [`CLEAN_UP_MAX_PAUSE`].
pub const CLEAN_UP_FIRST_PAUSE: Duration = Duration::from_millis(50);

/// The longest pause between clean-up attempts.
pub const CLEAN_UP_MAX_PAUSE: Duration = Duration::from_secs(2);

/// Runs `attempt` in the background until it succeeds, `gone()` turns true
/// (the lease or session that the entry lives on ended, the handle was
/// abandoned, the key expired by itself: nothing is left to clean), `until`
/// passes, or it fails with anything but [`Error::Unavailable`] (a refused
/// credential, an odd reply: retrying would not help). Pauses between attempts double from
/// [`CLEAN_UP_FIRST_PAUSE`] to [`CLEAN_UP_MAX_PAUSE`]. Every give-up is
/// logged through `tracing` (warn), naming `what`.
///
/// Pass `until: None` for an entry that would otherwise stay for as long as
/// the process lives (a contender on a lease kept alive): giving up on it
/// would block the name for good.
///
/// Outside a Tokio runtime nothing can run: that is logged, and the
/// backstop (TTL, lease, session) is what remains.
pub fn clean_up_in_background<A, Fut, G>(what: String, until: Option<Instant>, gone: G, mut attempt: A)
where
    A: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
    G: Fn() -> bool + Send + 'static,
{
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::warn!(target: "dlock", what = %what, why = "no Tokio runtime to clean up in", "clean-up given up");
        return;
    };
    drop(rt.spawn(async move {
        let mut pause = CLEAN_UP_FIRST_PAUSE;
        let mut failures = 0u32;
        loop {
            if gone() {
                return;
            }
            match attempt().await {
                Ok(()) => {
                    if failures > 0 {
                        tracing::debug!(target: "dlock", what = %what, failures, "clean-up done after retries");
                    }
                    return;
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    if until.is_some_and(|u| Instant::now() >= u) {
                        tracing::warn!(target: "dlock", what = %what, failures, error = %e, why = "out of time", "clean-up given up");
                        return;
                    }
                    // Only a backend out of reach is worth another try: a
                    // refused credential or an odd reply will not get better.
                    if !matches!(e, Error::Unavailable { .. }) {
                        tracing::warn!(target: "dlock", what = %what, failures, error = %e, why = "not a transient error", "clean-up given up");
                        return;
                    }
                    if failures == 1 {
                        tracing::debug!(target: "dlock", what = %what, error = %e, "clean-up retried");
                    }
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(CLEAN_UP_MAX_PAUSE);
        }
    }));
}

/// Runs `task` detached on the current Tokio runtime (a single request a
/// drop sends: revoking a lease, giving up a subscription). Outside a
/// runtime nothing can run: that is logged, and the backstop (TTL, lease,
/// session) is what remains.
pub fn spawn_detached<Fut>(what: &str, task: Fut)
where
    Fut: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn(task)),
        Err(_) => {
            tracing::debug!(target: "dlock", what = %what, "no Tokio runtime to run a detached request in")
        }
    }
}

/// An armed drop guard: `clean_up(state)` runs when it is dropped unless it
/// was disarmed first. The shape of every "if this call ends early (an
/// error, a cancelled future), undo what it did": arm it before the request
/// whose effect must be undone, update its state as the call learns more,
/// disarm it once the effect is wanted.
///
/// ```
/// use dlock_core::driver::OnDrop;
/// let mut undo = OnDrop::new(None, |rev: Option<i64>| println!("delete {rev:?}"));
/// *undo.state_mut() = Some(7); // learned from the reply
/// assert_eq!(undo.disarm(), Some(7)); // granted: nothing to undo
/// ```
#[must_use = "dropping it at once runs the clean-up at once"]
pub struct OnDrop<T, F: FnOnce(T)> {
    armed: Option<(T, F)>,
}

impl<T, F: FnOnce(T)> OnDrop<T, F> {
    /// Armed with `state`.
    pub fn new(state: T, clean_up: F) -> Self {
        OnDrop {
            armed: Some((state, clean_up)),
        }
    }

    /// The state the clean-up will get.
    pub fn state_mut(&mut self) -> &mut T {
        match &mut self.armed {
            Some((state, _)) => state,
            // Only `disarm` (which consumes the guard) and `drop` empty it.
            None => unreachable!("an OnDrop is armed until disarmed or dropped"),
        }
    }

    /// The clean-up will not run; returns its state.
    pub fn disarm(mut self) -> T {
        match self.armed.take() {
            Some((state, _)) => state,
            None => unreachable!("an OnDrop is armed until disarmed or dropped"),
        }
    }
}

impl<T, F: FnOnce(T)> Drop for OnDrop<T, F> {
    fn drop(&mut self) {
        if let Some((state, clean_up)) = self.armed.take() {
            clean_up(state);
        }
    }
}

/// The `host:port` part of `url` (or of each of its comma-separated
/// hosts), for messages: no scheme, no credentials, no path or query.
///
/// ```
/// use dlock_core::driver::endpoint_of;
/// assert_eq!(endpoint_of("redis://:secret@10.0.0.1:6379/2"), "10.0.0.1:6379");
/// assert_eq!(endpoint_of("http://127.0.0.1:2379"), "127.0.0.1:2379");
/// assert_eq!(endpoint_of("h1:2181,h2:2181/chroot"), "h1:2181,h2:2181");
/// assert_eq!(endpoint_of("redis://u:p/a@ss@h:1/0"), "h:1");
/// ```
pub fn endpoint_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    // Everything up to the last `@` is userinfo, whatever it holds (as in
    // `redact_url`): a password may hold `/` or `@`.
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    hosts.split(['/', '?', '#']).next().unwrap_or_default().to_owned()
}

/// This machine's name, for the owner values drivers write (whitespace
/// replaced, so it stays one word): what an operator sees as the holder's
/// host.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .map(|h| h.trim().replace(char::is_whitespace, "_"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

/// `url` with its credentials hidden, for messages and `Debug`: everything
/// between `scheme://` and the *last* `@` is userinfo (a password may hold
/// `/`, `?`, `#` or `@` unescaped; hiding too much is better than printing
/// a secret), shown as `user:***` (or `***` without a user); query
/// parameters named like secrets (`password`, `pass`, `pwd`, `token`,
/// `secret`, `auth`) have their values hidden too.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL (a typo such as `redis:/u:pw@h`): anything up to the
        // last `@` may be a credential.
        return match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_owned(),
        };
    };
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (Some(userinfo), rest),
        None => (None, rest),
    };
    let mut out = format!("{scheme}://");
    if let Some(userinfo) = userinfo {
        match userinfo.split_once(':') {
            Some((user, _)) if !user.contains(['/', '?', '#']) => {
                out.push_str(user);
                out.push_str(":***@");
            }
            _ => out.push_str("***@"),
        }
    }
    let (before, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    out.push_str(before);
    if let Some(query) = query {
        out.push('?');
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((name, _))
                    if ["password", "pass", "pwd", "token", "secret", "auth"]
                        .contains(&name.to_ascii_lowercase().as_str()) =>
                {
                    format!("{name}=***")
                }
                _ => p.to_owned(),
            })
            .collect();
        out.push_str(&params.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zero and more than a day are refused, naming the backend; the
    /// bounds themselves are fine.
    #[test]
    fn ttls_of_zero_or_more_than_a_day_are_refused() {
        let max = crate::AcquireOptions::MAX_TTL;
        for bad in [Duration::ZERO, max + Duration::from_nanos(1), Duration::MAX] {
            match check_ttl("redis", bad) {
                Err(Error::InvalidConfig(m)) => assert!(m.starts_with("redis: "), "{m}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        for good in [Duration::from_nanos(1), Duration::from_secs(30), max] {
            check_ttl("redis", good).unwrap();
        }
    }

    #[test]
    fn urls_are_redacted_whatever_the_password_holds() {
        for (url, shown) in [
            ("redis://u:p@h:1/2", "redis://u:***@h:1/2"),
            ("rediss://:p@h:1", "rediss://:***@h:1"),
            ("redis://token@h", "redis://***@h"),
            ("redis://h:1/0", "redis://h:1/0"),
            ("no-scheme", "no-scheme"),
            // A typo for a URL: what may be a credential is hidden all the same.
            ("redis:/u:pw@h:1", "***@h:1"),
            ("redis://u:se/cret@h", "redis://u:***@h"),
            ("redis://u:se?cret@h/0", "redis://u:***@h/0"),
            ("redis://u:a@b@h", "redis://u:***@h"),
            (
                "etcd://h:2379?user=u&password=s3cret",
                "etcd://h:2379?user=u&password=***",
            ),
            ("redlock://u:p@h1,h2", "redlock://u:***@h1,h2"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
            assert!(!redact_url(url).contains("cret"), "{url}");
        }
    }

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

    #[test]
    fn refusals_map_to_lost_and_not_held() {
        let k = LockKey::new("k").unwrap();
        assert!(matches!(Refusal::Expired.into_error(&k), Error::Lost { .. }));
        assert!(matches!(
            Refusal::HeldByOther.into_error(&k),
            Error::NotHeld { .. }
        ));
    }

    #[tokio::test]
    async fn a_lost_validity_is_not_renewed() {
        let (v, signal) = Validity::new(Instant::now(), Duration::from_secs(10), Drift::DEFAULT);
        let before = v.deadline();
        v.fire_lost();
        v.renewed(Instant::now() + Duration::from_secs(5), Duration::from_secs(10));
        assert_eq!(v.deadline(), before);
        assert!(signal.is_lost() && !v.is_valid());
    }

    #[test]
    fn on_drop_runs_once_unless_disarmed() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let ran = AtomicU32::new(0);
        {
            let mut undo = OnDrop::new(1, |n| {
                ran.fetch_add(n, Ordering::SeqCst);
            });
            *undo.state_mut() = 5;
        }
        assert_eq!(ran.load(Ordering::SeqCst), 5);
        let undo = OnDrop::new(1, |n| {
            ran.fetch_add(n, Ordering::SeqCst);
        });
        assert_eq!(undo.disarm(), 1);
        assert_eq!(ran.load(Ordering::SeqCst), 5);
    }
}
