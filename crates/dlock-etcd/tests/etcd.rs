//! etcd-specific behaviour against real servers: interop with `etcdctl
//! lock`, lease loss, a waiter whose key vanishes, a 3-member cluster losing
//! its leader and then its quorum, and bad endpoints.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey, Role, Wait};
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
    assert!(theirs.id.starts_with(&format!("{name}/")), "{theirs:?}");
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
    assert!(g.token().unwrap().get() > theirs.token.unwrap());

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

/// A lease revoked behind the handle's back is not used again: an acquire
/// made before any keep-alive noticed (here at once, after a guard's
/// extend found its key gone) gets a new lease, not "lease not found".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_right_after_a_revoke_gets_a_new_lease() {
    let f = common::EtcdFactory::shared().await;
    let lock = EtcdLock::connect(f.config.clone()).await.unwrap();
    // A long lease: its keep-alives (a third of it apart) stay out of the way.
    let opts = AcquireOptions::default().ttl(Duration::from_secs(60));
    let g = lock.acquire(&key(&unique("revoked-now")), opts).await.unwrap();
    etcdctl(
        &f.config.endpoints,
        &["lease", "revoke", &format!("{:x}", g.lease())],
    )
    .unwrap();
    assert!(matches!(
        g.extend(Duration::from_secs(60)).await,
        Err(Error::Lost { .. })
    ));
    assert!(g.lost().is_lost());
    for name in ["after-revoke", "after-revoke-2"] {
        let again = lock
            .acquire(&key(&unique(name)), opts)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        assert_ne!(again.lease(), g.lease());
        again.release().await.unwrap();
    }
}

/// The guards of a session cost no task each: one task tells them all
/// when the lease goes, each with its own `lost()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_task_tells_every_guard_of_a_session() {
    let f = common::EtcdFactory::shared().await;
    let lock = EtcdLock::connect(f.config.clone()).await.unwrap();
    let base = unique("followers");
    // The session (its keep-alive and its followers' task) exists first.
    // A short lease: the revoke is noticed at the next keep-alive.
    let opts = AcquireOptions::default().ttl(Duration::from_secs(3));
    let warm = lock.acquire(&key(&format!("{base}/warm")), opts).await.unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(lock.acquire(&key(&format!("{base}/{i}")), opts).await.unwrap());
    }
    let during = metrics.num_alive_tasks();
    assert!(
        during <= before + 1,
        "{before} tasks before 20 guards, {during} with them"
    );
    etcdctl(
        &f.config.endpoints,
        &["lease", "revoke", &format!("{:x}", warm.lease())],
    )
    .unwrap();
    for g in guards.iter().chain([&warm]) {
        tokio::time::timeout(LIMIT, g.lost().wait())
            .await
            .expect("every guard lost() after the revoke");
    }
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
        a.contenders(&ns).await.unwrap().len() == 2
    })
    .await;
    let theirs: Vec<String> = a
        .contenders(&ns)
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
        other.contenders(k.as_str()).await.unwrap().len() == 2
    })
    .await;
    // The waiter's network goes silent before its wait runs out: its delete
    // fails. (On a busy machine the silence may start while the waiter is
    // still setting up its watch: then the acquire ends Unavailable, and
    // the same clean-up must follow.)
    proxy.set(Fault::Blackhole);
    let r = tokio::time::timeout(LIMIT, w).await.unwrap().unwrap();
    assert!(
        matches!(r, Err(Error::Timeout { .. } | Error::Unavailable { .. })),
        "{r:?}"
    );
    proxy.set(Fault::None);
    g.release().await.unwrap();
    // The waiter's lease lives on (its handle is still open).
    let g = tokio::time::timeout(LIMIT, other.acquire(&k, AcquireOptions::default()))
        .await
        .expect("the timed-out waiter's key blocks the lock")
        .unwrap();
    g.release().await.unwrap();
    until("nothing left behind", async || {
        other.contenders(k.as_str()).await.unwrap().is_empty()
    })
    .await;
    drop(waiter);
}

