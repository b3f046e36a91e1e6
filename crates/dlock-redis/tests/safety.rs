//! The holder-pause nemesis against a real server: with the fence, no stale
//! write is accepted and no update is lost.

mod common;

use std::time::Duration;

use dlock_core::LockKey;
use dlock_testkit::LockFactory;
use dlock_testkit::safety::{SafetyPlan, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_register_survives_holder_pauses() {
    let factory = common::RedisFactory::shared().await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(factory.client().await.unwrap());
    }
    let key = LockKey::new(format!("safety-{:x}", rand::random::<u64>())).unwrap();
    let plan = SafetyPlan {
        duration: Duration::from_secs(3),
        ttl: Duration::from_millis(300),
        pause_every: 3,
        fence: true,
    };
    let report = run(clients, &key, plan).await;
    eprintln!("{}: {report}", factory.name());
    assert!(report.pauses > 0, "{report}");
    assert!(report.is_safe(), "{report}");
    assert_eq!(report.register, report.accepted, "{report}");
}
