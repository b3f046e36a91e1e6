//! Running scenarios: one by one from the generated tests, or all of them
//! against one factory (the broken-driver tests, reports).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use dlock_core::Lock;

use crate::LockFactory;
use crate::outcome::{Failure, ScenarioResult, Verdict, within};
use crate::scenarios::{self, Ctx, skip_reason};

/// The longest any one scenario may take, clean-up check included.
pub const SCENARIO_LIMIT: Duration = Duration::from_secs(180);

/// A running scenario's future.
pub type ScenarioFuture = Pin<Box<dyn Future<Output = ScenarioResult> + Send>>;

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
            holders_name_the_grant,
            keys_in_use_names_what_is_held,
            acquire_wait_times_out,
            mutual_exclusion_counter,
            tokens_increase_across_clients,
            expired_holder_cannot_release,
            extend_after_expiry_refused,
            expiry_frees_vanished_holder,
            lost_fires_on_expiry,
            auto_extend_keeps_lock,
            lost_fires_when_the_renewing_runtime_goes,
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
            extend_to_a_shorter_ttl_is_kept,
            namespace_clean_after_use,
            huge_durations_are_safe,
            acquire_all_is_all_or_nothing,
            acquire_all_is_lost_with_its_ttl,
            read_write_readers_share_writers_exclude,
            read_write_waiting_writer_not_starved,
            read_write_expired_reader_lets_the_writer_in,
            semaphore_admits_up_to_its_limit,
            semaphore_never_over_admits,
            semaphore_expired_permit_passes_on,
            unoffered_primitives_are_refused,
            cancelled_acquire_in_flight_leaves_nothing,
            failed_release_is_not_ok,
            unreachable_backend_is_unavailable,
            dead_link_fires_lost_in_time,
            cancelled_on_a_dead_link_is_not_replayed,
            reports_through_tracing,
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
pub async fn run_one<F: LockFactory>(factory: F, scenario: &Scenario<F>) -> ScenarioResult {
    within(SCENARIO_LIMIT, &format!("scenario {}", scenario.name), async {
        let ctx = Ctx::new(factory).await?;
        if let Some(why) = skip_reason(scenario.name, ctx.caps(), ctx.factory().breaks_links()) {
            return Ok(Verdict::Skipped(why));
        }
        let verdict = (scenario.run)(ctx.clone()).await?;
        ctx.await_clean().await?;
        Ok(verdict)
    })
    .await?
}

/// The scenarios that do not apply to `factory`'s backend, with the reason.
///
/// # Errors
///
/// A [`Failure`] if the factory cannot make a client (the capabilities come
/// from one).
pub async fn skipped_scenarios<F: LockFactory>(
    factory: &F,
) -> Result<Vec<(&'static str, &'static str)>, Failure> {
    let caps = factory.client().await?.capabilities();
    let links = factory.breaks_links();
    Ok(all_scenarios::<F>()
        .into_iter()
        .filter_map(|s| skip_reason(s.name, caps, links).map(|why| (s.name, why)))
        .collect())
}

/// Runs a scenario for a generated test, panicking with the failure so the
/// test fails by name. Prints the verdict. `declared` are the scenarios the
/// test file declared skipped (`conformance_tests!(f, skip: [..])`).
///
/// # Panics
///
/// When the scenario fails, or is skipped without being declared (so that a
/// skip always shows in `cargo test`'s output as an ignored test).
pub async fn run_scenario_test<F, M, MF>(name: &'static str, declared: &[&str], make: M)
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
        Ok(Verdict::Skipped(why)) if declared.contains(&name) => {
            eprintln!("conformance {backend} {name}: skipped ({why})");
        }
        Ok(Verdict::Skipped(why)) => panic!(
            "conformance {backend} {name}: skipped ({why}) but not declared: write \
             `conformance_tests!(factory, skip: [{name}, ...])` so that cargo test shows it as ignored"
        ),
        Err(Failure(why)) => panic!("conformance {backend} {name}: FAILED: {why}"),
    }
}

