//! `dlock-bench`: the benchmarks `cargo xtask bench` runs. Every scenario,
//! every backend, one run; each figure next to a floor measured in the same
//! run with the same client library. Writes `BENCHMARKS.md` and
//! `benchmarks.svg`; judges nothing (targets are reported, not asserted).
//!
//! ```text
//! dlock-bench [--quick] [--backend NAME] [--out DIR]
//! dlock-bench --breakdown [--quick] [--backend NAME]  (scenario 1c alone, to stdout)
//! dlock-bench --memory URL --guards N      (scenario 6's child process)
//! DLOCK_BENCH_URL=URL dlock-bench --instructions SUBJECT N  (1c's child, under callgrind)
//! ```
//!
//! Every step names itself; one that takes longer than 300 s (`--quick`)
//! or 1200 s (or `DLOCK_BENCH_STEP_LIMIT` seconds) ends the run with exit
//! status 3, naming the step and printing every thread's stack.
//!
//! Servers come from the same `DLOCK_TEST_*` variables as the tests
//! (`cargo xtask bench` sets them); without them private servers start.

mod breakdown;
mod family;
mod floor;
mod instructions;
mod peer;
mod report;
mod scenarios;
mod stats;
mod watchdog;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use dlock_testkit::launcher::shared;

use crate::floor::Floor;
use crate::scenarios::{Backend, FanOut, HotKey, ManyKeys, PeerAt, Uncontended};
use crate::stats::Lat;

/// How much of everything a run does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Size {
    pub(crate) quick: bool,
    pub(crate) iterations: usize,
    pub(crate) round_trips: usize,
    pub(crate) hot: Duration,
    pub(crate) many: Duration,
    pub(crate) waiters: Duration,
    pub(crate) fan_out: usize,
    pub(crate) guards: usize,
}

impl Size {
    fn new(quick: bool) -> Self {
        if quick {
            Size {
                quick,
                iterations: 300,
                round_trips: 200,
                hot: Duration::from_millis(1500),
                many: Duration::from_millis(1500),
                waiters: Duration::from_millis(1500),
                fan_out: 60,
                guards: 1000,
            }
        } else {
            Size {
                quick,
                iterations: 2000,
                round_trips: 1000,
                hot: Duration::from_secs(5),
                many: Duration::from_secs(5),
                waiters: Duration::from_secs(3),
                fan_out: 300,
                guards: 10_000,
            }
        }
    }
}

/// Everything one run measured, per backend.
pub(crate) struct BackendResults {
    pub(crate) name: &'static str,
    pub(crate) uncontended: Uncontended,
    pub(crate) round_trip: Lat,
    /// Scenario 1c.
    pub(crate) breakdown: breakdown::Breakdown,
    /// Raw clients' handoff (release → told → take), where there is one.
    pub(crate) handoff_floor: Option<Lat>,
    pub(crate) hot: HotKey,
    /// The hot key, ours against the peer's, in alternating rounds.
    pub(crate) versus: Option<(HotKey, HotKey)>,
    pub(crate) many: ManyKeys,
    pub(crate) waiters: Vec<HotKey>,
    /// (resident bytes before, after, guards)
    pub(crate) memory: Option<(u64, u64, usize)>,
    /// Scenario 7.
    pub(crate) family: Option<family::Family>,
}

/// The whole run.
pub(crate) struct Results {
    pub(crate) size: Size,
    pub(crate) backends: Vec<BackendResults>,
    pub(crate) fan_out: FanOut,
    pub(crate) took: Duration,
}

