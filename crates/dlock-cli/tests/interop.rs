//! `dlock` against the reference clients themselves: a Curator process
//! (Debian's `libcurator-recipes-java`) and a Go process on etcd's own
//! recipes (Debian's `golang-etcd-server-dev`) hold and wait beside
//! `dlock run`, and `dlock holder` lists their holders.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::launcher::shared;
use dlock_testkit::reference::{Ask, ReferenceClient, View};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");
const LIMIT: Duration = Duration::from_secs(30);

fn unique(name: &str) -> String {
    format!("{name}-{:x}", rand::random::<u64>())
}

/// `dlock --url URL ARGS...`, with every signal at its default (see
/// `tests/cli.rs`).
fn dlock(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new("env");
    c.args(["--default-signal", "--", DLOCK]);
    c.arg("--url").arg(url).args(args).env_remove("RUST_LOG");
    c
}

fn output(url: &str, args: &[&str]) -> Output {
    dlock(url, args).stdin(Stdio::null()).output().unwrap()
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A script that touches `started`, then holds until `stop` exists (at most
/// 30 s).
fn hold_until(started: &Path, stop: &Path) -> String {
    format!(
        "touch {}; i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done",
        started.display(),
        stop.display()
    )
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A Curator lease and `dlock run --permits 2` fill a semaphore of 2; a
/// second Curator contender waits (holding the `locks` mutex, its lease
/// made). `dlock holder` lists the two holders, Curator's among them, and
/// not the waiter's lease (it listed three); `dlock run --no-wait` is
/// refused; when `dlock run` ends, Curator's waiter holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_holder_lists_a_curator_semaphores_holders_and_not_its_waiter() {
    let zk = shared::zk().await.unwrap();
    let url = format!("zk://{}", zk.addresses[0]);
    let curator = ReferenceClient::curator(&zk.addresses[0], Duration::from_secs(4))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = unique("cli-sem");
    let path = format!("/dlock/{key}");
    let (cl, c3) = (curator.contender("cl"), curator.contender("c3"));
    let theirs = cl.acquire(Ask::Semaphore(&path, 2)).await.unwrap();
    let (started, stop) = (dir.path().join("started"), dir.path().join("stop"));
    let mut ours = dlock(
        &url,
        &[
            "run",
            &key,
            "--permits",
            "2",
            "--",
            "sh",
            "-c",
            &hold_until(&started, &stop),
        ],
    )
    .spawn()
    .unwrap();
    until("dlock run to hold a permit", || started.exists()).await;
    c3.start(Ask::Semaphore(&path, 2)).await.unwrap();
    c3.behind("leases=3").await.unwrap();
    let listed = output(&url, &["holder", &key]);
    let text = stdout(&listed);
    assert!(
        text.contains("is held by 2 holders:") && text.matches("  1 permit: ").count() == 2,
        "{listed:?}"
    );
    assert!(
        text.contains(&format!("{} (", theirs.node)) && text.contains(&format!("token {}", theirs.token)),
        "Curator's holder, with its czxid: {text}"
    );
    let refused = output(&url, &["run", &key, "--permits", "2", "--no-wait", "--", "true"]);
    assert_eq!(refused.status.code(), Some(75), "{refused:?}");
    std::fs::write(&stop, "").unwrap();
    assert!(ours.wait().unwrap().success());
    let third = c3.granted().await.unwrap();
    let text = stdout(&output(&url, &["holder", &key]));
    assert!(
        text.contains(&third.node) && text.contains(&theirs.node),
        "{text}"
    );
    cl.release().await.unwrap();
    c3.release().await.unwrap();
    curator.close().await;
}

/// A Go `RWMutex` writer holds: `dlock run --shared` waits; a second Go
/// writer queues behind *its* key; when the first writer goes, the
/// command runs, `dlock holder` names the read, Go's own view lists it as
/// the one holder (the second writer still waits) and `dlock run
/// --exclusive --no-wait` is refused naming the reader; when the command
/// ends, Go's second writer holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_run_shared_queues_between_go_writers() {
    let etcd = shared::etcd().await.unwrap();
    let hosts: Vec<&str> = etcd
        .addresses
        .iter()
        .map(|u| u.trim_start_matches("http://"))
        .collect();
    let url = format!("etcd://{}", hosts.join(","));
    let go = ReferenceClient::go_etcd(&etcd.addresses, Duration::from_secs(5))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = unique("cli-rw");
    let pfx = format!("dlock/{key}");
    let (g1, g2, view) = (go.contender("g1"), go.contender("g2"), go.contender("v"));
    let first = g1.acquire(Ask::Write(&pfx)).await.unwrap();
    let (started, stop) = (dir.path().join("started"), dir.path().join("stop"));
    let mut ours = dlock(
        &url,
        &[
            "run",
            &key,
            "--shared",
            "--",
            "sh",
            "-c",
            &hold_until(&started, &stop),
        ],
    )
    .spawn()
    .unwrap();
    // Our key, once it is in line (Go's view lists holders only: ask etcd
    // for every key).
    let lock = distlock::etcd::EtcdLock::connect(distlock::etcd::EtcdConfig::new(etcd.addresses.clone()))
        .await
        .unwrap();
    let mut read_key = None;
    let deadline = Instant::now() + LIMIT;
    while read_key.is_none() {
        assert!(Instant::now() < deadline, "dlock run's read key did not appear");
        read_key = lock
            .contenders(&format!("{key}/"))
            .await
            .unwrap()
            .into_iter()
            .find(|k| *k != first.node);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let read_key = read_key.unwrap();
    g2.start(Ask::Write(&pfx)).await.unwrap();
    g2.behind(&read_key).await.unwrap();
    assert!(!started.exists(), "dlock run's command ran beside Go's writer");
    g1.release().await.unwrap();
    until("dlock run's command to start", || started.exists()).await;
    let text = stdout(&output(&url, &["holder", &key]));
    assert!(
        text.contains("1 holder:") && text.contains(&format!("  read: {read_key} (")),
        "{text}"
    );
    let theirs = view.holders(View::ReadWrite(&pfx)).await.unwrap();
    assert_eq!(
        theirs
            .iter()
            .map(|l| (l.role.as_str(), l.node.as_str()))
            .collect::<Vec<_>>(),
        [("read", read_key.as_str())],
        "Go's view"
    );
    let refused = output(&url, &["run", &key, "--exclusive", "--no-wait", "--", "true"]);
    assert_eq!(refused.status.code(), Some(75), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("(read)"),
        "{refused:?}"
    );
    std::fs::write(&stop, "").unwrap();
    assert!(ours.wait().unwrap().success());
    let second = g2.granted().await.unwrap();
    assert!(second.token > first.token);
    g2.release().await.unwrap();
    go.close().await;
}
