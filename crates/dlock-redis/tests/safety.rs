//! The holder-pause nemesis against a real server: with the fence, no stale
//! write is accepted and no update is lost.

mod common;

use std::time::Duration;

use dlock_core::LockKey;
use dlock_redis::{RedisConfig, RedisLock};
use dlock_testkit::LockFactory;
use dlock_testkit::launcher::{Fault, FaultProxy, Redis};
use dlock_testkit::safety::{FaultKind, Faults, SafetyPlan, SafetyReport, Schedule, run, run_with_faults};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_register_survives_holder_pauses() {
    let factory = common::RedisFactory::shared().await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(factory.client().await.unwrap());
    }
    let key = LockKey::new(format!("safety-{:x}", rand::random::<u64>())).unwrap();
    let plan = SafetyPlan {
        duration: run_for(3),
        ttl: Duration::from_millis(300),
        pause_every: 3,
        fence: true,
    };
    let report = run(clients, &key, plan).await;
    eprintln!("{}: {report}", factory.name());
    publish(
        "redis",
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

/// One server, a proxy for client 2, and what the nemesis does to them.
struct RedisFaults {
    server: Redis,
    proxy: FaultProxy,
    last: Option<FaultKind>,
}

impl Faults for RedisFaults {
    async fn inject(&mut self, kind: FaultKind) -> Result<String, String> {
        self.last = Some(kind);
        match kind {
            FaultKind::KillRestart => self.server.members()[0]
                .kill()
                .map(|()| "killed the server (no persistence)".into()),
            FaultKind::Stop => self.server.members()[0]
                .pause()
                .map(|()| "SIGSTOP to the server".into()),
            FaultKind::Partition => {
                self.proxy.set(Fault::Blackhole);
                Ok("client 2 cut off".into())
            }
        }
        .map_err(|e| e.to_string())
    }

    async fn heal(&mut self) -> Result<String, String> {
        match self.last.take() {
            Some(FaultKind::KillRestart) => self.server.members()[0]
                .restart()
                .await
                .map(|()| "restarted".into()),
            Some(FaultKind::Stop) => self.server.members()[0].resume().map(|()| "SIGCONT".into()),
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
async fn fenced_register_survives_server_kills_stops_partitions_and_holder_pauses() {
    let server = Redis::start().await.unwrap();
    let proxy = FaultProxy::start(server.addrs()[0]).await.unwrap();
    let config =
        RedisConfig::from_url(server.url()).timeouts(Duration::from_secs(2), Duration::from_millis(500));
    let behind_proxy = RedisConfig::from_url(format!("redis://{}", proxy.addr()))
        .timeouts(Duration::from_secs(2), Duration::from_millis(500));
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
        kinds: vec![FaultKind::KillRestart, FaultKind::Stop, FaultKind::Partition],
        calm: Duration::from_secs(2),
        fault: Duration::from_secs(2),
    };
    let faults = RedisFaults {
        server,
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
    eprintln!("redis under faults: {report}");
    publish(
        "redis",
        "kill/stop/partition + holder pauses",
        &report,
        "no stale write accepted, no update lost",
    );
    assert!(report.faults.len() >= 2, "no fault was injected: {report}");
    assert!(report.is_safe(), "{report}");
}