/// The waiters of scenario 4 (each on top of the holder).
pub(crate) const WAITERS: [usize; 3] = [2, 16, 64];
/// The clients of scenario 2.
pub(crate) const HOT_CLIENTS: usize = 4;
/// The tasks of scenario 3.
pub(crate) const MANY_TASKS: usize = 64;
/// The hold time in scenarios 2 and 4.
pub(crate) const HOLD: Duration = Duration::from_millis(1);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--instructions") {
        // A child counted by callgrind: one thread, no watchdog thread.
        return match instructions::child(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dlock-bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // A step of the quick run takes seconds; of the full run, a minute or
    // two. `DLOCK_BENCH_STEP_LIMIT` (seconds) sets another limit.
    let quick = args.iter().any(|a| a == "--quick");
    let limit = std::env::var("DLOCK_BENCH_STEP_LIMIT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if quick { 300 } else { 1200 });
    watchdog::start(Duration::from_secs(limit));
    let result = if args.first().map(String::as_str) == Some("--memory") {
        runtime.block_on(memory_child(&args))
    } else {
        runtime.block_on(run(&args))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dlock-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn memory_child(args: &[String]) -> Result<(), String> {
    let url = args.get(1).ok_or("--memory needs a URL")?;
    let guards: usize = match (args.get(2).map(String::as_str), args.get(3)) {
        (Some("--guards"), Some(n)) => n.parse().map_err(|e| format!("--guards {n}: {e}"))?,
        _ => return Err("usage: dlock-bench --memory URL --guards N".into()),
    };
    watchdog::step(format!("memory of {guards} guards"));
    let (before, after) = scenarios::memory(url, guards).await?;
    println!("MEMORY {before} {after} {guards}");
    Ok(())
}

fn strip(u: &str) -> String {
    u.trim_start_matches("redis://")
        .trim_start_matches("http://")
        .to_owned()
}

async fn run(args: &[String]) -> Result<(), String> {
    let mut quick = false;
    let mut only: Option<String> = None;
    let mut breakdown_only = false;
    let mut out = std::path::PathBuf::from(".");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--breakdown" => breakdown_only = true,
            "--out" => out = it.next().ok_or("--out needs a directory")?.into(),
            "--backend" => only = Some(it.next().ok_or("--backend needs a name")?.clone()),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: dlock-bench [--quick] [--breakdown] [--backend NAME] [--out DIR]"
                ));
            }
        }
    }
    let size = Size::new(quick);
    let started = Instant::now();
    watchdog::step("starting the servers' clients");
    let redis = shared::redis().await.map_err(|e| e.to_string())?;
    let nodes = shared::redis_nodes().await.map_err(|e| e.to_string())?;
    let etcd = shared::etcd().await.map_err(|e| e.to_string())?;
    let zk = shared::zk().await.map_err(|e| e.to_string())?;
    let postgres = shared::postgres().await.map_err(|e| e.to_string())?;
    let join = |a: &[String]| a.iter().map(|u| strip(u)).collect::<Vec<_>>().join(",");
    let backends = [
        Backend {
            name: "redis",
            peer_at: Some(PeerAt::Rslock(redis.addresses.clone())),
            url: redis.addresses[0].clone(),
            floor: Floor::redis(&redis.addresses[0]).await?,
            other: Floor::redis(&redis.addresses[0]).await?,
            redis_url: Some(redis.addresses[0].clone()),
        },
        Backend {
            name: "redlock",
            peer_at: Some(PeerAt::Rslock(nodes.addresses.clone())),
            url: format!("redlock://{}", join(&nodes.addresses)),
            floor: Floor::redlock(&nodes.addresses).await?,
            other: Floor::redlock(&nodes.addresses).await?,
            redis_url: None,
        },
        Backend {
            name: "etcd",
            peer_at: Some(PeerAt::Etcd(etcd.addresses.clone())),
            url: format!("etcd://{}", join(&etcd.addresses)),
            floor: Floor::etcd(&etcd.addresses).await?,
            other: Floor::etcd(&etcd.addresses).await?,
            redis_url: None,
        },
        Backend {
            name: "zk",
            peer_at: Some(PeerAt::Zk(zk.addresses[0].clone())),
            url: format!("zk://{}", zk.addresses[0]),
            floor: Floor::zk(&zk.addresses[0]).await?,
            other: Floor::zk(&zk.addresses[0]).await?,
            redis_url: None,
        },
        Backend {
            name: "postgres",
            peer_at: None,
            url: postgres.addresses[0].clone(),
            floor: Floor::postgres(&postgres.addresses[0]).await?,
            other: Floor::postgres(&postgres.addresses[0]).await?,
            redis_url: None,
        },
    ];
    let mut results = Vec::new();
    for b in backends
        .iter()
        .filter(|b| only.as_ref().is_none_or(|o| o == b.name))
    {
        eprintln!("dlock-bench: {} ...", b.name);
        watchdog::step(format!("{}: breakdown", b.name));
        // Client instructions: every backend in a full run, Redis alone
        // in a quick one (it proves the counting still works).
        let counted = (instructions::available() && (!quick || b.name == "redis")).then_some(if quick {
            (5, 15)
        } else {
            (20, 220)
        });
        let breakdown = breakdown::breakdown(b, size.iterations, counted).await?;
        if breakdown_only {
            print!("{}", report::breakdown_table(b.name, &breakdown));
            continue;
        }
        watchdog::step(format!("{}: uncontended", b.name));
        let uncontended = scenarios::uncontended(b, size.iterations).await?;
        watchdog::step(format!("{}: round trip", b.name));
        let round_trip = scenarios::round_trip(b, size.round_trips).await?;
        watchdog::step(format!("{}: handoff floor", b.name));
        let handoff_floor = scenarios::handoff_floor(b, size.round_trips / 2).await?;
        watchdog::step(format!("{}: hot key", b.name));
        let hot = scenarios::hot_key(b, HOT_CLIENTS, HOLD, size.hot).await?;
        // Versus the peer: rounds alternate, ours first, each half as long.
        let mut versus = None;
        for round in 0..2 {
            watchdog::step(format!(
                "{}: hot key versus the peer, round {}",
                b.name,
                round + 1
            ));
            let ours = scenarios::hot_key(b, HOT_CLIENTS, HOLD, size.hot / 2).await?;
            let Some(theirs) = scenarios::peer_hot_key(b, HOT_CLIENTS, HOLD, size.hot / 2).await? else {
                break;
            };
            versus = Some(match versus {
                None => (ours, theirs),
                Some((o, t)) => (HotKey::merged(o, ours), HotKey::merged(t, theirs)),
            });
        }
        watchdog::step(format!("{}: many keys", b.name));
        let many = scenarios::many_keys(b, MANY_TASKS, size.many).await?;
        let mut waiters = Vec::new();
        for n in WAITERS {
            watchdog::step(format!("{}: {n} waiters", b.name));
            waiters.push(scenarios::hot_key(b, n + 1, HOLD, size.waiters).await?);
        }
        watchdog::step(format!("{}: memory (child process)", b.name));
        let memory = memory_in_child(&b.url, size.guards).await?;
        watchdog::step(format!("{}: lock family", b.name));
        let family = family::family(b, size.iterations / 2, size.waiters).await?;
        eprintln!(
            "dlock-bench: {}: uncontended p50 {:?} (floor {:?}), handoff p50 {:?}",
            b.name,
            uncontended.ours.p50(),
            uncontended.floor.p50(),
            hot.handoff.p50()
        );
        results.push(BackendResults {
            name: b.name,
            uncontended,
            round_trip,
            breakdown,
            handoff_floor,
            hot,
            versus,
            many,
            waiters,
            memory: Some(memory),
            family: Some(family),
        });
    }
    if breakdown_only {
        return Ok(());
    }
    eprintln!("dlock-bench: redlock fan-out ...");
    watchdog::step("redlock fan-out");
    let fan_out = scenarios::fan_out(&nodes.addresses, size.fan_out).await?;
    let results = Results {
        size,
        backends: results,
        fan_out,
        took: started.elapsed(),
    };
    watchdog::step("writing the report");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let stamp = report::Stamp::read().await;
    let md = report::markdown(&results, &stamp);
    let svg = report::svg(&results, &stamp)?;
    std::fs::write(out.join("BENCHMARKS.md"), md).map_err(|e| e.to_string())?;
    std::fs::write(out.join("benchmarks.svg"), svg).map_err(|e| e.to_string())?;
    println!(
        "dlock-bench: wrote {} and {} in {:.0?}",
        out.join("BENCHMARKS.md").display(),
        out.join("benchmarks.svg").display(),
        results.took
    );
    drop((redis, nodes, etcd, zk, postgres));
    Ok(())
}

/// Scenario 6 in a fresh process, so one backend's allocations do not hide
/// another's.
async fn memory_in_child(url: &str, guards: usize) -> Result<(u64, u64, usize), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = tokio::process::Command::new(exe)
        .args(["--memory", url, "--guards", &guards.to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    watchdog::child(child.id());
    let out = child.wait_with_output().await.map_err(|e| e.to_string());
    watchdog::child(None);
    let out = out?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("MEMORY "))
        .ok_or_else(|| {
            format!(
                "the memory child for {url} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let nums: Vec<u64> = line.split_whitespace().filter_map(|n| n.parse().ok()).collect();
    match nums[..] {
        [before, after, n] => Ok((before, after, usize::try_from(n).unwrap_or(guards))),
        _ => Err(format!("bad memory line {line:?}")),
    }
}
