//! Interoperability with Apache Curator itself: a Curator process (Debian's
//! `libcurator-recipes-java`, its version printed at the start of the run)
//! contends with our clients for the same locks.
//!
//! Per primitive, a free run (both kinds of contender looping, every hold
//! recorded and checked: nobody beside a writer or a mutex's holder, never
//! more than the limit, tokens in grant order) and fixed-order scenarios
//! that show the layouts agree: Curator waits behind *our* nodes and we
//! behind *its*, in the order each recipe decides, and each side lists the
//! other's holders.

mod common;

use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey, Role, Wait};
use dlock_testkit::reference::{Ask, Ours, Primitive, ReferenceClient, View, free_run};
use dlock_zk::ZkLock;

const LIMIT: Duration = Duration::from_secs(30);
/// How long each free run lasts.
const RUN: Duration = Duration::from_millis(1500);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

fn unique(name: &str) -> String {
    format!("{name}-{:x}", rand::random::<u64>())
}

/// Polls `cond` until it holds, for at most [`LIMIT`].
async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The shared ZooKeeper, our admin client and a Curator process.
async fn setup() -> (common::ZkFactory, ReferenceClient) {
    let f = common::ZkFactory::shared().await;
    let curator = ReferenceClient::curator(&f.config.connect, Duration::from_secs(4))
        .await
        .unwrap();
    (f, curator)
}

