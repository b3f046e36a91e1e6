//! `redis-server`: one instance, or N independent ones (for Redlock).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::member::{Member, start_all};
use super::{LaunchError, free_ports, loopback};

pub(crate) const SERVER: &str = "/usr/bin/redis-server";
pub(crate) const CLI: &str = "/usr/bin/redis-cli";

/// One or more independent `redis-server` processes, without persistence
/// (`save ""`, no AOF), each on its own free loopback port and directory.
#[derive(Debug)]
pub struct Redis {
    members: Vec<Member>,
    cluster: bool,
    clocks: Vec<PathBuf>,
    _dir: TempDir,
}

/// The wall-clock shim (see the file's header): Debian's libfaketime hangs
/// `redis-server` at start-up, as it clashes with jemalloc.
const CLOCK_SHIM: &str = include_str!("clockjump.c");

impl Redis {
    /// Starts one instance and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// If `redis-server` is missing or does not become ready in time.
    pub async fn start() -> Result<Self, LaunchError> {
        Self::start_many(1).await
    }

    /// Starts `n` independent instances (not a cluster, not replicas).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn start_many(n: usize) -> Result<Self, LaunchError> {
        Self::launch(n, false, false).await
    }

    /// Starts `n` independent instances whose wall clocks can be moved with
    /// [`jump_clock`](Self::jump_clock): each runs with a small
    /// `LD_PRELOAD` shim (built here with `cc`) that adds an offset to
    /// `CLOCK_REALTIME`, `gettimeofday` and `time`, the clock Redis expires
    /// keys by.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), or if the shim does not build.
    pub async fn start_many_with_clocks(n: usize) -> Result<Self, LaunchError> {
        Self::launch(n, false, true).await
    }

    /// Steps instance `index`'s wall clock forward by `by` (from where the
    /// real clock is; jumps do not add up), as NTP or an operator stepping
    /// the host's clock would. Keys whose expiry the new time passes are
    /// gone for that instance.
    ///
    /// # Errors
    ///
    /// If the instances were not started with
    /// [`start_many_with_clocks`](Self::start_many_with_clocks), or the
    /// offset cannot be written.
    pub fn jump_clock(&self, index: usize, by: Duration) -> Result<(), LaunchError> {
        use std::os::unix::fs::FileExt;
        let path = self
            .clocks
            .get(index)
            .ok_or_else(|| LaunchError(format!("redis-{index} has no movable clock")))?;
        let ns = i64::try_from(by.as_nanos()).map_err(|_| LaunchError("clock jump too large".into()))?;
        // Written in place (never truncated): the shim has it mapped.
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .write_all_at(&ns.to_le_bytes(), 0)?;
        Ok(())
    }

    /// Starts a Redis Cluster of `n` masters (no replicas; `n >= 3`), forms it
    /// with `redis-cli --cluster create`, and waits until every node reports
    /// `cluster_state:ok`.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), or if the cluster does not form in time.
    pub async fn start_cluster(n: usize) -> Result<Self, LaunchError> {
        let redis = Self::launch(n, true, false).await?;
        let nodes: Vec<String> = redis.addrs().iter().map(ToString::to_string).collect();
        let mut create = vec!["--cluster", "create"];
        create.extend(nodes.iter().map(String::as_str));
        create.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = std::process::Command::new(CLI)
            .args(&create)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| LaunchError(format!("cannot run {CLI}: {e}")))?;
        if !out.status.success() {
            return Err(LaunchError(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for addr in redis.addrs() {
            loop {
                let info = std::process::Command::new(CLI)
                    .args([
                        "-h",
                        "127.0.0.1",
                        "-p",
                        &addr.port().to_string(),
                        "cluster",
                        "info",
                    ])
                    .output()?;
                if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    return Err(LaunchError(format!(
                        "redis cluster node {addr} not ok within 30s"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(redis)
    }

    async fn launch(n: usize, cluster: bool, clocks: bool) -> Result<Self, LaunchError> {
        let dir = tempfile::Builder::new().prefix("dlock-redis-").tempdir()?;
        let shim = if clocks {
            Some(build_shim(dir.path())?)
        } else {
            None
        };
        let mut clock_files = Vec::new();
        let ports = free_ports(2 * n)?;
        let (ports, bus_ports) = ports.split_at(n);
        let mut members = Vec::with_capacity(n);
        for (i, &port) in ports.iter().enumerate() {
            let data = dir.path().join(format!("r{i}"));
            std::fs::create_dir_all(&data)?;
            let mut args: Vec<String> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &data.to_string_lossy(),
                "--daemonize",
                "no",
            ]
            .map(str::to_owned)
            .to_vec();
            if cluster {
                args.extend(
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-port",
                        &bus_ports[i].to_string(),
                        "--cluster-node-timeout",
                        "5000",
                    ]
                    .map(str::to_owned),
                );
            }
            let member = Member::new(
                format!("redis-{i}"),
                loopback(port),
                SERVER,
                args,
                dir.path().join(format!("r{i}.log")),
                |addr| {
                    Box::pin(async move { matches!(command(addr, &["PING"]).await, Ok(r) if r == "+PONG") })
                },
                Duration::from_secs(20),
            );
            members.push(match &shim {
                Some(shim) => {
                    let clock = dir.path().join(format!("clock-{i}"));
                    std::fs::write(&clock, 0i64.to_le_bytes())?;
                    let member = member
                        .env("LD_PRELOAD", shim.to_string_lossy())
                        .env("DLOCK_CLOCK_FILE", clock.to_string_lossy());
                    clock_files.push(clock);
                    member
                }
                None => member,
            });
        }
        start_all(&mut members).await?;
        Ok(Redis {
            members,
            cluster,
            clocks: clock_files,
            _dir: dir,
        })
    }

    /// For a cluster: `redis-cluster://127.0.0.1:P1?node=127.0.0.1:P2&...`,
    /// the URL form `dlock-redis` (and fred) take; `None` otherwise.
    pub fn cluster_url(&self) -> Option<String> {
        if !self.cluster {
            return None;
        }
        let addrs = self.addrs();
        let (first, rest) = addrs.split_first()?;
        let nodes: Vec<String> = rest.iter().map(|a| format!("node={a}")).collect();
        Some(format!("redis-cluster://{first}?{}", nodes.join("&")))
    }

    /// `redis://127.0.0.1:PORT` of the first instance.
    pub fn url(&self) -> String {
        self.urls().swap_remove(0)
    }

    /// The URL of every instance.
    pub fn urls(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("redis://{}", m.addr()))
            .collect()
    }

    /// The members, to kill, restart, pause or resume.
    pub fn members(&mut self) -> &mut [Member] {
        &mut self.members
    }

    /// The address of every instance.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.members.iter().map(Member::addr).collect()
    }
}

/// Builds the clock shim into `dir` with the C compiler Rust links with.
fn build_shim(dir: &Path) -> Result<PathBuf, LaunchError> {
    let source = dir.join("clockjump.c");
    let lib = dir.join("libclockjump.so");
    std::fs::write(&source, CLOCK_SHIM)?;
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&source)
        .output()
        .map_err(|e| LaunchError(format!("cannot run cc to build the clock shim: {e}")))?;
    if !out.status.success() {
        return Err(LaunchError(format!(
            "cc could not build the clock shim: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(lib)
}

/// Sends one command (inline RESP) and returns the first line of the reply,
/// e.g. `+PONG`, `:1`, `$3`. Bounded by a 2 s timeout.
///
/// # Errors
///
/// On connection failure, or no reply within the timeout.
pub async fn command(addr: SocketAddr, args: &[&str]) -> std::io::Result<String> {
    let talk = async {
        let mut stream = TcpStream::connect(addr).await?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream.write_all(req.as_bytes()).await?;
        let mut buf = vec![0u8; 512];
        let mut got = Vec::new();
        while !got.windows(2).any(|w| w == b"\r\n") {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ));
            }
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got);
        Ok(text.split("\r\n").next().unwrap_or_default().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), talk)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply within 2s"))?
}
