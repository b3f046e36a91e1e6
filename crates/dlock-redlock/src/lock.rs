//! [`Redlock`]: N independent nodes, a quorum, a validity.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::driver::host_name;
use dlock_core::driver::{OnDrop, saturating_add};
use dlock_core::{AcquireOptions, Capabilities, Claim, Error, Fencing, Lock, LockKey, Result, Wait, Waiting};
use dlock_redis_protocol::calls::Unfenced;
use dlock_redis_protocol::notices::Waiters;
use dlock_redis_protocol::{millis, scripts};
use tokio::task::JoinHandle;

use crate::config::RedlockConfig;
use crate::error::BACKEND;
use crate::guard::{RedlockGuard, release_in_background};
use crate::protocol::{Conn, MIN_TTL};
use crate::quorum::{NodeFailure, QuorumError};

/// How long the nodes that did not answer a failed attempt's give-back are
/// asked again.
const GIVE_BACK_RETRIES: Duration = Duration::from_secs(1);

/// How many rounds a one-shot acquire ([`Wait::No`]) makes at most when
/// rounds end in split votes.
const SPLIT_VOTE_ROUNDS: usize = 5;

/// A waiter not seen (no attempt) for this long counts as gone: releases
/// stop naming it and other waiters' attempts drop it. At least a second,
/// and four of its rounds: a retry delay, the attempt and the release of a
/// failed attempt's nodes (a slow node or a busy client may take the whole
/// node timeout for each).
fn waiter_window(config: &RedlockConfig) -> u64 {
    millis(
        config
            .retry_jitter
            .saturating_add(config.request_timeout.saturating_mul(2))
            .saturating_mul(4),
    )
    .max(1000)
}

/// Redlock over N independent Redis nodes. Cheap to clone.
///
/// Each node has its own command connection and subscriber connection; a
/// request goes to every node at once, each bounded by the per-node timeout.
/// See the [crate docs](crate) for what Redlock is, and is not, good for.
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
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
        value: String,
        sent: Instant,
    },
    /// Held elsewhere, or a split vote: worth waiting for. `held` is true
    /// when one other value holds a quorum of nodes (a real holder).
    Contended {
        pttl: Option<Duration>,
        held: bool,
    },
    /// Too many nodes failed to answer: no quorum possible.
    NoQuorum(QuorumError),
}

impl Redlock {
    /// Connects to every node (in parallel) and waits, up to
    /// `connect_timeout`, until a quorum is connected. Nodes that are down
    /// keep being retried in the background.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] as [`RedlockConfig::validate`];
    /// - [`Error::Unavailable`] when no quorum connects in time, naming each
    ///   node that did not.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the clients, closing their connections.
    pub async fn connect(config: RedlockConfig) -> Result<Self> {
        config.validate()?;
        let started = Instant::now();
        let (conn, tasks) = Conn::start(config)?;
        let conn = Arc::new(conn);
        // Wait until every node is connected, or until the deadline; once a
        // quorum is up, the others get a short grace only.
        let results = conn.wait_connected(started).await;
        let got = results.iter().filter(|r| r.is_ok()).count();
        let quorum = conn.quorum();
        let (waiters, dispatchers) = Waiters::start(conn.subscribers(), conn.config.request_timeout);
        if got < quorum {
            let failures = conn
                .names
                .iter()
                .zip(results)
                .filter_map(|(n, r)| r.err().map(|f| (n.clone(), f)))
                .collect();
            for t in tasks.iter().chain(&dispatchers) {
                t.abort();
            }
            return Err(Error::unavailable(
                BACKEND,
                QuorumError {
                    operation: "connect",
                    needed: quorum,
                    got,
                    failures,
                    validity_used_up: false,
                },
            ));
        }
        Ok(Redlock {
            inner: Arc::new(Inner {
                conn,
                waiters,
                host: host_name(),
                tasks: tasks.into_iter().chain(dispatchers).collect(),
            }),
        })
    }

