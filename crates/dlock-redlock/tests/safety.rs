//! The nemeses against Redlock: with no fencing token a paused holder's
//! stale write goes through (the run shows lost updates), and a quorum node
//! that forgets a key (restart without persistence, clock jump) lets two
//! clients hold at once (the checker reports the overlap).

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

/// Kleppmann's two ways to break Redlock, scripted: client A holds the lock
/// on exactly a quorum (nodes 0, 1 and 2; it cannot reach 3 and 4), then
/// node 2 forgets A's key, by a restart without persistence or by a jump of
/// its wall clock. Client B then gets 2, 3 and 4: a quorum of its own while
/// A still holds. The history checker must report the overlap.
mod nemeses {
    use std::time::{Duration, Instant};

    use dlock_core::{AcquireOptions, Guard, Lock, LockKey};
    use dlock_redlock::{Redlock, RedlockConfig};
    use dlock_testkit::history::{History, Op};
    use dlock_testkit::launcher::{Fault, FaultProxy, Redis, redis::command};
    use dlock_testkit::safety::publish_line;

    #[derive(Clone, Copy, Debug)]
    enum Forget {
        Restart,
        ClockJump,
    }

    async fn split_brain(forget: Forget) {
        let mut servers = Redis::start_many_with_clocks(5).await.unwrap();
        let addrs = servers.addrs();
        // The history's times and the faults' count from (about) one start.
        let history = History::new();
        let started = Instant::now();
        let mut faults = Vec::new();
        // A reaches nodes 3 and 4 through proxies that will blackhole them.
        let mut proxies = Vec::new();
        for &a in &addrs[3..] {
            proxies.push(FaultProxy::start(a).await.unwrap());
        }
        let mut a_nodes: Vec<String> = addrs[..3].iter().map(|a| format!("redis://{a}")).collect();
        a_nodes.extend(proxies.iter().map(|p| format!("redis://{}", p.addr())));
        let b_nodes = addrs.iter().map(|a| format!("redis://{a}"));
        let a = Redlock::connect(RedlockConfig::new(a_nodes)).await.unwrap();
        let b = Redlock::connect(RedlockConfig::new(b_nodes)).await.unwrap();
        for p in &proxies {
            p.set(Fault::Blackhole);
        }
        faults.push((
            started.elapsed(),
            "inject partition: client A cut off from nodes 3 and 4".to_owned(),
        ));

        let key = LockKey::new("split-brain").unwrap();
        let ttl = Duration::from_secs(30);
        let opts = AcquireOptions::default().ttl(ttl).auto_extend(false);
        let stored = format!("dlock:{}", key.as_str());
        let ga = a
            .try_acquire(&key, opts)
            .await
            .unwrap()
            .expect("A gets nodes 0, 1 and 2");
        history.record(0, key.as_str(), Op::AcquireOk(None));
        let held: Vec<bool> = {
            let mut v = Vec::new();
            for &n in &addrs {
                v.push(command(n, &["GET", &stored]).await.unwrap() != "$-1");
            }
            v
        };
        assert_eq!(
            held,
            [true, true, true, false, false],
            "A's grant is on exactly a quorum"
        );
        // While every node remembers A's key, B cannot get a quorum.
        assert!(
            b.try_acquire(&key, opts).await.unwrap().is_none(),
            "B got the lock A holds"
        );

        let what = match forget {
            Forget::Restart => {
                servers.members()[2].restart().await.unwrap();
                "node 2 killed and restarted without persistence"
            }
            Forget::ClockJump => {
                servers.jump_clock(2, ttl * 2).unwrap();
                "node 2's wall clock stepped forward by twice the TTL"
            }
        };
        faults.push((started.elapsed(), format!("inject {forget:?}: {what}")));
        assert_eq!(command(addrs[2], &["GET", &stored]).await.unwrap(), "$-1");

        let gb = b
            .try_acquire(&key, opts)
            .await
            .unwrap()
            .expect("B gets nodes 2, 3 and 4: a quorum while A holds");
        history.record(1, key.as_str(), Op::AcquireOk(None));
        assert!(
            ga.is_held(),
            "A still believes it holds: its validity is not over"
        );
        history.record(0, key.as_str(), Op::Release);
        history.record(1, key.as_str(), Op::Release);
        let _ = ga.release().await;
        let _ = gb.release().await;
        for p in &proxies {
            p.set(Fault::None);
        }
        faults.push((started.elapsed(), "heal: partition".to_owned()));

        let report = history.check(true, false);
        eprintln!("redlock, {forget:?}: {report}");
        publish_line(
            "redlock",
            &format!("{forget:?} of a quorum node while held"),
            "an overlap, reported by the checker",
            &report.to_string(),
            &faults,
        );
        assert_eq!(
            report.overlaps.len(),
            1,
            "the checker missed the overlap: {report}"
        );
        let (first, second) = &report.overlaps[0];
        assert_eq!((first.client, second.client), (0, 1), "{report}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quorum_node_restarted_without_persistence_lets_two_clients_hold() {
        split_brain(Forget::Restart).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quorum_node_clock_jump_lets_two_clients_hold() {
        split_brain(Forget::ClockJump).await;
    }
}
