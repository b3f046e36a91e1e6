//! ZooKeeper-specific behaviour against real servers: Curator's layout,
//! session expiry of a holder, and a 3-member ensemble losing its leader and
//! then its quorum.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey, Wait};
use dlock_testkit::history::History;
use dlock_testkit::launcher::{Fault, FaultProxy, ZooKeeper, shared, zk};
use dlock_testkit::workload::Contention;
use dlock_zk::{ZkConfig, ZkLock};
use zookeeper_client::{Acls, Client, CreateMode};

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

/// Creates a lock node exactly as Curator's `InterProcessMutex` names it,
/// through a plain ZooKeeper client.
async fn curator_node(client: &Client, dir: &str) -> String {
    curator_named(client, dir, "-lock-").await
}

/// Creates a node as Curator names it, with `infix` (`-lock-` for its
/// mutex, `-__READ__` / `-__WRIT__` for its read-write lock).
async fn curator_named(client: &Client, dir: &str, infix: &str) -> String {
    client
        .mkdir(dir, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
        .unwrap();
    let uuid = uuid_like();
    let (_, seq) = client
        .create(
            &format!("{dir}/_c_{uuid}{infix}"),
            b"curator",
            &CreateMode::EphemeralSequential.with_acls(Acls::anyone_all()),
        )
        .await
        .unwrap();
    format!("{dir}/_c_{uuid}{infix}{seq}")
}

fn uuid_like() -> String {
    let n: u128 = rand::random();
    let h = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn is_curator_name(node: &str) -> bool {
    let name = node.rsplit('/').next().unwrap_or_default();
    let Some(rest) = name.strip_prefix("_c_") else {
        return false;
    };
    let Some((uuid, seq)) = rest.split_once("-lock-") else {
        return false;
    };
    uuid.len() == 36
        && uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && seq.len() == 10
        && seq.chars().all(|c| c.is_ascii_digit())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_nodes_are_honoured_in_order_and_ours_look_like_curators() {
    let f = common::ZkFactory::shared().await;
    let raw = Client::connect(&f.config.connect).await.unwrap();
    let name = unique("curator");
    let k = key(&name);
    let dir = f.admin.lock_path(&k).unwrap();

    let first = curator_node(&raw, &dir).await;
    assert!(
        f.admin
            .try_acquire(&k, AcquireOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    let waiter = {
        let (lock, k) = (f.admin.clone(), k.clone());
        tokio::spawn(async move {
            lock.acquire(&k, AcquireOptions::default().wait(Wait::For(LIMIT)))
                .await
        })
    };
    until("dlock's node to queue", async || {
        f.admin.contenders(&name).await.unwrap().len() == 2
    })
    .await;
    let third = curator_node(&raw, &dir).await;
    let ours: Vec<String> = f
        .admin
        .contenders(&name)
        .await
        .unwrap()
        .into_iter()
        .filter(|n| *n != first && *n != third)
        .collect();
    assert_eq!(ours.len(), 1);
    assert!(is_curator_name(&ours[0]), "{}", ours[0]);

    // The first Curator node goes: dlock (second in line) gets the lock, not the third.
    raw.delete(&first, None).await.unwrap();
    let g = tokio::time::timeout(LIMIT, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(g.node(), ours[0]);
    let holder = f.admin.holder(&k).await.unwrap().unwrap();
    assert_eq!(holder.id, ours[0]);
    assert_eq!(
        holder.token.map(|t| i64::try_from(t).unwrap()),
        g.token().map(|t| i64::try_from(t.get()).unwrap())
    );
    g.release().await.unwrap();
    assert_eq!(
        f.admin.holder(&k).await.unwrap().unwrap().id,
        third,
        "the third contender is next"
    );
    raw.delete(&third, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_session_expires_loses_the_lock() {
    let server = shared::zk().await.unwrap();
    let connect = server.addresses[0].clone();
    let first: SocketAddr = connect.split(',').next().unwrap().parse().unwrap();
    let proxy = FaultProxy::start(first).await.unwrap();
    let config = ZkConfig::new(proxy.addr().to_string()).session_timeout(common::SESSION);
    let holder = ZkLock::connect(config).await.unwrap();
    let other = ZkLock::connect(ZkConfig::new(connect).session_timeout(common::SESSION))
        .await
        .unwrap();
    let k = key(&unique("expiry"));
    let g = holder.acquire(&k, AcquireOptions::default()).await.unwrap();
    assert!(g.is_held());

    // The holder's network goes silent: it cannot be sure any more, and the
    // server expires its session and hands the lock on.
    proxy.set(Fault::Blackhole);
    until("the holder to notice it is disconnected", async || !g.is_held()).await;
    let g2 = tokio::time::timeout(LIMIT, other.acquire(&k, AcquireOptions::default()))
        .await
        .unwrap()
        .unwrap();
    assert!(g2.token() > g.token());

    // When the network heals, the holder learns its session expired: LOST.
    proxy.set(Fault::None);
    tokio::time::timeout(LIMIT, g.lost().wait())
        .await
        .expect("lost() after the session expired");
    assert!(!g.is_held());
    assert!(matches!(
        g.release().await,
        Err(Error::Lost { .. } | Error::Unavailable { .. })
    ));
    // The holder's handle opens a new session for later acquires.
    assert!(
        holder
            .try_acquire(&k, AcquireOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    g2.release().await.unwrap();
    holder
        .acquire(&k, AcquireOptions::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ensemble_keeps_exclusion_through_a_leader_kill_and_fails_cleanly_without_quorum() {
    let mut ensemble = ZooKeeper::start_ensemble(3).await.unwrap();
    let config = ZkConfig {
        request_timeout: Duration::from_secs(3),
        ..ZkConfig::new(ensemble.connect_string()).session_timeout(Duration::from_secs(6))
    };
    let k = key("contended");
    let history = History::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(ZkLock::connect(config.clone()).await.unwrap());
    }
    let opts = AcquireOptions::default().wait(Wait::For(Duration::from_secs(10)));
    let work = Contention::start(
        clients,
        &k,
        8,
        Duration::from_millis(20),
        opts,
        &history,
        Duration::from_secs(120),
    );
    until("a few grants", async || work.grants() >= 4).await;
    let leader = ensemble.leader().await.expect("a leader");
    ensemble.members()[leader].kill().unwrap();
    work.finish().await.unwrap();
    let report = history.check(true, true);
    assert!(report.is_ok(), "{report}");
    assert!(report.grants >= 24, "{report}");

    // The member comes back as a follower.
    ensemble.members()[leader].restart().await.unwrap();
    let addr = ensemble.members()[leader].addr();
    assert!(zk::mode(addr).await.is_some());

    // Two of three down: no quorum. Acquire fails within its wait, cleanly.
    let lock = ZkLock::connect(config.clone()).await.unwrap();
    let survivor = (leader + 1) % 3;
    for (i, m) in ensemble.members().iter_mut().enumerate() {
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
    assert!(
        took < wait + config.request_timeout * 2 + Duration::from_secs(2),
        "took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_fails_cleanly() {
    let port = dlock_testkit::launcher::free_ports(1).unwrap()[0];
    let config = ZkConfig {
        connect_timeout: Duration::from_millis(500),
        ..ZkConfig::new(format!("127.0.0.1:{port}"))
    };
    let started = Instant::now();
    assert!(matches!(
        ZkLock::connect(config).await,
        Err(Error::Unavailable { .. })
    ));
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(matches!(
        ZkLock::connect(ZkConfig::new("nohost")).await,
        Err(Error::InvalidConfig(_))
    ));
    let f = common::ZkFactory::shared().await;
    for bad in ["a//b", "/lead", "trail/", "x/../y", "."] {
        let r = f.admin.acquire(&key(bad), AcquireOptions::default()).await;
        assert!(
            matches!(r, Err(Error::InvalidKey { .. })),
            "{bad}: {:?}",
            r.map(|g| g.token())
        );
    }
}

/// A disconnect shorter than the session: SUSPENDED (`is_held()` false),
/// then connected again within the session (`is_held()` true, nothing lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_disconnect_suspends_and_then_resumes() {
    let server = shared::zk().await.unwrap();
    let first: SocketAddr = server.addresses[0].split(',').next().unwrap().parse().unwrap();
    let proxy = FaultProxy::start(first).await.unwrap();
    let lock =
        ZkLock::connect(ZkConfig::new(proxy.addr().to_string()).session_timeout(Duration::from_secs(8)))
            .await
            .unwrap();
    let k = key(&unique("suspend"));
    let g = lock.acquire(&k, AcquireOptions::default()).await.unwrap();
    proxy.set(Fault::Blackhole);
    until("SUSPENDED", async || !g.is_held()).await;
    proxy.set(Fault::None);
    until("connected again", async || g.is_held()).await;
    assert!(!g.lost().is_lost());
    assert_eq!(lock.holder(&k).await.unwrap().unwrap().id, g.node());
    g.release().await.unwrap();
}

/// A holder cut off for longer than its session: its `lost()` must fire
/// before the server can hand the lock to a waiter (the server expires the
/// session about one timeout after it last heard from the holder; the
/// client library declares it expired only at 7/5 of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_lost_before_a_waiter_is_granted() {
    let server = shared::zk().await.unwrap();
    let connect = server.addresses[0].clone();
    let first: SocketAddr = connect.split(',').next().unwrap().parse().unwrap();
    let proxy = FaultProxy::start(first).await.unwrap();
    let session = Duration::from_secs(4);
    let holder = ZkLock::connect(ZkConfig::new(proxy.addr().to_string()).session_timeout(session))
        .await
        .unwrap();
    let waiter = ZkLock::connect(ZkConfig::new(connect).session_timeout(session))
        .await
        .unwrap();
    let k = key(&unique("partition"));
    let g = holder.acquire(&k, AcquireOptions::default()).await.unwrap();
    let lost = g.lost();
    let lost_at = tokio::spawn(async move {
        lost.wait().await;
        Instant::now()
    });
    let w = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            let g = waiter.acquire(&k, AcquireOptions::default()).await;
            (Instant::now(), g)
        })
    };
    until("the waiter to queue", async || {
        waiter.contenders(k.as_str()).await.unwrap().len() == 2
    })
    .await;
    proxy.set(Fault::Blackhole);
    let (granted_at, g2) = tokio::time::timeout(LIMIT, w).await.unwrap().unwrap();
    let g2 = g2.unwrap();
    let lost_at = tokio::time::timeout(LIMIT, lost_at).await.unwrap().unwrap();
    assert!(
        lost_at < granted_at,
        "the holder learned it lost the lock {:?} after the waiter got it",
        lost_at - granted_at
    );
    assert!(!g.is_held());
    proxy.set(Fault::None);
    g2.release().await.unwrap();
}

/// Someone else deleting the holder's node (an operator, a stray client)
/// fires `lost()`, however soon after the grant: held briefly or longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_by_someone_else_fires_lost() {
    let f = common::ZkFactory::shared().await;
    let raw = Client::connect(&f.config.connect).await.unwrap();
    let server: SocketAddr = f.config.connect.split(',').next().unwrap().parse().unwrap();
    for watched in [false, true] {
        let k = key(&unique("deleted"));
        let g = f.admin.acquire(&k, AcquireOptions::default()).await.unwrap();
        if watched {
            // Held for a while: the guard watches its node by then.
            until("the guard to watch its node", async || {
                watchers(server, g.node()).await == 1
            })
            .await;
        }
        raw.delete(g.node(), None).await.unwrap();
        tokio::time::timeout(LIMIT, g.lost().wait())
            .await
            .expect("lost() after the node was deleted");
        assert!(!g.is_held());
        assert!(matches!(g.release().await, Err(Error::Lost { .. })));
    }
}

/// A guard costs its session a slot, not a task: one task watches every
/// guard of a session (their nodes' deletion, their own TTLs). Deleting one
/// node fires that guard only; a guard without auto-extend gives its node up
/// at its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_task_watches_every_guard_of_a_session() {
    let f = common::ZkFactory::shared().await;
    // A long session: this test is not about session timing, and one
    // stalled heartbeat must not fire every guard.
    let lock = ZkLock::connect(f.config.clone().session_timeout(Duration::from_secs(10)))
        .await
        .unwrap();
    let raw = Client::connect(&f.config.connect).await.unwrap();
    let server: SocketAddr = f.config.connect.split(',').next().unwrap().parse().unwrap();
    let base = unique("watched");
    // The session (and its tasks) exists first.
    let warm = lock
        .acquire(&key(&format!("{base}/warm")), AcquireOptions::default())
        .await
        .unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(
            lock.acquire(&key(&format!("{base}/{i}")), AcquireOptions::default())
                .await
                .unwrap(),
        );
    }
    let short = AcquireOptions::default()
        .auto_extend(false)
        .ttl(Duration::from_secs(2));
    let timed = lock.acquire(&key(&format!("{base}/timed")), short).await.unwrap();
    for g in &guards {
        until("every guard to watch its node", async || {
            watchers(server, g.node()).await == 1
        })
        .await;
    }
    let during = metrics.num_alive_tasks();
    assert!(
        during <= before,
        "{before} tasks before 21 guards, {during} with them"
    );
    raw.delete(guards[7].node(), None).await.unwrap();
    tokio::time::timeout(LIMIT, guards[7].lost().wait())
        .await
        .expect("lost() after its node was deleted");
    tokio::time::timeout(LIMIT, timed.lost().wait())
        .await
        .expect("lost() after the guard's own TTL");
    let node = timed.node().to_owned();
    until("the timed-out guard's node to go", async || {
        matches!(raw.check_stat(&node).await, Ok(None))
    })
    .await;
    for (i, g) in guards.iter().chain([&warm]).enumerate() {
        assert_eq!(g.lost().is_lost(), i == 7, "guard {i}");
    }
    for g in guards.into_iter().filter(|g| !g.lost().is_lost()) {
        g.release().await.unwrap();
    }
}

/// A handle whose session (and zookeeper-client's task) lives on a runtime
/// of its own, which the caller can shut down.
async fn on_its_own_runtime(config: ZkConfig) -> (tokio::runtime::Runtime, ZkLock) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let lock = runtime.spawn(ZkLock::connect(config)).await.unwrap().unwrap();
    (runtime, lock)
}

/// A session whose runtime goes away (its tasks with it) tells its guards:
/// they are lost, and the handle opens a new session on the next acquire,
/// even one made the instant the first guard reads lost (the session is
/// marked ended before any guard is told). That instant is a race, so it
/// is run a number of times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_are_lost_when_their_sessions_runtime_goes() {
    const ROUNDS: usize = 30;
    const GUARDS: usize = 50;
    let f = common::ZkFactory::shared().await;
    let config = f.config.clone().session_timeout(Duration::from_secs(10));
    for round in 0..ROUNDS {
        let (other, lock) = on_its_own_runtime(config.clone()).await;
        let mut guards = Vec::with_capacity(GUARDS);
        for i in 0..GUARDS {
            let k = key(&unique(&format!("runtime-{i}")));
            guards.push(lock.acquire(&k, AcquireOptions::default()).await.unwrap());
        }
        // Acquires on a plain thread the moment any guard reads lost, while
        // the others may still be being told.
        let observer = {
            let signals: Vec<_> = guards.iter().map(|g| g.lost().clone()).collect();
            let (lock, runtime) = (lock.clone(), tokio::runtime::Handle::current());
            std::thread::spawn(move || {
                let deadline = Instant::now() + LIMIT;
                while !signals.iter().any(|s| s.is_lost()) {
                    assert!(Instant::now() < deadline, "no guard lost within {LIMIT:?}");
                    std::hint::spin_loop();
                }
                runtime.block_on(async {
                    let k = key(&unique("runtime-again"));
                    let g = lock.acquire(&k, AcquireOptions::default()).await?;
                    g.release().await
                })
            })
        };
        other.shutdown_background();
        for g in &guards {
            tokio::time::timeout(LIMIT, g.lost().wait())
                .await
                .expect("lost() once the session's runtime went");
            assert!(!g.is_held());
        }
        tokio::task::spawn_blocking(move || observer.join().unwrap())
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: an acquire at the first lost(): {e:?}"));
        drop(guards);
        let again = lock
            .acquire(&key(&unique("runtime-again")), AcquireOptions::default())
            .await
            .unwrap();
        again.release().await.unwrap();
    }
}

/// A waiter whose session's runtime goes (zookeeper-client's task, and the
/// sender of the watch it waits on, with it) gets an answer, not a panic:
/// the lock after the old session expires, or an error saying why not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_sessions_runtime_goes_is_answered() {
    let f = common::ZkFactory::shared().await;
    let raw = Client::connect(&f.config.connect).await.unwrap();
    let config = f.config.clone().session_timeout(Duration::from_secs(4));
    let (other, lock) = on_its_own_runtime(config).await;
    let k = key(&unique("runtime-waiter"));
    let dir = lock.lock_path(&k).unwrap();
    let held = lock.acquire(&k, AcquireOptions::default()).await.unwrap();
    let waiter = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move {
            let g = lock
                .acquire(&k, AcquireOptions::default().wait(Wait::For(LIMIT)))
                .await?;
            g.release().await
        })
    };
    until("the waiter to queue", async || {
        raw.list_children(&dir).await.is_ok_and(|c| c.len() == 2)
    })
    .await;
    other.shutdown_background();
    let answer = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("the waiter is answered")
        .expect("the waiter does not panic");
    assert!(
        matches!(
            answer,
            Ok(()) | Err(Error::Unavailable { .. } | Error::Lost { .. })
        ),
        "{answer:?}"
    );
    drop(held);
}

