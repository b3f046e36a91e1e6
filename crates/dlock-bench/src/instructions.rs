//! Client instructions per cycle, counted by callgrind: the same binary
//! doing the same cycles executes the same instructions whatever else the
//! machine is doing, so a difference between two clients that a noisy
//! latency hides shows here.
//!
//! Each count is two runs of a child process (`dlock-bench --instructions
//! SUBJECT URL N`) under `valgrind --tool=callgrind`: `N1` and then `N2`
//! cycles on one thread (a current-thread runtime) after the same warm-up.
//! Their difference over `N2 - N1` is what one cycle costs the client
//! (connecting, warming up and exiting cancel out). Every thread of the
//! process counts: our code, the client library's tasks, the runtime, the
//! system call wrappers (not the kernel).

use std::future::Future;

use distlock::{AcquireOptions, Config, Lock};
use dlock_redis_protocol::calls::Scripts;

use crate::floor::Floor;
use crate::peer::Peer;

/// Cycles every child runs before it counts.
const WARMUP: usize = 20;

/// Where valgrind is (Debian's package).
const VALGRIND: &str = "/usr/bin/valgrind";

/// The child's environment variable for the backend's URL (not its argv,
/// which anyone on the machine can read).
const URL_VAR: &str = "DLOCK_BENCH_URL";

/// How long one child run may take before it counts as hung.
const CHILD_LIMIT: std::time::Duration = std::time::Duration::from_secs(180);

/// Whether callgrind is there to count with.
pub(crate) fn available() -> bool {
    std::path::Path::new(VALGRIND).exists()
}

/// The child's side: `N` cycles of `subject` against the backend of the
/// dlock URL in [`URL_VAR`], after [`WARMUP`] of them. The subjects, as the
/// breakdown's rows name them: `floor` (the raw client), `peer` (the peer
/// library), `scripts` (our two scripts alone through the raw client,
/// Redis), `static-plain` and `static` (the static driver without and with
/// auto-extend), `any` (`AnyLock`). Runs on a current-thread
/// runtime of its own (one thread: the counts repeat).
pub(crate) fn child(args: &[String]) -> Result<(), String> {
    let [_, subject, n] = args else {
        return Err(format!(
            "usage: {URL_VAR}=URL dlock-bench --instructions SUBJECT N"
        ));
    };
    let url = std::env::var(URL_VAR).map_err(|_| format!("{URL_VAR} is not set"))?;
    let n: usize = n.parse().map_err(|e| format!("--instructions N {n:?}: {e}"))?;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?
        .block_on(cycles_of(subject, &url, n))
        .map_err(|e| e.replace(url.as_str(), &dlock_core::driver::redact_url(&url)))
}

async fn repeat<F, Fut>(n: usize, mut cycle: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    for _ in 0..WARMUP + n {
        cycle().await?;
    }
    Ok(())
}

async fn ours<L: Lock>(lock: &L, n: usize, opts: AcquireOptions) -> Result<(), String> {
    let key = crate::scenarios::key("instructions");
    repeat(n, || crate::scenarios::ours(lock, &key, opts)).await
}