/// Without auto-extend, `extend` is a keep-alive of the guard's own lease:
/// the key is never written (Go's `RWMutex` orders by modification
/// revision). An extend cut while its answer is on the way (the future
/// dropped) leaves the key as it was, on the same lease with the same
/// revisions, and the lock held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_whose_answer_is_lost_leaves_the_key_as_it_was() {
    use dlock_testkit::launcher::{Fault, FaultProxy};
    let f = common::EtcdFactory::shared().await;
    let endpoint = f.config.endpoints[0].trim_start_matches("http://");
    let proxy = FaultProxy::start(endpoint.parse().unwrap()).await.unwrap();
    let config =
        EtcdConfig::new([proxy.addr().to_string()]).timeouts(Duration::from_secs(5), Duration::from_secs(20));
    let lock = EtcdLock::connect(config).await.unwrap();
    let k = key(&unique("extend-lost"));
    let ttl = Duration::from_secs(20);
    let g = lock
        .acquire(&k, AcquireOptions::default().ttl(ttl).auto_extend(false))
        .await
        .unwrap();
    let kv = || {
        let out = etcdctl(&f.config.endpoints, &["get", g.etcd_key(), "-w", "json"]).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let kv = &v["kvs"][0];
        (
            kv["create_revision"].clone(),
            kv["mod_revision"].clone(),
            kv["lease"].clone(),
        )
    };
    let before = kv();
    assert!(!before.1.is_null(), "our key: {before:?}");
    // A second each way: the keep-alive reaches etcd, its answer is cut.
    proxy.set(Fault::Delay(Duration::from_secs(1)));
    let cut = tokio::time::timeout(Duration::from_millis(1500), g.extend(ttl)).await;
    assert!(cut.is_err(), "the extend finished before it was cut: {cut:?}");
    proxy.set(Fault::None);
    assert_eq!(kv(), before, "the key was rewritten or moved");
    assert!(g.is_held());
    g.extend(ttl).await.unwrap();
    assert_eq!(kv(), before, "the key was rewritten or moved");
    g.release().await.unwrap();
}

/// Racing first acquires of one handle share one lease (one session), not
/// one lease, keep-alive stream and task each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_first_acquires_share_one_lease() {
    let f = common::EtcdFactory::shared().await;
    let lock = EtcdLock::connect(f.config.clone()).await.unwrap();
    let base = unique("race");
    let keys: Vec<LockKey> = (0..8).map(|i| key(&format!("{base}/{i}"))).collect();
    let guards =
        futures::future::join_all(keys.iter().map(|k| lock.acquire(k, AcquireOptions::default()))).await;
    let leases: std::collections::BTreeSet<i64> =
        guards.iter().map(|g| g.as_ref().unwrap().lease()).collect();
    assert_eq!(leases.len(), 1, "{leases:?}");
    for g in guards {
        g.unwrap().release().await.unwrap();
    }
}

/// Without auto-extend, a grant keeps its whole TTL however long it waited:
/// the lease must not start (and run out) while the waiter waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_longer_than_the_ttl_is_granted_the_whole_ttl() {
    let f = common::EtcdFactory::shared().await;
    let (a, b) = (
        f.admin.clone(),
        EtcdLock::connect(f.config.clone()).await.unwrap(),
    );
    let k = key(&unique("long-wait"));
    let g = a.acquire(&k, AcquireOptions::default()).await.unwrap();
    let ttl = Duration::from_secs(2);
    let waiting = Instant::now();
    let w = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move {
            b.acquire(
                &k,
                AcquireOptions::default()
                    .ttl(ttl)
                    .auto_extend(false)
                    .wait(Wait::Forever),
            )
            .await
        })
    };
    until("the waiter to queue", async || {
        a.contenders(k.as_str()).await.unwrap().len() == 2
    })
    .await;
    // Held past the waiter's TTL (and etcd's lease granularity).
    until("the wait to outlast the TTL", async || {
        waiting.elapsed() > ttl + Duration::from_secs(2)
    })
    .await;
    g.release().await.unwrap();
    let granted = tokio::time::timeout(LIMIT, w).await.unwrap().unwrap();
    let g2 = granted.expect("a long wait ended in an error");
    assert!(g2.is_held());
    g2.release().await.unwrap();
}

