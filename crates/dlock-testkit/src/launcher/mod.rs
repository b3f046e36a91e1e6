//! Real servers on loopback for tests: Redis, etcd and ZooKeeper from
//! Debian's packages, started on free ports in temporary directories, waited
//! for with a deadline, and stopped (by pid) when dropped. Each member can be
//! killed, restarted, paused (`SIGSTOP`) and resumed; a [`FaultProxy`] can sit
//! in front of any of them.
//!
//! Nothing here touches any address but 127.0.0.1.
//!
//! ```no_run
//! # async fn demo() -> Result<(), dlock_testkit::launcher::LaunchError> {
//! use dlock_testkit::launcher::{Etcd, Redis, ZooKeeper};
//!
//! let redis = Redis::start().await?;                 // one instance
//! let nodes = Redis::start_many(5).await?;           // five independent ones
//! let etcd = Etcd::start_cluster(3).await?;          // a 3-member cluster
//! let zk = ZooKeeper::start_ensemble(1).await?;      // standalone
//! println!("{} {} {}", redis.url(), etcd.endpoints().join(","), zk.connect_string());
//! # drop(nodes); Ok(()) }
//! ```

pub mod etcd;
mod member;
pub mod postgres;
mod proxy;
pub mod redis;
pub mod shared;
pub mod zk;

use std::fmt;
use std::net::{SocketAddr, TcpListener};

pub use etcd::Etcd;
pub use member::Member;
pub use postgres::Postgres;
pub use proxy::{Fault, FaultProxy};
pub use redis::Redis;
pub use zk::ZooKeeper;

/// Why a server could not be started, stopped or reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchError(pub String);

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LaunchError {}

impl From<std::io::Error> for LaunchError {
    fn from(e: std::io::Error) -> Self {
        LaunchError(e.to_string())
    }
}

/// Picks `n` distinct free TCP ports on 127.0.0.1, below the system's
/// ephemeral range where it can (bound together, then released, so they
/// differ from each other).
///
/// Below the ephemeral range, because a server killed and restarted by a
/// fault test must get its port back: a port from that range can meanwhile
/// become the source port of any outgoing connection on the machine, and
/// the restart would fail with "address in use".
///
/// # Errors
///
/// If the OS cannot hand out a port.
pub fn free_ports(n: usize) -> Result<Vec<u16>, LaunchError> {
    let (low, _) = ephemeral_range();
    let mut listeners = Vec::new();
    // Random tries in [10000, low); what is left comes from the OS.
    if low > 10_000 {
        for _ in 0..n.saturating_mul(20) {
            if listeners.len() == n {
                break;
            }
            let port = rand::random_range(10_000..low);
            if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
                listeners.push(l);
            }
        }
    }
    while listeners.len() < n {
        listeners.push(TcpListener::bind("127.0.0.1:0")?);
    }
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()?)
}

/// The system's ephemeral port range (`net.ipv4.ip_local_port_range`),
/// Linux's default when it cannot be read.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32_768, 60_999))
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The Debian packages the launcher, the drivers' builds and the interop
/// tests' reference clients need.
pub const PACKAGES: [&str; 13] = [
    "redis-server",
    "redis-tools",
    "etcd-server",
    "etcd-client",
    "zookeeper",
    "postgresql",
    "protobuf-compiler",
    "gcc",
    "golang-go",
    "golang-etcd-server-dev",
    "libcurator-recipes-java",
    "openjdk-17-jdk-headless",
    "python3-redis",
];

/// Which of [`PACKAGES`] look missing on this machine (by the files they
/// install).
pub fn missing_packages() -> Vec<&'static str> {
    let present = |path: &str| std::path::Path::new(path).exists();
    let mut missing = Vec::new();
    for (package, file) in [
        ("redis-server", redis::SERVER),
        ("redis-tools", redis::CLI),
        ("etcd-server", etcd::SERVER),
        ("etcd-client", etcd::CTL),
        ("zookeeper", zk::JAR),
        ("postgresql", postgres::SERVER),
        ("protobuf-compiler", "/usr/bin/protoc"),
        // The reference clients the interop tests run: etcd's own Go
        // recipes (built offline in GOPATH mode) and Apache Curator.
        ("golang-go", "/usr/bin/go"),
        (
            "golang-etcd-server-dev",
            "/usr/share/gocode/src/go.etcd.io/etcd/contrib/recipes",
        ),
        ("libcurator-recipes-java", "/usr/share/java/curator-recipes.jar"),
        // javac compiles the Curator program (zookeeper brings a JRE only).
        ("openjdk-17-jdk-headless", "/usr/bin/javac"),
        // redis-py, for Debian's python3 (the Redis interop test).
        (
            "python3-redis",
            "/usr/lib/python3/dist-packages/redis/__init__.py",
        ),
        // Builds the Redis clock shim (and links Rust itself).
        ("gcc", "/usr/bin/cc"),
    ] {
        if !present(file) {
            missing.push(package);
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports for servers are distinct and, where the system leaves room,
    /// outside the ephemeral range (a restarted server gets its port back).
    /// What `missing_packages` can name is listed in `PACKAGES`.
    #[test]
    fn packages_list_every_package_checked() {
        let src = include_str!("mod.rs");
        let checked = src[src.find("pub fn missing_packages").unwrap()..]
            .lines()
            .filter_map(|l| l.trim().strip_prefix("(\""))
            .map(|l| &l[..l.find('"').unwrap()]);
        for p in checked {
            assert!(PACKAGES.contains(&p), "{p} is checked but not in PACKAGES");
        }
    }

    #[test]
    fn free_ports_are_distinct_and_below_the_ephemeral_range() {
        let ports = free_ports(12).unwrap();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), 12, "{ports:?}");
        let (low, _) = ephemeral_range();
        if low > 10_000 {
            assert!(
                ports.iter().all(|&p| (10_000..low).contains(&p)),
                "{ports:?} (ephemeral from {low})"
            );
        }
    }
}