async fn cycles_of(subject: &str, url: &str, n: usize) -> Result<(), String> {
    let config = Config::from_url(url).map_err(|e| e.to_string())?;
    let err = |e: distlock::Error| format!("{url}: {e}");
    let key = format!("bench-instructions-{:x}", rand::random::<u32>());
    match subject {
        "floor" => {
            let f = match &config {
                Config::Redis(c) => Floor::redis(&c.url).await?,
                Config::Redlock(c) => Floor::redlock(&c.nodes).await?,
                Config::Etcd(c) => Floor::etcd(&c.endpoints).await?,
                Config::Zk(c) => Floor::zk(&c.connect).await?,
                Config::Postgres(c) => Floor::postgres(&c.url).await?,
                _ => return Err(format!("no floor for {url}")),
            };
            repeat(n, || f.cycle(&key)).await
        }
        "peer" => {
            let p = match &config {
                Config::Redis(c) => Peer::rslock(std::slice::from_ref(&c.url)),
                Config::Redlock(c) => Peer::rslock(&c.nodes),
                Config::Etcd(c) => Peer::etcd(&c.endpoints).await?,
                Config::Zk(c) => Peer::zk(&c.connect).await?,
                _ => return Err(format!("no peer for {url}")),
            };
            repeat(n, || p.cycle(&key)).await
        }
        "scripts" => {
            let Config::Redis(c) = &config else {
                return Err(format!("our scripts alone are measured on Redis, not {url}"));
            };
            let Floor::Redis(raw) = Floor::redis(&c.url).await? else {
                return Err("the Redis floor has no raw client".into());
            };
            let scripts = Scripts::default();
            let key = format!("dlock:{key}");
            repeat(n, || crate::floor::scripts_alone(&raw, &scripts, &key)).await
        }
        "static-plain" | "static" => {
            let opts = AcquireOptions::default().auto_extend(subject == "static");
            match config {
                Config::Redis(c) => {
                    ours(&dlock_redis::RedisLock::connect(c).await.map_err(err)?, n, opts).await
                }
                Config::Redlock(c) => {
                    ours(&dlock_redlock::Redlock::connect(c).await.map_err(err)?, n, opts).await
                }
                Config::Etcd(c) => ours(&dlock_etcd::EtcdLock::connect(c).await.map_err(err)?, n, opts).await,
                Config::Zk(c) => ours(&dlock_zk::ZkLock::connect(c).await.map_err(err)?, n, opts).await,
                _ => Err(format!("no static driver measured for {url}")),
            }
        }
        "any" => {
            let any = distlock::connect_url(url).await.map_err(err)?;
            ours(&any, n, AcquireOptions::default()).await
        }
        other => Err(format!("no subject {other:?}")),
    }
}

/// What callgrind collected in one child run of `n` cycles.
async fn collected(subject: &str, url: &str, n: usize) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = tokio::process::Command::new(VALGRIND)
        .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .arg(exe)
        .args(["--instructions", subject, &n.to_string()])
        .env(URL_VAR, url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("valgrind: {e}"))?;
    crate::watchdog::child(child.id());
    // A hung child is killed (on drop) and reported, not waited for.
    let out = tokio::time::timeout(CHILD_LIMIT, child.wait_with_output()).await;
    crate::watchdog::child(None);
    let out = out
        .map_err(|_| format!("the instruction count of {subject} took over {CHILD_LIMIT:?}"))?
        .map_err(|e| e.to_string())?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    match (out.status.success(), ir_collected(&stderr)) {
        (true, Some(ir)) => Ok(ir),
        _ => Err(format!(
            "the instruction count of {subject} on {} ({}): {}",
            dlock_core::driver::redact_url(url),
            out.status,
            stderr.lines().rev().take(5).collect::<Vec<_>>().join(" / ")
        )),
    }
}

/// The total callgrind reports (`==pid== Collected : 123456`).
fn ir_collected(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .find_map(|l| l.split_once("Collected :").map(|(_, n)| n.trim()))
        .and_then(|n| n.parse().ok())
}

/// Client instructions per cycle of `subject`: `(collected(n2) -
/// collected(n1)) / (n2 - n1)`.
///
/// # Errors
///
/// When a child run fails or callgrind prints no total.
pub(crate) async fn per_cycle(subject: &str, url: &str, n1: usize, n2: usize) -> Result<f64, String> {
    let a = collected(subject, url, n1).await?;
    let b = collected(subject, url, n2).await?;
    if b < a || n2 <= n1 {
        return Err(format!(
            "the instruction count of {subject}: {n2} cycles counted {b}, fewer than {n1} cycles' {a}"
        ));
    }
    Ok((b - a) as f64 / (n2 - n1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_callgrinds_total() {
        let stderr = "==7== Callgrind, a call-graph generating cache profiler\n==7== \n==7== Events    : Ir\n==7== Collected : 48211933\n==7== \n==7== I   refs:      48,211,933\n";
        assert_eq!(ir_collected(stderr), Some(48_211_933));
        assert_eq!(ir_collected("==7== error\n"), None);
    }
}
