//! What a scenario returns: [`Verdict`] or [`Failure`], and the small helpers
//! scenarios use to wait on conditions with a deadline.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

/// A scenario that did not fail either passed or did not apply to the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Everything the scenario checks held.
    Passed,
    /// The backend's capabilities say the scenario does not apply (e.g. FIFO
    /// order on a non-FIFO backend). The reason says which capability.
    Skipped(&'static str),
}

/// Why a scenario failed: a sentence for a human.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

impl From<dlock_core::Error> for Failure {
    fn from(e: dlock_core::Error) -> Self {
        Failure(format!("unexpected lock error: {e} ({e:?})"))
    }
}

/// The result of one scenario.
pub type ScenarioResult = Result<Verdict, Failure>;

/// Fails the scenario with a formatted message unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::Failure(format!($($msg)+)));
        }
    };
}
pub(crate) use ensure;

/// Awaits `fut`, failing with "`what` did not happen within `limit`" if it
/// takes longer.
///
/// # Errors
///
/// A [`Failure`] naming `what` when the deadline passes first.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> Result<T, Failure> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| Failure(format!("{what} did not happen within {limit:?}")))
}

/// Polls `cond` (every few milliseconds) until it returns `true`, failing if
/// it has not by `limit`. This is how the kit waits for a condition instead of
/// sleeping "long enough".
///
/// # Errors
///
/// A [`Failure`] naming `what` when the deadline passes first, or the first
/// error `cond` returns.
pub async fn wait_until<Fut>(
    limit: Duration,
    what: &str,
    mut cond: impl FnMut() -> Fut,
) -> Result<(), Failure>
where
    Fut: Future<Output = Result<bool, Failure>>,
{
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(2);
    loop {
        if cond().await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Failure(format!("{what} did not happen within {limit:?}")));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}
