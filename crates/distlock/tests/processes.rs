//! The safety run with each client in its own OS process, on every backend
//! at once: three processes per backend (this binary, run again as a
//! client), each with its own connections and sessions, loop acquire →
//! fenced read-modify-write → release against a register the parent serves;
//! client 0 is frozen with `SIGSTOP` while holding, past its TTL (for
//! ZooKeeper past its session), then thawed to write with its old token.
//!
//! Claims checked: Redis, etcd and ZooKeeper accept no stale write and lose
//! no update, and show no overlapping holds; Redlock, which has no token,
//! loses updates (the damage is detected).
//!
//! A test binary with its own `main` (`harness = false`): with
//! `DLOCK_SAFETY_PARENT` set it is a client process.

use std::time::Duration;

use distlock::Config;
use dlock_testkit::launcher::shared;
use dlock_testkit::safety::processes::{self, PARENT_VAR, ProcessPlan};
use dlock_testkit::safety::{SafetyReport, publish, run_for};

const CONFIG_VAR: &str = "DLOCK_SAFETY_CONFIG";

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if let Ok(parent) = std::env::var(PARENT_VAR) {
        // A client process.
        let result = runtime.block_on(async {
            let config = std::env::var(CONFIG_VAR).map_err(|e| format!("{CONFIG_VAR}: {e}"))?;
            let config = Config::from_toml(&config).map_err(|e| e.to_string())?;
            let lock = distlock::connect(&config).await.map_err(|e| e.to_string())?;
            let parent = parent
                .parse()
                .map_err(|e| format!("{PARENT_VAR}={parent:?}: {e}"))?;
            processes::client(lock, parent).await
        });
        if let Err(e) = result {
            eprintln!("client process: {e}");
            std::process::exit(1);
        }
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        println!("separate_processes_every_backend: test");
        return;
    }
    runtime.block_on(parent());
    println!("test separate_processes_every_backend ... ok");
}

struct Run {
    backend: &'static str,
    config: Config,
    plan: ProcessPlan,
}

fn strip(u: &str) -> String {
    u.trim_start_matches("redis://")
        .trim_start_matches("http://")
        .to_owned()
}

async fn parent() {
    let redis = shared::redis().await.expect("a redis server for the tests");
    let nodes = shared::redis_nodes().await.expect("redis nodes for the tests");
    let etcd = shared::etcd().await.expect("an etcd server for the tests");
    let zk = shared::zk().await.expect("a zookeeper server for the tests");
    let join = |a: &[String]| a.iter().map(|u| strip(u)).collect::<Vec<_>>().join(",");
    let url = |u: String| Config::from_url(&u).unwrap_or_else(|e| panic!("{u}: {e}"));
    let plan = |backend: &str, secs, ttl, pause, fence| ProcessPlan {
        clients: 3,
        duration: run_for(secs),
        ttl,
        pause_every: 3,
        pause,
        fence,
        key: format!("processes-{backend}-{:x}", rand::random::<u32>()),
    };
    let ms = Duration::from_millis;
    let mut zk_config = url(format!("zk://{}", zk.addresses[0]));
    let session = Duration::from_secs(4);
    if let Config::Zk(c) = &mut zk_config {
        c.session_timeout = session;
    }
    let runs = vec![
        Run {
            backend: "redis",
            config: url(redis.addresses[0].clone()),
            plan: plan("redis", 10, ms(300), ms(1000), true),
        },
        Run {
            backend: "redlock",
            config: url(format!("redlock://{}", join(&nodes.addresses))),
            plan: plan("redlock", 10, ms(300), ms(1000), false),
        },
        Run {
            backend: "etcd",
            config: url(format!("etcd://{}", join(&etcd.addresses))),
            plan: plan("etcd", 15, Duration::from_secs(2), Duration::from_secs(5), true),
        },
        Run {
            backend: "zk",
            config: zk_config,
            // Frozen past the session: a frozen client cannot give its node
            // up itself, the session's expiry must.
            plan: plan("zk", 20, Duration::from_secs(1), session * 2 + ms(500), true),
        },
    ];
    let exe = std::env::current_exe().expect("this test binary's path");
    let mut tasks = Vec::new();
    for run in runs {
        let exe = exe.clone();
        let toml = run.config.to_toml().expect("a config as TOML");
        tasks.push(tokio::spawn(async move {
            let report = processes::run(run.plan, |_| {
                let mut cmd = tokio::process::Command::new(&exe);
                cmd.env(CONFIG_VAR, &toml);
                cmd
            })
            .await;
            (run.backend, report)
        }));
    }
    let mut broken = Vec::new();
    for task in tasks {
        let (backend, report) = task.await.expect("a run's task");
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                broken.push(format!("{backend}: the run failed: {e}"));
                continue;
            }
        };
        eprintln!("{backend}, separate processes: {report}");
        if let Some(problem) = judge(backend, &report) {
            broken.push(format!("{backend}: {problem}: {report}"));
        }
    }
    drop((redis, nodes, etcd, zk));
    assert!(broken.is_empty(), "claims broken:\n{}", broken.join("\n"));
}

/// Publishes the run and returns what is wrong with it, if anything.
fn judge(backend: &str, report: &SafetyReport) -> Option<&'static str> {
    let run = "3 client processes, holder frozen with SIGSTOP";
    if backend == "redlock" {
        publish(backend, run, report, "the damage is detected: lost updates > 0");
        return if report.pauses == 0 {
            Some("no client was frozen")
        } else if report.lost_updates == 0 {
            Some("the frozen holder lost no update: the nemesis did not bite")
        } else {
            None
        };
    }
    publish(
        backend,
        run,
        report,
        "0 overlaps, no stale write accepted, no update lost",
    );
    if report.pauses == 0 {
        Some("no client was frozen")
    } else if !report.is_safe() {
        Some("unsafe")
    } else if !report.history.overlaps.is_empty() {
        Some("overlapping holds")
    } else if report.history.grants < 3 {
        Some("hardly any grants")
    } else {
        None
    }
}
