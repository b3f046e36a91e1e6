//! [`RedisLock`]: connecting, acquiring, waiting, and the operator views.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dlock_core::{
    AcquireOptions, Capabilities, Error, Fencing, FencingToken, Lock, LockKey, Result, Wait, Waiting,
};
use fred::clients::{Client, SubscriberClient};
use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::Builder;
use fred::types::config::ReconnectPolicy;
use fred::types::scripts::Script;
use futures::StreamExt;
use tokio::task::JoinHandle;

use crate::config::RedisConfig;
use crate::guard::RedisGuard;
use dlock_redis_protocol::notices::Waiters;
use dlock_redis_protocol::scripts::{self, FENCE_SUFFIX, QUEUE_SUFFIX, SEEN_SUFFIX};
use dlock_redis_protocol::{Outcome, host_name, millis as ms};

pub(crate) const BACKEND: &str = "redis";

/// The shortest TTL the driver honours (Redis expiries are in milliseconds;
/// a watchdog at a third of less than this could not keep up).
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The fallback poll while waiting, jittered between half and all of this,
/// and never longer than the holder's remaining TTL.
const POLL: Duration = Duration::from_millis(150);

/// A waiter not seen (no attempt) for this long counts as gone: releases
/// stop naming it and other waiters' attempts drop it. At least a second,
/// and two of its rounds (a poll and an attempt, which a busy server or
/// client may take the whole command timeout for; the gap between two
/// attempts' arrival is at most a poll and two of those).
fn waiter_window(command_timeout: Duration) -> u64 {
    let round = POLL.saturating_add(command_timeout.saturating_mul(2));
    dlock_redis_protocol::millis(round.saturating_mul(2)).max(1000)
}

/// A lock backend on one Redis server (or a Redis Cluster).
///
/// Cheap to clone: clones share one multiplexed connection for commands and
/// one subscriber connection for release notifications, whatever the number
/// of keys and guards. See the [crate docs](crate) for the protocol.
#[derive(Clone)]
pub struct RedisLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: RedisConfig,
    pub(crate) client: Client,
    subscriber: SubscriberClient,
    waiters: Arc<Waiters>,
    scripts: Scripts,
    host: String,
    abandoned: AtomicBool,
    tasks: Vec<JoinHandle<()>>,
}

struct Scripts {
    acquire: Script,
    release: Script,
    extend: Script,
    leave: Script,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (client, subscriber) = (self.client.clone(), self.subscriber.clone());
            drop(rt.spawn(async move {
                let _ = client.quit().await;
                let _ = subscriber.quit().await;
            }));
        }
    }
}

enum Attempt {
    Granted {
        token: FencingToken,
        value: String,
        sent: Instant,
    },
    Held {
        pttl: Option<Duration>,
    },
}

/// Who holds a key, for operators: see [`RedisLock::holder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The raw value of the lock key.
    pub value: String,
    /// The holder's host, pid and acquire time, when dlock wrote the value
    /// (`None` for a lock set by another client).
    pub info: Option<scripts::ValueInfo>,
    /// How much longer the lock lives; `None` if it was set without expiry.
    pub remaining: Option<Duration>,
    /// The key's fence counter: the token of the latest grant (when present).
    pub fence_counter: Option<u64>,
}

impl Holder {
    /// When the holder acquired (wall clock; for display only).
    pub fn since(&self) -> Option<SystemTime> {
        self.info
            .as_ref()
            .and_then(|i| UNIX_EPOCH.checked_add(Duration::from_millis(i.since_unix_ms)))
    }
}

/// fred's errors as dlock's, for this backend.
pub(crate) fn map_err(e: fred::error::Error) -> Error {
    dlock_redis_protocol::map_err(BACKEND, e)
}

