//! [`Redlock`]: N independent nodes, a quorum, a validity.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_core::driver::{OnDrop, saturating_add};
use dlock_core::{AcquireOptions, Capabilities, Error, Fencing, Lock, LockKey, Result, Wait, Waiting};
use dlock_redis_protocol::notices::Waiters;
use dlock_redis_protocol::{Outcome, host_name, millis, redact_url, scripts};
use fred::clients::{Client, SubscriberClient};
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ReconnectPolicy};
use fred::types::scripts::Script;
use fred::types::{Builder, Value};
use futures::StreamExt;
use futures::future::join_all;
use tokio::task::JoinHandle;

use crate::config::RedlockConfig;
use crate::guard::RedlockGuard;
use crate::quorum::{NodeFailure, QuorumError, Tally, fan_out, fan_out_until};

pub(crate) const BACKEND: &str = "redlock";

/// The shortest TTL Redlock honours: below this, the per-node timeout and
/// the drift allowance leave no validity.
pub const MIN_TTL: Duration = Duration::from_millis(100);

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
            .saturating_add(config.node_timeout.saturating_mul(2))
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
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: RedlockConfig,
    nodes: Vec<Node>,
    names: Vec<String>,
    waiters: Arc<Waiters>,
    scripts: Scripts,
    host: String,
    abandoned: AtomicBool,
    tasks: Vec<JoinHandle<()>>,
}