    /// The configuration this handle was connected with.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.conn.config
    }

    /// Each node (URL, password redacted) and whether its command connection
    /// is up right now.
    pub fn node_status(&self) -> Vec<(String, bool)> {
        self.inner
            .conn
            .names
            .iter()
            .cloned()
            .zip(self.inner.conn.commands_up())
            .collect()
    }

    /// The Redis key a lock key is stored under on every node.
    pub fn redis_key(&self, key: &LockKey) -> String {
        format!("{}{}", self.config().key_prefix, key.as_str())
    }

    fn is_abandoned(&self) -> bool {
        self.inner.conn.is_abandoned()
    }

    /// One round: the acquire script on every node at once; a grant iff a
    /// quorum said yes with validity left (decided as soon as a quorum said
    /// yes: the slower nodes are not waited for). Anything less is released
    /// on every node (awaited) before returning.
    async fn attempt(&self, lock_key: &str, ttl: Duration, waiter: Option<&str>) -> Result<Attempt> {
        let conn = &self.inner.conn;
        let value = dlock_core::driver::owner_value(&self.inner.host);
        let sent = Instant::now();
        // Released on every node if the attempt ends without a verdict (a
        // dropped future): until its TTL has passed everywhere.
        let cleanup = OnDrop::new((), |()| {
            release_in_background(
                conn,
                lock_key.to_owned(),
                value.clone(),
                saturating_add(sent, ttl),
            );
        });
        let window = waiter_window(&conn.config);
        let quorum = conn.quorum();
        let replies = conn
            .acquire_everywhere(lock_key, &value, ttl, waiter.map(|w| (w, window)), quorum)
            .await;
        let elapsed = sent.elapsed();
        let mut granted = 0;
        let mut held = 0;
        let mut holders: HashMap<String, usize> = HashMap::new();
        let mut pttl: Option<Duration> = None;
        let mut failures = Vec::new();
        // A node still asked when the quorum said yes counts as silent.
        for (name, reply) in conn.names.iter().zip(replies) {
            match reply.unwrap_or(Err(NodeFailure::Timeout)) {
                Ok(Unfenced::Granted) => granted += 1,
                Ok(Unfenced::Held(p, value)) => {
                    held += 1;
                    failures.push((name.clone(), NodeFailure::Held));
                    if let Some(value) = value {
                        *holders.entry(value).or_default() += 1;
                    }
                    if let Some(p) = p {
                        pttl = Some(pttl.map_or(p, |q| q.min(p)));
                    }
                }
                Err(f) => failures.push((name.clone(), f)),
            }
        }
        let validity = ttl
            .checked_sub(elapsed + conn.config.drift(ttl))
            .unwrap_or_default();
        if granted >= quorum && !validity.is_zero() {
            cleanup.disarm();
            return Ok(Attempt::Granted { value, sent });
        }
        // Not ours: give back what we got, on every node (the silent ones
        // too); nodes that did not answer are asked again in the background
        // (for a second at most: a busy moment, not an outage, which would
        // otherwise leave a retrying task behind every failed attempt; the
        // TTL is the backstop).
        let given_back = conn.release_everywhere(lock_key, &value).await;
        cleanup.disarm();
        if given_back.unanswered() > 0 {
            let until = saturating_add(sent, ttl).min(saturating_add(Instant::now(), GIVE_BACK_RETRIES));
            release_in_background(conn, lock_key.to_owned(), value.clone(), until);
        }
        let error = QuorumError {
            operation: "acquire",
            needed: quorum,
            got: granted,
            validity_used_up: granted >= quorum,
            failures,
        };
        let silent = conn.names.len() - granted - held;
        Ok(if silent > conn.names.len() - quorum || error.validity_used_up {
            Attempt::NoQuorum(error)
        } else {
            Attempt::Contended {
                pttl,
                held: holders.values().any(|&n| n >= quorum),
            }
        })
    }

    /// Takes a waiter out of the key's queue on every node, in the
    /// background (it gave up).
    fn leave_in_background(&self, lock_key: &str, waiter: String) {
        if self.is_abandoned() {
            return;
        }
        let (conn, lock_key) = (Arc::clone(&self.inner.conn), lock_key.to_owned());
        dlock_core::driver::spawn_detached("redlock: leave the waiter queues", async move {
            conn.leave_everywhere(&lock_key, &waiter).await;
        });
    }
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field("config", self.config())
            .field("abandoned", &self.is_abandoned())
            .finish()
    }
}

impl Lock for Redlock {
    type Guard = RedlockGuard;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::None, false, Waiting::Notified, MIN_TTL).with_reason(
            "a count or a set of readers cannot be kept across a quorum of independent servers (two \
             majorities can each count a different set of holders, and together exceed the limit); use a \
             backend whose capabilities offer them (Redis, etcd, ZooKeeper)",
        )
    }

    /// See [`Lock::abandon`].
    /// Drops every connection at once without releasing anything, as if this
    /// process had died: watchdogs stop, guards' drops release nothing, locks
    /// expire by their TTL.
    ///
    /// # Cancel safety
    ///
    /// The handle is marked abandoned at once.
    async fn abandon(&self) {
        self.inner.conn.abandon().await;
    }

    /// See [`Lock::keys_in_use`]: the names any reachable node holds now.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when no node could be scanned.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    async fn keys_in_use(&self, prefix: &str) -> Result<Vec<String>> {
        let key_prefix = &self.config().key_prefix;
        let keys = self
            .inner
            .conn
            .lock_keys(&format!("{key_prefix}{prefix}"))
            .await?;
        Ok(dlock_core::driver::names(
            keys.iter().filter_map(|k| k.strip_prefix(key_prefix.as_str())),
        ))
    }

    /// See [`Lock::grant`]: mutexes only ([`Claim::Mutex`]; the others are
    /// refused with [`Error::Unsupported`] before this is called). Each
    /// round sends the acquire script to every node at once (with
    /// [`Wait::No`]: one round, or up to five when rounds end in split votes
    /// with no quorum held by anyone); a grant needs a quorum and validity
    /// left (`ttl - elapsed - drift > 0`, elapsed on the monotonic clock from
    /// the first send). A failed round is released on every node before the
    /// next. Between rounds: a release notice from any node, or a random
    /// delay.
    ///
    /// Semaphores are not offered: a count cannot be kept across a quorum
    /// of independent servers (two majorities can each count a different
    /// set of holders, and together exceed the limit); use a backend whose
    /// capabilities offer semaphores (Redis, etcd, ZooKeeper).
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] when the wait ran out while the key was held;
    /// - [`Error::Unavailable`] when too many nodes failed to answer for a
    ///   quorum (its source is a [`QuorumError`] naming each node and why);
    /// - [`Error::InvalidConfig`] if the handle was abandoned.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped round is released on every node in the
    /// background; the TTL is the backstop.
    async fn grant(&self, key: &LockKey, claim: Claim, opts: AcquireOptions) -> Result<RedlockGuard> {
        match claim {
            Claim::Mutex => self.acquire_mutex(key, opts).await,
            other => Err(other.unsupported(BACKEND)),
        }
    }
}

