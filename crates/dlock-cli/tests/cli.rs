//! `dlock` end to end, against the local test servers: mutual exclusion of
//! two processes, exit codes, `--no-wait`, fencing tokens in the child's
//! environment, a lock lost while the child runs, and Ctrl-C forwarding.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::launcher::{etcd::etcdctl, redis::command, shared};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");
const LIMIT: Duration = Duration::from_secs(30);

struct Backends {
    urls: Vec<(&'static str, String)>,
    etcd: Vec<String>,
    redis: String,
    _keep: Vec<Box<dyn std::any::Any + Send>>,
}

async fn backends() -> Backends {
    let redis = shared::redis().await.unwrap();
    let etcd = shared::etcd().await.unwrap();
    let zk = shared::zk().await.unwrap();
    let etcd_hosts: Vec<String> = etcd
        .addresses
        .iter()
        .map(|u| u.trim_start_matches("http://").to_owned())
        .collect();
    Backends {
        urls: vec![
            ("redis", redis.addresses[0].clone()),
            ("etcd", format!("etcd://{}", etcd_hosts.join(","))),
            ("zk", format!("zk://{}", zk.addresses[0])),
        ],
        etcd: etcd.addresses.clone(),
        redis: redis.addresses[0].clone(),
        _keep: vec![Box::new(redis), Box::new(etcd), Box::new(zk)],
    }
}

fn unique(name: &str) -> String {
    format!("{name}-{:x}", rand::random::<u64>())
}

/// `dlock --url URL ARGS...`, started with every signal at its default.
///
/// The dispositions are set here, not inherited: a test run as a background
/// job of a non-interactive shell inherits SIGINT and SIGQUIT ignored (under
/// `nohup`, SIGHUP too), and `dlock` rightly keeps an ignored signal ignored
/// for its command, so a test that sends one would wait for nothing.
/// `env --default-signal` (coreutils) resets them and execs `dlock`, so the
/// child's pid is `dlock`'s.
fn dlock(url: &str, args: &[&str]) -> Command {
    let mut c = Command::new("env");
    c.args(["--default-signal", "--", DLOCK]);
    // Whatever the shell running the tests says: stderr is checked.
    c.arg("--url").arg(url).args(args).env_remove("RUST_LOG");
    c
}

fn run(url: &str, key: &str, extra: &[&str], script: &str) -> Output {
    let mut args = vec!["run", key];
    args.extend(extra);
    args.extend(["--", "sh", "-c", script]);
    dlock(url, &args).output().unwrap()
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

/// A `dlock run` holding `key` for `secs` seconds, once its command runs
/// (it touches `started`).
async fn hold(url: &str, key: &str, started: &Path, secs: u32) -> std::process::Child {
    let script = format!("touch {}; sleep {secs}", started.display());
    let holder = dlock(url, &["run", key, "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    until("the holder to start", || started.exists()).await;
    holder
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_interleave() {
    let b = backends().await;
    let dir = tempfile::tempdir().unwrap();
    for (name, url) in &b.urls {
        let key = unique("exclusive");
        let log = dir.path().join(format!("{name}.log"));
        let script = format!(
            "echo begin $$ >> {0}; sleep 0.3; echo end $$ >> {0}",
            log.display()
        );
        let spawn = || {
            dlock(url, &["run", &key, "--", "sh", "-c", &script])
                .spawn()
                .unwrap()
        };
        let (mut a, mut c) = (spawn(), spawn());
        assert!(
            a.wait().unwrap().success() && c.wait().unwrap().success(),
            "{name}"
        );
        let lines: Vec<String> = read(&log).lines().map(str::to_owned).collect();
        assert_eq!(lines.len(), 4, "{name}: {lines:?}");
        for pair in lines.chunks(2) {
            let (b0, e0) = (pair[0].strip_prefix("begin "), pair[1].strip_prefix("end "));
            assert!(b0.is_some() && b0 == e0, "{name}: interleaved: {lines:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_pass_through_and_tokens_increase() {
    let b = backends().await;
    for (name, url) in &b.urls {
        let key = unique("codes");
        assert_eq!(run(url, &key, &[], "exit 7").status.code(), Some(7), "{name}");
        assert_eq!(
            run(url, &key, &[], "kill -9 $$").status.code(),
            Some(128 + 9),
            "{name}"
        );
        let mut last = 0u64;
        for _ in 0..3 {
            let out = run(
                url,
                &key,
                &[],
                "echo $DLOCK_KEY $DLOCK_BACKEND $DLOCK_FENCING_TOKEN",
            );
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let fields: Vec<&str> = text.split_whitespace().collect();
            assert_eq!(fields[..2], [key.as_str(), *name], "{text}");
            let token: u64 = fields[2]
                .parse()
                .unwrap_or_else(|_| panic!("{name}: no token in {text:?}"));
            assert!(token > last, "{name}: token {token} after {last}");
            last = token;
        }
        let missing = run(url, &key, &[], "exit 0");
        assert!(missing.status.success());
        let cannot = dlock(url, &["run", &key, "--", "/nonexistent/program"])
            .output()
            .unwrap();
        assert_eq!(cannot.status.code(), Some(127), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wait_on_a_held_key_fails_fast_and_names_the_holder() {
    let b = backends().await;
    let dir = tempfile::tempdir().unwrap();
    for (name, url) in &b.urls {
        let key = unique("held");
        let started = dir.path().join(format!("{name}.started"));
        let mut holder = hold(url, &key, &started, 3).await;
        let t = Instant::now();
        let out = run(url, &key, &["--no-wait"], "echo should-not-run");
        assert_eq!(out.status.code(), Some(75), "{name}: {out:?}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{name}: --no-wait took {:?}",
            t.elapsed()
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("should-not-run"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("held by"), "{name}: {err}");
        let bounded = run(url, &key, &["--wait", "300ms"], "true");
        assert_eq!(bounded.status.code(), Some(75), "{name}");
        let holder_out = dlock(url, &["holder", &key]).output().unwrap();
        assert!(
            String::from_utf8_lossy(&holder_out.stdout).contains("is held by"),
            "{name}: {holder_out:?}"
        );
        assert!(holder.wait().unwrap().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_terminates_the_child() {
    let b = backends().await;
    let dir = tempfile::tempdir().unwrap();
    // How each backend's lock is taken away from outside.
    for (name, url) in b.urls.iter().filter(|(n, _)| *n != "zk") {
        let key = unique("lost");
        let (started, term) = (
            dir.path().join(format!("{name}.started")),
            dir.path().join(format!("{name}.term")),
        );
        let script = format!(
            "trap 'touch {}; exit 0' TERM; touch {}; sleep 60 & wait",
            term.display(),
            started.display()
        );
        let child = dlock(
            url,
            &[
                "run", &key, "--ttl", "3s", "--grace", "5s", "--", "sh", "-c", &script,
            ],
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let t = Instant::now();
        until("the child to start", || started.exists()).await;
        match *name {
            "redis" => {
                let addr = b.redis.trim_start_matches("redis://").parse().unwrap();
                assert_eq!(
                    command(addr, &["DEL", &format!("dlock:{key}")]).await.unwrap(),
                    ":1"
                );
            }
            "etcd" => {
                let keys = etcdctl(
                    &b.etcd,
                    &["get", "--prefix", "--keys-only", &format!("dlock/{key}/")],
                )
                .unwrap();
                let lease = keys
                    .lines()
                    .find(|l| !l.is_empty())
                    .unwrap()
                    .rsplit('/')
                    .next()
                    .unwrap();
                let lease = lease.split('-').next().unwrap().to_owned();
                etcdctl(&b.etcd, &["lease", "revoke", &lease]).unwrap();
            }
            _ => unreachable!(),
        }
        let status = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.status.code(), Some(76), "{name}: {status:?}");
        assert!(term.exists(), "{name}: the child got no SIGTERM");
        // The whole process group got it: nothing kept the pipes open.
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{name}: took {:?}",
            t.elapsed()
        );
    }
}

/// A waiter whose place in line vanishes (its etcd lease revoked) was
/// never granted: "not acquired" (75) and nothing ran, not "lost while the
/// command ran" (76).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_in_line_lost_while_waiting_is_not_acquired_and_nothing_runs() {
    let b = backends().await;
    let url = &b.urls.iter().find(|(n, _)| *n == "etcd").unwrap().1;
    let dir = tempfile::tempdir().unwrap();
    let key = unique("lost-in-line");
    let (started, ran) = (dir.path().join("started"), dir.path().join("ran"));
    let contenders = || {
        etcdctl(
            &b.etcd,
            &["get", "--prefix", "--keys-only", &format!("dlock/{key}/")],
        )
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect::<Vec<_>>()
    };
    let mut holder = dlock(
        url,
        &[
            "run",
            &key,
            "--",
            "sh",
            "-c",
            &format!("touch {}; sleep 120", started.display()),
        ],
    )
    .spawn()
    .unwrap();
    until("the holder's command to start", || started.exists()).await;
    let holders = contenders();
    assert_eq!(holders.len(), 1, "{holders:?}");
    let waiter = dlock(
        url,
        &[
            "run",
            &key,
            "--wait",
            "120s",
            "--",
            "sh",
            "-c",
            &format!("touch {}", ran.display()),
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    until("the waiter to queue", || contenders().len() == 2).await;
    let theirs = contenders().into_iter().find(|k| *k != holders[0]).unwrap();
    let lease = theirs
        .rsplit('/')
        .next()
        .unwrap()
        .split('-')
        .next()
        .unwrap()
        .to_owned();
    etcdctl(&b.etcd, &["lease", "revoke", &lease]).unwrap();
    // Well before the wait (or the holder) could end it.
    let out = tokio::time::timeout(
        LIMIT,
        tokio::task::spawn_blocking(move || waiter.wait_with_output()),
    )
    .await
    .expect("the waiter was not told its place in line was gone")
    .unwrap()
    .unwrap();
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("lost"), "{out:?}");
    assert!(!ran.exists(), "the command ran without the lock");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(holder.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    holder.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_is_forwarded_and_the_lock_released() {
    let b = backends().await;
    let dir = tempfile::tempdir().unwrap();
    for (name, url) in &b.urls {
        let key = unique("ctrl-c");
        let started = dir.path().join(format!("{name}.started"));
        let script = format!("trap 'exit 3' INT; touch {}; sleep 60", started.display());
        let child = dlock(url, &["run", &key, "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        until("the child to start", || started.exists()).await;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{name}: {out:?}");
        // Released: a --no-wait run gets it at once.
        assert_eq!(
            run(url, &key, &["--no-wait"], "true").status.code(),
            Some(0),
            "{name}"
        );
    }
}

#[test]
fn no_backend_configured_explains_the_three_ways() {
    let out = Command::new(DLOCK)
        .args(["run", "k", "--", "true"])
        .env_remove("DLOCK_URL")
        .env_remove("DLOCK_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for way in ["--url", "--config", "DLOCK_URL"] {
        assert!(err.contains(way), "{err}");
    }
    let help = Command::new(DLOCK).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for code in ["69", "75", "76", "127"] {
        assert!(text.contains(code), "exit code {code} undocumented in --help");
    }
}

/// Whether `pid` is a live process (not gone, not a zombie waiting for a reaper).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

fn pid_in(path: &Path) -> Option<i32> {
    read(path).trim().parse().ok()
}

/// `dlock` killed with SIGKILL (the OOM killer): the command must not run
/// on while the lock expires and another host starts a second copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_dies_with_a_killed_dlock() {
    let b = backends().await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 120", pidfile.display());
    let mut child = dlock(&b.redis, &["run", &unique("killed"), "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    until("the command to start", || pid_in(&pidfile).is_some()).await;
    let command = pid_in(&pidfile).unwrap();
    assert!(alive(command));
    child.kill().unwrap();
    child.wait().unwrap();
    let gone = Instant::now() + LIMIT;
    while alive(command) && Instant::now() < gone {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let survived = alive(command);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(command),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(!survived, "the command outlived dlock by {LIMIT:?}");
}

/// SIGHUP (an ssh session dropped) and SIGQUIT reach the command as SIGTERM
/// does, and the lock is released when it exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hangup_and_quit_are_forwarded_and_the_lock_released() {
    let b = backends().await;
    let dir = tempfile::tempdir().unwrap();
    for (sig, name) in [
        (nix::sys::signal::Signal::SIGHUP, "HUP"),
        (nix::sys::signal::Signal::SIGQUIT, "QUIT"),
    ] {
        let key = unique("hangup");
        let (started, got) = (
            dir.path().join(format!("{name}.started")),
            dir.path().join(format!("{name}.got")),
        );
        let script = format!(
            "trap 'echo {name} > {got}; exit 4' {name}; touch {started}; for i in $(seq 600); do sleep 0.1; done",
            got = got.display(),
            started = started.display()
        );
        let child = dlock(&b.redis, &["run", &key, "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        until("the command to start", || started.exists()).await;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, sig).unwrap();
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        until("the command to get the signal", || got.exists()).await;
        assert_eq!(out.status.code(), Some(4), "{name}: {out:?}");
        assert_eq!(
            run(&b.redis, &key, &["--no-wait"], "true").status.code(),
            Some(0),
            "{name}: not released"
        );
    }
}

/// Under a terminal, the command gets the terminal's foreground while it
/// runs: a command that reads the terminal must not be stopped by SIGTTIN
/// while the lock stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_reading_the_terminal_does_not_hang() {
    let b = backends().await;
    // Alone in the foreground, and in a pipeline that shares dlock's group.
    for pipe in ["", " | cat"] {
        let inner = format!(
            "{DLOCK} --url {} run {} -- sh -c 'read x; echo got:$x'{pipe}",
            b.redis,
            unique("tty")
        );
        under_a_terminal(&inner).await;
    }
}

/// Runs `inner` under script(1) on a new pseudo-terminal fed "hello", and
/// checks that the command read it.
async fn under_a_terminal(inner: &str) {
    use std::io::Write;
    // script(1) runs `inner` on a new pseudo-terminal, feeding it our stdin.
    let mut script = Command::new("script")
        .args(["-qec", inner, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    script.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let pid = script.id();
    let waited = tokio::time::timeout(
        LIMIT,
        tokio::task::spawn_blocking(move || script.wait_with_output()),
    )
    .await;
    let Ok(out) = waited else {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        );
        panic!("a command reading the terminal hung for {LIMIT:?}");
    };
    let out = out.unwrap().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("got:hello"),
        "{inner}: {out:?}"
    );
}

/// The command starts with SIGPIPE at its default (Rust programs ignore it,
/// and an ignored signal stays ignored across exec: `yes | head` would
/// then report a broken pipe) and no signal blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_gets_default_signal_dispositions() {
    let b = backends().await;
    let out = run(
        &b.redis,
        &unique("sigpipe"),
        &[],
        "exec grep -E '^Sig(Ign|Blk)' /proc/self/status",
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status = String::from_utf8_lossy(&out.stdout);
    let mask = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap()
    };
    assert_eq!(mask("SigIgn:") & (1 << (13 - 1)), 0, "SIGPIPE ignored: {status}");
    assert_eq!(mask("SigBlk:"), 0, "signals blocked: {status}");
}

/// A signal `dlock` was started with ignored (`nohup`, a background job)
/// stays ignored for its command, as with any program that execs another;
/// the others start at their default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inherited_ignored_signal_stays_ignored_for_the_command() {
    let b = backends().await;
    let out = Command::new("env")
        .args([
            "--default-signal",
            "--ignore-signal=QUIT",
            "--",
            DLOCK,
            "--url",
            &b.redis,
        ])
        .args(["run", &unique("ignored"), "--", "sh", "-c"])
        .arg("exec grep -E '^SigIgn' /proc/self/status")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status = String::from_utf8_lossy(&out.stdout);
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap();
    let bit = |n: u32| 1u64 << (n - 1);
    assert_ne!(ignored & bit(3), 0, "SIGQUIT not ignored: {status}");
    assert_eq!(
        ignored & (bit(1) | bit(2) | bit(15)),
        0,
        "HUP, INT or TERM ignored: {status}"
    );
}

/// A URL with a password need not be on the command line (`ps` shows it to
/// everyone): `--url-file` reads it; the command never sees it (DLOCK_URL
/// and DLOCK_CONFIG are removed from its environment); `--help` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urls_with_passwords_stay_off_the_command_line_and_out_of_the_command() {
    let b = backends().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("url");
    std::fs::write(&file, format!("{}\n", b.redis)).unwrap();
    let out = Command::new(DLOCK)
        .arg("--url-file")
        .arg(&file)
        .args(["run", &unique("url-file"), "--", "sh", "-c", "env"])
        .env("DLOCK_URL", "redis://user:s3cret@127.0.0.1:1")
        .env("DLOCK_CONFIG", "/nonexistent/secret.toml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let env = String::from_utf8_lossy(&out.stdout);
    assert!(env.contains("DLOCK_KEY="), "{env}");
    assert!(!env.contains("s3cret") && !env.contains("DLOCK_CONFIG"), "{env}");
    let help = Command::new(DLOCK).arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--url-file"));
}

/// `-v` tells on stderr what the lock did (granted, released, with the
/// backend, key and token), nothing is told without it, and `-vv` (or
/// `RUST_LOG`) also tells the waiting (queued, timed out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbose_tells_what_the_lock_does_on_stderr() {
    let b = backends().await;
    let dir = tempfile::tempdir().unwrap();
    for (name, url) in &b.urls {
        let key = unique("verbose");
        let out = dlock(url, &["-v", "run", &key, "--", "true"]).output().unwrap();
        assert!(out.status.success(), "{name}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let backend = format!("backend=\"{name}\"");
        let at_key = format!("key=\"{key}\"");
        for line in ["granted", "released"] {
            let line = err
                .lines()
                .find(|l| l.contains(line))
                .unwrap_or_else(|| panic!("{name}: no `{line}` in {err}"));
            assert!(
                line.contains(&backend) && line.contains(&at_key) && line.contains("token="),
                "{name}: {line}"
            );
        }
        let quiet = dlock(url, &["run", &key, "--", "true"]).output().unwrap();
        assert!(quiet.status.success(), "{name}: {quiet:?}");
        assert!(quiet.stderr.is_empty(), "{name}: {quiet:?}");

        let started = dir.path().join(format!("{name}.started"));
        let mut holder = hold(url, &key, &started, 2).await;
        let waiting = ["run", &key, "--wait", "200ms", "--", "true"];
        let mut very_verbose = dlock(url, &[&["-vv"][..], &waiting].concat());
        let mut rust_log = dlock(url, &waiting);
        rust_log.env("RUST_LOG", "dlock=debug");
        for (how, c) in [("-vv", &mut very_verbose), ("RUST_LOG", &mut rust_log)] {
            let out = c.output().unwrap();
            assert_eq!(out.status.code(), Some(75), "{name} {how}: {out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            for told in ["queued", "timed out waited_ms="] {
                assert!(err.contains(told), "{name} {how}: no `{told}` in {err}");
            }
        }
        assert!(holder.wait().unwrap().success());
    }
}

/// `--shared` runs beside other readers and keeps the writer
/// (`--exclusive`) out; `--permits N` lets N commands run at once and no
/// more; a backend without the primitive says so (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_and_permits_run_side_by_side_up_to_their_limit() {
    let b = backends().await;
    let dir = tempfile::tempdir().unwrap();
    // Holders hold until told to stop (no timing assumption).
    let stop = dir.path().join("stop");
    let hold_until_stopped = |started: &Path| {
        format!(
            // At most 30 s, even if the test never says stop.
            "touch {}; i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done",
            started.display(),
            stop.display()
        )
    };
    for (name, url) in &b.urls {
        // Readers: a second one runs while the first holds; a writer may
        // not; `dlock holder` lists the reader.
        let key = unique("shared");
        let started = dir.path().join(format!("{name}-reader.started"));
        let script = hold_until_stopped(&started);
        let mut reader = dlock(url, &["run", &key, "--shared", "--", "sh", "-c", &script])
            .spawn()
            .unwrap();
        until("the first reader to start", || started.exists()).await;
        let second = run(url, &key, &["--shared", "--no-wait"], "echo second-reader");
        assert_eq!(second.status.code(), Some(0), "{name}: {second:?}");
        assert!(String::from_utf8_lossy(&second.stdout).contains("second-reader"));
        let writer = run(url, &key, &["--exclusive", "--no-wait"], "echo should-not-run");
        assert_eq!(writer.status.code(), Some(75), "{name}: {writer:?}");
        assert!(
            String::from_utf8_lossy(&writer.stderr).contains("(read)"),
            "{name}: the refusal names the reader: {writer:?}"
        );
        let listed = dlock(url, &["holder", &key]).output().unwrap();
        let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
        assert!(
            listed.contains("1 holder:") && listed.contains("  read: "),
            "{name}: {listed}"
        );
        std::fs::write(&stop, "").unwrap();
        assert!(reader.wait().unwrap().success());
        std::fs::remove_file(&stop).unwrap();
        // Two permits: two hold, a third is refused; both are listed.
        let key = unique("permits");
        let mut holders = Vec::new();
        for i in 0..2 {
            let started = dir.path().join(format!("{name}-permit-{i}.started"));
            let script = hold_until_stopped(&started);
            holders.push(
                dlock(url, &["run", &key, "--permits", "2", "--", "sh", "-c", &script])
                    .spawn()
                    .unwrap(),
            );
            until("a permit holder to start", || started.exists()).await;
        }
        let third = run(url, &key, &["--permits", "2", "--no-wait"], "echo should-not-run");
        assert_eq!(third.status.code(), Some(75), "{name}: {third:?}");
        let listed = dlock(url, &["holder", &key]).output().unwrap();
        let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
        assert!(
            listed.contains("2 holders:") && listed.matches("  1 permit: ").count() == 2,
            "{name}: {listed}"
        );
        std::fs::write(&stop, "").unwrap();
        for mut h in holders {
            assert!(h.wait().unwrap().success());
        }
        std::fs::remove_file(&stop).unwrap();
        let listed = dlock(url, &["holder", &key]).output().unwrap();
        assert!(
            String::from_utf8_lossy(&listed.stdout).contains("is not held"),
            "{name}: {listed:?}"
        );
    }
    // A backend without semaphores.
    let nodes = shared::redis_nodes().await.unwrap();
    let hosts: Vec<&str> = nodes
        .addresses
        .iter()
        .map(|u| u.trim_start_matches("redis://"))
        .collect();
    let redlock = format!("redlock://{}", hosts.join(","));
    let out = run(
        &redlock,
        &unique("no-sem"),
        &["--permits", "2"],
        "echo should-not-run",
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not offer semaphores"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("should-not-run"));
}

/// `DLOCK_URL=postgres://...` through the facade: a command runs under the
/// lock, a second one is refused while it holds (naming the holder), and
/// `dlock holder` shows the row; a read-write lock is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_url_locks_and_names_its_holder() {
    let server = shared::postgres().await.unwrap();
    let url = server.addresses[0].clone();
    let dir = tempfile::tempdir().unwrap();
    let key = unique("pg");
    let once = Command::new(DLOCK)
        .args(["run", &key, "--", "sh", "-c", "echo ran-under-postgres"])
        .env("DLOCK_URL", &url)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(once.status.success(), "{once:?}");
    assert!(String::from_utf8_lossy(&once.stdout).contains("ran-under-postgres"));
    let started = dir.path().join("started");
    let mut holder = hold(&url, &key, &started, 3).await;
    let refused = run(&url, &key, &["--no-wait"], "echo should-not-run");
    assert_eq!(refused.status.code(), Some(75), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("held by"),
        "{refused:?}"
    );
    let who = dlock(&url, &["holder", &key]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&who.stdout).contains("is held by"),
        "{who:?}"
    );
    assert!(holder.wait().unwrap().success());
    let rw = run(&url, &unique("pg-rw"), &["--shared"], "echo should-not-run");
    assert_eq!(rw.status.code(), Some(2), "{rw:?}");
    assert!(
        String::from_utf8_lossy(&rw.stderr).contains("does not offer read-write locks"),
        "{rw:?}"
    );
}
