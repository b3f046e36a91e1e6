//! The kit proves it can fail: every planted flaw is caught by at least one
//! scenario, while the same driver without a flaw passes every scenario.

use dlock_testkit::broken::{Flaw, NaiveFactory};
use dlock_testkit::{Outcome, run_all};

fn summary(results: &[(&str, Outcome)]) -> String {
    results
        .iter()
        .map(|(name, o)| match o {
            Ok(v) => format!("  {name}: {v:?}"),
            Err(f) => format!("  {name}: FAILED: {f}"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

async fn naive() -> NaiveFactory {
    NaiveFactory::new(Flaw::None)
}

// The flawless NaiveLock keeps the contract: every scenario, by name.
dlock_testkit::conformance_tests!(naive);

macro_rules! caught {
    ($($test:ident: $flaw:expr,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let flaw = $flaw;
            let results = run_all(|| async move { NaiveFactory::new(flaw) }, true).await;
            let caught = results.iter().find(|(_, o)| o.is_err());
            eprintln!("{flaw:?}:\n{}", summary(&results));
            assert!(caught.is_some(), "no scenario caught {flaw:?}:\n{}", summary(&results));
        }
    )*};
}

caught! {
    caught_grants_to_everyone: Flaw::GrantsToEveryone,
    caught_reuses_tokens: Flaw::ReusesTokens,
    caught_never_expires: Flaw::NeverExpires,
    caught_release_deletes_any_holder: Flaw::ReleaseDeletesAnyHolder,
    caught_extend_resurrects: Flaw::ExtendResurrects,
    caught_lost_never_fires: Flaw::LostNeverFires,
    caught_cancel_leaves_held: Flaw::CancelLeavesHeld,
}