impl RedisLock {
    /// Connects the command and subscriber connections.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] for a bad URL or timeout, naming the problem;
    /// - [`Error::Unavailable`] if the server cannot be reached within
    ///   `connect_timeout`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the half-built clients, which closes their
    /// connections.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use dlock_redis::{RedisConfig, RedisLock};
    ///
    /// # async fn demo() -> dlock_core::Result<()> {
    /// let lock = RedisLock::connect(RedisConfig::from_url("redis://127.0.0.1:6379")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        let fred_config = config.to_fred()?;
        let mut builder = Builder::from_config(fred_config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = config.connect_timeout;
                c.internal_command_timeout = config.command_timeout;
                // A command is sent once: a silent resend after a reconnect
                // could take a lock nobody is waiting for any more.
                c.max_command_attempts = 1;
            })
            .with_performance_config(|p| {
                p.default_command_timeout = config.command_timeout;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2));
        let client = builder.build().map_err(map_err)?;
        let subscriber = builder.build_subscriber_client().map_err(map_err)?;
        let connected = tokio::time::timeout(config.connect_timeout, async {
            client.init().await?;
            subscriber.init().await
        })
        .await;
        let failure = match connected {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(map_err(e)),
            Err(_) => Some(Error::unavailable(
                BACKEND,
                format!("no connection within {:?}", config.connect_timeout),
            )),
        };
        if let Some(e) = failure {
            let (c, s) = (client.clone(), subscriber.clone());
            tokio::spawn(async move {
                let _ = c.quit().await;
                let _ = s.quit().await;
            });
            return Err(match e {
                Error::Unavailable { .. } | Error::InvalidConfig(_) => e,
                other => Error::unavailable(BACKEND, other),
            });
        }
        let resubscribe = subscriber.manage_subscriptions();
        let (waiters, dispatchers) = Waiters::start(vec![subscriber.clone()], config.command_timeout);
        Ok(RedisLock {
            inner: Arc::new(Inner {
                config,
                client,
                subscriber,
                waiters,
                scripts: Scripts {
                    acquire: Script::from_lua(scripts::ACQUIRE),
                    release: Script::from_lua(scripts::RELEASE),
                    extend: Script::from_lua(scripts::EXTEND),
                    leave: Script::from_lua(scripts::LEAVE),
                },
                host: host_name(),
                abandoned: AtomicBool::new(false),
                tasks: std::iter::once(resubscribe).chain(dispatchers).collect(),
            }),
        })
    }

    /// The configuration this handle was connected with.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// The Redis key a lock key is stored under.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for a key holding a companion-key suffix
    /// (`:dlock-fence`, `:dlock-queue`, `:dlock-seen`: it could be another
    /// lock's fence counter or queue), and on a Redis Cluster for a key with
    /// a `}` but no hash tag (its fence counter could not share its slot).
    pub fn redis_key(&self, key: &LockKey) -> Result<String> {
        let lock_key = format!("{}{}", self.inner.config.key_prefix, key.as_str());
        scripts::check_layout(&lock_key).map_err(|reason| Error::InvalidKey { reason })?;
        if self.inner.config.is_cluster() && scripts::fence_key(&lock_key).is_none() {
            return Err(Error::InvalidKey {
                reason: format!(
                    "{lock_key:?} has a '}}' but no hash tag: on a Redis Cluster its fence counter could not share its slot"
                ),
            });
        }
        Ok(lock_key)
    }

    /// Who holds `key` and for how much longer; `None` if nobody does.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when Redis fails;
    /// [`Error::InvalidKey`] as [`redis_key`](Self::redis_key).
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    pub async fn holder(&self, key: &LockKey) -> Result<Option<Holder>> {
        let lock_key = self.redis_key(key)?;
        let client = &self.inner.client;
        let value: Option<String> = client.get(&lock_key).await.map_err(map_err)?;
        let Some(value) = value else { return Ok(None) };
        let pttl: i64 = client.pttl(&lock_key).await.map_err(map_err)?;
        let fence_counter: Option<u64> = match scripts::fence_key(&lock_key) {
            Some(k) => client.get(k).await.map_err(map_err)?,
            None => None,
        };
        Ok(Some(Holder {
            info: scripts::parse_value(&value),
            value,
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            fence_counter,
        }))
    }

    /// The lock keys (without the configured prefix) that are held now and
    /// start with `prefix`. Scans every primary on a cluster.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when Redis fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    pub async fn held_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let full = format!("{}{prefix}", self.inner.config.key_prefix);
        let mut pattern = String::with_capacity(full.len() + 1);
        for c in full.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('*');
        let client = &self.inner.client;
        let mut stream = if self.inner.config.is_cluster() {
            client.scan_cluster_buffered(pattern, Some(500), None).boxed()
        } else {
            client.scan_buffered(pattern, Some(500), None).boxed()
        };
        let mut keys = Vec::new();
        while let Some(key) = stream.next().await {
            let key = key.map_err(map_err)?;
            let Some(name) = key.as_str() else { continue };
            if [FENCE_SUFFIX, QUEUE_SUFFIX, SEEN_SUFFIX]
                .iter()
                .any(|s| name.ends_with(s))
            {
                continue;
            }
            if let Some(stripped) = name.strip_prefix(&self.inner.config.key_prefix) {
                keys.push(stripped.to_owned());
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// Drops both connections at once without releasing anything, as if this
    /// process had died: watchdogs stop, guards' drops release nothing, and
    /// the locks of this handle expire by their TTL. For tests and for
    /// shutdown paths that must not block.
    ///
    /// # Cancel safety
    ///
    /// The handle is marked abandoned at once; dropping the future may leave
    /// the connections to close on their own.
    pub async fn abandon(&self) {
        self.inner.abandoned.store(true, Ordering::SeqCst);
        let _ = self.inner.client.quit().await;
        let _ = self.inner.subscriber.quit().await;
    }

    pub(crate) fn is_abandoned(&self) -> bool {
        self.inner.abandoned.load(Ordering::SeqCst)
    }

    fn check_up(&self) -> Result<()> {
        if self.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this RedisLock was abandoned"));
        }
        Ok(())
    }

    /// One `SET NX PX` + fence attempt. If the call is dropped or fails
    /// without a definite answer, a compare-value release follows in the
    /// background, so a grant nobody receives does not outlive the call.
    async fn attempt(
        &self,
        lock_key: &str,
        fence_key: &str,
        ttl: Duration,
        waiter: Option<&str>,
    ) -> Result<Attempt> {
        let value = scripts::new_value(&self.inner.host);
        let mut cleanup = ReleaseOnDrop {
            lock: self,
            lock_key,
            value: &value,
            ttl,
            armed: true,
        };
        let sent = Instant::now();
        let reply: Vec<i64> = self
            .inner
            .scripts
            .acquire
            .evalsha_with_reload(
                &self.inner.client,
                vec![
                    lock_key,
                    fence_key,
                    &scripts::companion_key(lock_key, QUEUE_SUFFIX),
                    &scripts::companion_key(lock_key, SEEN_SUFFIX),
                ],
                vec![
                    value.clone(),
                    ms(ttl).to_string(),
                    waiter.unwrap_or_default().to_owned(),
                    waiter_window(self.inner.config.command_timeout).to_string(),
                ],
            )
            .await
            .map_err(map_err)?;
        // Disarmed only for a reply we understood: a grant whose token we
        // refuse is released in the background.
        match reply.as_slice() {
            [1, token] => {
                let token = u64::try_from(*token)
                    .map_err(|_| Error::backend(BACKEND, format!("negative fencing token {token}")))?;
                cleanup.armed = false;
                drop(cleanup);
                Ok(Attempt::Granted {
                    token: FencingToken::new(token),
                    value,
                    sent,
                })
            }
            [0, pttl] => {
                cleanup.armed = false;
                Ok(Attempt::Held {
                    pttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                })
            }
            other => Err(Error::backend(
                BACKEND,
                format!("unexpected acquire reply {other:?}"),
            )),
        }
    }

    /// Runs the release script.
    pub(crate) async fn run_release(&self, lock_key: &str, value: &str) -> Result<Outcome> {
        let channel = scripts::channel(lock_key);
        let reply: i64 = self
            .inner
            .scripts
            .release
            .evalsha_with_reload(
                &self.inner.client,
                vec![
                    lock_key,
                    &scripts::companion_key(lock_key, QUEUE_SUFFIX),
                    &scripts::companion_key(lock_key, SEEN_SUFFIX),
                ],
                vec![value, channel.as_str()],
            )
            .await
            .map_err(map_err)?;
        Outcome::from_reply(BACKEND, reply)
    }

    /// Takes a waiter out of its key's queue, in the background (it gave up).
    fn leave_in_background(&self, lock_key: &str, waiter: String) {
        if self.is_abandoned() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let lock = self.clone();
            let keys = vec![
                scripts::companion_key(lock_key, QUEUE_SUFFIX),
                scripts::companion_key(lock_key, SEEN_SUFFIX),
            ];
            drop(rt.spawn(async move {
                let _: std::result::Result<i64, _> = lock
                    .inner
                    .scripts
                    .leave
                    .evalsha_with_reload(&lock.inner.client, keys, vec![waiter])
                    .await;
            }));
        }
    }

    /// Runs the extend script.
    pub(crate) async fn run_extend(&self, lock_key: &str, value: &str, ttl: Duration) -> Result<Outcome> {
        let reply: i64 = self
            .inner
            .scripts
            .extend
            .evalsha_with_reload(
                &self.inner.client,
                vec![lock_key],
                vec![value.to_owned(), ms(ttl).to_string()],
            )
            .await
            .map_err(map_err)?;
        Outcome::from_reply(BACKEND, reply)
    }

    /// Releases in the background (for drops).
    pub(crate) fn release_in_background(&self, lock_key: String, value: String, until: Instant) {
        if self.is_abandoned() {
            return;
        }
        let (lock, gone) = (self.clone(), self.clone());
        dlock_core::driver::clean_up_in_background(
            format!("redis: release {lock_key}"),
            // Past the local deadline the key expires on its own.
            Some(until),
            move || gone.is_abandoned(),
            move || {
                let (lock, lock_key, value) = (lock.clone(), lock_key.clone(), value.clone());
                async move { lock.run_release(&lock_key, &value).await.map(drop) }
            },
        );
    }
}

