//! The kit proves it can fail: every planted flaw is caught by at least one
//! scenario, while the same driver without a flaw passes every scenario.

use dlock_testkit::broken::{Flaw, NaiveFactory};
use dlock_testkit::{MemFactory, all_scenarios, run_all, run_one};

async fn naive() -> NaiveFactory {
    NaiveFactory::new(Flaw::None)
}

// The flawless NaiveLock keeps the contract: every scenario, by name (it
// promises no FIFO order).
dlock_testkit::conformance_tests!(naive, skip: [
    fifo_waiters,
    unoffered_primitives_are_refused,
]);

macro_rules! caught {
    ($($test:ident: $flaw:expr => $by:literal,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let flaw = $flaw;
            let scenario = all_scenarios::<NaiveFactory>()
                .into_iter()
                .find(|s| s.name == $by)
                .expect("a scenario of that name");
            let outcome = run_one(NaiveFactory::new(flaw), &scenario).await;
            eprintln!("{flaw:?} in {}: {outcome:?}", $by);
            assert!(outcome.is_err(), "{} did not catch {flaw:?}: {outcome:?}", $by);
        }
    )*};
}

// Each flaw, and the scenario meant to catch it.
caught! {
    caught_grants_to_everyone: Flaw::GrantsToEveryone => "try_acquire_held_and_free",
    caught_reuses_tokens: Flaw::ReusesTokens => "acquire_release_reacquire",
    caught_never_expires: Flaw::NeverExpires => "expired_holder_cannot_release",
    caught_release_deletes_any_holder: Flaw::ReleaseDeletesAnyHolder => "expired_holder_cannot_release",
    caught_extend_resurrects: Flaw::ExtendResurrects => "extend_after_expiry_refused",
    caught_lost_never_fires: Flaw::LostNeverFires => "extend_after_expiry_refused",
    caught_cancel_leaves_held: Flaw::CancelLeavesHeld => "cancelled_acquire_leaves_nothing",
    caught_cancel_in_flight_leaves_held: Flaw::CancelInFlightLeavesHeld => "cancelled_acquire_in_flight_leaves_nothing",
    caught_unreachable_looks_held: Flaw::UnreachableLooksHeld => "unreachable_backend_is_unavailable",
    caught_release_ignores_link_errors: Flaw::ReleaseIgnoresLinkErrors => "failed_release_is_not_ok",
    caught_lost_only_when_heard: Flaw::LostOnlyWhenHeard => "dead_link_fires_lost_in_time",
    caught_silent: Flaw::Silent => "reports_through_tracing",
    caught_all_in_given_order: Flaw::AllInGivenOrder => "acquire_all_is_all_or_nothing",
    caught_reader_ignores_waiting_writer: Flaw::ReaderIgnoresWaitingWriter => "read_write_waiting_writer_not_starved",
    caught_semaphore_over_admits: Flaw::SemaphoreOverAdmits => "semaphore_admits_up_to_its_limit",
    caught_writer_ignores_readers: Flaw::WriterIgnoresReaders => "read_write_readers_share_writers_exclude",
}

/// `run_all` reports every scenario and the counts; a flaw stops it at the
/// first failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_counts_passes_skips_and_failures() {
    let report = run_all(|| async { NaiveFactory::new(Flaw::ReusesTokens) }, true).await;
    assert_eq!(
        (report.passed(), report.skipped(), report.failed()),
        (0, 0, 1),
        "{report}"
    );
    assert!(
        report.to_string().ends_with("0 passed, 0 skipped, 1 failed"),
        "{report}"
    );
    assert_eq!(
        report.first_failure().map(|(n, _)| n),
        Some("acquire_release_reacquire")
    );

    let report = run_all(|| async { MemFactory::new() }, false).await;
    // The link scenarios, and the one for primitives a backend lacks.
    let skips = dlock_testkit::LINK_SCENARIOS.len() + 1;
    assert_eq!(
        (report.passed(), report.skipped(), report.failed()),
        (all_scenarios::<MemFactory>().len() - skips, skips, 0),
        "{report}"
    );
}
