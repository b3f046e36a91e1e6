//! The protocol, this driver's side: the only file that talks to the
//! nodes. The scripts, their keys, arguments and replies are
//! `dlock_redis_protocol`'s (shared with `dlock-redis`); here are the N
//! connections, each request sent to every node at once (bounded by the
//! node timeout), and what came back, tallied.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dlock_core::driver::Refusal;
use dlock_core::driver::redact_url;
use dlock_core::{Error, Result};
use dlock_redis_protocol::calls::{Scripts, Unfenced};
use dlock_redis_protocol::{outcome_of, scripts};
use fred::clients::{Client, SubscriberClient};
use fred::interfaces::ClientLike;
use fred::types::Builder;
use fred::types::config::{Config, ReconnectPolicy};
use futures::StreamExt;
use futures::future::join_all;
use tokio::task::JoinHandle;

use crate::config::RedlockConfig;
use crate::error::{BACKEND, map_err};
use crate::quorum::{NodeFailure, QuorumError, Tally, fan_out, fan_out_until};

/// The shortest TTL Redlock honours: below this, the per-node timeout and
/// the drift allowance leave no validity.
pub const MIN_TTL: Duration = Duration::from_millis(100);

struct Node {
    client: Client,
    subscriber: SubscriberClient,
}

/// What a handle and its guards share to talk to the nodes: a command and
/// a subscriber connection per node, their names (URLs, passwords hidden),
/// the configuration, the scripts, and whether the handle was abandoned
/// (then nothing more is sent: as if the process had died).
pub(crate) struct Conn {
    nodes: Vec<Node>,
    pub(crate) names: Vec<String>,
    pub(crate) config: RedlockConfig,
    scripts: Scripts,
    abandoned: AtomicBool,
    /// Keeps every guard of this handle, in one task.
    pub(crate) keeper: dlock_core::driver::Keeper,
}

/// The last user gone (the handle and every guard): every connection is
/// closed in the background.
impl Drop for Conn {
    fn drop(&mut self) {
        for node in &self.nodes {
            let (c, s) = (node.client.clone(), node.subscriber.clone());
            dlock_core::driver::spawn_detached("redlock: close a node's connections", async move {
                let _ = c.quit().await;
                let _ = s.quit().await;
            });
        }
    }
}

