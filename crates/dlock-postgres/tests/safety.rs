//! The safety runs against real servers: the holder-pause nemesis (with the
//! fence, no stale write is accepted and no update is lost), and server
//! kill/restart, SIGSTOP and a client partition (0 overlapping holds).

mod common;

use std::time::Duration;

use dlock_core::LockKey;
use dlock_postgres::{PostgresConfig, PostgresLock};
use dlock_testkit::launcher::{FaultProxy, Postgres};
use dlock_testkit::safety::{
    FaultKind, MemberFaults, SafetyPlan, Schedule, pause_run, publish, residue, run_for, run_with_faults,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_register_survives_holder_pauses() {
    let factory = common::PostgresFactory::shared().await;
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
        (
            "postgres",
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
async fn a_server_under_faults_keeps_exclusion() {
    let mut server = Postgres::start().await.unwrap();
    let proxy = FaultProxy::start(server.members()[0].addr()).await.unwrap();
    let timeouts = (Duration::from_secs(2), Duration::from_secs(1));
    let direct = PostgresConfig::from_url(server.url()).timeouts(timeouts.0, timeouts.1);
    let behind_proxy = PostgresConfig {
        url: server
            .url()
            .replacen(&server.addr().to_string(), &proxy.addr().to_string(), 1),
        ..direct.clone()
    };
    let admin = direct.clone();
    let clients = vec![
        PostgresLock::connect(direct.clone()).await.unwrap(),
        PostgresLock::connect(direct).await.unwrap(),
        PostgresLock::connect(behind_proxy).await.unwrap(),
    ];
    let plan = SafetyPlan {
        duration: run_for(20),
        ttl: Duration::from_secs(2),
        pause_every: 0,
        fence: true,
    };
    let schedule = Schedule {
        kinds: vec![FaultKind::KillRestart, FaultKind::Stop, FaultKind::Partition],
        calm: Duration::from_secs(2),
        fault: Duration::from_secs(3),
    };
    let faults = MemberFaults::new(server, |p: &mut Postgres| p.members(), 0, proxy);
    let (mut report, faults) = run_with_faults(
        clients,
        &LockKey::new("register").unwrap(),
        plan,
        faults,
        schedule,
    )
    .await;
    // The server (in `faults`) is still up: ask what the run left.
    report.residue = Some(
        residue(
            &common::PostgresFactory::new(admin, None).await,
            "register",
            plan.ttl * 4 + Duration::from_secs(10),
        )
        .await,
    );
    drop(faults);
    eprintln!("postgres under faults: {report}");
    publish(
        "postgres",
        "server kill/restart and stop, client partition",
        &report,
        "exclusion holds: 0 overlaps; no stale write accepted",
    );
    assert!(report.faults.len() >= 2, "no fault was injected: {report}");
    assert!(report.is_safe(), "{report}");
    assert!(report.residue_cleared(), "{report}");
    assert!(report.history.overlaps.is_empty(), "{report}");
}