/// Our semaphore and Curator's `InterProcessSemaphoreV2` share one layout:
/// leases named as Curator names them in `{name}/leases` count against our
/// limit, ours are named so, and a waiter holds the `{name}/locks` mutex
/// while it waits (so waiters are served in order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_interoperates_with_curator_names() {
    let f = common::ZkFactory::shared().await;
    let raw = Client::connect(&f.config.connect).await.unwrap();
    let k = key(&unique("curator-sem"));
    let dir = f.admin.lock_path(&k).unwrap();
    let leases = format!("{dir}/leases");
    let now = AcquireOptions::default().wait(Wait::No);
    let theirs = [
        curator_named(&raw, &leases, "-lease-").await,
        curator_named(&raw, &leases, "-lease-").await,
    ];
    let ours = f.admin.acquire_permits(&k, 1, 3, now).await.unwrap();
    let name = ours.node().rsplit('/').next().unwrap().to_owned();
    let (uuid, seq) = name.strip_prefix("_c_").unwrap().split_once("-lease-").unwrap();
    assert_eq!((uuid.len(), seq.len()), (36, 10), "{name}");
    assert!(ours.node().starts_with(&format!("{leases}/")), "{}", ours.node());
    // Two of theirs and one of ours: the limit of 3 is reached.
    assert!(matches!(
        f.admin.acquire_permits(&k, 1, 3, now).await,
        Err(Error::Timeout { .. })
    ));
    // The refused call took its lease and the mutex back before it
    // returned: a next try is not held up by them.
    assert_eq!(raw.list_children(&leases).await.unwrap().len(), 3);
    let locks_now = raw
        .list_children(&format!("{dir}/locks"))
        .await
        .unwrap_or_default();
    assert!(locks_now.is_empty(), "{locks_now:?}");
    let waiting = {
        let (lock, k) = (f.admin.clone(), k.clone());
        tokio::spawn(async move {
            lock.acquire_permits(&k, 1, 3, AcquireOptions::default().wait(Wait::For(LIMIT)))
                .await
        })
    };
    let locks = format!("{dir}/locks");
    until("the waiter to hold the semaphore's mutex", async || {
        raw.list_children(&locks)
            .await
            .map(|c| c.len() == 1)
            .unwrap_or(false)
    })
    .await;
    raw.delete(&theirs[0], None).await.unwrap();
    let second = waiting.await.unwrap().unwrap();
    until("the waiter to give the mutex back", async || {
        raw.list_children(&locks)
            .await
            .map(|c| c.is_empty())
            .unwrap_or(true)
    })
    .await;
    for g in [ours, second] {
        g.release().await.unwrap();
    }
    raw.delete(&theirs[1], None).await.unwrap();
}

