//! The holder-pause nemesis against a real server: with the fence, no stale
//! write is accepted and no update is lost.

mod common;

use std::time::Duration;

use dlock_core::LockKey;
use dlock_etcd::{EtcdConfig, EtcdLock};
use dlock_testkit::LockFactory;
use dlock_testkit::launcher::{Etcd, Fault, FaultProxy};
use dlock_testkit::safety::{FaultKind, Faults, SafetyPlan, SafetyReport, Schedule, run, run_with_faults};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_register_survives_holder_pauses() {
    let factory = common::EtcdFactory::shared().await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(factory.client().await.unwrap());
    }
    let key = LockKey::new(format!("safety-{:x}", rand::random::<u64>())).unwrap();
    let plan = SafetyPlan {
        duration: run_for(10),
        ttl: Duration::from_secs(2),
        pause_every: 3,
        fence: true,
    };
    let report = run(clients, &key, plan).await;
    eprintln!("{}: {report}", factory.name());
    publish(
        "etcd",
        "holder pauses",
        &report,
        "no stale write accepted, no update lost",
    );
    assert!(report.pauses > 0, "{report}");
    assert!(report.is_safe(), "{report}");
    assert_eq!(report.register, report.accepted, "{report}");
}

/// The run's length: `DLOCK_SAFETY_SECONDS` (set by `cargo xtask safety
/// --seconds S`), or a short default for `cargo xtask test`.
fn run_for(default_secs: u64) -> Duration {
    let secs = std::env::var("DLOCK_SAFETY_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_secs);
    Duration::from_secs(secs)
}

/// Prints the report in the line format `cargo xtask safety` collects into
/// RELIABILITY.md.
fn publish(backend: &str, run: &str, report: &SafetyReport, claim: &str) {
    println!("SAFETY-REPORT|{backend}|{run}|{claim}|{report}");
    for (at, what) in &report.faults {
        println!("SAFETY-FAULT|{backend}|{run}|{at:?}|{what}");
    }
}

/// A cluster's members, a proxy for client 2, and what the nemesis does.
struct ClusterFaults<S> {
    cluster: S,
    members: fn(&mut S) -> &mut [dlock_testkit::launcher::Member],
    proxy: FaultProxy,
    last: Option<FaultKind>,
}

impl<S: Send + 'static> Faults for ClusterFaults<S> {
    async fn inject(&mut self, kind: FaultKind) -> Result<String, String> {
        self.last = Some(kind);
        let m = &mut (self.members)(&mut self.cluster)[2];
        match kind {
            FaultKind::KillRestart => m.kill().map(|()| format!("killed {}", m.name())),
            FaultKind::Stop => m.pause().map(|()| format!("SIGSTOP to {}", m.name())),
            FaultKind::Partition => {
                self.proxy.set(Fault::Blackhole);
                Ok("client 2 cut off".into())
            }
        }
        .map_err(|e| e.to_string())
    }

    async fn heal(&mut self) -> Result<String, String> {
        let m = &mut (self.members)(&mut self.cluster)[2];
        match self.last.take() {
            Some(FaultKind::KillRestart) => m.restart().await.map(|()| format!("restarted {}", m.name())),
            Some(FaultKind::Stop) => m.resume().map(|()| format!("SIGCONT to {}", m.name())),
            Some(FaultKind::Partition) => {
                self.proxy.set(Fault::None);
                Ok("client 2 reconnected".into())
            }
            None => Ok("nothing to heal".into()),
        }
        .map_err(|e| e.to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_under_member_faults_keeps_exclusion() {
    let mut cluster = Etcd::start_cluster(3).await.unwrap();
    let first = cluster.members()[0].addr();
    let proxy = FaultProxy::start(first).await.unwrap();
    let timeouts = (Duration::from_secs(2), Duration::from_secs(2));
    let all = EtcdConfig::new(cluster.endpoints()).timeouts(timeouts.0, timeouts.1);
    let behind_proxy = EtcdConfig::new([format!("http://{}", proxy.addr())]).timeouts(timeouts.0, timeouts.1);
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
    let faults = ClusterFaults {
        cluster,
        members: |c: &mut Etcd| c.members(),
        proxy,
        last: None,
    };
    let (report, _faults) = run_with_faults(
        clients,
        &LockKey::new("register").unwrap(),
        plan,
        faults,
        schedule,
    )
    .await;
    eprintln!("etcd under faults: {report}");
    publish(
        "etcd",
        "member kill/stop, client partition",
        &report,
        "exclusion holds: 0 overlaps; no stale write accepted",
    );
    assert!(report.faults.len() >= 2, "no fault was injected: {report}");
    assert!(report.is_safe(), "{report}");
    assert!(report.history.overlaps.is_empty(), "{report}");
}
