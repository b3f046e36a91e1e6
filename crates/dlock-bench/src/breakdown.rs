//! Scenario 1c: where an uncontended cycle's time goes. The same cycle as
//! scenario 1, taken apart: the floor, the peer, our scripts alone (Redis),
//! the static driver without and with auto-extend, and the facade's
//! `AnyLock` (what scenario 1 measures). Each is a pass of its own, so the
//! counters below belong to it alone:
//!
//! - latency p50 of the pass;
//! - client CPU per cycle: this process's CPU time (every thread: ours, the
//!   client library's connection tasks, the system calls), so what the
//!   client costs the machine, next to what the floor's client costs;
//! - allocations (and bytes) per cycle, from a counting global allocator;
//! - worker parks per cycle: how often a runtime worker went to sleep, that
//!   is, how many wake-ups a cycle needs;
//! - server CPU per cycle (Redis, Redlock: every node's `INFO cpu`, before
//!   and after): what the servers spent on the commands and scripts, so
//!   the rest of the difference is the client's.

use std::future::Future;
use std::time::{Duration, Instant};

use cpu_time::ProcessTime;
use distlock::{AcquireOptions, Config, Lock};
use dlock_redis_protocol::calls::Scripts;
use fred::prelude::{Client as Fred, ClientLike};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

use crate::floor::Floor;
use crate::scenarios::{Backend, ours};
use crate::stats::Lat;

/// Counts every allocation of the process (scenario 1c reads it; the cost,
/// a few atomic adds per allocation, is the same for every side).
#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// One part of the breakdown: a pass of `n` cycles of one kind.
pub(crate) struct Part {
    /// What was measured.
    pub(crate) what: String,
    pub(crate) lat: Lat,
    /// Process CPU time per cycle.
    pub(crate) cpu: Duration,
    /// Allocations (and reallocations) per cycle.
    pub(crate) allocs: f64,
    /// Bytes allocated per cycle.
    pub(crate) bytes: f64,
    /// Runtime worker parks per cycle.
    pub(crate) parks: f64,
    /// Server CPU time per cycle (summed over nodes), where the server says.
    pub(crate) server: Option<Duration>,
    /// The [`instructions`](crate::instructions) subject this row is.
    pub(crate) subject: &'static str,
    /// Client instructions per cycle (callgrind), where counted.
    pub(crate) instructions: Option<f64>,
}

/// The breakdown of one backend.
pub(crate) struct Breakdown {
    pub(crate) parts: Vec<Part>,
}

/// The Redis servers whose command statistics a pass reads.
fn stat_servers(floor: &Floor) -> Vec<Fred> {
    match floor {
        Floor::Redis(c) => vec![c.clone()],
        Floor::Redlock(nodes) => nodes.clone(),
        Floor::Etcd(_) | Floor::Zk(_) | Floor::Postgres(_) => Vec::new(),
    }
}

fn parks() -> u64 {
    let m = tokio::runtime::Handle::current().metrics();
    (0..m.num_workers()).map(|w| m.worker_park_count(w)).sum()
}

/// The server process's CPU time (`used_cpu_sys` + `used_cpu_user` of
/// `INFO cpu`). Not `INFO commandstats`: a script's time there includes
/// the commands it calls, which are counted again on their own lines.
fn server_cpu(info: &str) -> Duration {
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .map(|s| Duration::try_from_secs_f64(s).unwrap_or_default())
        .sum()
}

async fn servers_cpu(servers: &[Fred]) -> Result<Duration, String> {
    let mut total = Duration::ZERO;
    for s in servers {
        let info: String = s
            .info(Some(fred::types::InfoKind::Cpu))
            .await
            .map_err(|e| e.to_string())?;
        total += server_cpu(&info);
    }
    Ok(total)
}

/// One pass: `warmup` cycles, then `n` measured ones.
async fn pass<F, Fut>(
    (what, subject): (String, &'static str),
    servers: &[Fred],
    n: usize,
    mut cycle: F,
) -> Result<Part, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    for _ in 0..n / 10 + 5 {
        cycle().await?;
    }
    let server_before = servers_cpu(servers).await?;
    let mut lat = Lat::default();
    let region = Region::new(GLOBAL);
    let (cpu, parked) = (ProcessTime::now(), parks());
    for _ in 0..n {
        let t = Instant::now();
        cycle().await?;
        lat.record(t.elapsed());
    }
    let (cpu, parked, stats) = (cpu.elapsed(), parks() - parked, region.change());
    let server = if servers.is_empty() {
        None
    } else {
        Some(servers_cpu(servers).await?.saturating_sub(server_before))
    };
    let per = |x: f64| x / n as f64;
    Ok(Part {
        what,
        lat,
        cpu: cpu / u32::try_from(n).unwrap_or(u32::MAX),
        allocs: per((stats.allocations + stats.reallocations) as f64),
        bytes: per(stats.bytes_allocated as f64),
        parks: per(parked as f64),
        server: server.map(|s| s / u32::try_from(n).unwrap_or(u32::MAX)),
        subject,
        instructions: None,
    })
}