/// Sends a compare-value release if an acquire attempt ends without a
/// definite answer (dropped or failed).
struct ReleaseOnDrop<'a> {
    lock: &'a RedisLock,
    lock_key: &'a str,
    value: &'a str,
    /// The attempt's TTL: a grant it did not see expires within it.
    ttl: Duration,
    armed: bool,
}

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.lock.release_in_background(
                self.lock_key.to_owned(),
                self.value.to_owned(),
                dlock_core::driver::saturating_add(Instant::now(), self.ttl),
            );
        }
    }
}

/// Takes a waiter that gave up (timed out, failed, was dropped) out of the
/// key's queue, so releases do not name it.
struct LeaveOnDrop<'a> {
    lock: &'a RedisLock,
    lock_key: &'a str,
    waiter: &'a str,
    armed: bool,
}

impl Drop for LeaveOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.lock
                .leave_in_background(self.lock_key, self.waiter.to_owned());
        }
    }
}

fn jittered(bound: Option<Duration>) -> Duration {
    let poll = POLL / 2 + POLL.mul_f64(rand::random::<f64>() / 2.0);
    match bound {
        // Wake right after the holder's TTL runs out.
        Some(pttl) => poll.min(pttl.saturating_add(Duration::from_millis(1))),
        None => poll,
    }
}