/// A holder whose lease is revoked (an operator, `etcdctl lease revoke`)
/// learns it at its next keep-alive: `lost()` fires and `is_held()` turns
/// false then, not only when the local deadline (60 s here) runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_is_revoked_is_lost_at_its_next_keep_alive() {
    let f = common::EtcdFactory::shared().await;
    let lock = EtcdLock::connect(f.config.clone()).await.unwrap();
    let k = key(&unique("revoked"));
    let g = lock
        .acquire(&k, AcquireOptions::default().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    etcdctl(
        &f.config.endpoints,
        &["lease", "revoke", &format!("{:x}", g.lease())],
    )
    .unwrap();
    tokio::time::timeout(LIMIT, g.lost().wait())
        .await
        .expect("lost() did not fire for a revoked lease");
    assert!(!g.is_held());
}

/// The lease (hex) of a contender key `{prefix}{name}/{lease:x}-{n:x}`.
fn lease_of(key: &str) -> &str {
    let name = key.rsplit('/').next().unwrap_or(key);
    name.split('-').next().unwrap_or(name)
}

/// A waiter whose own lease ends while it waits is told at its next
/// keep-alive (`Lost`), not when the holder finally lets go, nor when the
/// lease's deadline passes: with a 60 s TTL, well within [`LIMIT`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_lease_ends_is_told_at_its_next_keep_alive() {
    let f = common::EtcdFactory::shared().await;
    let (a, b) = (
        f.admin.clone(),
        EtcdLock::connect(f.config.clone()).await.unwrap(),
    );
    let k = key(&unique("waiter-lease"));
    let g = a.acquire(&k, AcquireOptions::default()).await.unwrap();
    let w = {
        let (b, k) = (b.clone(), k.clone());
        let opts = AcquireOptions::default().ttl(Duration::from_secs(60));
        tokio::spawn(async move { b.acquire(&k, opts).await })
    };
    until("the waiter to queue", async || {
        a.contenders(k.as_str()).await.unwrap().len() == 2
    })
    .await;
    // The waiter's key is `{prefix}{name}/{lease:x}-{n}`: revoke that lease.
    let keys = a.contenders(k.as_str()).await.unwrap();
    let theirs = keys
        .iter()
        .find(|key| !key.ends_with(g.etcd_key().rsplit('/').next().unwrap()))
        .unwrap();
    etcdctl(&f.config.endpoints, &["lease", "revoke", lease_of(theirs)]).unwrap();
    let r = tokio::time::timeout(LIMIT, w)
        .await
        .expect("the waiter hung while its lease was gone")
        .unwrap();
    assert!(matches!(r, Err(Error::Lost { .. })), "{:?}", r.map(|g| g.token()));
    assert!(g.is_held());
    g.release().await.unwrap();
}

