//! The holder-pause nemesis against a real server: with the fence, no stale
//! write is accepted and no update is lost.

mod common;

use std::time::Duration;

use dlock_core::LockKey;
use dlock_testkit::launcher::{FaultProxy, ZooKeeper};
use dlock_testkit::safety::{
    FaultKind, MemberFaults, SafetyPlan, Schedule, family_runs, pause_run, publish, residue, run_for,
    run_with_faults,
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
    let family_configs = [all.clone(), all.clone(), all.clone(), behind_proxy.clone()];
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
        schedule.clone(),
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
    // The semaphore's count and the read-write lock's exclusion, under
    // the same faults: four clients, one of them behind the proxy.
    let (family, faults) = family_runs(
        "zk",
        async || {
            let mut clients = Vec::new();
            for config in &family_configs {
                clients.push(ZkLock::connect(config.clone()).await.unwrap());
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

/// Partitions only: the client behind the proxy is cut off at inject.
struct Cut(FaultProxy);

impl dlock_testkit::safety::Faults for Cut {
    async fn inject(&mut self, _: FaultKind) -> Result<String, String> {
        self.0.set(dlock_testkit::launcher::Fault::Blackhole);
        Ok("the proxied client cut off".into())
    }
    async fn heal(&mut self) -> Result<String, String> {
        self.0.set(dlock_testkit::launcher::Fault::None);
        Ok("the proxied client reconnected".into())
    }
}

/// Partitions longer than the session (1.5x): the cut-off client's session
/// expires on the server while it cannot hear about it; exclusion must hold
/// (its guards are lost before the server can grant to anyone else) and
/// nothing may be left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_longer_than_the_session_keep_exclusion() {
    let server = dlock_testkit::launcher::shared::zk().await.unwrap();
    let connect = server.addresses[0].clone();
    let first: std::net::SocketAddr = connect.split(',').next().unwrap().parse().unwrap();
    let proxy = FaultProxy::start(first).await.unwrap();
    let session = Duration::from_secs(2);
    let direct = ZkConfig {
        request_timeout: Duration::from_secs(1),
        ..ZkConfig::new(connect).session_timeout(session)
    };
    let behind_proxy = ZkConfig {
        request_timeout: Duration::from_secs(1),
        ..ZkConfig::new(proxy.addr().to_string()).session_timeout(session)
    };
    let clients = vec![
        ZkLock::connect(behind_proxy).await.unwrap(),
        ZkLock::connect(direct.clone()).await.unwrap(),
        ZkLock::connect(direct.clone()).await.unwrap(),
    ];
    let plan = SafetyPlan {
        duration: run_for(14),
        // Longer than the session: the session, not the guard's own TTL,
        // decides when a cut-off holder is lost.
        ttl: Duration::from_secs(5),
        // The proxied client holds across partitions now and then.
        pause_every: 2,
        fence: true,
    };
    let schedule = Schedule {
        kinds: vec![FaultKind::Partition],
        calm: Duration::from_secs(2),
        fault: session * 3 / 2,
    };
    let key = LockKey::new(format!("long-partition-{:x}", rand::random::<u64>())).unwrap();
    let (mut report, faults) = run_with_faults(clients, &key, plan, Cut(proxy), schedule).await;
    report.residue = Some(
        residue(
            &common::ZkFactory::new(direct, None).await,
            key.as_str(),
            session * 2 + Duration::from_secs(10),
        )
        .await,
    );
    drop((faults, server));
    eprintln!("zk, partitions longer than the session: {report}");
    publish(
        "zk",
        "client partitions of 1.5x the session",
        &report,
        "exclusion holds: 0 overlaps; no stale write accepted",
    );
    assert!(!report.faults.is_empty(), "no fault was injected: {report}");
    assert!(report.is_safe(), "{report}");
    assert!(report.residue_cleared(), "{report}");
    assert!(report.history.overlaps.is_empty(), "{report}");
}
