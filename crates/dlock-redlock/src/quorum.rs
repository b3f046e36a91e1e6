//! The fan-out: one request to every node at once, each bounded by the
//! per-node timeout, and the tally of what came back.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use dlock_core::driver::{Outcome, Refusal};
use futures::future::join_all;

/// Why one node did not say yes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeFailure {
    /// No reply within the per-node timeout.
    Timeout,
    /// The node could not be reached (refused, reset, not connected).
    Unreachable(String),
    /// Another client's value holds the key there.
    Held,
    /// The key was already gone there (the lock had expired).
    Expired,
    /// The node answered with an error.
    Error(String),
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeFailure::Timeout => f.write_str("timed out"),
            NodeFailure::Unreachable(why) => write!(f, "unreachable ({why})"),
            NodeFailure::Held => f.write_str("held by another"),
            NodeFailure::Expired => f.write_str("already expired"),
            NodeFailure::Error(why) => write!(f, "error ({why})"),
        }
    }
}

/// No quorum: each node that did not say yes, and why. The `source` of the
/// [`Error::Unavailable`](dlock_core::Error::Unavailable) Redlock returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumError {
    /// What was attempted (`acquire`, `extend`, `release`).
    pub operation: &'static str,
    /// How many yeses were needed.
    pub needed: usize,
    /// How many came.
    pub got: usize,
    /// Each failing node (URL, password redacted) and why.
    pub failures: Vec<(String, NodeFailure)>,
    /// Set when a quorum said yes but too late: the validity was used up.
    pub validity_used_up: bool,
}

impl fmt::Display for QuorumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "redlock {}: no quorum ({} of {} needed)",
            self.operation, self.got, self.needed
        )?;
        if self.validity_used_up {
            f.write_str("; a quorum answered, but after the lock's validity was used up")?;
        }
        for (node, why) in &self.failures {
            write!(f, "; {node}: {why}")?;
        }
        Ok(())
    }
}

impl std::error::Error for QuorumError {}

/// Classifies a fred error for one node.
pub(crate) fn node_failure(e: &fred::error::Error) -> NodeFailure {
    if *e.kind() == fred::error::ErrorKind::Timeout {
        return NodeFailure::Timeout;
    }
    match crate::error::map_err(e.clone()) {
        dlock_core::Error::Unavailable { .. } => NodeFailure::Unreachable(e.details().to_owned()),
        _ => NodeFailure::Error(e.details().to_owned()),
    }
}

/// How long the fan-out waits for a request that fred has not ended: fred's
/// own time-out (the node time-out, set as each client's command time-out)
/// ends every command, and only it marks the command so that fred never
/// writes it later. A command still queued while fred reconnects is written
/// once the node is back unless marked, so a fan-out that gave up first
/// (same figure, started a moment earlier) left an acquire to take its key
/// after an outage, for the whole TTL. The fan-out's own bound is a backstop
/// past the three commands a script call can be (`EVALSHA`, `SCRIPT LOAD`,
/// `EVALSHA`), so fred's time-out is always the one that fires.
pub(crate) fn backstop(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(3)
        .saturating_add(Duration::from_millis(10))
}

/// Runs `request(i)` for every node `i` in `0..nodes` at once, each ended by
/// fred's node time-out `timeout` (a silent node costs that much), with
/// [`backstop`] as the fan-out's own bound.
pub(crate) async fn fan_out<T, F, Fut>(
    nodes: usize,
    timeout: Duration,
    request: F,
) -> Vec<Result<T, NodeFailure>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<T, fred::error::Error>>,
{
    join_all((0..nodes).map(|i| {
        let call = request(i);
        async move {
            match tokio::time::timeout(backstop(timeout), call).await {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(node_failure(&e)),
                Err(_) => Err(NodeFailure::Timeout),
            }
        }
    }))
    .await
}

/// As [`fan_out`] (same bounds), but returns as soon as `needed` replies satisfy `yes`:
/// the slowest nodes do not hold up a grant a quorum already gave (a
/// delayed or silent node costs nothing then). Requests still in flight are
/// not recalled: each was already handed to its node's connection (and
/// runs [`to_the_end`](dlock_redis_protocol::to_the_end) where a late
/// write would take a key), so a later
/// release on that connection reaches the node after it. Their slots are
/// `None`.
pub(crate) async fn fan_out_until<T, F, Fut>(
    nodes: usize,
    timeout: Duration,
    request: F,
    yes: impl Fn(&T) -> bool,
    needed: usize,
) -> Vec<Option<Result<T, NodeFailure>>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<T, fred::error::Error>>,
{
    use futures::StreamExt;
    let mut pending: futures::stream::FuturesUnordered<_> = (0..nodes)
        .map(|i| {
            let call = request(i);
            async move {
                let r = match tokio::time::timeout(backstop(timeout), call).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(node_failure(&e)),
                    Err(_) => Err(NodeFailure::Timeout),
                };
                (i, r)
            }
        })
        .collect();
    let mut replies: Vec<Option<Result<T, NodeFailure>>> = (0..nodes).map(|_| None).collect();
    let mut said_yes = 0;
    while let Some((i, r)) = pending.next().await {
        if r.as_ref().is_ok_and(&yes) {
            said_yes += 1;
        }
        replies[i] = Some(r);
        if said_yes >= needed {
            break;
        }
    }
    replies
}

/// The tally of a release or extend fan-out.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub done: usize,
    pub expired: usize,
    pub held: usize,
    pub failures: Vec<(String, NodeFailure)>,
}

impl Tally {
    /// How many nodes gave no answer (timed out, unreachable, an error):
    /// their keys may still be there.
    pub(crate) fn unanswered(&self) -> usize {
        self.failures.len() - self.expired - self.held
    }

    pub(crate) fn of(names: &[String], replies: Vec<Result<Outcome, NodeFailure>>) -> Self {
        let mut t = Tally::default();
        for (name, reply) in names.iter().zip(replies) {
            match reply {
                Ok(Ok(())) => t.done += 1,
                Ok(Err(Refusal::Expired)) => {
                    t.expired += 1;
                    t.failures.push((name.clone(), NodeFailure::Expired));
                }
                Ok(Err(Refusal::HeldByOther)) => {
                    t.held += 1;
                    t.failures.push((name.clone(), NodeFailure::Held));
                }
                Err(f) => t.failures.push((name.clone(), f)),
            }
        }
        t
    }

    /// The verdict for a quorum of `quorum`: done with a quorum of yeses;
    /// `HeldByOther` when a quorum holds another value; `Expired` when a
    /// quorum no longer has ours; otherwise (too many nodes silent) `None`.
    pub(crate) fn verdict(&self, quorum: usize) -> Option<Outcome> {
        if self.done >= quorum {
            Some(Ok(()))
        } else if self.held >= quorum {
            Some(Err(Refusal::HeldByOther))
        } else if self.expired + self.held >= quorum {
            Some(Err(Refusal::Expired))
        } else {
            None
        }
    }
}