impl Redlock {
    async fn acquire_mutex(&self, key: &LockKey, opts: AcquireOptions) -> Result<RedlockGuard> {
        if self.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this Redlock was abandoned"));
        }
        let started = Instant::now();
        let lock_key = self.redis_key(key);
        scripts::check_layout(&lock_key).map_err(|reason| Error::InvalidKey { reason })?;
        let ttl = opts.ttl.max(MIN_TTL);
        let deadline = dlock_core::driver::wait_deadline(opts.wait, started);
        let failed = |attempt: Attempt| match attempt {
            Attempt::Contended { .. } => Error::Timeout {
                key: key.as_str().to_owned(),
            },
            Attempt::NoQuorum(e) => Error::unavailable(BACKEND, e),
            Attempt::Granted { .. } => Error::backend(BACKEND, "a grant treated as a failure"),
        };
        let grant = |value, sent| {
            RedlockGuard::new(
                Arc::clone(&self.inner.conn),
                key.clone(),
                lock_key.clone(),
                value,
                ttl,
                sent,
                opts,
            )
        };
        let mut last = match self.attempt(&lock_key, ttl, None).await? {
            Attempt::Granted { value, sent } => return Ok(grant(value, sent)),
            other => other,
        };
        if opts.wait == Wait::No {
            // A split vote (racers each got some nodes) says nothing about a
            // holder: retry a few rounds after a random delay, as Redlock does.
            for _ in 1..SPLIT_VOTE_ROUNDS {
                if !matches!(last, Attempt::Contended { held: false, .. }) {
                    break;
                }
                let jitter = self.config().retry_jitter;
                tokio::time::sleep(jitter.mul_f64(rand::random::<f64>())).await;
                last = match self.attempt(&lock_key, ttl, None).await? {
                    Attempt::Granted { value, sent } => return Ok(grant(value, sent)),
                    other => other,
                };
            }
            return Err(failed(last));
        }
        if matches!(last, Attempt::Contended { .. }) {
            dlock_core::trace::queued();
        }
        let waiting = self
            .inner
            .waiters
            .wait_on(scripts::channel(&lock_key), deadline)
            .await;
        // Queued on every node from the next attempt on (a release names
        // its node's first live waiter); out of the queues again on a grant
        // (by the script) or when this call ends otherwise (here).
        let queued = OnDrop::new((), |()| self.leave_in_background(&lock_key, waiting.id.clone()));
        loop {
            let notified = waiting.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            last = match self.attempt(&lock_key, ttl, Some(&waiting.id)).await? {
                Attempt::Granted { value, sent } => {
                    queued.disarm();
                    return Ok(grant(value, sent));
                }
                other => other,
            };
            let jitter = self.config().retry_jitter;
            let mut delay = jitter / 2 + jitter.mul_f64(rand::random::<f64>() / 2.0);
            if let Attempt::Contended { pttl: Some(p), .. } = &last {
                delay = delay.min(*p + Duration::from_millis(1));
            }
            let mut wake = dlock_core::driver::saturating_add(Instant::now(), delay);
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Err(failed(last));
                }
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
    fn a_waiter_window_covers_four_rounds_and_never_overflows() {
        let mut c = RedlockConfig::new(["redis://127.0.0.1:1"]);
        assert_eq!(waiter_window(&c), 1000);
        c.request_timeout = Duration::from_millis(500);
        assert_eq!(waiter_window(&c), 4 * (100 + 1000));
        c.request_timeout = Duration::MAX;
        assert_eq!(
            u128::from(waiter_window(&c)),
            dlock_core::driver::FAR_FUTURE.as_millis()
        );
    }
}
