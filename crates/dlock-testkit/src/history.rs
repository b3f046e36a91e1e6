//! A history recorder and checker.
//!
//! Clients record what they did and saw, all on one monotonic clock; the
//! checker then looks for what the contract forbids:
//!
//! - **overlapping holds** (where the backend promises exclusion): a hold
//!   runs from the client seeing `AcquireOk` to it *invoking* the release (or
//!   noticing the loss). Both ends are taken on the side that favours the
//!   driver, so every overlap reported is a real one;
//! - **token order**: for one key, tokens strictly increase in grant order;
//! - **the fenced resource** never accepts a token lower than one it already
//!   accepted (write events are recorded in the order the resource decided).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::FencingToken;

/// What happened, from one client's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The client called acquire.
    AcquireInvoke,
    /// Acquire returned a guard, with this token.
    AcquireOk(Option<FencingToken>),
    /// Acquire returned a definite refusal (timeout, held).
    AcquireFail,
    /// Acquire returned an error after which the grant is unknown.
    AcquireUnknown,
    /// The client noticed its lock was lost (`lost()` fired or `is_held()` false).
    Lost,
    /// The client is about to release (recorded before the call).
    Release,
    /// A fenced write with this token, and whether the resource accepted it.
    Write {
        /// The token presented.
        token: FencingToken,
        /// Whether the resource accepted it.
        accepted: bool,
    },
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Time since the history started (monotonic clock).
    pub at: Duration,
    /// Which client.
    pub client: usize,
    /// Which key (or resource, for writes).
    pub key: String,
    /// What happened.
    pub op: Op,
}

/// A shared, append-only history. Cloning shares it.
#[derive(Debug, Clone)]
pub struct History {
    start: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> Self {
        History {
            start: Instant::now(),
            events: Arc::default(),
        }
    }

    /// Records `op` by `client` on `key`, stamped now.
    pub fn record(&self, client: usize, key: &str, op: Op) {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        // Stamp under the lock, so the order of the list is the order of time.
        events.push(Event {
            at: self.start.elapsed(),
            client,
            key: key.to_owned(),
            op,
        });
    }

    /// Records `op` stamped at `at`, an instant already past: for events whose
    /// time is known only afterwards (e.g. the moment a paused client's grant
    /// stopped being valid: its local deadline).
    pub fn record_at(&self, at: Instant, client: usize, key: &str, op: Op) {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        events.push(Event {
            at: at.saturating_duration_since(self.start),
            client,
            key: key.to_owned(),
            op,
        });
    }

    /// A copy of the events so far, in time order.
    pub fn events(&self) -> Vec<Event> {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner).clone();
        events.sort_by_key(|e| e.at); // stable: same-instant events keep their order
        events
    }

    /// Checks the history. `exclusion`: the backend promises no overlapping
    /// holds; `fencing`: it promises strictly increasing tokens.
    pub fn check(&self, exclusion: bool, fencing: bool) -> Report {
        check(&self.events(), exclusion, fencing)
    }
}

/// One hold, from grant seen to release invoked or loss seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Which client held.
    pub client: usize,
    /// The key.
    pub key: String,
    /// The grant's token.
    pub token: Option<FencingToken>,
    /// When the client saw the grant.
    pub from: Duration,
    /// When it invoked release or saw the loss; `None` if never.
    pub to: Option<Duration>,
}

/// What the checker found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Grants seen.
    pub grants: usize,
    /// Pairs of holds of one key that overlapped (where exclusion is promised).
    pub overlaps: Vec<(Hold, Hold)>,
    /// Consecutive grants of one key whose tokens did not strictly increase.
    pub token_regressions: Vec<(Hold, Hold)>,
    /// Grants without a token on a fencing backend.
    pub missing_tokens: usize,
    /// Fenced writes accepted.
    pub writes_accepted: usize,
    /// Fenced writes rejected.
    pub writes_rejected: usize,
    /// Writes the resource accepted although it had accepted a higher token.
    pub stale_accepted: Vec<Event>,
}

impl Report {
    /// `true` when nothing forbidden was found.
    pub fn is_ok(&self) -> bool {
        self.overlaps.is_empty()
            && self.token_regressions.is_empty()
            && self.missing_tokens == 0
            && self.stale_accepted.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} grants, {} overlapping holds, {} token regressions, {} grants without token, \
             fenced writes {} accepted / {} rejected, {} stale writes accepted",
            self.grants,
            self.overlaps.len(),
            self.token_regressions.len(),
            self.missing_tokens,
            self.writes_accepted,
            self.writes_rejected,
            self.stale_accepted.len()
        )?;
        if let Some((a, b)) = self.overlaps.first() {
            write!(f, "; first overlap: {a:?} and {b:?}")?;
        }
        if let Some((a, b)) = self.token_regressions.first() {
            write!(f, "; first regression: {a:?} then {b:?}")?;
        }
        if let Some(e) = self.stale_accepted.first() {
            write!(f, "; first stale write: {e:?}")?;
        }
        Ok(())
    }
}

