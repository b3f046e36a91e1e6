//! `cargo xtask safety [--backend B] [--seconds S]`: the safety runs of
//! every driver (their `tests/safety.rs`), longer, and `RELIABILITY.md`
//! written from their report lines.

use std::fmt::Write as _;
use std::process::Stdio;

use tokio::process::Command;

use crate::servers::Servers;
use crate::system::ensure_packages;

const BACKENDS: [&str; 6] = ["redis", "redlock", "etcd", "zk", "postgres", "processes"];

/// `cargo xtask safety`.
pub async fn run(args: &[String]) -> Result<(), String> {
    let mut backends: Vec<&str> = BACKENDS.to_vec();
    let mut seconds: u64 = 600;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--backend" => {
                let b = it.next().ok_or("--backend needs a value")?;
                if !BACKENDS.contains(&b.as_str()) {
                    return Err(format!("unknown backend {b:?}; known: {}", BACKENDS.join(", ")));
                }
                backends.retain(|x| x == b);
            }
            "--seconds" => {
                seconds = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|&s| (30..=3600).contains(&s))
                    .ok_or("--seconds needs a number of seconds between 30 and 3600 (a run needs time for its faults)")?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    ensure_packages()?;
    let servers = Servers::start().await?;
    let mut reports = Vec::new();
    let mut faults = Vec::new();
    let mut failed = Vec::new();
    for backend in &backends {
        eprintln!("xtask safety: {backend}, {seconds} s per run");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        // "processes": every backend with each client in its own process.
        let package = format!("dlock-{backend}");
        let args: Vec<&str> = if *backend == "processes" {
            vec![
                "test",
                "-p",
                "distlock",
                "--features",
                "full",
                "--test",
                "processes",
            ]
        } else {
            vec!["test", "-p", &package, "--test", "safety"]
        };
        let out = Command::new(cargo)
            .args(&args)
            .args(["--", "--nocapture"])
            .envs(servers.env())
            .env("DLOCK_SAFETY_SECONDS", seconds.to_string())
            .stderr(Stdio::inherit())
            .output()
            .await
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        for line in stdout.lines() {
            if let Some(r) = line.strip_prefix("SAFETY-REPORT|") {
                println!("{r}");
                reports.push(r.to_owned());
            } else if let Some(f) = line.strip_prefix("SAFETY-FAULT|") {
                faults.push(f.to_owned());
            }
        }
        if !out.status.success() {
            failed.push(*backend);
        }
    }
    drop(servers);
    let doc = reliability(seconds, &backends, &reports, &faults, &failed).await;
    std::fs::write("RELIABILITY.md", doc).map_err(|e| format!("writing RELIABILITY.md: {e}"))?;
    println!("wrote RELIABILITY.md");
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("safety runs failed: {}", failed.join(", ")))
    }
}

