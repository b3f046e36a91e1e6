//! etcd-specific behaviour against real servers: interop with `etcdctl
//! lock`, lease loss, a waiter whose key vanishes, a 3-member cluster losing
//! its leader and then its quorum, and bad endpoints.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey, Wait};
use dlock_etcd::{EtcdConfig, EtcdLock};
use dlock_testkit::history::History;
use dlock_testkit::launcher::{Etcd, etcd::etcdctl, shared};
use dlock_testkit::workload::Contention;

const LIMIT: Duration = Duration::from_secs(30);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

fn unique(name: &str) -> String {
    format!("{name}-{:x}", rand::random::<u64>())
}

async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn etcdctl_cmd(endpoints: &[String]) -> Command {
    let mut c = Command::new("etcdctl");
    c.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_and_dlock_exclude_each_other() {
    let server = shared::etcd().await.unwrap();
    let endpoints = server.addresses.clone();
    let lock = EtcdLock::connect(EtcdConfig::new(endpoints.clone()).key_prefix(""))
        .await
        .unwrap();
    let name = unique("interop");
    let k = key(&name);

    // etcdctl holds NAME for two seconds, then releases.
    let mut held = etcdctl_cmd(&endpoints)
        .args(["lock", &name, "sleep", "2"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    until("etcdctl to take the lock", async || {
        lock.holder(&k).await.unwrap().is_some()
    })
    .await;
    let theirs = lock.holder(&k).await.unwrap().unwrap();
    assert!(theirs.key.starts_with(&format!("{name}/")), "{theirs:?}");
    assert!(
        lock.try_acquire(&k, AcquireOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    let g = lock
        .acquire(&k, AcquireOptions::default().wait(Wait::For(LIMIT)))
        .await
        .unwrap();
    assert!(held.wait().unwrap().success());
    assert!(g.token().unwrap().get() > u64::try_from(theirs.create_revision).unwrap());

    // dlock holds NAME: etcdctl waits (and is stopped by `timeout`).
    let blocked = Command::new("timeout")
        .args(["2", "etcdctl"])
        .args(etcdctl_cmd(&endpoints).get_args())
        .env("ETCDCTL_API", "3")
        .args(["lock", &name, "echo", "got-it"])
        .output()
        .unwrap();
    // `timeout` exits with 124 when it had to stop etcdctl, still waiting.
    assert_eq!(blocked.status.code(), Some(124), "{blocked:?}");
    assert!(!String::from_utf8_lossy(&blocked.stdout).contains("got-it"));
    g.release().await.unwrap();
    let after = etcdctl_cmd(&endpoints)
        .args(["lock", &name, "echo", "got-it"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&after.stdout).contains("got-it"),
        "{after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_fires_lost_and_frees_the_lock() {
    let f = common::EtcdFactory::shared().await;
    let (a, b) = (
        f.admin.clone(),
        EtcdLock::connect(f.config.clone()).await.unwrap(),
    );
    let k = key(&unique("revoked"));
    let g = a
        .acquire(&k, AcquireOptions::default().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    assert!(g.is_held());
    etcdctl(
        &f.config.endpoints,
        &["lease", "revoke", &format!("{:x}", g.lease())],
    )
    .unwrap();
    tokio::time::timeout(LIMIT, g.lost().wait())
        .await
        .expect("lost() after the revoke");
    assert!(!g.is_held());
    assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    let g2 = tokio::time::timeout(LIMIT, b.acquire(&k, AcquireOptions::default()))
        .await
        .unwrap()
        .unwrap();
    g2.release().await.unwrap();
    // The dead session is not reused: a new acquire on `a` works.
    a.acquire(&k, AcquireOptions::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// etcd #11456: a waiter whose own key disappears while it waits must not
/// report a grant when its predecessors go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_vanished_is_not_granted() {
    let f = common::EtcdFactory::shared().await;
    let (a, b) = (
        f.admin.clone(),
        EtcdLock::connect(f.config.clone()).await.unwrap(),
    );
    let k = key(&unique("vanish"));
    let pfx = a.lock_prefix(&k);
    let ga = a.acquire(&k, AcquireOptions::default()).await.unwrap();
    let waiter = {
        let k = k.clone();
        tokio::spawn(async move {
            b.acquire(&k, AcquireOptions::default().wait(Wait::For(LIMIT)))
                .await
        })
    };
    let ns = pfx.strip_prefix("dlock/").unwrap().to_owned();
    until("the waiter's key", async || {
        a.contender_keys(&ns).await.unwrap().len() == 2
    })
    .await;
    let theirs: Vec<String> = a
        .contender_keys(&ns)
        .await
        .unwrap()
        .into_iter()
        .filter(|key| key != ga.etcd_key())
        .collect();
    assert_eq!(theirs.len(), 1);
    etcdctl(&f.config.endpoints, &["del", &theirs[0]]).unwrap();
    ga.release().await.unwrap();
    let r = tokio::time::timeout(LIMIT, waiter).await.unwrap().unwrap();
    assert!(matches!(r, Err(Error::Lost { .. })), "{:?}", r.map(|g| g.token()));
}

fn leader(endpoints: &[String]) -> usize {
    let out = etcdctl(endpoints, &["endpoint", "status", "-w", "simple"]).unwrap();
    out.lines()
        .position(|l| l.split(", ").nth(4) == Some("true"))
        .expect("a leader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_exclusion_through_a_leader_kill_and_fails_cleanly_without_quorum() {
    let mut cluster = Etcd::start_cluster(3).await.unwrap();
    let endpoints = cluster.endpoints();
    let config = EtcdConfig::new(endpoints.clone()).timeouts(Duration::from_secs(2), Duration::from_secs(2));
    let k = key("contended");
    let history = History::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(EtcdLock::connect(config.clone()).await.unwrap());
    }
    let opts = AcquireOptions::default()
        .ttl(Duration::from_secs(10))
        .wait(Wait::For(Duration::from_secs(10)));
    let work = Contention::start(
        clients,
        &k,
        8,
        Duration::from_millis(20),
        opts,
        &history,
        Duration::from_secs(90),
    );
    until("a few grants", async || work.grants() >= 4).await;
    let dead = leader(&endpoints);
    cluster.members()[dead].kill().unwrap();
    work.finish().await.unwrap();
    let report = history.check(true, true);
    assert!(report.is_ok(), "{report}");
    assert!(report.grants >= 24, "{report}");

    // The member comes back and the cluster serves through it again.
    cluster.members()[dead].restart().await.unwrap();
    let back = vec![endpoints[dead].clone()];
    until("the restarted member to serve", async || {
        etcdctl(&back, &["put", "back", "1"]).is_ok()
    })
    .await;

    // Two of three down: no quorum. Acquire fails within its wait, cleanly.
    let lock = EtcdLock::connect(config.clone()).await.unwrap();
    let survivor = (dead + 1) % 3;
    for (i, m) in cluster.members().iter_mut().enumerate() {
        if i != survivor {
            m.kill().unwrap();
        }
    }
    let wait = Duration::from_secs(3);
    let started = Instant::now();
    let r = lock
        .acquire(&key("no-quorum"), AcquireOptions::default().wait(Wait::For(wait)))
        .await;
    let took = started.elapsed();
    assert!(
        matches!(r, Err(Error::Unavailable { .. } | Error::Timeout { .. })),
        "{:?}",
        r.map(|g| g.token())
    );
    assert!(took < wait + Duration::from_secs(5), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_endpoints_fail_cleanly() {
    let port = dlock_testkit::launcher::free_ports(1).unwrap()[0];
    let dial = Duration::from_millis(500);
    let config = EtcdConfig::new([format!("http://127.0.0.1:{port}")]).timeouts(dial, dial);
    let started = Instant::now();
    let r = EtcdLock::connect(config).await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    assert!(
        started.elapsed() < dial * 2 + Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    for bad in ["not an endpoint", "http://h:port", ""] {
        let r = EtcdLock::connect(EtcdConfig::new([bad])).await;
        assert!(matches!(r, Err(Error::InvalidConfig(_))), "{bad}: {r:?}");
    }
}

/// A waiter that times out while its clean-up delete fails must not leave
/// its key behind: its lease is kept alive, so nobody could take the lock
/// again while the process lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_whose_clean_up_fails_leaves_nothing_behind() {
    use dlock_testkit::launcher::{Fault, FaultProxy};
    let f = common::EtcdFactory::shared().await;
    let endpoint = f.config.endpoints[0].trim_start_matches("http://");
    let proxy = FaultProxy::start(endpoint.parse().unwrap()).await.unwrap();
    let config = EtcdConfig::new([proxy.addr().to_string()])
        .timeouts(Duration::from_secs(5), Duration::from_millis(300));
    let waiter = EtcdLock::connect(config).await.unwrap();
    let other = f.admin.clone();
    let k = key(&unique("cleanup"));
    let ttl = AcquireOptions::default().ttl(Duration::from_secs(20));
    let g = other.acquire(&k, ttl).await.unwrap();
    let w = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            waiter
                .acquire(&k, ttl.wait(Wait::For(Duration::from_secs(1))))
                .await
        })
    };
    until("the waiter to queue", async || {
        other.contender_keys(k.as_str()).await.unwrap().len() == 2
    })
    .await;
    // The waiter's network goes silent before its wait runs out: its delete fails.
    proxy.set(Fault::Blackhole);
    let r = tokio::time::timeout(LIMIT, w).await.unwrap().unwrap();
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    proxy.set(Fault::None);
    g.release().await.unwrap();
    // The waiter's lease lives on (its handle is still open).
    let g = tokio::time::timeout(LIMIT, other.acquire(&k, AcquireOptions::default()))
        .await
        .expect("the timed-out waiter's key blocks the lock")
        .unwrap();
    g.release().await.unwrap();
    until("nothing left behind", async || {
        other.contender_keys(k.as_str()).await.unwrap().is_empty()
    })
    .await;
    drop(waiter);
}