/// The generated `declared_skips_match_the_backend` test: the scenarios a
/// test file declares skipped must be exactly those [`skip_reason`] skips
/// for its factory, so that no applicable scenario can be hidden by
/// declaring it skipped, and no skip goes unseen.
///
/// # Panics
///
/// When the two lists differ (the message lists both, with reasons).
pub async fn check_declared_skips<F, M, MF>(declared: &[&str], make: M)
where
    F: LockFactory,
    M: FnOnce() -> MF,
    MF: Future<Output = F>,
{
    let factory = make().await;
    let backend = factory.name();
    let skipped = skipped_scenarios(&factory)
        .await
        .unwrap_or_else(|Failure(why)| panic!("conformance {backend}: {why}"));
    let undeclared: Vec<_> = skipped.iter().filter(|(n, _)| !declared.contains(n)).collect();
    let applicable: Vec<_> = declared
        .iter()
        .filter(|d| !skipped.iter().any(|(n, _)| n == *d))
        .collect();
    for (name, why) in &skipped {
        eprintln!("conformance {backend} {name}: skipped ({why})");
    }
    assert!(
        undeclared.is_empty() && applicable.is_empty(),
        "conformance {backend}: the declared skips differ from the backend's: \
         skipped but not declared {undeclared:?}; declared but applicable (they must run) {applicable:?}"
    );
}

/// What [`run_all`] returns: every scenario's outcome, in order, and the
/// counts.
#[derive(Debug)]
pub struct Report {
    /// Each scenario run, by name, with its outcome.
    pub results: Vec<(&'static str, ScenarioResult)>,
}

impl Report {
    /// How many passed.
    pub fn passed(&self) -> usize {
        self.count(|o| matches!(o, Ok(Verdict::Passed)))
    }

    /// How many were skipped (did not apply to the backend).
    pub fn skipped(&self) -> usize {
        self.count(|o| matches!(o, Ok(Verdict::Skipped(_))))
    }

    /// How many failed.
    pub fn failed(&self) -> usize {
        self.count(Result::is_err)
    }

    /// The first failure, if any: its scenario and why.
    pub fn first_failure(&self) -> Option<(&'static str, &Failure)> {
        self.results
            .iter()
            .find_map(|(name, o)| o.as_ref().err().map(|f| (*name, f)))
    }

    fn count(&self, f: impl Fn(&ScenarioResult) -> bool) -> usize {
        self.results.iter().filter(|(_, o)| f(o)).count()
    }
}

impl std::fmt::Display for Report {
    /// One line per scenario, then `N passed, N skipped, N failed`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, outcome) in &self.results {
            match outcome {
                Ok(Verdict::Passed) => writeln!(f, "  {name}: passed")?,
                Ok(Verdict::Skipped(why)) => writeln!(f, "  {name}: skipped ({why})")?,
                Err(why) => writeln!(f, "  {name}: FAILED: {why}")?,
            }
        }
        write!(
            f,
            "{} passed, {} skipped, {} failed",
            self.passed(),
            self.skipped(),
            self.failed()
        )
    }
}

/// Runs every scenario against factories made by `make`, in order, and
/// reports each outcome and the counts. With `stop_at_first_failure`, stops
/// after the first failing scenario (enough to show a broken driver is
/// caught).
pub async fn run_all<F, M, MF>(mut make: M, stop_at_first_failure: bool) -> Report
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
    Report { results }
}