/// Our read-write lock and Curator's `InterProcessReadWriteLock` share one
/// layout: nodes named as Curator names them (`_c_{uuid}-__WRIT__…`,
/// `_c_{uuid}-__READ__…`) exclude ours and ours theirs, by Curator's rules
/// (a writer must be first; a reader waits only for earlier writers), and
/// our nodes are named as Curator would name them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_interoperates_with_curator_names() {
    let f = common::ZkFactory::shared().await;
    let raw = Client::connect(&f.config.connect).await.unwrap();
    let k = key(&unique("curator-rw"));
    let dir = f.admin.lock_path(&k).unwrap();
    let now = AcquireOptions::default().wait(Wait::No);
    let opts = AcquireOptions::default().wait(Wait::For(LIMIT));
    // A Curator writer holds: we can neither read nor write.
    let writer = curator_named(&raw, &dir, "-__WRIT__").await;
    assert!(matches!(
        f.admin.acquire_read(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    assert!(matches!(
        f.admin.acquire_write(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    // A read waiting behind it is granted when it goes.
    let reading = {
        let (lock, k) = (f.admin.clone(), k.clone());
        tokio::spawn(async move { lock.acquire_read(&k, opts).await })
    };
    until("our reader to queue behind the Curator writer", async || {
        raw.list_children(&dir).await.unwrap().len() == 2
    })
    .await;
    raw.delete(&writer, None).await.unwrap();
    let ours = reading.await.unwrap().unwrap();
    let name = ours.node().rsplit('/').next().unwrap().to_owned();
    let (uuid, seq) = name.strip_prefix("_c_").unwrap().split_once("-__READ__").unwrap();
    assert_eq!(uuid.len(), 36, "{name}");
    assert_eq!(seq.len(), 10, "{name}");
    // A Curator reader beside ours (by Curator's rule it holds: no writer
    // before it); a
    // Curator writer then queues behind both, and a later reader of ours
    // waits for that writer.
    let their_reader = curator_named(&raw, &dir, "-__READ__").await;
    let their_writer = curator_named(&raw, &dir, "-__WRIT__").await;
    assert!(matches!(
        f.admin.acquire_read(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    assert!(matches!(
        f.admin.acquire_write(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    for node in [their_reader, their_writer] {
        raw.delete(&node, None).await.unwrap();
    }
    let second = f.admin.acquire_read(&k, now).await.unwrap();
    second.release().await.unwrap();
    ours.release().await.unwrap();
    let w = f.admin.acquire_write(&k, now).await.unwrap();
    assert!(w.node().contains("-__WRIT__"), "{}", w.node());
    w.release().await.unwrap();
}

/// How many sessions watch `path` (`wchp`: watches by path, each path
/// followed by one tab-indented session id per watcher).
async fn watchers(server: SocketAddr, path: &str) -> usize {
    let listing = zk::four_letter(server, "wchp").await.unwrap_or_default();
    let mut lines = listing.lines().skip_while(|l| *l != path);
    lines
        .next()
        .map_or(0, |_| lines.take_while(|l| l.starts_with('\t')).count())
}

/// A waiter that times out while its clean-up delete fails must not leave
/// its node behind: nobody could take the lock again while its session lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_waiter_whose_clean_up_fails_leaves_nothing_behind() {
    let server = shared::zk().await.unwrap();
    let connect = server.addresses[0].clone();
    let first: SocketAddr = connect.split(',').next().unwrap().parse().unwrap();
    let proxy = FaultProxy::start(first).await.unwrap();
    let mut config = ZkConfig::new(proxy.addr().to_string()).session_timeout(Duration::from_secs(10));
    config.request_timeout = Duration::from_millis(300);
    let waiter = ZkLock::connect(config).await.unwrap();
    let other = ZkLock::connect(ZkConfig::new(connect).session_timeout(common::SESSION))
        .await
        .unwrap();
    let k = key(&unique("cleanup"));
    let g = other.acquire(&k, AcquireOptions::default()).await.unwrap();
    let w = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            waiter
                .acquire(
                    &k,
                    AcquireOptions::default().wait(Wait::For(Duration::from_secs(1))),
                )
                .await
        })
    };
    // Queued and watching the holder's node (the holder watches it too).
    until("the waiter to watch the holder", async || {
        other.contenders(k.as_str()).await.unwrap().len() == 2 && watchers(first, g.node()).await >= 2
    })
    .await;
    // The waiter's network goes silent before its wait runs out: its delete fails.
    proxy.set(Fault::Blackhole);
    let r = tokio::time::timeout(LIMIT, w).await.unwrap().unwrap();
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    proxy.set(Fault::None);
    g.release().await.unwrap();
    // The waiter's session lives on (its handle is still open).
    let g = tokio::time::timeout(LIMIT, other.acquire(&k, AcquireOptions::default()))
        .await
        .expect("the timed-out waiter's node blocks the lock")
        .unwrap();
    g.release().await.unwrap();
    until("nothing left behind", async || {
        other.contenders(k.as_str()).await.unwrap().is_empty()
    })
    .await;
    drop(waiter);
}

/// `a/x-lock-1` would create a node under `a`'s lock directory that looks
/// like a contender of `a`: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_collide_with_the_layout_are_invalid() {
    let f = common::ZkFactory::shared().await;
    let base = unique("layout");
    for name in [
        format!("{base}/x-lock-1"),
        format!("{base}/_c_u-lock-0000000001/y"),
    ] {
        let r = f.admin.try_acquire(&key(&name), AcquireOptions::default()).await;
        assert!(
            matches!(r, Err(Error::InvalidKey { .. })),
            "{name}: {:?}",
            r.map(|g| g.is_some())
        );
    }
    // A top-level name may say "lock" as it likes.
    let g = f
        .admin
        .acquire(&key(&format!("{base}-lock-1")), AcquireOptions::default())
        .await
        .unwrap();
    g.release().await.unwrap();
}

/// A ZooKeeper that is not there and a bad connect string each read as one
/// sentence naming the backend, where, and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_and_a_bad_url_read_as_sentences() {
    let addr = dlock_testkit::link::nowhere(1).unwrap()[0];
    let mut config = ZkConfig::new(format!("{addr}/app"));
    config.connect_timeout = Duration::from_secs(1);
    let e = ZkLock::connect(config).await.expect_err("nothing listens there");
    assert_eq!(
        e.to_string(),
        format!("zk at {addr} unavailable: no server answered within 1s")
    );
    let e = ZkLock::connect(ZkConfig::new(""))
        .await
        .expect_err("no server named");
    let shown = e.to_string();
    assert!(matches!(e, Error::InvalidConfig(_)), "{shown}");
    assert_eq!(shown.matches("invalid configuration").count(), 1, "{shown}");
}

/// `holders` lists a semaphore's holders and not the waiter queued behind
/// them, even when holder and waiter share one session (one handle), and
/// the read-write lock's reader and writer each in their turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_leave_a_semaphores_waiter_out_even_on_the_holders_session() {
    use dlock_core::Role;
    let server = shared::zk().await.unwrap();
    let lock = ZkLock::connect(ZkConfig::new(server.addresses[0].clone()))
        .await
        .unwrap();
    let k = key(&unique("holders"));
    let opts = AcquireOptions::default().ttl(Duration::from_secs(20));
    let held = lock.acquire_permits(&k, 1, 1, opts).await.unwrap();
    let waiter = tokio::spawn({
        let (lock, k) = (lock.clone(), k.clone());
        async move {
            lock.acquire_permits(&k, 1, 1, opts.wait(Wait::Forever))
                .await
                .map(drop)
        }
    });
    let client = Client::connect(&server.addresses[0]).await.unwrap();
    let leases = format!("/dlock/{}/leases", k.as_str());
    until("the waiter's lease", async || {
        client.list_children(&leases).await.map(|c| c.len()) == Ok(2)
    })
    .await;
    let holders = lock.holders(&k).await.unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].role, Role::Permits(1));
    assert_eq!(holders[0].id, held.node());
    waiter.abort();
    held.release().await.unwrap();
    let r = lock.acquire_read(&k, opts).await.unwrap();
    let roles: Vec<Role> = lock.holders(&k).await.unwrap().iter().map(|h| h.role).collect();
    assert_eq!(roles, [Role::Read]);
    r.release().await.unwrap();
    let w = lock.acquire_write(&k, opts).await.unwrap();
    let roles: Vec<Role> = lock.holders(&k).await.unwrap().iter().map(|h| h.role).collect();
    assert_eq!(roles, [Role::Write]);
    w.release().await.unwrap();
}

/// A semaphore waiter whose `{name}/locks` mutex node goes while it waits
/// (an operator's delete; a silent spell just short of the session
/// timeout) gives its leases back and starts again: a second waiter that
/// took the mutex meanwhile is not kept out by them, and the first is
/// served after it. Before, the two waited on each other forever (their
/// counts did not fit together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_waiter_whose_mutex_goes_starts_again() {
    let f = common::ZkFactory::shared().await;
    let raw = Client::connect(&f.config.connect).await.unwrap();
    let k = key(&unique("sem-mutex-gone"));
    let dir = f.admin.lock_path(&k).unwrap();
    let (leases, locks) = (format!("{dir}/leases"), format!("{dir}/locks"));
    let opts = AcquireOptions::default().wait(Wait::For(LIMIT));
    let (a, b, c) = (
        ZkLock::connect(f.config.clone()).await.unwrap(),
        ZkLock::connect(f.config.clone()).await.unwrap(),
        ZkLock::connect(f.config.clone()).await.unwrap(),
    );
    let held = a.acquire_permits(&k, 1, 1, opts).await.unwrap();
    let first = tokio::spawn({
        let k = k.clone();
        async move { b.acquire_permits(&k, 1, 1, opts).await }
    });
    until("the first waiter's lease and mutex", async || {
        raw.list_children(&leases).await.map(|c| c.len()) == Ok(2)
            && raw.list_children(&locks).await.map(|c| c.len()) == Ok(1)
    })
    .await;
    let mutex = raw.list_children(&locks).await.unwrap().remove(0);
    let old_leases = raw.list_children(&leases).await.unwrap();
    // The second waiter queues for the mutex behind the first before the
    // first's node goes: it is then served first, whatever the timing.
    let second = tokio::spawn({
        let k = k.clone();
        async move { c.acquire_permits(&k, 1, 1, opts).await }
    });
    until("the second waiter queued behind the first's mutex", async || {
        raw.list_children(&locks).await.map(|c| c.len()) == Ok(2)
    })
    .await;
    raw.delete(&format!("{locks}/{mutex}"), None).await.unwrap();
    // Settled: the first gave its lease back and queued again behind the
    // second, which holds the mutex with its lease (one lease each: the
    // holder's and the second's).
    until(
        "the first waiter to give its lease back and queue again",
        async || {
            let (Ok(now_leases), Ok(now_locks)) =
                (raw.list_children(&leases).await, raw.list_children(&locks).await)
            else {
                return false;
            };
            now_leases.len() == 2
                && now_leases.iter().filter(|l| old_leases.contains(l)).count() == 1
                && now_locks.len() == 2
                && !now_locks.contains(&mutex)
        },
    )
    .await;
    held.release().await.unwrap();
    // Each waiter gives its permit back as soon as it has it: neither
    // waits for the other's.
    let got = tokio::time::timeout(LIMIT, async {
        tokio::join!(
            async { second.await.unwrap().unwrap().release().await.unwrap() },
            async { first.await.unwrap().unwrap().release().await.unwrap() }
        );
    })
    .await;
    assert!(got.is_ok(), "the two waiters waited on each other");
}
