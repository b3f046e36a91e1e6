//! The holder-pause nemesis against a real server: with the fence, no stale
//! write is accepted and no update is lost.

mod common;

use std::time::Duration;

use dlock_core::LockKey;
use dlock_redis::{RedisConfig, RedisLock};
use dlock_testkit::launcher::{FaultProxy, Redis};
use dlock_testkit::safety::{
    FaultKind, MemberFaults, SafetyPlan, Schedule, pause_run, publish, residue, run_for, run_with_faults,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_register_survives_holder_pauses() {
    let factory = common::RedisFactory::shared().await;
    let plan = SafetyPlan {
        duration: run_for(3),
        ttl: Duration::from_millis(300),
        pause_every: 3,
        fence: true,
    };
    let report = pause_run(
        &factory,
        3,
        plan,
        (
            "redis",
            "holder pauses",
            "no stale write accepted, no update lost",
        ),
    )
    .await;
    assert!(report.pauses > 0, "{report}");
    assert!(report.is_safe(), "{report}");
    assert!(report.residue_cleared(), "{report}");
    assert_eq!(report.register, report.accepted, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_register_survives_server_kills_stops_partitions_and_holder_pauses() {
    let server = Redis::start().await.unwrap();
    let proxy = FaultProxy::start(server.addrs()[0]).await.unwrap();
    let config =
        RedisConfig::from_url(server.url()).timeouts(Duration::from_secs(2), Duration::from_millis(500));
    let behind_proxy = RedisConfig::from_url(format!("redis://{}", proxy.addr()))
        .timeouts(Duration::from_secs(2), Duration::from_millis(500));
    let admin = config.clone();
    let clients = vec![
        RedisLock::connect(config.clone()).await.unwrap(),
        RedisLock::connect(config).await.unwrap(),
        RedisLock::connect(behind_proxy).await.unwrap(),
    ];
    let plan = SafetyPlan {
        duration: run_for(20),
        ttl: Duration::from_millis(500),
        pause_every: 5,
        fence: true,
    };
    let schedule = Schedule {
        kinds: vec![
            FaultKind::KillRestart,
            FaultKind::SnapshotRestart,
            FaultKind::Stop,
            FaultKind::Partition,
        ],
        calm: Duration::from_secs(2),
        fault: Duration::from_secs(2),
    };
    let faults = MemberFaults::new(server, |r: &mut Redis| r.members(), 0, proxy);
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
            &common::RedisFactory::new(admin, None).await,
            "register",
            plan.ttl * 4 + Duration::from_secs(10),
        )
        .await,
    );
    drop(faults);
    eprintln!("redis under faults: {report}");
    publish(
        "redis",
        "kill/stale-snapshot restart/stop/partition + holder pauses",
        &report,
        "no stale write accepted, no update lost",
    );
    assert!(report.faults.len() >= 2, "no fault was injected: {report}");
    // Each heal is followed by a grant (the last one may meet the run's end).
    assert!(
        report.heals_without_grant <= 1,
        "no recovery after a heal: {report}"
    );
    assert!(report.is_safe(), "{report}");
    assert!(report.residue_cleared(), "{report}");
    // Also across the restart from a snapshot that missed the last grants.
    assert!(
        report.history.token_regressions.is_empty(),
        "tokens went back: {:?}",
        report.history.token_regressions.first()
    );
}