struct Node {
    client: Client,
    subscriber: SubscriberClient,
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
            for node in &self.nodes {
                let (c, s) = (node.client.clone(), node.subscriber.clone());
                drop(rt.spawn(async move {
                    let _ = c.quit().await;
                    let _ = s.quit().await;
                }));
            }
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
        let mut nodes = Vec::with_capacity(config.nodes.len());
        for url in &config.nodes {
            let fred_config = Config::from_url(url).map_err(|e| {
                Error::InvalidConfig(format!("redlock node {}: {}", redact_url(url), e.details()))
            })?;
            let mut builder = Builder::from_config(fred_config);
            builder
                .with_connection_config(|c| {
                    c.connection_timeout = config.connect_timeout;
                    c.internal_command_timeout = config.connect_timeout;
                    c.max_command_attempts = 1;
                })
                .with_performance_config(|p| {
                    p.default_command_timeout = config.node_timeout.max(Duration::from_millis(1))
                })
                // Independent nodes: come back quickly after a restart.
                .set_policy(ReconnectPolicy::new_exponential(0, 20, 500, 2));
            let map = |e| dlock_redis_protocol::map_err(BACKEND, e);
            nodes.push(Node {
                client: builder.build().map_err(map)?,
                subscriber: builder.build_subscriber_client().map_err(map)?,
            });
        }
        let names: Vec<String> = config.nodes.iter().map(|u| redact_url(u)).collect();
        // The connection tasks run (and reconnect) until the clients quit.
        let mut tasks = Vec::new();
        for node in &nodes {
            drop(node.client.connect());
            drop(node.subscriber.connect());
            tasks.push(node.subscriber.manage_subscriptions());
        }
        // Wait until every node is connected, or until the deadline; once a
        // quorum is up, the others get a short grace only.
        let started = Instant::now();
        let quorum = config.quorum();
        let grace = config.node_timeout * 4;
        let mut quorum_at: Option<Instant> = None;
        let results: Vec<Result<(), NodeFailure>> = loop {
            let up: Vec<bool> = nodes
                .iter()
                .map(|n| n.client.is_connected() && n.subscriber.is_connected())
                .collect();
            let count = up.iter().filter(|&&u| u).count();
            if count >= quorum && quorum_at.is_none() {
                quorum_at = Some(Instant::now());
            }
            let now = Instant::now();
            let done = count == nodes.len()
                || now >= dlock_core::driver::saturating_add(started, config.connect_timeout)
                || quorum_at.is_some_and(|t| now >= t + grace);
            if done {
                break up
                    .into_iter()
                    .map(|u| if u { Ok(()) } else { Err(NodeFailure::Timeout) })
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let got = results.iter().filter(|r| r.is_ok()).count();
        let (waiters, dispatchers) = Waiters::start(
            nodes.iter().map(|n| n.subscriber.clone()).collect(),
            config.node_timeout,
        );
        let lock = Redlock {
            inner: Arc::new(Inner {
                config,
                names,
                waiters,
                scripts: Scripts {
                    acquire: Script::from_lua(scripts::ACQUIRE_UNFENCED),
                    release: Script::from_lua(scripts::RELEASE),
                    extend: Script::from_lua(scripts::EXTEND),
                    leave: Script::from_lua(scripts::LEAVE),
                },
                host: host_name(),
                abandoned: AtomicBool::new(false),
                tasks: tasks.into_iter().chain(dispatchers).collect(),
                nodes,
            }),
        };
        if got < quorum {
            let failures = lock
                .inner
                .names
                .iter()
                .zip(results)
                .filter_map(|(n, r)| r.err().map(|f| (n.clone(), f)))
                .collect();
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
        Ok(lock)
    }

    /// The configuration this handle was connected with.
    pub fn config(&self) -> &RedlockConfig {
        &self.inner.config
    }

    /// Each node (URL, password redacted) and whether its command connection
    /// is up right now.
    pub fn node_status(&self) -> Vec<(String, bool)> {
        self.inner
            .names
            .iter()
            .zip(&self.inner.nodes)
            .map(|(name, n)| (name.clone(), n.client.is_connected()))
            .collect()
    }

    /// The Redis key a lock key is stored under on every node.
    pub fn redis_key(&self, key: &LockKey) -> String {
        format!("{}{}", self.inner.config.key_prefix, key.as_str())
    }

    /// The lock keys (without the prefix) starting with `prefix` that any
    /// reachable node holds now.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when no node could be scanned.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    pub async fn held_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let full = format!("{}{prefix}", self.inner.config.key_prefix);
        let mut pattern = String::new();
        for c in full.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('*');
        let mut keys = Vec::new();
        let mut scanned = 0;
        let mut last_error = None;
        for node in &self.inner.nodes {
            let mut stream = node.client.scan_buffered(pattern.clone(), Some(500), None);
            let mut ok = true;
            while let Some(key) = stream.next().await {
                match key {
                    Ok(key) => keys.extend(
                        key.as_str()
                            .filter(|k| {
                                ![scripts::QUEUE_SUFFIX, scripts::SEEN_SUFFIX]
                                    .iter()
                                    .any(|s| k.ends_with(s))
                            })
                            .and_then(|k| k.strip_prefix(&self.inner.config.key_prefix))
                            .map(str::to_owned),
                    ),
                    Err(e) => {
                        last_error = Some(e);
                        ok = false;
                        break;
                    }
                }
            }
            scanned += usize::from(ok);
        }
        if scanned == 0 {
            if let Some(e) = last_error {
                return Err(dlock_redis_protocol::map_err(BACKEND, e));
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// Drops every connection at once without releasing anything, as if this
    /// process had died: watchdogs stop, guards' drops release nothing, locks
    /// expire by their TTL.
    ///
    /// # Cancel safety
    ///
    /// The handle is marked abandoned at once.
    pub async fn abandon(&self) {
        self.inner.abandoned.store(true, Ordering::SeqCst);
        join_all(self.inner.nodes.iter().map(|n| async {
            let _ = n.client.quit().await;
            let _ = n.subscriber.quit().await;
        }))
        .await;
    }

    pub(crate) fn is_abandoned(&self) -> bool {
        self.inner.abandoned.load(Ordering::SeqCst)
    }

    pub(crate) fn quorum(&self) -> usize {
        self.inner.config.quorum()
    }

    /// One round: the acquire script on every node at once; a grant iff a
    /// quorum said yes with validity left (decided as soon as a quorum said
    /// yes: the slower nodes are not waited for). Anything less is released
    /// on every node (awaited) before returning.
    async fn attempt(&self, lock_key: &str, ttl: Duration, waiter: Option<&str>) -> Result<Attempt> {
        let value = scripts::new_value(&self.inner.host);
        let sent = Instant::now();
        // Released on every node if the attempt ends without a verdict (a
        // dropped future): until its TTL has passed everywhere.
        let cleanup = OnDrop::new((), |()| {
            self.release_in_background(lock_key.to_owned(), value.clone(), saturating_add(sent, ttl));
        });
        let ttl_ms = millis(ttl).to_string();
        let window_ms = waiter_window(&self.inner.config).to_string();
        let (queue, seen) = (
            scripts::companion_key(lock_key, scripts::QUEUE_SUFFIX),
            scripts::companion_key(lock_key, scripts::SEEN_SUFFIX),
        );
        let granted_here = |reply: &Vec<Value>| reply.first().and_then(Value::as_i64) == Some(1);
        let replies = fan_out_until(
            self.inner.nodes.len(),
            self.inner.config.node_timeout,
            |i| {
                self.inner
                    .scripts
                    .acquire
                    .evalsha_with_reload::<Vec<Value>, _, _>(
                        &self.inner.nodes[i].client,
                        vec![lock_key, queue.as_str(), seen.as_str()],
                        vec![
                            value.as_str(),
                            ttl_ms.as_str(),
                            waiter.unwrap_or_default(),
                            window_ms.as_str(),
                        ],
                    )
            },
            granted_here,
            self.quorum(),
        )
        .await;
        // A node still asked when the quorum said yes counts as silent.
        let replies = replies
            .into_iter()
            .map(|r| r.unwrap_or(Err(NodeFailure::Timeout)));
        let elapsed = sent.elapsed();
        let mut granted = 0;
        let mut held = 0;
        let mut holders: HashMap<String, usize> = HashMap::new();
        let mut pttl: Option<Duration> = None;
        let mut failures = Vec::new();
        for (name, reply) in self.inner.names.iter().zip(replies) {
            let reply = reply.map(|values| values.iter().map(Value::as_string).collect::<Vec<_>>());
            let parsed: Option<(i64, i64, Option<String>)> = match reply.as_deref() {
                Ok([Some(flag), Some(p)]) => {
                    Some((flag.parse().unwrap_or(-1), p.parse().unwrap_or(-1), None))
                }
                Ok([Some(flag), Some(p), v]) => {
                    Some((flag.parse().unwrap_or(-1), p.parse().unwrap_or(-1), v.clone()))
                }
                _ => None,
            };
            match (parsed, &reply) {
                (Some((1, _, _)), _) => granted += 1,
                (Some((0, p, value)), _) => {
                    held += 1;
                    failures.push((name.clone(), NodeFailure::Held));
                    if let Some(value) = value {
                        *holders.entry(value).or_default() += 1;
                    }
                    if let Ok(p) = u64::try_from(p) {
                        let p = Duration::from_millis(p);
                        pttl = Some(pttl.map_or(p, |q| q.min(p)));
                    }
                }
                (_, Err(f)) => failures.push((name.clone(), f.clone())),
                (_, Ok(other)) => {
                    failures.push((
                        name.clone(),
                        NodeFailure::Error(format!("unexpected reply {other:?}")),
                    ));
                }
            }
        }
        let quorum = self.quorum();
        let validity = ttl
            .checked_sub(elapsed + self.inner.config.drift(ttl))
            .unwrap_or_default();
        if granted >= quorum && !validity.is_zero() {
            cleanup.disarm();
            return Ok(Attempt::Granted { value, sent });
        }
        // Not ours: give back what we got, on every node (the silent ones
        // too); nodes that did not answer are asked again in the background.
        // (For a second at most: a busy moment, not an outage, which would
        // otherwise leave a retrying task behind every failed attempt; the
        // TTL is the backstop.)
        let given_back = self.release_everywhere(lock_key, &value).await;
        cleanup.disarm();
        if given_back.unanswered() > 0 {
            let until = saturating_add(sent, ttl).min(saturating_add(Instant::now(), GIVE_BACK_RETRIES));
            self.release_in_background(lock_key.to_owned(), value.clone(), until);
        }
        let error = QuorumError {
            operation: "acquire",
            needed: quorum,
            got: granted,
            validity_used_up: granted >= quorum,
            failures,
        };
        let silent = self.inner.nodes.len() - granted - held;
        Ok(
            if silent > self.inner.nodes.len() - quorum || error.validity_used_up {
                Attempt::NoQuorum(error)
            } else {
                Attempt::Contended {
                    pttl,
                    held: holders.values().any(|&n| n >= quorum),
                }
            },
        )
    }

    /// Takes a waiter out of the key's queue on every node, in the
    /// background (it gave up).
    fn leave_in_background(&self, lock_key: &str, waiter: String) {
        if self.is_abandoned() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let lock = self.clone();
            let keys = vec![
                scripts::companion_key(lock_key, scripts::QUEUE_SUFFIX),
                scripts::companion_key(lock_key, scripts::SEEN_SUFFIX),
            ];
            drop(rt.spawn(async move {
                let leave = lock.inner.nodes.iter().map(|n| {
                    lock.inner.scripts.leave.evalsha_with_reload::<i64, _, _>(
                        &n.client,
                        keys.clone(),
                        vec![waiter.clone()],
                    )
                });
                let _ = join_all(leave).await;
            }));
        }
    }

    /// The release script on every node at once.
    pub(crate) async fn release_everywhere(&self, lock_key: &str, value: &str) -> Tally {
        let channel = scripts::channel(lock_key);
        let channel = channel.as_str();
        let (queue, seen) = (
            scripts::companion_key(lock_key, scripts::QUEUE_SUFFIX),
            scripts::companion_key(lock_key, scripts::SEEN_SUFFIX),
        );
        let (queue, seen) = (queue.as_str(), seen.as_str());
        let replies = fan_out(
            self.inner.nodes.len(),
            self.inner.config.node_timeout,
            |i| async move {
                let reply: i64 = self
                    .inner
                    .scripts
                    .release
                    .evalsha_with_reload(
                        &self.inner.nodes[i].client,
                        vec![lock_key, queue, seen],
                        vec![value, channel],
                    )
                    .await?;
                Ok(Outcome::from_reply(BACKEND, reply).unwrap_or(Outcome::HeldByOther))
            },
        )
        .await;
        Tally::of(&self.inner.names, replies)
    }

    /// The extend script on every node at once.
    pub(crate) async fn extend_everywhere(&self, lock_key: &str, value: &str, ttl: Duration) -> Tally {
        let ttl_ms = millis(ttl).to_string();
        let ttl_ms = ttl_ms.as_str();
        let replies = fan_out(
            self.inner.nodes.len(),
            self.inner.config.node_timeout,
            |i| async move {
                let reply: i64 = self
                    .inner
                    .scripts
                    .extend
                    .evalsha_with_reload(&self.inner.nodes[i].client, vec![lock_key], vec![value, ttl_ms])
                    .await?;
                Ok(Outcome::from_reply(BACKEND, reply).unwrap_or(Outcome::HeldByOther))
            },
        )
        .await;
        Tally::of(&self.inner.names, replies)
    }

    /// The error for a tally without a verdict: no quorum answered.
    pub(crate) fn no_quorum(&self, operation: &'static str, tally: Tally) -> Error {
        Error::unavailable(
            BACKEND,
            QuorumError {
                operation,
                needed: self.quorum(),
                got: tally.done,
                failures: tally.failures,
                validity_used_up: false,
            },
        )
    }

    /// Releases on every node in the background (for drops).
    pub(crate) fn release_in_background(&self, lock_key: String, value: String, until: Instant) {
        if self.is_abandoned() {
            return;
        }
        let (lock, gone) = (self.clone(), self.clone());
        // On every node at once, again while some node did not answer, until
        // `until` (past it the key has expired everywhere by its TTL).
        dlock_core::driver::clean_up_in_background(
            format!("redlock: release {lock_key}"),
            Some(until),
            move || gone.is_abandoned(),
            move || {
                let (lock, lock_key, value) = (lock.clone(), lock_key.clone(), value.clone());
                async move {
                    let tally = lock.release_everywhere(&lock_key, &value).await;
                    match tally.unanswered() {
                        0 => Ok(()),
                        n => Err(Error::unavailable(
                            BACKEND,
                            format!("{n} node(s) did not answer the release"),
                        )),
                    }
                }
            },
        );
    }
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field("config", &self.inner.config)
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
        Capabilities::new(Fencing::None, false, Waiting::Notified, MIN_TTL)
    }

    /// See [`Lock::acquire`]. Each round sends the acquire script to every
    /// node at once (with [`Wait::No`]: one round, or up to five when rounds
    /// end in split votes with no quorum held by anyone); a grant needs a quorum and validity left
    /// (`ttl - elapsed - drift > 0`, elapsed on the monotonic clock from the
    /// first send). A failed round is released on every node before the next.
    /// Between rounds: a release notice from any node, or a random delay.
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
    async fn acquire(&self, key: &LockKey, opts: AcquireOptions) -> Result<RedlockGuard> {
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
                self.clone(),
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
                let jitter = self.inner.config.retry_jitter;
                tokio::time::sleep(jitter.mul_f64(rand::random::<f64>())).await;
                last = match self.attempt(&lock_key, ttl, None).await? {
                    Attempt::Granted { value, sent } => return Ok(grant(value, sent)),
                    other => other,
                };
            }
            return Err(failed(last));
        }
        let waiting = self
            .inner
            .waiters
            .wait_on(scripts::channel(&lock_key), deadline)
            .await;
        // Queued on every node from the next attempt on (a release names
        // its node's first live waiter); out of the queues again on a grant
        // (by the script) or when this call ends otherwise (here).
        let mut queued = LeaveOnDrop {
            lock: self,
            lock_key: &lock_key,
            waiter: &waiting.id,
            armed: true,
        };
        loop {
            let notified = waiting.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            last = match self.attempt(&lock_key, ttl, Some(&waiting.id)).await? {
                Attempt::Granted { value, sent } => {
                    queued.armed = false;
                    return Ok(grant(value, sent));
                }
                other => other,
            };
            let jitter = self.inner.config.retry_jitter;
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

/// Takes a waiter that gave up out of the key's queues, so releases do not
/// name it.
struct LeaveOnDrop<'a> {
    lock: &'a Redlock,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_window_covers_four_rounds_and_never_overflows() {
        let mut c = RedlockConfig::new(["redis://127.0.0.1:1"]);
        assert_eq!(waiter_window(&c), 1000);
        c.node_timeout = Duration::from_millis(500);
        assert_eq!(waiter_window(&c), 4 * (100 + 1000));
        c.node_timeout = Duration::MAX;
        assert_eq!(
            u128::from(waiter_window(&c)),
            dlock_core::driver::FAR_FUTURE.as_millis()
        );
    }
}
