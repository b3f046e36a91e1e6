//! The holder-pause nemesis against Redlock: with no fencing token the
//! paused holder's stale write goes through, and the run shows lost updates.

mod common;

use std::time::Duration;

use dlock_testkit::safety::{SafetyPlan, pause_run, run_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_loses_updates_without_tokens() {
    let factory = common::RedlockFactory::shared().await;
    let plan = SafetyPlan {
        duration: run_for(4),
        ttl: Duration::from_millis(300),
        pause_every: 3,
        fence: false,
    };
    let report = pause_run(
        &factory,
        3,
        plan,
        (
            "redlock",
            "holder pauses, no fence possible",
            "the damage is detected: lost updates > 0",
        ),
    )
    .await;
    assert!(report.pauses > 0, "{report}");
    // Redlock gives no token, so nothing can fence the paused holder: the
    // run must show the damage.
    assert!(report.lost_updates > 0, "{report}");
}
