//! [`RedisLock`]: connecting, acquiring, waiting, and the operator views.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::driver::host_name;
use dlock_core::driver::{OnDrop, saturating_add};
use dlock_core::{
    AcquireOptions, Capabilities, Claim, Error, Fencing, FencingToken, Holder, Lock, LockKey, Result, Role,
    Wait, Waiting,
};
use dlock_redis_protocol::calls::{Family, Fenced};
use dlock_redis_protocol::notices::Waiters;
use dlock_redis_protocol::scripts::{self, FENCE_SUFFIX};
use tokio::task::JoinHandle;

use crate::config::RedisConfig;
use crate::error::BACKEND;
use crate::guard::{RedisGuard, release_in_background};
use crate::protocol::{Conn, MIN_TTL};

/// The fallback poll while waiting, jittered between half and all of this,
/// and never longer than the holder's remaining TTL.
const POLL: Duration = Duration::from_millis(150);

/// A waiter not seen (no attempt) for this long counts as gone: releases
/// stop naming it and other waiters' attempts drop it. At least a second,
/// and two of its rounds (a poll and an attempt, which a busy server or
/// client may take the whole request timeout for; the gap between two
/// attempts' arrival is at most a poll and two of those).
fn waiter_window(request_timeout: Duration) -> u64 {
    let round = POLL.saturating_add(request_timeout.saturating_mul(2));
    dlock_redis_protocol::millis(round.saturating_mul(2)).max(1000)
}

/// A lock backend on one Redis server (or a Redis Cluster).
///
/// Cheap to clone: clones share one multiplexed connection for commands and
/// one subscriber connection for release notifications, whatever the number
/// of keys and guards. See the [crate docs](crate) for the protocol.
#[derive(Clone)]
pub struct RedisLock {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    conn: Arc<Conn>,
    waiters: Arc<Waiters>,
    host: String,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The connections close with the last guard (`Conn`'s drop).
        for t in &self.tasks {
            t.abort();
        }
    }
}