/// Checks a list of events, which must be in time order; see the module docs.
pub fn check(events: &[Event], exclusion: bool, fencing: bool) -> Report {
    let mut report = Report::default();
    let mut holds: Vec<Hold> = Vec::new();
    let mut open: HashMap<(usize, String), usize> = HashMap::new();
    let mut highest: HashMap<String, FencingToken> = HashMap::new();

    for e in events {
        let id = (e.client, e.key.clone());
        match e.op {
            Op::AcquireOk(token) => {
                report.grants += 1;
                if fencing && token.is_none() {
                    report.missing_tokens += 1;
                }
                open.insert(id, holds.len());
                holds.push(Hold {
                    client: e.client,
                    key: e.key.clone(),
                    token,
                    from: e.at,
                    to: None,
                });
            }
            Op::Release | Op::Lost => {
                if let Some(i) = open.remove(&id) {
                    holds[i].to = Some(e.at);
                }
            }
            Op::Write { token, accepted } => {
                if accepted {
                    report.writes_accepted += 1;
                    match highest.get(&e.key) {
                        Some(&h) if token < h => report.stale_accepted.push(e.clone()),
                        _ => {
                            highest.insert(e.key.clone(), token);
                        }
                    }
                } else {
                    report.writes_rejected += 1;
                }
            }
            Op::AcquireInvoke | Op::AcquireFail | Op::AcquireUnknown => {}
        }
    }

    let mut by_key: HashMap<&str, Vec<&Hold>> = HashMap::new();
    for h in &holds {
        by_key.entry(h.key.as_str()).or_default().push(h);
    }
    for list in by_key.values_mut() {
        list.sort_by_key(|h| h.from);
        if exclusion {
            // Against the hold that ends last among those started earlier.
            let mut latest: Option<&Hold> = None;
            for &h in list.iter() {
                if let Some(prev) = latest {
                    let prev_end = prev.to.unwrap_or(Duration::MAX);
                    if h.from < prev_end {
                        report.overlaps.push((prev.clone(), h.clone()));
                    }
                }
                let ends_later =
                    latest.is_none_or(|p| h.to.unwrap_or(Duration::MAX) > p.to.unwrap_or(Duration::MAX));
                if ends_later {
                    latest = Some(h);
                }
            }
        }
        if fencing {
            for pair in list.windows(2) {
                if let (Some(a), Some(b)) = (pair[0].token, pair[1].token)
                    && b <= a
                {
                    report.token_regressions.push((pair[0].clone(), pair[1].clone()));
                }
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ms: u64, client: usize, op: Op) -> Event {
        Event {
            at: Duration::from_millis(ms),
            client,
            key: "k".into(),
            op,
        }
    }
    fn t(n: u64) -> Option<FencingToken> {
        Some(FencingToken::new(n))
    }

    #[test]
    fn a_clean_handoff_passes() {
        let h = [
            ev(0, 1, Op::AcquireOk(t(1))),
            ev(5, 1, Op::Release),
            ev(6, 2, Op::AcquireOk(t(2))),
            ev(9, 2, Op::Lost),
        ];
        let r = check(&h, true, true);
        assert!(r.is_ok(), "{r}");
        assert_eq!(r.grants, 2);
    }

    #[test]
    fn finds_overlaps_regressions_and_stale_writes() {
        let w = |ms, c, n, accepted| {
            ev(
                ms,
                c,
                Op::Write {
                    token: FencingToken::new(n),
                    accepted,
                },
            )
        };
        let h = [
            ev(0, 1, Op::AcquireOk(t(5))),
            w(1, 1, 5, true),
            ev(2, 2, Op::AcquireOk(t(5))), // overlaps 1, token not higher
            w(3, 2, 7, true),
            w(4, 1, 5, true), // lower than 7: stale
            ev(5, 1, Op::Release),
            ev(6, 2, Op::Release),
        ];
        let r = check(&h, true, true);
        assert_eq!(r.overlaps.len(), 1);
        assert_eq!(r.token_regressions.len(), 1);
        assert_eq!(r.stale_accepted.len(), 1);
        assert!(!r.is_ok());
        // Without promises of exclusion or fencing, only the stale write remains.
        let r = check(&h, false, false);
        assert!(r.overlaps.is_empty() && r.token_regressions.is_empty());
        assert_eq!(r.stale_accepted.len(), 1);
    }

    #[test]
    fn an_unreleased_hold_overlaps_everything_after_it() {
        let h = [
            ev(0, 1, Op::AcquireOk(t(1))),
            ev(10, 2, Op::AcquireOk(t(2))),
            ev(11, 2, Op::Release),
            ev(20, 3, Op::AcquireOk(t(3))),
        ];
        assert_eq!(check(&h, true, true).overlaps.len(), 2);
    }
}
