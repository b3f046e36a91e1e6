//! Running scenarios: one by one from the generated tests, or all of them
//! against one factory (the broken-driver tests, reports).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::LockFactory;
use crate::outcome::{Failure, Outcome, Verdict, within};
use crate::scenarios::{self, Ctx};

/// The longest any one scenario may take, clean-up check included.
pub const SCENARIO_LIMIT: Duration = Duration::from_secs(180);

/// A running scenario's future.
pub type ScenarioFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// A scenario by name, runnable against any factory of type `F`.
pub struct Scenario<F> {
    /// The scenario's name (its function's name).
    pub name: &'static str,
    /// Runs it.
    pub run: fn(Ctx<F>) -> ScenarioFuture,
}

impl<F> std::fmt::Debug for Scenario<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The names of every scenario, in the order they run (and the callback
/// macro they are fed to). One list, used by `conformance_tests!` and
/// [`all_scenarios`].
#[doc(hidden)]
#[macro_export]
macro_rules! __with_scenarios {
    ([$($callback:tt)*] ( $($args:tt)* )) => {
        $($callback)*! { ($($args)*)
            acquire_release_reacquire,
            try_acquire_held_and_free,
            acquire_wait_times_out,
            mutual_exclusion_counter,
            tokens_increase_across_clients,
            expired_holder_cannot_release,
            extend_after_expiry_refused,
            expiry_frees_vanished_holder,
            lost_fires_on_expiry,
            auto_extend_keeps_lock,
            release_wakes_waiter,
            drop_releases,
            cancelled_acquire_leaves_nothing,
            fifo_waiters,
            many_keys_independent,
            invalid_keys_rejected,
            fenced_stale_write_rejected,
            with_lock_cancels_on_loss,
            try_acquire_race,
            extend_keeps_lock,
            namespace_clean_after_use,
            huge_durations_are_safe,
        }
    };
}

macro_rules! scenario_vec {
    (() $($name:ident),* $(,)?) => {
        vec![$(Scenario { name: stringify!($name), run: |ctx| Box::pin(scenarios::$name(ctx)) }),*]
    };
}

/// Every scenario, in order.
pub fn all_scenarios<F: LockFactory>() -> Vec<Scenario<F>> {
    __with_scenarios!([scenario_vec]())
}

/// Runs one scenario in a fresh namespace, then checks that the namespace is
/// left empty. The whole run is bounded by [`SCENARIO_LIMIT`].
///
/// # Errors
///
/// The scenario's [`Failure`], a residue failure, or a time-out.
pub async fn run_one<F: LockFactory>(factory: F, scenario: &Scenario<F>) -> Outcome {
    within(SCENARIO_LIMIT, &format!("scenario {}", scenario.name), async {
        let ctx = Ctx::new(factory).await?;
        let verdict = (scenario.run)(ctx.clone()).await?;
        ctx.await_clean().await?;
        Ok(verdict)
    })
    .await?
}

/// Runs a scenario for a generated test, panicking with the failure so the
/// test fails by name. Prints the verdict.
///
/// # Panics
///
/// When the scenario fails.
pub async fn run_scenario_test<F, M, MF>(name: &'static str, make: M)
where
    F: LockFactory,
    M: FnOnce() -> MF,
    MF: Future<Output = F>,
{
    let factory = make().await;
    let backend = factory.name();
    let scenario = all_scenarios::<F>()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no scenario named {name}"));
    match run_one(factory, &scenario).await {
        Ok(Verdict::Passed) => eprintln!("conformance {backend} {name}: passed"),
        Ok(Verdict::Skipped(why)) => eprintln!("conformance {backend} {name}: skipped ({why})"),
        Err(Failure(why)) => panic!("conformance {backend} {name}: FAILED: {why}"),
    }
}

/// Runs every scenario against factories made by `make`, in order, and
/// returns each outcome. With `stop_at_first_failure`, stops after the first
/// failing scenario (enough to show a broken driver is caught).
pub async fn run_all<F, M, MF>(mut make: M, stop_at_first_failure: bool) -> Vec<(&'static str, Outcome)>
where
    F: LockFactory,
    M: FnMut() -> MF,
    MF: Future<Output = F>,
{
    let mut results = Vec::new();
    for scenario in all_scenarios::<F>() {
        let outcome = run_one(make().await, &scenario).await;
        let failed = outcome.is_err();
        results.push((scenario.name, outcome));
        if failed && stop_at_first_failure {
            break;
        }
    }
    results
}

/// Expands to one `#[tokio::test]` per conformance scenario, in a module
/// named `conformance`, so `cargo test -- --list` shows each by name and each
/// passes or fails on its own.
///
/// The argument is a function (or path to one) `async fn() -> impl LockFactory`
/// that makes the factory for one test. The calling crate needs `tokio` with
/// the `macros` and `rt-multi-thread` features as a (dev-)dependency.
///
/// ```
/// async fn factory() -> dlock_testkit::MemFactory {
///     dlock_testkit::MemFactory::new()
/// }
/// dlock_testkit::conformance_tests!(factory);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($make:path) => {
        $crate::__with_scenarios!([$crate::__dlock_conformance_tests]($make));
    };
}

/// Implementation detail of [`conformance_tests!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __dlock_conformance_tests {
    (($make:path) $($name:ident),* $(,)?) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    $crate::run_scenario_test(stringify!($name), $make).await;
                }
            )*
        }
    };
}