/// The last segment of a path.
fn name_of(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// How many lock nodes (holders and waiters) are under `k`'s directory.
async fn nodes(lock: &ZkLock, k: &LockKey) -> usize {
    lock.contenders(k.as_str()).await.unwrap().len()
}

fn opts() -> AcquireOptions {
    AcquireOptions::default().wait(Wait::For(LIMIT))
}

/// Our clients for a free run: one with auto-extend, one without (both
/// call `extend()` while they hold and the others wait).
async fn ours(f: &common::ZkFactory) -> Vec<Ours<ZkLock>> {
    let mut all = Vec::new();
    for auto_extend in [true, false] {
        all.push(Ours {
            name: format!("dlock-{}", if auto_extend { "auto" } else { "manual" }),
            lock: ZkLock::connect(f.config.clone()).await.unwrap(),
            auto_extend,
            ttl: Duration::from_secs(10),
        });
    }
    all
}

async fn free_run_against_curator(primitive: Primitive, name: &str) {
    let (f, curator) = setup().await;
    let k = key(&unique(name));
    let path = f.admin.lock_path(&k).unwrap();
    let theirs = vec![curator.contender("c1"), curator.contender("c2")];
    let run = free_run(primitive, &k, &path, ours(&f).await, theirs, RUN)
        .await
        .unwrap();
    let report = &run.report;
    assert!(report.is_ok(), "{report}");
    assert!(
        report.holds_by("dlock") >= 2 && report.holds_by("Curator") >= 2,
        "both kinds must hold, and more than once: {report}"
    );
    if primitive == Primitive::ReadWrite {
        assert!(report.most_at_once >= 2, "no two readers ever shared: {report}");
    }
    curator.close().await;
    until("nothing left behind", async || nodes(&f.admin, &k).await == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_free_run_with_curator() {
    free_run_against_curator(Primitive::Mutex, "free-mutex").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_free_run_with_curator() {
    free_run_against_curator(Primitive::ReadWrite, "free-rw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_free_run_with_curator() {
    free_run_against_curator(Primitive::Semaphore { limit: 2 }, "free-sem").await;
}

/// `InterProcessMutex` and ours, in a fixed order: Curator holds; ours
/// waits and is listed as nobody; a second Curator contender queues behind
/// *our* node (Curator's own predecessor watch); Curator's view lists ours
/// as the holder once granted, and ours lists theirs; tokens (`czxid`)
/// increase along the line; an `extend()` while Curator waits changes
/// nothing for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_layouts_agree_with_curator() {
    let (f, curator) = setup().await;
    let k = key(&unique("mutex"));
    let path = f.admin.lock_path(&k).unwrap();
    let (c1, c2, view) = (
        curator.contender("c1"),
        curator.contender("c2"),
        curator.contender("v"),
    );
    let mut first = c1.acquire(Ask::Mutex(&path)).await.unwrap();
    for auto_extend in [true, false] {
        let h = f
            .admin
            .holder(&k)
            .await
            .unwrap()
            .expect("Curator's holder, seen by us");
        assert_eq!(
            (h.id.as_str(), h.token.map(|t| t as i64).unwrap_or(-1)),
            (first.node.as_str(), first.token as i64)
        );
        assert!(f.admin.try_acquire(&k, opts()).await.unwrap().is_none());
        let ours = tokio::spawn({
            let (lock, k) = (f.admin.clone(), k.clone());
            async move { lock.acquire(&k, opts().auto_extend(auto_extend).ttl(LIMIT)).await }
        });
        until("our waiter's node", async || nodes(&f.admin, &k).await == 2).await;
        let listed = f.admin.holders(&k).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].id, first.node);
        let ours_node = f
            .admin
            .contenders(k.as_str())
            .await
            .unwrap()
            .into_iter()
            .find(|n| *n != first.node)
            .unwrap();
        // Curator's second contender waits for *our* node.
        c2.start(Ask::Mutex(&path)).await.unwrap();
        c2.behind(name_of(&ours_node)).await.unwrap();
        c1.release().await.unwrap();
        let g = ours.await.unwrap().unwrap();
        assert_eq!(g.node(), ours_node);
        assert!(g.token().unwrap().get() > first.token);
        let theirs = view.holders(View::Mutex(&path)).await.unwrap();
        assert_eq!(
            theirs
                .iter()
                .map(|l| (l.node.as_str(), l.token))
                .collect::<Vec<_>>(),
            [(g.node(), g.token().unwrap().get())],
            "Curator's view of the holder"
        );
        g.extend(LIMIT).await.unwrap();
        let ours_token = g.token().unwrap().get();
        g.release().await.unwrap();
        let second = c2.granted().await.unwrap();
        assert!(second.token > ours_token);
        let h = f.admin.holder(&k).await.unwrap().unwrap();
        assert_eq!(h.id, second.node);
        c2.release().await.unwrap();
        // The next round (without auto-extend) starts as this one did.
        first = c1.acquire(Ask::Mutex(&path)).await.unwrap();
    }
    c1.release().await.unwrap();
    curator.close().await;
    until("nothing left behind", async || nodes(&f.admin, &k).await == 0).await;
}

/// `InterProcessReadWriteLock` and ours, in a fixed order, both ways round:
/// readers of both share (each side lists both); a writer of one queues
/// behind the reader of the other, and a later reader of the first waits
/// behind that queued writer (Curator's reader watches *our* writer's node;
/// ours is refused while Curator's writer waits); the writer is granted
/// when the readers go, alone, and the later readers after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_layouts_agree_with_curator() {
    let (f, curator) = setup().await;
    let k = key(&unique("rw"));
    let path = f.admin.lock_path(&k).unwrap();
    let now = AcquireOptions::default().wait(Wait::No);
    let view = curator.contender("v");
    let roles = |listed: &[dlock_core::Holder]| -> Vec<(Role, String)> {
        listed.iter().map(|h| (h.role, h.id.clone())).collect()
    };

    // 1. Our reader (without auto-extend), Curator's beside it.
    let r1 = f
        .admin
        .acquire_read(&k, opts().auto_extend(false).ttl(LIMIT))
        .await
        .unwrap();
    let cr = curator.contender("cr");
    cr.start(Ask::Read(&path)).await.unwrap();
    let cr_grant = cr.granted_at_once().await.unwrap();
    let mut both = vec![
        (Role::Read, r1.node().to_owned()),
        (Role::Read, cr_grant.node.clone()),
    ];
    both.sort_by(|a, b| a.1.cmp(&b.1));
    let mut seen = roles(&f.admin.holders(&k).await.unwrap());
    seen.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(seen, both, "our view of both readers");
    let mut theirs: Vec<(String, String)> = view
        .holders(View::ReadWrite(&path))
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.role, l.node))
        .collect();
    theirs.sort();
    let mut expected = vec![
        ("read".to_owned(), r1.node().to_owned()),
        ("read".to_owned(), cr_grant.node.clone()),
    ];
    expected.sort();
    assert_eq!(theirs, expected, "Curator's view of both readers");

    // 2. Curator's writer queues behind the readers (it watches the
    // latest, Curator's own reader); our later reader is refused, and one
    // that waits is granted only after that writer.
    let cw = curator.contender("cw");
    cw.start(Ask::Write(&path)).await.unwrap();
    cw.behind(name_of(&cr_grant.node)).await.unwrap();
    assert!(matches!(
        f.admin.acquire_read(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    let later = tokio::spawn({
        let (lock, k) = (f.admin.clone(), k.clone());
        async move { lock.acquire_read(&k, opts()).await }
    });
    until("our later reader's node", async || nodes(&f.admin, &k).await == 4).await;
    // An extend while Curator's writer waits; then both readers go.
    r1.extend(LIMIT).await.unwrap();
    r1.release().await.unwrap();
    cr.release().await.unwrap();
    let w = cw.granted().await.unwrap();
    assert!(w.token > cr_grant.token);
    let listed = f.admin.holders(&k).await.unwrap();
    assert_eq!(
        roles(&listed),
        [(Role::Write, w.node.clone())],
        "our view of Curator's writer"
    );
    assert!(
        !later.is_finished(),
        "our later reader was granted beside Curator's writer"
    );
    cw.release().await.unwrap();
    let r2 = later.await.unwrap().unwrap();
    assert!(r2.token().unwrap().get() > w.token);

    // 3. The other way round: our writer queues behind Curator's reader
    // (and ours), Curator's later reader waits behind *our* writer.
    let cr2 = curator.contender("cr2");
    let their_reader = cr2.acquire(Ask::Read(&path)).await.unwrap();
    let writing = tokio::spawn({
        let (lock, k) = (f.admin.clone(), k.clone());
        async move { lock.acquire_write(&k, opts().auto_extend(false).ttl(LIMIT)).await }
    });
    until("our writer's node", async || nodes(&f.admin, &k).await == 3).await;
    let our_writer = f
        .admin
        .contenders(k.as_str())
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.contains("__WRIT__"))
        .unwrap();
    let cr3 = curator.contender("cr3");
    cr3.start(Ask::Read(&path)).await.unwrap();
    cr3.behind(name_of(&our_writer)).await.unwrap();
    let theirs = view.holders(View::ReadWrite(&path)).await.unwrap();
    assert!(
        theirs.iter().all(|l| l.role == "read") && theirs.len() == 2,
        "Curator's view while our writer waits: {theirs:?}"
    );
    r2.release().await.unwrap();
    cr2.release().await.unwrap();
    let w = writing.await.unwrap().unwrap();
    assert_eq!(w.node(), our_writer);
    assert!(w.token().unwrap().get() > their_reader.token);
    let theirs = view.holders(View::ReadWrite(&path)).await.unwrap();
    assert_eq!(
        theirs
            .iter()
            .map(|l| (l.role.as_str(), l.node.as_str()))
            .collect::<Vec<_>>(),
        [("write", our_writer.as_str())],
        "Curator's view of our writer"
    );
    // An extend while Curator's reader waits keeps it waiting.
    w.extend(LIMIT).await.unwrap();
    assert!(matches!(
        f.admin.acquire_read(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    let ours_token = w.token().unwrap().get();
    w.release().await.unwrap();
    let last = cr3.granted().await.unwrap();
    assert!(last.token > ours_token);
    cr3.release().await.unwrap();
    curator.close().await;
    until("nothing left behind", async || nodes(&f.admin, &k).await == 0).await;
}

/// `InterProcessSemaphoreV2` and ours, limit 2: a Curator lease and ours
/// fill it; a third (Curator's) waits, holding the `locks` mutex; ours is
/// refused meanwhile. Each side lists the other's holder; ours lists
/// exactly the two holders, not the waiter's lease (it listed three:
/// Curator's waiter was recognised only by a tag that dlock alone writes).
/// Then a waiter of ours queues behind Curator's for the `locks` mutex and
/// is served after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_fills_across_both_clients_and_lists_its_holders() {
    let (f, curator) = setup().await;
    let k = key(&unique("sem"));
    let path = f.admin.lock_path(&k).unwrap();
    let (cl, c3, view) = (
        curator.contender("cl"),
        curator.contender("c3"),
        curator.contender("v"),
    );
    let now = AcquireOptions::default().wait(Wait::No);
    let theirs = cl.acquire(Ask::Semaphore(&path, 2)).await.unwrap();
    let dl = f
        .admin
        .acquire_permits(&k, 1, 2, opts().auto_extend(false).ttl(LIMIT))
        .await
        .unwrap();
    c3.start(Ask::Semaphore(&path, 2)).await.unwrap();
    c3.behind("leases=3").await.unwrap();
    assert!(matches!(
        f.admin.acquire_permits(&k, 1, 2, now).await,
        Err(Error::Timeout { .. })
    ));
    let mut listed: Vec<(Role, String, i64)> = f
        .admin
        .holders(&k)
        .await
        .unwrap()
        .into_iter()
        .map(|h| (h.role, h.id, h.token.map(|t| t as i64).unwrap_or(-1)))
        .collect();
    listed.sort_by(|a, b| a.1.cmp(&b.1));
    let mut expected = vec![
        (Role::Permits(1), theirs.node.clone(), theirs.token as i64),
        (
            Role::Permits(1),
            dl.node().to_owned(),
            dl.token().unwrap().get() as i64,
        ),
    ];
    expected.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        listed, expected,
        "our view: Curator's holder and ours, not Curator's waiter"
    );
    // Curator's view: every lease, ours among them (Curator cannot tell
    // its waiter's apart).
    let participants = view.holders(View::Semaphore(&path, 2)).await.unwrap();
    assert_eq!(participants.len(), 3, "{participants:?}");
    assert!(
        participants.iter().any(|l| l.node == dl.node()),
        "{participants:?}"
    );
    // An extend while Curator's waiter waits; then our release lets it in.
    dl.extend(LIMIT).await.unwrap();
    dl.release().await.unwrap();
    let third = c3.granted().await.unwrap();
    // Ours waits now: first for the `locks` mutex, then for a lease.
    let ours = tokio::spawn({
        let (lock, k) = (f.admin.clone(), k.clone());
        async move { lock.acquire_permits(&k, 1, 2, opts()).await }
    });
    until("our waiter's lease", async || nodes(&f.admin, &k).await == 4).await;
    let listed = f.admin.holders(&k).await.unwrap();
    let mut nodes_listed: Vec<&str> = listed.iter().map(|h| h.id.as_str()).collect();
    nodes_listed.sort_unstable();
    let mut holding = vec![theirs.node.as_str(), third.node.as_str()];
    holding.sort_unstable();
    assert_eq!(nodes_listed, holding, "our own waiter is left out too");
    cl.release().await.unwrap();
    let g = ours.await.unwrap().unwrap();
    let participants = view.holders(View::Semaphore(&path, 2)).await.unwrap();
    let mut seen: Vec<&str> = participants.iter().map(|l| l.node.as_str()).collect();
    seen.sort_unstable();
    let mut now_held = vec![g.node(), third.node.as_str()];
    now_held.sort_unstable();
    assert_eq!(seen, now_held, "Curator's view once ours holds");
    g.release().await.unwrap();
    c3.release().await.unwrap();
    curator.close().await;
    until("nothing left behind", async || nodes(&f.admin, &k).await == 0).await;
}

/// Where the layouts do not meet: a mutex and a read-write lock of one
/// name. In Curator's recipes and ours alike they do not exclude each
/// other (each recipe sorts only its own nodes); this pins it, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_and_a_read_write_lock_of_one_name_do_not_exclude_each_other() {
    let (f, curator) = setup().await;
    let k = key(&unique("mixed"));
    let path = f.admin.lock_path(&k).unwrap();
    let now = AcquireOptions::default().wait(Wait::No);
    let (cm, cw) = (curator.contender("cm"), curator.contender("cw"));
    cm.acquire(Ask::Mutex(&path)).await.unwrap();
    let w = f
        .admin
        .acquire_write(&k, now)
        .await
        .expect("our writer beside Curator's mutex");
    cm.release().await.unwrap();
    let m = f
        .admin
        .acquire(&k, now)
        .await
        .expect("our mutex beside our writer");
    w.release().await.unwrap();
    cw.start(Ask::Write(&path)).await.unwrap();
    cw.granted_at_once()
        .await
        .expect("Curator's writer beside our mutex");
    m.release().await.unwrap();
    cw.release().await.unwrap();
    curator.close().await;
}