impl std::fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLock")
            .field("config", &self.inner.config)
            .field("abandoned", &self.is_abandoned())
            .finish()
    }
}

impl Lock for RedisLock {
    type Guard = RedisGuard;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, false, Waiting::Notified, MIN_TTL)
    }

    /// See [`Lock::acquire`]. One script per attempt; a waiter subscribes to
    /// the key's release channel and retries when a release is announced,
    /// polling (jittered, at most the holder's remaining TTL) as a fallback.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the wait runs out; [`Error::Unavailable`] when
    /// Redis cannot be reached; [`Error::Backend`] when the lock key holds
    /// another type (a hash, a list) or Redis answers oddly;
    /// [`Error::InvalidKey`] as [`RedisLock::redis_key`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call sends a compare-value release for an
    /// attempt whose answer it did not see, and gives up its subscription.
    async fn acquire(&self, key: &LockKey, opts: AcquireOptions) -> Result<RedisGuard> {
        self.check_up()?;
        let started = Instant::now();
        let lock_key = self.redis_key(key)?;
        let fence_key =
            scripts::fence_key(&lock_key).unwrap_or_else(|| format!("{{{lock_key}}}{FENCE_SUFFIX}"));
        let ttl = opts.ttl.max(MIN_TTL);
        let deadline = dlock_core::driver::wait_deadline(opts.wait, started);
        let timeout = || Error::Timeout {
            key: key.as_str().to_owned(),
        };
        let grant = |attempt| match attempt {
            Attempt::Granted { token, value, sent } => Some(RedisGuard::new(
                self.clone(),
                key.clone(),
                lock_key.clone(),
                value,
                token,
                ttl,
                sent,
                opts,
            )),
            Attempt::Held { .. } => None,
        };
        let first = self.attempt(&lock_key, &fence_key, ttl, None).await?;
        if let granted @ Attempt::Granted { .. } = first {
            return grant(granted).ok_or_else(timeout);
        }
        if opts.wait == Wait::No {
            return Err(timeout());
        }
        let waiting = self
            .inner
            .waiters
            .wait_on(scripts::channel(&lock_key), deadline)
            .await;
        // Queued from the next attempt on; out of the queue again on a grant
        // (by the script) or when this call ends otherwise (here).
        let mut queued = LeaveOnDrop {
            lock: self,
            lock_key: &lock_key,
            waiter: &waiting.id,
            armed: true,
        };
        loop {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(timeout());
            }
            let notified = waiting.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let pttl = match self
                .attempt(&lock_key, &fence_key, ttl, Some(&waiting.id))
                .await?
            {
                Attempt::Held { pttl } => pttl,
                granted => {
                    queued.armed = false;
                    return grant(granted).ok_or_else(timeout);
                }
            };
            let mut wake = dlock_core::driver::saturating_add(Instant::now(), jittered(pttl));
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(wake.into()) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_window_covers_two_rounds_and_never_overflows() {
        assert_eq!(waiter_window(Duration::from_millis(100)), 1000);
        assert_eq!(waiter_window(Duration::from_secs(2)), 2 * (150 + 4000));
        assert_eq!(
            u128::from(waiter_window(Duration::MAX)),
            dlock_core::driver::FAR_FUTURE.as_millis()
        );
    }
}