/// How many streams of a gRPC method the etcd at `endpoint` has started
/// (its `/metrics`, read over plain HTTP).
fn streams_started(endpoint: &str, method: &str) -> u64 {
    use std::io::{Read, Write};
    let addr = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines()
        .filter(|l| {
            l.starts_with("grpc_server_started_total{") && l.contains(&format!("grpc_method=\"{method}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A kept-alive lease keeps one keep-alive stream, and a waiter one watch,
/// however long they last. (With HTTP/2 pings every 2 s, more often than
/// etcd's `--grpc-keepalive-min-time` of 5 s allows, etcd closed the
/// connection whenever it idled a few seconds: every keep-alive of a 30 s
/// lease, and every waiter's watch with it, started over.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_survive_idle_connections() {
    let server = Etcd::start().await.unwrap();
    let endpoint = server.endpoints()[0].clone();
    let config = EtcdConfig::new(server.endpoints());
    let (a, b) = (
        EtcdLock::connect(config.clone()).await.unwrap(),
        EtcdLock::connect(config).await.unwrap(),
    );
    let k = key(&unique("streams"));
    let opts = AcquireOptions::default().ttl(Duration::from_secs(30));
    let g = a.acquire(&k, opts).await.unwrap();
    let w = {
        let (b, k) = (b.clone(), k.clone());
        tokio::spawn(async move { b.acquire(&k, opts).await })
    };
    until("the waiter to queue", async || {
        a.contenders(k.as_str()).await.unwrap().len() == 2
    })
    .await;
    // One keep-alive stream per session, and the waiter's watch (opened
    // after its key: wait for them before counting from here).
    until("both sessions' keep-alives and the waiter's watch", async || {
        streams_started(&endpoint, "LeaseKeepAlive") == 2 && streams_started(&endpoint, "Watch") == 1
    })
    .await;
    let (keep_alives, watches) = (2, 1);
    // What is under test is time passing: a connection quiet between two
    // keep-alives (10 s apart), and then some.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(g.is_held());
    assert_eq!(
        streams_started(&endpoint, "LeaseKeepAlive"),
        keep_alives,
        "keep-alive streams were reopened"
    );
    assert_eq!(
        streams_started(&endpoint, "Watch"),
        watches,
        "the waiter's watch was reopened"
    );
    g.release().await.unwrap();
    w.await.unwrap().unwrap().release().await.unwrap();
}

/// An etcd that is not there and a bad endpoint each read as one sentence
/// naming the backend, where, and why (not tonic's whole debug chain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_and_a_bad_url_read_as_sentences() {
    let addr = dlock_testkit::link::nowhere(1).unwrap()[0];
    let e = EtcdLock::connect(EtcdConfig::new([format!("http://{addr}")]))
        .await
        .expect_err("nothing listens there");
    assert_eq!(
        e.to_string(),
        format!("etcd at {addr} unavailable: connection refused")
    );
    let e = EtcdLock::connect(EtcdConfig::new(["ftp://h:1"]))
        .await
        .expect_err("not an etcd endpoint");
    let shown = e.to_string();
    assert!(matches!(e, Error::InvalidConfig(_)), "{shown}");
    assert_eq!(shown.matches("invalid configuration").count(), 1, "{shown}");
    assert!(shown.contains("ftp://h:1"), "{shown}");
}

/// Our read-write lock and Go's `recipes.RWMutex` share one layout: keys
/// under `{prefix}NAME/write/` and `{prefix}NAME/read/` written as Go
/// writes them exclude ours by create revision (a writer waits for every
/// earlier key, a reader for earlier writers only), and ours go there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_interoperates_with_go_recipe_keys() {
    let f = common::EtcdFactory::shared().await;
    let k = key(&unique("go-rw"));
    let pfx = f.admin.lock_prefix(&k);
    let now = AcquireOptions::default().wait(Wait::No);
    let nanos = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            .to_string()
    };
    // A Go writer holds: we can neither read nor write.
    let go_writer = format!("{pfx}write/{}", nanos());
    etcdctl(&f.config.endpoints, &["put", &go_writer, ""]).unwrap();
    assert!(matches!(
        f.admin.acquire_read(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    assert!(matches!(
        f.admin.acquire_write(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    etcdctl(&f.config.endpoints, &["del", &go_writer]).unwrap();
    // A Go reader holds: we can read beside it, not write.
    let go_reader = format!("{pfx}read/{}", nanos());
    etcdctl(&f.config.endpoints, &["put", &go_reader, ""]).unwrap();
    let ours = f.admin.acquire_read(&k, now).await.unwrap();
    assert!(matches!(
        f.admin.acquire_write(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    let keys = etcdctl(
        &f.config.endpoints,
        &["get", "--prefix", "--keys-only", &format!("{pfx}read/")],
    )
    .unwrap();
    assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 2, "{keys}");
    ours.release().await.unwrap();
    etcdctl(&f.config.endpoints, &["del", &go_reader]).unwrap();
    let w = f.admin.acquire_write(&k, now).await.unwrap();
    let keys = etcdctl(
        &f.config.endpoints,
        &["get", "--prefix", "--keys-only", &format!("{pfx}write/")],
    )
    .unwrap();
    assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 1, "{keys}");
    w.release().await.unwrap();
}

/// A key under a semaphore's prefix that dlock did not write takes every
/// permit. Here the key of the report: a count of `u64::MAX`, which
/// overflowed the sum of counts (a panic in a debug build; in release the
/// sum wrapped and two holders were admitted to a limit of 1). While it is
/// there nobody is admitted; operators see it as what holds; once it is
/// deleted the limit of 1 admits exactly one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_semaphore_key_with_a_huge_count_admits_nobody() {
    let f = common::EtcdFactory::shared().await;
    let (a, b) = (
        f.admin.clone(),
        EtcdLock::connect(f.config.clone()).await.unwrap(),
    );
    let k = key(&unique("sem-overflow"));
    let planted = format!("{}sem/{}/1/zz", a.lock_prefix(&k), u64::MAX);
    etcdctl(&f.config.endpoints, &["put", &planted, ""]).unwrap();
    let now = AcquireOptions::default().wait(Wait::No);
    // Both asked while both could hold together: each guard is kept.
    let (ra, rb) = tokio::join!(a.acquire_permits(&k, 1, 1, now), b.acquire_permits(&k, 1, 1, now));
    for r in [ra, rb] {
        assert!(
            matches!(r, Err(Error::Timeout { .. })),
            "admitted behind a key that fills the semaphore: {:?}",
            r.map(|g| g.token())
        );
    }
    let holders = a.holders(&k).await.unwrap();
    let seen: Vec<(Role, &str)> = holders.iter().map(|h| (h.role, h.id.as_str())).collect();
    assert_eq!(seen, [(Role::Permits(u32::MAX), planted.as_str())]);
    etcdctl(&f.config.endpoints, &["del", &planted]).unwrap();
    let g = a.acquire_permits(&k, 1, 1, now).await.unwrap();
    assert!(matches!(
        b.acquire_permits(&k, 1, 1, now).await,
        Err(Error::Timeout { .. })
    ));
    g.release().await.unwrap();
}

/// `holder()` reports what the first contender holds, by its key: the
/// semaphore's permits, a read or the write of the read-write lock, the
/// mutex. (It said `Mutex` for all of them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_reports_what_the_holder_holds() {
    let f = common::EtcdFactory::shared().await;
    let lock = f.admin.clone();
    let opts = AcquireOptions::default();
    let sem = key(&unique("role-sem"));
    let g = lock.acquire_permits(&sem, 2, 3, opts).await.unwrap();
    let h = lock.holder(&sem).await.unwrap().expect("a holder");
    assert_eq!((h.role, h.id.as_str()), (Role::Permits(2), g.etcd_key()));
    assert_eq!(lock.holders(&sem).await.unwrap(), [h]);
    g.release().await.unwrap();
    let rw = key(&unique("role-rw"));
    let g = lock.acquire_read(&rw, opts).await.unwrap();
    assert_eq!(lock.holder(&rw).await.unwrap().map(|h| h.role), Some(Role::Read));
    g.release().await.unwrap();
    let g = lock.acquire_write(&rw, opts).await.unwrap();
    assert_eq!(lock.holder(&rw).await.unwrap().map(|h| h.role), Some(Role::Write));
    g.release().await.unwrap();
    let m = key(&unique("role-mutex"));
    let g = lock.acquire(&m, opts).await.unwrap();
    assert_eq!(lock.holder(&m).await.unwrap().map(|h| h.role), Some(Role::Mutex));
    g.release().await.unwrap();
    assert_eq!(lock.holder(&m).await.unwrap(), None);
}
