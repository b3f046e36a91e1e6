//! Who held what, ours and theirs on one clock, and what that may not
//! show: a writer (or a mutex's holder) beside anyone, more permits than
//! the limit, and tokens out of the grant order.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Guard, Lock, LockKey, Role, Wait};

use super::{Ask, Contender, REPLY_LIMIT, ReferenceError, Result};

/// One hold, from the moment its holder was seen holding (our acquire
/// returned; their `granted` line was read) to the moment its release was
/// asked for. Both ends favour the holder (the hold really began earlier
/// and ended later), so every overlap found is a real one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// Who held (e.g. `dlock-1`, `curator c2`).
    pub who: String,
    /// What it held.
    pub role: Role,
    /// Its token (`czxid`, create revision).
    pub token: Option<u64>,
    /// Seen holding, since the record started.
    pub from: Duration,
    /// Release asked for; `None` while it holds.
    pub to: Option<Duration>,
}

impl Span {
    fn end(&self) -> Duration {
        self.to.unwrap_or(Duration::MAX)
    }

    fn exclusive(&self) -> bool {
        matches!(self.role, Role::Mutex | Role::Write)
    }

    fn permits(&self) -> u64 {
        match self.role {
            Role::Permits(n) => u64::from(n),
            _ => 0,
        }
    }
}

/// A shared record of holds. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Holds {
    start: Instant,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Default for Holds {
    fn default() -> Self {
        Self::new()
    }
}

impl Holds {
    /// An empty record whose clock starts now.
    pub fn new() -> Self {
        Holds {
            start: Instant::now(),
            spans: Arc::default(),
        }
    }

    /// `who` is seen holding `role` (with `token`): call it once the grant
    /// is in. Returns the hold's number for [`end`](Self::end).
    pub fn begin(&self, who: &str, role: Role, token: Option<u64>) -> usize {
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        spans.push(Span {
            who: who.to_owned(),
            role,
            token,
            from: self.start.elapsed(),
            to: None,
        });
        spans.len() - 1
    }

    /// Hold `span` ends: call it *before* asking for the release.
    pub fn end(&self, span: usize) {
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = spans.get_mut(span) {
            s.to = Some(self.start.elapsed());
        }
    }

    /// The holds so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Checks the record: a mutex's holder or a writer beside anyone; more
    /// than `limit` permits at once; and, for holds that exclude each other
    /// (one of them a mutex's or a write) and did not overlap, a token of
    /// the earlier not below the later's.
    pub fn check(&self, limit: u32) -> HoldsReport {
        check(&self.spans(), limit)
    }
}

/// What [`Holds::check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HoldsReport {
    /// Holds recorded.
    pub holds: usize,
    /// Holds per holder.
    pub by: BTreeMap<String, usize>,
    /// The most holders at once.
    pub most_at_once: usize,
    /// Holds that overlapped where they may not, or permits over the limit.
    pub violations: Vec<String>,
    /// Excluding holds whose tokens are not in their grant order.
    pub disorder: Vec<String>,
}

impl HoldsReport {
    /// Nothing forbidden was found.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty() && self.disorder.is_empty()
    }

    /// Holds whose holder's name starts with `prefix`.
    pub fn holds_by(&self, prefix: &str) -> usize {
        self.by
            .iter()
            .filter(|(who, _)| who.starts_with(prefix))
            .map(|(_, n)| n)
            .sum()
    }
}

impl fmt::Display for HoldsReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} holds {:?}; most at once {}; {} overlaps where exclusion is promised; {} tokens out of order",
            self.holds,
            self.by,
            self.most_at_once,
            self.violations.len(),
            self.disorder.len()
        )?;
        if let Some(v) = self.violations.first() {
            write!(f, "; first overlap: {v}")?;
        }
        if let Some(d) = self.disorder.first() {
            write!(f, "; first disorder: {d}")?;
        }
        Ok(())
    }
}