impl Conn {
    /// Builds every node's clients and starts connecting them (they
    /// reconnect until they quit); returns the subscription tasks.
    pub(crate) fn start(config: RedlockConfig) -> Result<(Self, Vec<JoinHandle<()>>)> {
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
                    p.default_command_timeout = config.request_timeout.max(Duration::from_millis(1))
                })
                // Independent nodes: come back quickly after a restart.
                .set_policy(ReconnectPolicy::new_exponential(0, 20, 500, 2));
            nodes.push(Node {
                client: builder.build().map_err(map_err)?,
                subscriber: builder.build_subscriber_client().map_err(map_err)?,
            });
        }
        let mut tasks = Vec::new();
        for node in &nodes {
            drop(node.client.connect());
            drop(node.subscriber.connect());
            tasks.push(node.subscriber.manage_subscriptions());
        }
        let names = config.nodes.iter().map(|u| redact_url(u)).collect();
        let conn = Conn {
            nodes,
            names,
            config,
            scripts: Scripts::default(),
            abandoned: AtomicBool::new(false),
            keeper: dlock_core::driver::Keeper::new(),
        };
        Ok((conn, tasks))
    }

    /// Each node's subscriber connection (for release notices).
    pub(crate) fn subscribers(&self) -> Vec<SubscriberClient> {
        self.nodes.iter().map(|n| n.subscriber.clone()).collect()
    }

    /// Whether each node's connections (both) are up.
    pub(crate) fn up(&self) -> Vec<bool> {
        self.nodes
            .iter()
            .map(|n| n.client.is_connected() && n.subscriber.is_connected())
            .collect()
    }

    /// Whether each node's command connection is up.
    pub(crate) fn commands_up(&self) -> Vec<bool> {
        self.nodes.iter().map(|n| n.client.is_connected()).collect()
    }

    pub(crate) fn quorum(&self) -> usize {
        self.config.quorum()
    }

    pub(crate) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// Marks the handle abandoned and closes every connection.
    pub(crate) async fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        join_all(self.nodes.iter().map(|n| async {
            let _ = n.client.quit().await;
            let _ = n.subscriber.quit().await;
        }))
        .await;
    }

    /// The acquire script on every node at once, until `needed` said yes
    /// (the slower nodes are not waited for: `None` for them). Each node's
    /// commands run [`to_the_end`](dlock_redis_protocol::to_the_end): an
    /// acquire nobody waits for any more (cancelled, or a quorum reached
    /// without it) is never written late.
    pub(crate) async fn acquire_everywhere(
        &self,
        lock_key: &str,
        value: &str,
        ttl: Duration,
        waiter: Option<(&str, u64)>,
        needed: usize,
    ) -> Vec<Option<std::result::Result<Unfenced, NodeFailure>>> {
        fan_out_until(
            self.nodes.len(),
            self.config.request_timeout,
            |i| {
                self.scripts
                    .acquire_unfenced(&self.nodes[i].client, lock_key, value, ttl, waiter)
            },
            |r| *r == Unfenced::Granted,
            needed,
        )
        .await
    }

    /// The release script on every node at once.
    pub(crate) async fn release_everywhere(&self, lock_key: &str, value: &str) -> Tally {
        let replies = fan_out(self.nodes.len(), self.config.request_timeout, |i| async move {
            let reply = self
                .scripts
                .release(&self.nodes[i].client, lock_key, value)
                .await?;
            Ok(outcome_of(BACKEND, reply).unwrap_or(Err(Refusal::HeldByOther)))
        })
        .await;
        Tally::of(&self.names, replies)
    }

    /// The extend script on every node at once.
    pub(crate) async fn extend_everywhere(&self, lock_key: &str, value: &str, ttl: Duration) -> Tally {
        let replies = fan_out(self.nodes.len(), self.config.request_timeout, |i| async move {
            let reply = self
                .scripts
                .extend(&self.nodes[i].client, lock_key, value, ttl)
                .await?;
            Ok(outcome_of(BACKEND, reply).unwrap_or(Err(Refusal::HeldByOther)))
        })
        .await;
        Tally::of(&self.names, replies)
    }

    /// A waiter gives up its place, on every node at once.
    pub(crate) async fn leave_everywhere(&self, lock_key: &str, waiter: &str) {
        let leave = self
            .nodes
            .iter()
            .map(|n| self.scripts.leave(&n.client, lock_key, waiter));
        let _ = join_all(leave).await;
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

    /// Every lock key starting with `start` that any reachable node holds
    /// (companion keys left out), sorted.
    ///
    /// # Errors
    ///
    /// When no node could be scanned, the last node's error.
    pub(crate) async fn lock_keys(&self, start: &str) -> Result<Vec<String>> {
        let mut pattern = String::new();
        for c in start.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('*');
        let mut keys = Vec::new();
        let mut scanned = 0;
        let mut last_error = None;
        for node in &self.nodes {
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
                            .map(|k| k.to_owned()),
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
        if scanned == 0
            && let Some(e) = last_error
        {
            return Err(map_err(e));
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// Until when a connect waits: every node up, or the connect timeout,
    /// or a short grace once a quorum is up.
    pub(crate) async fn wait_connected(&self, started: Instant) -> Vec<std::result::Result<(), NodeFailure>> {
        let quorum = self.quorum();
        let grace = self.config.request_timeout.saturating_mul(4);
        let mut quorum_at: Option<Instant> = None;
        loop {
            let up = self.up();
            let count = up.iter().filter(|&&u| u).count();
            if count >= quorum && quorum_at.is_none() {
                quorum_at = Some(Instant::now());
            }
            let now = Instant::now();
            let done = count == up.len()
                || now >= dlock_core::driver::saturating_add(started, self.config.connect_timeout)
                || quorum_at.is_some_and(|t| now >= dlock_core::driver::saturating_add(t, grace));
            if done {
                return up
                    .into_iter()
                    .map(|u| if u { Ok(()) } else { Err(NodeFailure::Timeout) })
                    .collect();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The handle's connection, as its guards' leases see it.
impl dlock_core::driver::LeaseHome for Conn {
    const BACKEND: &'static str = BACKEND;

    fn keeper(&self) -> &dlock_core::driver::Keeper {
        &self.keeper
    }

    fn is_abandoned(&self) -> bool {
        Conn::is_abandoned(self)
    }
}
