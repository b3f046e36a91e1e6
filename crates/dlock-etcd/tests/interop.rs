//! Interoperability with etcd's own Go recipes and `etcdctl lock`: a Go
//! process built from Debian's `golang-etcd-server-dev` sources (its etcd
//! version printed at the start of the run) contends with our clients for
//! the same locks: `concurrency.Mutex` and `contrib/recipes`' `RWMutex`.
//!
//! Per primitive, a free run (both kinds of contender looping, every hold
//! recorded and checked: nobody beside a writer or a mutex's holder, tokens
//! in grant order) and fixed-order scenarios that show the layouts agree:
//! the Go recipes wait behind *our* keys and ours behind theirs, in the
//! order each decides, and each side lists the other's holders. Go's
//! `RWMutex` orders contenders by *modification* revision: the tests of a
//! read without auto-extend that extends, or that is granted after
//! waiting, show that our keys are never rewritten under it.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey, Role, Wait};
use dlock_etcd::EtcdLock;
use dlock_testkit::reference::{Ask, Ours, Primitive, ReferenceClient, View, announce, free_run};
use tokio::io::{AsyncBufReadExt, BufReader};

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

/// The shared etcd, our admin client and a Go process.
async fn setup() -> (common::EtcdFactory, ReferenceClient) {
    let f = common::EtcdFactory::shared().await;
    let go = ReferenceClient::go_etcd(&f.config.endpoints, Duration::from_secs(5))
        .await
        .unwrap();
    (f, go)
}

/// `k`'s prefix as the Go recipes take it (they add the `/`).
fn go_prefix(f: &common::EtcdFactory, k: &LockKey) -> String {
    f.admin.lock_prefix(k).trim_end_matches('/').to_owned()
}

/// Every key under `k` (holders and waiters).
async fn keys(lock: &EtcdLock, k: &LockKey) -> Vec<String> {
    lock.contenders(&format!("{}/", k.as_str())).await.unwrap()
}

/// The one key under `k` that is not in `known`, once there is one.
async fn new_key(lock: &EtcdLock, k: &LockKey, known: &[&str]) -> String {
    let mut found = None;
    until("a new contender key", async || {
        found = keys(lock, k)
            .await
            .into_iter()
            .find(|key| !known.contains(&key.as_str()));
        found.is_some()
    })
    .await;
    found.unwrap()
}

fn opts() -> AcquireOptions {
    AcquireOptions::default().wait(Wait::For(LIMIT))
}

/// Our clients for a free run: one with auto-extend, one without (both
/// call `extend()` while they hold and the others wait).
async fn ours(f: &common::EtcdFactory) -> Vec<Ours<EtcdLock>> {
    let mut all = Vec::new();
    for auto_extend in [true, false] {
        all.push(Ours {
            name: format!("dlock-{}", if auto_extend { "auto" } else { "manual" }),
            lock: EtcdLock::connect(f.config.clone()).await.unwrap(),
            auto_extend,
            ttl: Duration::from_secs(10),
        });
    }
    all
}