fn check(spans: &[Span], limit: u32) -> HoldsReport {
    let mut report = HoldsReport {
        holds: spans.len(),
        ..HoldsReport::default()
    };
    for s in spans {
        *report.by.entry(s.who.clone()).or_default() += 1;
    }
    let show = |s: &Span| {
        format!(
            "{} {} (token {:?}) {:?}..{:?}",
            s.who, s.role, s.token, s.from, s.to
        )
    };
    for (i, a) in spans.iter().enumerate() {
        // Who holds at the moment `a` is seen holding.
        let at_once: Vec<&Span> = spans
            .iter()
            .filter(|b| b.from <= a.from && a.from < b.end())
            .collect();
        report.most_at_once = report.most_at_once.max(at_once.len());
        let permits: u64 = at_once.iter().map(|b| b.permits()).sum();
        if permits > u64::from(limit) {
            report.violations.push(format!(
                "{permits} permits of {limit} held when {} began: {}",
                show(a),
                at_once.iter().map(|b| show(b)).collect::<Vec<_>>().join(", ")
            ));
        }
        for b in &spans[i + 1..] {
            if !(a.exclusive() || b.exclusive()) {
                continue;
            }
            let overlap = a.from < b.end() && b.from < a.end();
            if overlap {
                report
                    .violations
                    .push(format!("{} overlapped {}", show(a), show(b)));
                continue;
            }
            let (first, then) = if a.end() <= b.from { (a, b) } else { (b, a) };
            if let (Some(x), Some(y)) = (first.token, then.token)
                && x >= y
            {
                report
                    .disorder
                    .push(format!("{} before {}", show(first), show(then)));
            }
        }
    }
    report
}

/// What a free run contends for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    /// The mutex.
    Mutex,
    /// The read-write lock: each contender writes every third time.
    ReadWrite,
    /// One permit of a semaphore of `limit`.
    Semaphore {
        /// The semaphore's limit.
        limit: u32,
    },
}

impl Primitive {
    fn role(self, turn: usize) -> Role {
        match self {
            Primitive::Mutex => Role::Mutex,
            Primitive::ReadWrite if turn.is_multiple_of(3) => Role::Write,
            Primitive::ReadWrite => Role::Read,
            Primitive::Semaphore { .. } => Role::Permits(1),
        }
    }

    fn limit(self) -> u32 {
        match self {
            Primitive::Semaphore { limit } => limit,
            _ => 1,
        }
    }
}

/// One of our clients in a free run.
#[derive(Debug, Clone)]
pub struct Ours<L> {
    /// Its name in the report (e.g. `dlock-auto`).
    pub name: String,
    /// The client (its own connection and session).
    pub lock: L,
    /// Its grants' `auto_extend`; either way it calls `extend()` once in
    /// every hold, while the others wait.
    pub auto_extend: bool,
    /// Its grants' TTL.
    pub ttl: Duration,
}

/// What a free run found.
#[derive(Debug, Clone)]
pub struct FreeRun {
    /// The record's verdict.
    pub report: HoldsReport,
    /// The holds themselves.
    pub spans: Vec<Span>,
}

/// A hold's length: a few milliseconds of "work".
fn work() -> Duration {
    Duration::from_micros(rand::random_range(500..4_000))
}