enum Attempt {
    Granted {
        token: FencingToken,
        value: Arc<str>,
        sent: Instant,
    },
    Held {
        pttl: Option<Duration>,
    },
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
        let conn = Arc::new(
            Conn::connect(&config)
                .await
                .map_err(|e| e.at(&dlock_core::driver::endpoint_of(&config.url)))?,
        );
        let resubscribe = conn.subscriber.manage_subscriptions();
        let (waiters, dispatchers) = Waiters::start(vec![conn.subscriber.clone()], config.request_timeout);
        Ok(RedisLock {
            inner: Arc::new(Inner {
                config,
                conn,
                waiters,
                host: host_name(),
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
    /// (`:dlock-fence`, `:dlock-queue`, `:dlock-seen`, `:dlock-readers`,
    /// `:dlock-writer`, `:dlock-wwait`, `:dlock-permits`: it could be
    /// another lock's fence counter, queue, readers, writer or permits), and on a Redis Cluster for a key with
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

    /// The name's fence counter: the token of the latest grant of `key`,
    /// of any primitive and by anyone; `None` if it is absent (never
    /// granted, or lapsed 24 h after the last grant). The token of the
    /// mutex's holder and of the writer, which is not stored with them.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when Redis fails;
    /// [`Error::InvalidKey`] as [`redis_key`](Self::redis_key).
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    pub async fn fence_counter(&self, key: &LockKey) -> Result<Option<u64>> {
        let lock_key = self.redis_key(key)?;
        self.inner.conn.fence_counter(&lock_key).await
    }

    fn is_abandoned(&self) -> bool {
        self.inner.conn.is_abandoned()
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
        kind: Option<Family>,
        lock_key: &str,
        fence_key: &str,
        ttl: Duration,
        waiter: Option<&str>,
    ) -> Result<Attempt> {
        let value: Arc<str> = dlock_core::driver::owner_value(&self.inner.host).into();
        // Disarmed only for a reply we understood: a grant whose token we
        // refuse (or whose reply we lost) is released in the background,
        // until its TTL has run out anyway.
        let cleanup = OnDrop::new((), |()| {
            release_in_background(
                &self.inner.conn,
                kind,
                lock_key.into(),
                Arc::clone(&value),
                saturating_add(Instant::now(), ttl),
            );
        });
        let sent = Instant::now();
        let window = waiter_window(self.inner.config.request_timeout);
        let found = self
            .inner
            .conn
            .acquire(
                kind,
                lock_key,
                fence_key,
                &value,
                ttl,
                waiter.map(|w| (w, window)),
            )
            .await?;
        cleanup.disarm();
        Ok(match found {
            Fenced::Granted(token) => Attempt::Granted {
                token: FencingToken::new(token),
                // A reader's or a permit holder's member carries its token.
                value: match kind {
                    Some(f) => f.held_value(&value, token).into(),
                    None => value,
                },
                sent,
            },
            Fenced::Held(pttl) => Attempt::Held { pttl },
        })
    }

    /// Takes a waiter out of its key's queue, in the background (it gave up).
    fn leave_in_background(&self, kind: Option<Family>, lock_key: &str, waiter: String) {
        if self.is_abandoned() {
            return;
        }
        let (conn, lock_key) = (Arc::clone(&self.inner.conn), lock_key.to_owned());
        dlock_core::driver::spawn_detached("redis: leave a waiter queue", async move {
            let _ = conn.leave(kind, &lock_key, &waiter).await;
        });
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
            .with_read_write()
            .with_semaphores()
            .with_holders()
    }

    /// See [`Lock::abandon`].
    /// Drops both connections at once without releasing anything, as if this
    /// process had died: watchdogs stop, guards' drops release nothing, and
    /// the locks of this handle expire by their TTL. For tests and for
    /// shutdown paths that must not block.
    ///
    /// # Cancel safety
    ///
    /// The handle is marked abandoned at once; dropping the future may leave
    /// the connections to close on their own.
    async fn abandon(&self) {
        self.inner.conn.abandon().await;
    }

    /// See [`Lock::keys_in_use`]: the names whose lock key (or a read-write
    /// lock's or semaphore's key) Redis holds now. Scans every primary on a
    /// cluster.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when Redis fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    async fn keys_in_use(&self, prefix: &str) -> Result<Vec<String>> {
        let key_prefix = &self.inner.config.key_prefix;
        let keys = self
            .inner
            .conn
            .lock_keys(&format!("{key_prefix}{prefix}"), self.inner.config.is_cluster())
            .await?;
        Ok(dlock_core::driver::names(
            keys.iter().filter_map(|k| k.strip_prefix(key_prefix.as_str())),
        ))
    }

    /// See [`Lock::holders`]: the mutex's holder (its `id` is the lock
    /// key), then the read-write lock's writer and readers, then the
    /// semaphore's permit holders (`id`: the companion key beside the lock
    /// key). Expired readers and permits are left out. `remaining` is
    /// `None` for a key set without expiry.
    ///
    /// Tokens: a reader's and a permit holder's is stored with it (its
    /// member ends in ` t<token>`; `None` for one granted by a dlock that
    /// did not store it yet, never a token that is not its own). The
    /// mutex's and the writer's is not stored: it is the name's
    /// [`fence_counter`](RedisLock::fence_counter). No grant of their own
    /// primitive (nor, for the writer, a read) can bump it while they hold,
    /// so it is theirs unless the same name was since granted as another
    /// primitive (a name is meant for one kind of lock only), or `None`
    /// once the counter lapsed.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when Redis fails;
    /// [`Error::InvalidKey`] as [`RedisLock::redis_key`].
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    async fn holders(&self, key: &LockKey) -> Result<Vec<Holder>> {
        let lock_key = self.redis_key(key)?;
        let mutex = self.inner.conn.held_by(&lock_key).await?;
        let fence_counter = match &mutex {
            Some(held) => held.fence_counter,
            None => self.inner.conn.fence_counter(&lock_key).await?,
        };
        let since = |value: &str| dlock_core::driver::Owner::from_value(value).and_then(|o| o.since());
        let mut all: Vec<Holder> = mutex
            .into_iter()
            .map(|held| Holder {
                role: Role::Mutex,
                id: lock_key.clone(),
                since: since(&held.value),
                detail: held.value,
                token: held.fence_counter,
                remaining: held.remaining,
            })
            .collect();
        for semaphore in [false, true] {
            for found in self.inner.conn.family_holders(semaphore, &lock_key).await? {
                let (role, suffix, token) = match found.family {
                    Family::Read => (Role::Read, scripts::READERS_SUFFIX, found.token),
                    // The writer's own token is not stored (see above).
                    Family::Write => (Role::Write, scripts::WRITER_SUFFIX, fence_counter),
                    Family::Permits { count, .. } => {
                        (Role::Permits(count), scripts::PERMITS_SUFFIX, found.token)
                    }
                };
                all.push(Holder {
                    role,
                    id: scripts::companion_key(&lock_key, suffix),
                    since: since(&found.value),
                    detail: found.value,
                    token,
                    remaining: found.remaining,
                });
            }
        }
        Ok(all)
    }

    /// See [`Lock::grant`]. One script per attempt; a waiter subscribes to
    /// the key's release channel and retries when a release is announced,
    /// polling (jittered, at most the holder's remaining TTL) as a fallback.
    /// The layouts:
    ///
    /// - **Mutex** ([`Claim::Mutex`]): the string `KEY`, and the fence counter beside it.
    /// - **Read** ([`Claim::Read`]): a member `"<value> t<token>"` of the sorted set
    ///   `{KEY}:dlock-readers`, scored by when it expires (server time);
    ///   granted unless a writer holds or waits (a stream of readers cannot
    ///   starve a writer). The token is the next of the name's fence counter.
    /// - **Write** ([`Claim::Write`]): the string `{KEY}:dlock-writer`, set when no
    ///   writer holds and no reader is left; a refused waiter marks itself
    ///   waiting from its second attempt on (`{KEY}:dlock-wwait`, until its
    ///   window runs out), which holds new readers back.
    /// - **Permits** ([`Claim::Permits`]): a member `"<count> <value> t<token>"` of the
    ///   sorted set `{KEY}:dlock-permits`, scored by when it expires;
    ///   granted when the live members' counts plus `count` are at most
    ///   `limit`. Waiters are not served in order: a request for many
    ///   permits can wait behind a stream of small ones.
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
    /// attempt whose answer it did not see, and gives up its subscription;
    /// a dropped writer also takes its waiting mark back (in the background;
    /// its window is the backstop).
    async fn grant(&self, key: &LockKey, claim: Claim, opts: AcquireOptions) -> Result<RedisGuard> {
        let family = match claim {
            Claim::Mutex => None,
            Claim::Read => Some(Family::Read),
            Claim::Write => Some(Family::Write),
            Claim::Permits { count, limit } => Some(Family::Permits { count, limit }),
        };
        self.take(family, key, opts).await
    }
}

impl RedisLock {
    /// Takes `key` as `kind` (`None`: the mutex).
    async fn take(&self, kind: Option<Family>, key: &LockKey, opts: AcquireOptions) -> Result<RedisGuard> {
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
                Arc::clone(&self.inner.conn),
                kind,
                key.clone(),
                lock_key.as_str().into(),
                value,
                token,
                ttl,
                sent,
                opts,
            )),
            Attempt::Held { .. } => None,
        };
        let first = self.attempt(kind, &lock_key, &fence_key, ttl, None).await?;
        if let granted @ Attempt::Granted { .. } = first {
            return grant(granted).ok_or_else(timeout);
        }
        if opts.wait == Wait::No {
            return Err(timeout());
        }
        dlock_core::trace::queued();
        let waiting = self
            .inner
            .waiters
            .wait_on(
                kind.map_or_else(|| scripts::channel(&lock_key), |f| f.channel(&lock_key)),
                deadline,
            )
            .await;
        // Queued (a mutex) or marked waiting (a write) from the next attempt
        // on; out again on a grant (by the script) or when this call ends
        // otherwise (here). Readers and permits are neither.
        let queues = kind.is_none_or(Family::queues);
        let waiter = queues.then_some(waiting.id.as_str());
        let queued = OnDrop::new((), |()| {
            if queues {
                self.leave_in_background(kind, &lock_key, waiting.id.clone());
            }
        });
        loop {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(timeout());
            }
            let notified = waiting.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let pttl = match self.attempt(kind, &lock_key, &fence_key, ttl, waiter).await? {
                Attempt::Held { pttl } => pttl,
                granted => {
                    queued.disarm();
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