/// The static driver's passes: without auto-extend, then with it (the
/// default).
async fn static_passes<L: Lock>(
    lock: &L,
    servers: &[Fred],
    n: usize,
    parts: &mut Vec<Part>,
) -> Result<(), String> {
    let key = crate::scenarios::key("breakdown-static");
    let plain = AcquireOptions::default().auto_extend(false);
    parts.push(
        pass(
            ("dlock, static driver, no auto-extend".into(), "static-plain"),
            servers,
            n,
            || ours(lock, &key, plain),
        )
        .await?,
    );
    let default = AcquireOptions::default();
    parts.push(
        pass(("dlock, static driver".into(), "static"), servers, n, || {
            ours(lock, &key, default)
        })
        .await?,
    );
    Ok(())
}

/// Scenario 1c for `b`, `n` cycles per part; each part's client
/// instructions per cycle too when `counted` gives the two cycle counts
/// of the [`instructions`](crate::instructions) runs.
pub(crate) async fn breakdown(
    b: &Backend,
    n: usize,
    counted: Option<(usize, usize)>,
) -> Result<Breakdown, String> {
    let servers = stat_servers(&b.floor);
    let mut parts = Vec::new();
    let floor_key = format!("bench-floor-{:x}", rand::random::<u32>());
    parts.push(
        pass(("floor".into(), "floor"), &servers, n, || {
            b.floor.cycle(&floor_key)
        })
        .await?,
    );
    if let Some(p) = b.peer().await? {
        let peer_key = format!("bench-peer-{:x}", rand::random::<u32>());
        parts.push(pass((p.name().into(), "peer"), &servers, n, || p.cycle(&peer_key)).await?);
    }
    if let Floor::Redis(c) = &b.floor {
        let s = Scripts::default();
        let key = format!("dlock:bench-scripts-{:x}", rand::random::<u32>());
        parts.push(
            pass(
                ("our two scripts alone (raw client)".into(), "scripts"),
                &servers,
                n,
                || crate::floor::scripts_alone(c, &s, &key),
            )
            .await?,
        );
    }
    let config = Config::from_url(&b.url).map_err(|e| e.to_string())?;
    let err = |e: distlock::Error| format!("{}: {e}", b.name);
    match config {
        Config::Redis(c) => {
            let lock = dlock_redis::RedisLock::connect(c).await.map_err(err)?;
            static_passes(&lock, &servers, n, &mut parts).await?;
        }
        Config::Redlock(c) => {
            let lock = dlock_redlock::Redlock::connect(c).await.map_err(err)?;
            static_passes(&lock, &servers, n, &mut parts).await?;
        }
        Config::Etcd(c) => {
            let lock = dlock_etcd::EtcdLock::connect(c).await.map_err(err)?;
            static_passes(&lock, &servers, n, &mut parts).await?;
        }
        Config::Zk(c) => {
            let lock = dlock_zk::ZkLock::connect(c).await.map_err(err)?;
            static_passes(&lock, &servers, n, &mut parts).await?;
        }
        _ => {}
    }
    let any = b.client().await?;
    let key = crate::scenarios::key("breakdown-any");
    let opts = AcquireOptions::default();
    parts.push(
        pass(
            ("dlock through AnyLock (scenario 1)".into(), "any"),
            &servers,
            n,
            || ours(&any, &key, opts),
        )
        .await?,
    );
    if let Some((n1, n2)) = counted {
        for p in &mut parts {
            crate::watchdog::step(format!("{}: instructions of {}", b.name, p.what));
            // Not counted is a blank, not a failed run (a valgrind that
            // cannot run this binary, a hung child).
            match crate::instructions::per_cycle(p.subject, &b.url, n1, n2).await {
                Ok(i) => p.instructions = Some(i),
                Err(e) => eprintln!("dlock-bench: {}: not counted: {e}", b.name),
            }
        }
    }
    Ok(Breakdown { parts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_cpu_is_system_plus_user_time() {
        let info =
            "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:0.250000\r\nused_cpu_sys_children:9.000000\r\n";
        assert_eq!(server_cpu(info), Duration::from_millis(1750));
    }
}