async fn output(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

async fn reliability(
    seconds: u64,
    backends: &[&str],
    reports: &[String],
    faults: &[String],
    failed: &[&str],
) -> String {
    let date = output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).await;
    let commit = output("git", &["rev-parse", "--short", "HEAD"]).await;
    let cores = output("nproc", &[]).await;
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_owned())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or_else(String::new, |kb| format!("{} GiB", kb / 1024 / 1024));
    let mut d = String::new();
    let _ = writeln!(d, "# Reliability\n");
    let _ = writeln!(
        d,
        "Written by `cargo xtask safety` from the safety runs' own report lines; do not edit by hand.\n"
    );
    let _ = writeln!(d, "## What each backend guarantees\n");
    let _ = writeln!(d, "| backend | exclusion | fencing | what the runs check |");
    let _ = writeln!(d, "|---|---|---|---|");
    let _ = writeln!(
        d,
        "| etcd | while the holder is not paused past its lease | strict (create revision) | 0 overlapping holds under member kill/stop and client partition; 0 stale writes accepted, 0 lost updates with holder pauses; under the same faults, a semaphore of 2 never has 3 holders and a read-write lock's writer never holds beside anyone |"
    );
    let _ = writeln!(
        d,
        "| ZooKeeper | while the holder is not paused past its session / TTL | strict (czxid) | the same as etcd, and 0 overlapping holds when a holder is cut off for 1.5x its session (its `lost()` comes before anyone else's grant) |"
    );
    let _ = writeln!(
        d,
        "| Redis (single) | while the one server keeps its data and the holder is not paused | strict (`max(counter + 1, server TIME µs)`) | 0 stale writes accepted, 0 lost updates, tokens never going back, under server kill (no persistence), a restart from a snapshot older than the last grants, SIGSTOP, client partition and holder pauses |"
    );
    let _ = writeln!(
        d,
        "| PostgreSQL | while the one primary keeps its data and the holder is not paused (an asynchronous standby may lose the last grants) | strict (`max(fence + 1, server clock µs)`, in the row) | 0 overlapping holds, 0 stale writes accepted, 0 lost updates under server kill/restart (the rows survive), SIGSTOP of the whole server (the postmaster and every backend), client partition and holder pauses |"
    );
    let _ = writeln!(
        d,
        "| Redlock | timing-dependent (efficiency locks only) | none | holder pauses and frozen client processes *do* lose updates; a quorum node restarted without persistence, or whose clock steps forward, lets two clients hold at once: the runs assert the checker reports it |"
    );
    let _ = writeln!(
        d,
        "\nRedis and PostgreSQL leases run on the server's wall clock (`PX`, `now()`): a step of that clock forward shortens every lease on it by the step, and can let a second holder in while the first still trusts its own (monotonic) deadline; keep the servers' clocks slewed, not stepped (chrony, `ntpd -x`). No run here steps a single Redis or PostgreSQL server's clock; the Redlock run shows what a stepped node does. etcd and ZooKeeper count leases and sessions on the leader's monotonic timers."
    );
    let _ = writeln!(
        d,
        "\nThe read-write lock and semaphore runs count from the clients' own view: each hold lasts from the grant's reply to the last moment its guard said `is_held()`, and the checker sweeps all holds for a moment with more than the limit's permits, or a writer beside another holder."
    );
    let _ = writeln!(d, "\n## Faults injected\n");
    let _ = writeln!(d, "| fault | how |");
    let _ = writeln!(d, "|---|---|");
    let _ = writeln!(
        d,
        "| kill / restart | `SIGKILL` to a server or member, restart after the fault period (Redis without persistence) |"
    );
    let _ = writeln!(
        d,
        "| stop | `SIGSTOP` to a server or member (PostgreSQL: every process of the server, so open connections get no answer either), `SIGCONT` after the fault period |"
    );
    let _ = writeln!(
        d,
        "| partition | one client's connection through the fault proxy, blackholed, then healed (ZooKeeper: also for 1.5x the session, while it holds) |\n| stale snapshot restart | Redis: `SAVE` at inject; at heal the server is killed and restarted from that snapshot, which misses every grant made since |"
    );
    let _ = writeln!(
        d,
        "| holder pause | a client stops while holding, past its TTL, then writes with its old token |"
    );
    let _ = writeln!(
        d,
        "| process freeze | one of three client *processes* gets `SIGSTOP` while holding (between its read and its write), past its TTL or session, then `SIGCONT` |"
    );
    let _ = writeln!(
        d,
        "| Redlock node restart | a node holding the key (one of exactly a quorum) is killed and restarted without persistence |"
    );
    let _ = writeln!(
        d,
        "| Redlock clock jump | that node's wall clock is stepped forward by twice the TTL (an `LD_PRELOAD` shim built by the launcher: Debian's libfaketime hangs redis-server, a jemalloc clash, libfaketime issue #130) |"
    );
    let _ = writeln!(
        d,
        "\nEach run also reports the residue: what the backend still held for the run's key once the clients had drained, and how long until it was gone."
    );
    let _ = writeln!(d, "\n## Last run\n");
    let _ = writeln!(
        d,
        "- date: {date}; commit: {commit}; machine: {cores} cores, {memory}"
    );
    let _ = writeln!(
        d,
        "- command: `cargo xtask safety --seconds {seconds}` (backends: {})",
        backends.join(", ")
    );
    let _ = writeln!(
        d,
        "- failed: {}\n",
        if failed.is_empty() {
            "none".to_owned()
        } else {
            failed.join(", ")
        }
    );
    let _ = writeln!(d, "| backend | run | claim | result |");
    let _ = writeln!(d, "|---|---|---|---|");
    for r in reports {
        let cols: Vec<&str> = r.splitn(4, '|').collect();
        if let [backend, run, claim, result] = cols[..] {
            let _ = writeln!(d, "| {backend} | {run} | {claim} | {result} |");
        }
    }
    if !faults.is_empty() {
        let _ = writeln!(d, "\n### Fault timeline\n");
        // At most a few lines per run: a long run freezes its holder
        // hundreds of times.
        const PER_RUN: usize = 8;
        let mut shown: Vec<(String, usize)> = Vec::new();
        for f in faults {
            let run: String = f.splitn(3, '|').take(2).collect::<Vec<_>>().join(" · ");
            let i = match shown.iter().position(|(r, _)| *r == run) {
                Some(i) => i,
                None => {
                    shown.push((run.clone(), 0));
                    shown.len() - 1
                }
            };
            shown[i].1 += 1;
            if shown[i].1 <= PER_RUN {
                let _ = writeln!(d, "- {}", f.replace('|', " · "));
            }
        }
        for (run, n) in shown.iter().filter(|(_, n)| *n > PER_RUN) {
            let _ = writeln!(d, "- {run}: {} more fault events not listed", n - PER_RUN);
        }
    }
    d
}