/// Expands to one `#[tokio::test]` per conformance scenario, in a module
/// named `conformance`, so `cargo test -- --list` shows each by name and each
/// passes or fails on its own.
///
/// The first argument is a function (or path to one)
/// `async fn() -> impl LockFactory` that makes the factory for one test.
/// After it, `skip: [..]` names the scenarios that do not apply to the
/// backend ([`skip_reason`] says which: no FIFO promise, no fencing tokens,
/// no links to break). Those tests are `#[ignore]`d, so `cargo test` reports
/// them as ignored rather than passed, and one more test,
/// `conformance::declared_skips_match_the_backend`, fails if the list is not
/// exactly what the backend's capabilities skip. A scenario that turns out
/// skipped without being declared fails, saying so.
///
/// The calling crate needs only `dlock-testkit` as a dev-dependency: the
/// macro brings its own `tokio`. One call per module (it defines a module
/// named `conformance`): to run the kit against two configurations in one
/// test file, put each call in a module of its own.
///
/// ```
/// async fn factory() -> dlock_testkit::MemFactory {
///     dlock_testkit::MemFactory::new()
/// }
/// dlock_testkit::conformance_tests!(factory, skip: [
///     cancelled_acquire_in_flight_leaves_nothing,
///     unreachable_backend_is_unavailable,
///     failed_release_is_not_ok,
///     dead_link_fires_lost_in_time,
///     cancelled_on_a_dead_link_is_not_replayed,
/// ]);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($make:path $(, skip: [$($skip:ident),* $(,)?])? $(,)?) => {
        $crate::__dlock_conformance_tests! { ($) ($make) [$($($skip)*)?] }
    };
}

/// Implementation detail of [`conformance_tests!`]: `$d` is a `$`, so the
/// module can define its own macro (one arm per declared skip). Each test is
/// a plain `#[test]` running the scenario on the kit's own Tokio runtime
/// builder, so the calling crate needs no `tokio` of its own.
#[doc(hidden)]
#[macro_export]
macro_rules! __dlock_conformance_tests {
    (($d:tt) ($make:path) [$($skip:ident)*]) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;

            // A declared skip that names no scenario fails to compile here.
            $(#[allow(unused_imports)] use $crate::scenarios::$skip as _;)*

            macro_rules! __dlock_test {
                $(
                    ($skip) => {
                        #[test]
                        #[ignore = "skipped: not for this backend (see declared_skips_match_the_backend)"]
                        fn $skip() {
                            $crate::__block_on($crate::run_scenario_test(stringify!($skip), &[stringify!($skip)], $make));
                        }
                    };
                )*
                ($d name:ident) => {
                    #[test]
                    fn $d name() {
                        $crate::__block_on($crate::run_scenario_test(stringify!($d name), &[$(stringify!($skip)),*], $make));
                    }
                };
            }

            macro_rules! __dlock_tests {
                (() $d($d name:ident),* $d(,)?) => { $d( __dlock_test!($d name); )* };
            }

            $crate::__with_scenarios!([__dlock_tests]());

            #[test]
            fn declared_skips_match_the_backend() {
                $crate::__block_on($crate::check_declared_skips(&[$(stringify!($skip)),*], $make));
            }
        }
    };
}

/// Runs a generated test's future on a fresh two-worker Tokio runtime
/// (implementation detail of [`conformance_tests!`]).
///
/// # Panics
///
/// If no runtime can be built, or when `fut` panics.
#[doc(hidden)]
pub fn __block_on<T>(fut: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime for the conformance test")
        .block_on(fut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::LINK_SCENARIOS;
    use dlock_core::Capabilities;

    /// Every name `skip_reason` decides on is a scenario (a rename cannot
    /// silently stop a skip).
    #[test]
    fn skip_reasons_name_real_scenarios() {
        let names: Vec<_> = all_scenarios::<crate::MemFactory>()
            .iter()
            .map(|s| s.name)
            .collect();
        for name in LINK_SCENARIOS.iter().chain(&[
            "fifo_waiters",
            "tokens_increase_across_clients",
            "fenced_stale_write_rejected",
            "unoffered_primitives_are_refused",
        ]) {
            assert!(names.contains(name), "{name} is not a scenario");
        }
        let family = names
            .iter()
            .filter(|n| n.starts_with("read_write_") || n.starts_with("semaphore_"))
            .count();
        assert_eq!(
            family, 6,
            "the read-write and semaphore scenarios go by their prefixes"
        );
        let none = Capabilities::new(
            dlock_core::Fencing::None,
            false,
            dlock_core::Waiting::Polled,
            std::time::Duration::from_millis(1),
        );
        let skipped: Vec<_> = names
            .iter()
            .filter(|n| skip_reason(n, none, false).is_some())
            .collect();
        assert_eq!(skipped.len(), 3 + family + LINK_SCENARIOS.len(), "{skipped:?}");
    }
}
