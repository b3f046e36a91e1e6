//! The holder-pause nemesis against a real server: with the fence, no stale
//! write is accepted and no update is lost.

mod common;

use std::time::Duration;

use dlock_core::LockKey;
use dlock_testkit::launcher::{FaultProxy, ZooKeeper};
use dlock_testkit::safety::{
    FaultKind, MemberFaults, SafetyPlan, Schedule, pause_run, publish, residue, run_for, run_with_faults,
};
use dlock_zk::{ZkConfig, ZkLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_register_survives_holder_pauses() {
    let factory = common::ZkFactory::shared().await;
    let plan = SafetyPlan {
        duration: run_for(5),
        ttl: Duration::from_millis(500),
        pause_every: 3,
        fence: true,
    };
    let report = pause_run(
        &factory,
        3,
        plan,
        ("zk", "holder pauses", "no stale write accepted, no update lost"),
    )
    .await;
    assert!(report.pauses > 0, "{report}");
    assert!(report.is_safe(), "{report}");
    assert!(report.residue_cleared(), "{report}");
    assert_eq!(report.register, report.accepted, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ensemble_under_member_faults_keeps_exclusion() {
    let mut ensemble = ZooKeeper::start_ensemble(3).await.unwrap();
    let first = ensemble.members()[0].addr();
    let proxy = FaultProxy::start(first).await.unwrap();
    let session = Duration::from_secs(4);
    let all = ZkConfig {
        request_timeout: Duration::from_secs(2),
        ..ZkConfig::new(ensemble.connect_string()).session_timeout(session)
    };
    let behind_proxy = ZkConfig {
        request_timeout: Duration::from_secs(2),
        ..ZkConfig::new(proxy.addr().to_string()).session_timeout(session)
    };
    let admin = all.clone();
    let clients = vec![
        ZkLock::connect(all.clone()).await.unwrap(),
        ZkLock::connect(all).await.unwrap(),
        ZkLock::connect(behind_proxy).await.unwrap(),
    ];
    let plan = SafetyPlan {
        duration: run_for(24),
        ttl: Duration::from_millis(500),
        pause_every: 0,
        fence: true,
    };
    let schedule = Schedule {
        kinds: vec![FaultKind::KillRestart, FaultKind::Stop, FaultKind::Partition],
        calm: Duration::from_secs(2),
        fault: Duration::from_secs(3),
    };
    let faults = MemberFaults::new(ensemble, |z: &mut ZooKeeper| z.members(), 2, proxy);
    let (mut report, faults) = run_with_faults(
        clients,
        &LockKey::new("register").unwrap(),
        plan,
        faults,
        schedule,
    )
    .await;
    // The servers (in `faults`) are still up: ask what the run left.
    report.residue = Some(
        residue(
            &common::ZkFactory::new(admin, None).await,
            "register",
            session * 2 + Duration::from_secs(10),
        )
        .await,
    );
    drop(faults);
    eprintln!("zk under faults: {report}");
    publish(
        "zk",
        "member kill/stop, client partition",
        &report,
        "exclusion holds: 0 overlaps; no stale write accepted",
    );
    assert!(report.faults.len() >= 2, "no fault was injected: {report}");
    // Each heal is followed by a grant (the last one may meet the run's end).
    assert!(
        report.heals_without_grant <= 1,
        "no recovery after a heal: {report}"
    );
    assert!(report.is_safe(), "{report}");
    assert!(report.residue_cleared(), "{report}");
    assert!(report.history.overlaps.is_empty(), "{report}");
}
