//! The holder-pause nemesis against a real server: with the fence, no stale
//! write is accepted and no update is lost.

mod common;

use std::time::Duration;

use dlock_core::LockKey;
use dlock_etcd::{EtcdConfig, EtcdLock};
use dlock_testkit::launcher::{Etcd, FaultProxy};
use dlock_testkit::safety::{
    FaultKind, MemberFaults, SafetyPlan, Schedule, family_runs, pause_run, publish, residue, run_for,
    run_with_faults,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_register_survives_holder_pauses() {
    let factory = common::EtcdFactory::shared().await;
    let plan = SafetyPlan {
        duration: run_for(10),
        ttl: Duration::from_secs(2),
        pause_every: 3,
        fence: true,
    };
    let report = pause_run(
        &factory,
        3,
        plan,
        ("etcd", "holder pauses", "no stale write accepted, no update lost"),
    )
    .await;
    assert!(report.pauses > 0, "{report}");
    assert!(report.is_safe(), "{report}");
    assert!(report.residue_cleared(), "{report}");
    assert_eq!(report.register, report.accepted, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_under_member_faults_keeps_exclusion() {
    let mut cluster = Etcd::start_cluster(3).await.unwrap();
    let first = cluster.members()[0].addr();
    let proxy = FaultProxy::start(first).await.unwrap();
    let timeouts = (Duration::from_secs(2), Duration::from_secs(2));
    let all = EtcdConfig::new(cluster.endpoints()).timeouts(timeouts.0, timeouts.1);
    let behind_proxy = EtcdConfig::new([format!("http://{}", proxy.addr())]).timeouts(timeouts.0, timeouts.1);
    let admin = all.clone();
    let family_configs = [all.clone(), all.clone(), all.clone(), behind_proxy.clone()];
    let clients = vec![
        EtcdLock::connect(all.clone()).await.unwrap(),
        EtcdLock::connect(all).await.unwrap(),
        EtcdLock::connect(behind_proxy).await.unwrap(),
    ];
    let plan = SafetyPlan {
        duration: run_for(24),
        ttl: Duration::from_secs(2),
        pause_every: 0,
        fence: true,
    };
    let schedule = Schedule {
        kinds: vec![FaultKind::KillRestart, FaultKind::Stop, FaultKind::Partition],
        calm: Duration::from_secs(2),
        fault: Duration::from_secs(3),
    };
    let faults = MemberFaults::new(cluster, |c: &mut Etcd| c.members(), 2, proxy);
    let (mut report, faults) = run_with_faults(
        clients,
        &LockKey::new("register").unwrap(),
        plan,
        faults,
        schedule.clone(),
    )
    .await;
    // The servers (in `faults`) are still up: ask what the run left.
    report.residue = Some(
        residue(
            &common::EtcdFactory::new(admin, None).await,
            "register",
            plan.ttl * 4 + Duration::from_secs(10),
        )
        .await,
    );
    // The semaphore's count and the read-write lock's exclusion, under
    // the same faults: four clients, one of them behind the proxy.
    let (family, faults) = family_runs(
        "etcd",
        async || {
            let mut clients = Vec::new();
            for config in &family_configs {
                clients.push(EtcdLock::connect(config.clone()).await.unwrap());
            }
            clients
        },
        plan,
        faults,
        &schedule,
    )
    .await;
    drop(faults);
    for found in &family {
        assert!(found.is_safe(), "{found}");
        assert!(found.grants > 0, "{found}");
        assert!(!found.faults.is_empty(), "no fault was injected: {found}");
    }
    eprintln!("etcd under faults: {report}");
    publish(
        "etcd",
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