async fn free_run_against_go(primitive: Primitive, name: &str) {
    let (f, go) = setup().await;
    let k = key(&unique(name));
    let theirs = vec![go.contender("g1"), go.contender("g2")];
    let run = free_run(primitive, &k, &go_prefix(&f, &k), ours(&f).await, theirs, RUN)
        .await
        .unwrap();
    let report = &run.report;
    assert!(report.is_ok(), "{report}");
    assert!(
        report.holds_by("dlock") >= 2 && report.holds_by("etcd Go") >= 2,
        "both kinds must hold, and more than once: {report}"
    );
    if primitive == Primitive::ReadWrite {
        assert!(report.most_at_once >= 2, "no two readers ever shared: {report}");
    }
    go.close().await;
    until("nothing left behind", async || {
        keys(&f.admin, &k).await.is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_free_run_with_go() {
    free_run_against_go(Primitive::Mutex, "free-mutex").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_free_run_with_go() {
    free_run_against_go(Primitive::ReadWrite, "free-rw").await;
}

/// `etcdctl lock NAME` (no command: it holds until SIGTERM), its key read
/// from the line it prints once it holds.
struct Etcdctl {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Etcdctl {
    fn lock(endpoints: &[String], name: &str) -> Self {
        let mut child = tokio::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .args(["lock", name])
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("etcdctl (Debian etcd-client)");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Etcdctl { child, lines }
    }

    /// The key it holds, once it says it holds.
    async fn granted(&mut self) -> String {
        let line = tokio::time::timeout(LIMIT, self.lines.next_line())
            .await
            .expect("etcdctl to hold in time")
            .unwrap();
        line.expect("etcdctl's key").trim().to_owned()
    }

    /// SIGTERM: it unlocks and exits.
    async fn stop(mut self) {
        let pid = self.child.id().unwrap().to_string();
        let sent = tokio::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap();
        assert!(sent.success());
        let status = tokio::time::timeout(LIMIT, self.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "etcdctl lock: {status}");
    }
}

/// `concurrency.Mutex`, `etcdctl lock` and ours in one line, in a fixed
/// order: Go holds; ours waits, then `etcdctl`, then a second Go contender,
/// which waits for `etcdctl`'s key (Go's own `waitDeletes`); each is
/// granted in turn with a higher token; our view and Go's show each holder
/// in its turn; an `extend()` while the others wait changes nothing for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_layouts_agree_with_go_and_etcdctl() {
    let (f, go) = setup().await;
    let version = std::process::Command::new("etcdctl")
        .arg("version")
        .output()
        .unwrap();
    announce(
        "etcdctl",
        String::from_utf8_lossy(&version.stdout)
            .lines()
            .next()
            .unwrap_or_default(),
    );
    let k = key(&unique("mutex"));
    let pfx = go_prefix(&f, &k);
    let (g1, g2, view) = (go.contender("g1"), go.contender("g2"), go.contender("v"));
    let first = g1.acquire(Ask::Mutex(&pfx)).await.unwrap();
    let h = f
        .admin
        .holder(&k)
        .await
        .unwrap()
        .expect("Go's holder, seen by us");
    assert_eq!(
        (h.id.as_str(), h.token.map(|t| t as i64).unwrap_or(-1)),
        (first.node.as_str(), first.token as i64)
    );
    assert_eq!(h.role, Role::Mutex);
    assert!(f.admin.try_acquire(&k, opts()).await.unwrap().is_none());
    let ours = tokio::spawn({
        let (lock, k) = (f.admin.clone(), k.clone());
        async move { lock.acquire(&k, opts().auto_extend(false).ttl(LIMIT)).await }
    });
    let our_key = new_key(&f.admin, &k, &[&first.node]).await;
    let mut ctl = Etcdctl::lock(&f.config.endpoints, &pfx);
    let ctl_key = new_key(&f.admin, &k, &[&first.node, &our_key]).await;
    g2.start(Ask::Mutex(&pfx)).await.unwrap();
    g2.behind(&ctl_key).await.unwrap();
    let listed = f.admin.holders(&k).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, first.node);
    g1.release().await.unwrap();
    let g = ours.await.unwrap().unwrap();
    assert_eq!(g.etcd_key(), our_key);
    let ours_token = g.token().unwrap().get();
    assert!(ours_token > first.token);
    let theirs = view.holders(View::Mutex(&pfx)).await.unwrap();
    assert_eq!(
        theirs
            .iter()
            .map(|l| (l.node.as_str(), l.token))
            .collect::<Vec<_>>(),
        [(our_key.as_str(), ours_token)],
        "Go's view of our holder"
    );
    g.extend(LIMIT).await.unwrap();
    assert_eq!(f.admin.holder(&k).await.unwrap().unwrap().id, our_key);
    g.release().await.unwrap();
    assert_eq!(ctl.granted().await, ctl_key);
    let h = f.admin.holder(&k).await.unwrap().unwrap();
    assert_eq!(h.id, ctl_key);
    assert!(h.token.unwrap() > ours_token);
    ctl.stop().await;
    let second = g2.granted().await.unwrap();
    assert!(second.token > h.token.unwrap());
    g2.release().await.unwrap();
    go.close().await;
    until("nothing left behind", async || {
        keys(&f.admin, &k).await.is_empty()
    })
    .await;
}

/// `RWMutex` and ours, in a fixed order, both ways round: readers of both
/// share (each side lists both); a writer of one queues behind the reader
/// of the other, and a later reader of the first waits behind that queued
/// writer (Go's reader waits for *our* writer's key; ours is refused while
/// Go's writer waits); the writer is granted when the readers go, alone,
/// and the later readers after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_layouts_agree_with_go() {
    let (f, go) = setup().await;
    let k = key(&unique("rw"));
    let pfx = go_prefix(&f, &k);
    let now = AcquireOptions::default().wait(Wait::No);
    let view = go.contender("v");
    let listed = async |lock: &EtcdLock| -> Vec<(Role, String)> {
        let mut all: Vec<(Role, String)> = lock
            .holders(&k)
            .await
            .unwrap()
            .into_iter()
            .map(|h| (h.role, h.id))
            .collect();
        all.sort_by(|a, b| a.1.cmp(&b.1));
        all
    };
    let go_view = async || -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = view
            .holders(View::ReadWrite(&pfx))
            .await
            .unwrap()
            .into_iter()
            .map(|l| (l.role, l.node))
            .collect();
        all.sort_by(|a, b| a.1.cmp(&b.1));
        all
    };

    // 1. Our reader, Go's beside it.
    let r1 = f.admin.acquire_read(&k, opts()).await.unwrap();
    let gr = go.contender("gr");
    gr.start(Ask::Read(&pfx)).await.unwrap();
    let gr_grant = gr.granted_at_once().await.unwrap();
    let mut both = vec![
        (Role::Read, r1.etcd_key().to_owned()),
        (Role::Read, gr_grant.node.clone()),
    ];
    both.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(listed(&f.admin).await, both, "our view of both readers");
    let mut theirs: Vec<(String, String)> =
        both.iter().map(|(_, k)| ("read".to_owned(), k.clone())).collect();
    theirs.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(go_view().await, theirs, "Go's view of both readers");

    // 2. Go's writer queues behind the readers (it waits for the latest,
    // Go's own reader); our later reader is refused, and one that waits
    // is granted only after that writer.
    let gw = go.contender("gw");
    gw.start(Ask::Write(&pfx)).await.unwrap();
    gw.behind(&gr_grant.node).await.unwrap();
    assert!(matches!(
        f.admin.acquire_read(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    let gw_key = new_key(&f.admin, &k, &[r1.etcd_key(), &gr_grant.node]).await;
    let later = tokio::spawn({
        let (lock, k) = (f.admin.clone(), k.clone());
        async move { lock.acquire_read(&k, opts()).await }
    });
    let later_key = new_key(&f.admin, &k, &[r1.etcd_key(), &gr_grant.node, &gw_key]).await;
    r1.extend(LIMIT).await.unwrap();
    gr.release().await.unwrap();
    // Go's writer looks again and finds our reader in its way.
    gw.behind(r1.etcd_key()).await.unwrap();
    r1.release().await.unwrap();
    let w = gw.granted().await.unwrap();
    assert_eq!(w.node, gw_key);
    assert_eq!(
        listed(&f.admin).await,
        [(Role::Write, gw_key.clone())],
        "our view of Go's writer"
    );
    assert!(
        !later.is_finished(),
        "our later reader was granted beside Go's writer"
    );
    gw.release().await.unwrap();
    let r2 = later.await.unwrap().unwrap();
    assert_eq!(r2.etcd_key(), later_key);
    assert!(r2.token().unwrap().get() > w.token);

    // 3. The other way round: our writer (without auto-extend) queues
    // behind Go's reader and ours, Go's later reader waits behind *our*
    // writer.
    let gr2 = go.contender("gr2");
    let their_reader = gr2.acquire(Ask::Read(&pfx)).await.unwrap();
    let writing = tokio::spawn({
        let (lock, k) = (f.admin.clone(), k.clone());
        async move { lock.acquire_write(&k, opts().auto_extend(false).ttl(LIMIT)).await }
    });
    let our_writer = new_key(&f.admin, &k, &[r2.etcd_key(), &their_reader.node]).await;
    let gr3 = go.contender("gr3");
    gr3.start(Ask::Read(&pfx)).await.unwrap();
    gr3.behind(&our_writer).await.unwrap();
    let theirs = go_view().await;
    assert!(
        theirs.len() == 2 && theirs.iter().all(|(role, _)| role == "read"),
        "Go's view while our writer waits: {theirs:?}"
    );
    r2.release().await.unwrap();
    gr2.release().await.unwrap();
    let w = writing.await.unwrap().unwrap();
    assert_eq!(w.etcd_key(), our_writer);
    assert!(w.token().unwrap().get() > their_reader.token);
    assert_eq!(
        go_view().await,
        [("write".to_owned(), our_writer.clone())],
        "Go's view of our writer"
    );
    // An extend while Go's reader waits keeps it waiting.
    w.extend(LIMIT).await.unwrap();
    assert_eq!(
        go_view().await,
        [("write".to_owned(), our_writer.clone())],
        "Go's view after the extend"
    );
    let ours_token = w.token().unwrap().get();
    w.release().await.unwrap();
    let last = gr3.granted().await.unwrap();
    assert!(last.token > ours_token);
    gr3.release().await.unwrap();
    go.close().await;
    until("nothing left behind", async || {
        keys(&f.admin, &k).await.is_empty()
    })
    .await;
}

/// The defect: our reader without auto-extend (DX) holds; Go's reader (G0)
/// joins it; Go's writer (GX) queues behind G0; DX extends; G0 goes. GX
/// must then find DX in its way. It was granted beside DX: the extend
/// moved DX's key to a fresh lease, a write that moved its *modification*
/// revision past GX's, and Go's `RWMutex` waits only for keys modified
/// before its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_without_auto_extend_that_extends_keeps_go_writers_out() {
    let (f, go) = setup().await;
    let k = key(&unique("extend-read"));
    let pfx = go_prefix(&f, &k);
    let (g0, gx, view) = (go.contender("g0"), go.contender("gx"), go.contender("v"));
    let dx = f
        .admin
        .acquire_read(&k, AcquireOptions::default().auto_extend(false).ttl(LIMIT))
        .await
        .unwrap();
    g0.start(Ask::Read(&pfx)).await.unwrap();
    let g0_read = g0.granted_at_once().await.unwrap();
    gx.start(Ask::Write(&pfx)).await.unwrap();
    gx.behind(&g0_read.node).await.unwrap();
    dx.extend(LIMIT).await.unwrap();
    let theirs = view.holders(View::ReadWrite(&pfx)).await.unwrap();
    assert!(
        theirs.iter().any(|l| l.node == dx.etcd_key()) && theirs.iter().all(|l| l.role == "read"),
        "Go's view after our extend: {theirs:?}"
    );
    g0.release().await.unwrap();
    gx.behind(dx.etcd_key())
        .await
        .expect("Go's writer must wait for our reader after it extended");
    let ours_token = dx.token().unwrap().get();
    dx.release().await.unwrap();
    let w = gx.granted().await.unwrap();
    assert!(w.token > ours_token);
    gx.release().await.unwrap();
    go.close().await;
}

/// The same defect at the grant: our reader without auto-extend (DX)
/// waits behind Go's writer (GW) with Go's reader (G0) after it, and Go's
/// writer (GX) after G0; GW goes: DX and G0 are granted; G0 goes: GX must
/// find DX in its way (the grant moved DX's key onto a lease of its own:
/// the same write as an extend's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_without_auto_extend_granted_after_waiting_keeps_go_writers_out() {
    let (f, go) = setup().await;
    let k = key(&unique("granted-read"));
    let pfx = go_prefix(&f, &k);
    let (gw, g0, gx) = (go.contender("gw"), go.contender("g0"), go.contender("gx"));
    let first = gw.acquire(Ask::Write(&pfx)).await.unwrap();
    let dx = tokio::spawn({
        let (lock, k) = (f.admin.clone(), k.clone());
        async move {
            lock.acquire_read(
                &k,
                AcquireOptions::default()
                    .auto_extend(false)
                    .ttl(LIMIT)
                    .wait(Wait::For(LIMIT)),
            )
            .await
        }
    });
    let dx_key = new_key(&f.admin, &k, &[&first.node]).await;
    g0.start(Ask::Read(&pfx)).await.unwrap();
    g0.behind(&first.node).await.unwrap();
    let g0_key = new_key(&f.admin, &k, &[&first.node, &dx_key]).await;
    gx.start(Ask::Write(&pfx)).await.unwrap();
    gx.behind(&g0_key).await.unwrap();
    gw.release().await.unwrap();
    let dx = dx.await.unwrap().unwrap();
    g0.granted().await.unwrap();
    g0.release().await.unwrap();
    gx.behind(dx.etcd_key())
        .await
        .expect("Go's writer must wait for our reader granted after waiting");
    dx.release().await.unwrap();
    gx.granted().await.unwrap();
    gx.release().await.unwrap();
    go.close().await;
}

/// Where the layouts do not meet: a mutex and a read-write lock of one
/// name (Go's recipes and ours alike). A mutex's key sits where a writer
/// looks, so a writer waits for an earlier mutex holder and a mutex for
/// every earlier reader or writer; a reader looks only under `write/`, so
/// it is granted beside a mutex's holder. This pins it, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_and_a_read_write_lock_of_one_name_exclude_each_other_only_in_part() {
    let (f, go) = setup().await;
    let k = key(&unique("mixed"));
    let pfx = go_prefix(&f, &k);
    let now = AcquireOptions::default().wait(Wait::No);
    let (gm, gw, gr) = (go.contender("gm"), go.contender("gw"), go.contender("gr"));
    // Go's mutex holds: our reader is granted beside it, our writer not.
    let theirs = gm.acquire(Ask::Mutex(&pfx)).await.unwrap();
    let r = f
        .admin
        .acquire_read(&k, now)
        .await
        .expect("our reader beside Go's mutex");
    assert!(matches!(
        f.admin.acquire_write(&k, now).await,
        Err(Error::Timeout { .. })
    ));
    gm.release().await.unwrap();
    r.release().await.unwrap();
    // Our mutex holds: Go's reader is granted beside it; Go's writer waits
    // for it.
    let m = f.admin.acquire(&k, now).await.unwrap();
    gr.start(Ask::Read(&pfx)).await.unwrap();
    gr.granted_at_once().await.expect("Go's reader beside our mutex");
    gr.release().await.unwrap();
    gw.start(Ask::Write(&pfx)).await.unwrap();
    gw.behind(m.etcd_key()).await.unwrap();
    let ours_token = m.token().unwrap().get();
    m.release().await.unwrap();
    let w = gw.granted().await.unwrap();
    assert!(w.token > ours_token && w.token > theirs.token);
    gw.release().await.unwrap();
    go.close().await;
}

/// etcd has no semaphore recipe: ours is dlock's own layout, under
/// `NAME/sem/`, and no reference client can share its count. What does
/// happen with Go's recipes on the same name: Go's mutex (and writer)
/// waits for our permit holders' keys (they are under its prefix), Go's
/// reader does not, and our semaphore does not see Go's keys at all: a
/// permit is granted beside Go's mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_have_no_reference_recipe_on_etcd() {
    let (f, go) = setup().await;
    let k = key(&unique("sem"));
    let pfx = go_prefix(&f, &k);
    let now = AcquireOptions::default().wait(Wait::No);
    let (gm, gr) = (go.contender("gm"), go.contender("gr"));
    let p = f.admin.acquire_permits(&k, 1, 2, now).await.unwrap();
    gm.start(Ask::Mutex(&pfx)).await.unwrap();
    gm.behind(p.etcd_key()).await.unwrap();
    gr.start(Ask::Read(&pfx)).await.unwrap();
    gr.granted_at_once().await.expect("Go's reader beside our permit");
    gr.release().await.unwrap();
    p.release().await.unwrap();
    gm.granted().await.unwrap();
    let beside = f
        .admin
        .acquire_permits(&k, 1, 2, now)
        .await
        .expect("our permit beside Go's mutex");
    beside.release().await.unwrap();
    gm.release().await.unwrap();
    go.close().await;
}