/// Our clients and the reference client's contenders loop on one lock for
/// `run_for` (each finishing its turn), recording every hold. `key` is the
/// lock's name for ours, `path` the same lock as the reference client names
/// it. Each contender's `n`-th turn takes [`Primitive`]'s role for its turn
/// (offset by its place, so reads and writes mix).
///
/// # Errors
///
/// When a contender fails or a reply does not come in time; our grants
/// that were lost while held are errors too.
pub async fn free_run<L: Lock>(
    primitive: Primitive,
    key: &LockKey,
    path: &str,
    ours: Vec<Ours<L>>,
    theirs: Vec<Contender>,
    run_for: Duration,
) -> Result<FreeRun> {
    let holds = Holds::new();
    let until = Instant::now() + run_for;
    let mut tasks = tokio::task::JoinSet::new();
    for (place, us) in ours.into_iter().enumerate() {
        let (holds, key) = (holds.clone(), key.clone());
        tasks.spawn(async move {
            let opts = AcquireOptions::default()
                .ttl(us.ttl)
                .auto_extend(us.auto_extend)
                .wait(Wait::For(REPLY_LIMIT));
            let fail = |e: &dyn fmt::Display| ReferenceError(format!("{}: {e}", us.name));
            let mut turn = place;
            while Instant::now() < until {
                let role = primitive.role(turn);
                turn += 1;
                let g = match role {
                    Role::Mutex => us.lock.acquire(&key, opts).await,
                    Role::Read => us.lock.acquire_read(&key, opts).await,
                    Role::Write => us.lock.acquire_write(&key, opts).await,
                    Role::Permits(n) => us.lock.acquire_permits(&key, n, primitive.limit(), opts).await,
                }
                .map_err(|e| fail(&e))?;
                let span = holds.begin(&us.name, role, g.token().map(|t| t.get()));
                tokio::time::sleep(work()).await;
                g.extend(us.ttl).await.map_err(|e| fail(&e))?;
                tokio::time::sleep(work()).await;
                if !g.is_held() {
                    return Err(fail(&"a grant was lost while held"));
                }
                holds.end(span);
                g.release().await.map_err(|e| fail(&e))?;
            }
            Ok(())
        });
    }
    for (place, them) in theirs.into_iter().enumerate() {
        let (holds, path) = (holds.clone(), path.to_owned());
        tasks.spawn(async move {
            let who = format!("{} {}", them.client(), them.id());
            let mut turn = place + 1;
            while Instant::now() < until {
                let role = primitive.role(turn);
                turn += 1;
                let ask = match role {
                    Role::Mutex => Ask::Mutex(&path),
                    Role::Read => Ask::Read(&path),
                    Role::Write => Ask::Write(&path),
                    Role::Permits(_) => Ask::Semaphore(&path, primitive.limit()),
                };
                let g = them.acquire(ask).await?;
                let span = holds.begin(&who, role, Some(g.token));
                tokio::time::sleep(work() * 2).await;
                holds.end(span);
                them.release().await?;
            }
            Ok(())
        });
    }
    let mut first_error = None;
    while let Some(done) = tasks.join_next().await {
        let r = done.unwrap_or_else(|e| Err(ReferenceError(format!("a contender's task failed: {e}"))));
        if let Err(e) = r {
            first_error.get_or_insert(e);
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(FreeRun {
        report: holds.check(primitive.limit()),
        spans: holds.spans(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(who: &str, role: Role, token: u64, from: u64, to: u64) -> Span {
        Span {
            who: who.to_owned(),
            role,
            token: Some(token),
            from: Duration::from_millis(from),
            to: Some(Duration::from_millis(to)),
        }
    }

    #[test]
    fn readers_share_and_writers_do_not() {
        let ok = [
            span("a", Role::Read, 1, 0, 10),
            span("b", Role::Read, 2, 5, 15),
            span("c", Role::Write, 3, 15, 20),
            span("d", Role::Read, 4, 20, 30),
        ];
        let r = check(&ok, 1);
        assert!(r.is_ok(), "{r}");
        assert_eq!(r.most_at_once, 2);
        let bad = [span("a", Role::Read, 1, 0, 10), span("w", Role::Write, 2, 9, 12)];
        assert_eq!(check(&bad, 1).violations.len(), 1);
        let bad = [span("a", Role::Mutex, 1, 0, 10), span("b", Role::Mutex, 2, 3, 4)];
        assert_eq!(check(&bad, 1).violations.len(), 1);
    }

    #[test]
    fn permits_count_to_the_limit() {
        let two = [
            span("a", Role::Permits(1), 9, 0, 10),
            span("b", Role::Permits(1), 1, 1, 10),
            span("c", Role::Permits(1), 5, 10, 12),
        ];
        assert!(check(&two, 2).is_ok(), "permits carry no order");
        let three = [
            span("a", Role::Permits(1), 1, 0, 10),
            span("b", Role::Permits(1), 2, 1, 10),
            span("c", Role::Permits(1), 3, 2, 12),
        ];
        assert_eq!(check(&three, 2).violations.len(), 1);
    }

    #[test]
    fn excluding_holds_take_tokens_in_order() {
        let h = [span("a", Role::Write, 5, 0, 10), span("b", Role::Read, 4, 11, 12)];
        assert_eq!(check(&h, 1).disorder.len(), 1);
        let h = [span("a", Role::Read, 5, 0, 10), span("b", Role::Read, 4, 11, 12)];
        assert!(check(&h, 1).is_ok(), "reads are not ordered among themselves");
    }
}
