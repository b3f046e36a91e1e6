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
mod proxy;
pub mod redis;
pub mod shared;
pub mod zk;

use std::fmt;
use std::net::{SocketAddr, TcpListener};

pub use etcd::Etcd;
pub use member::Member;
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

/// Picks `n` distinct free TCP ports on 127.0.0.1 (bound together, then
/// released, so they differ from each other).
///
/// # Errors
///
/// If the OS cannot hand out a port.
pub fn free_ports(n: usize) -> Result<Vec<u16>, LaunchError> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()?)
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The Debian packages the launcher (and the drivers' builds) need.
pub const PACKAGES: [&str; 6] = [
    "redis-server",
    "etcd-server",
    "etcd-client",
    "zookeeper",
    "protobuf-compiler",
    "gcc",
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
        ("protobuf-compiler", "/usr/bin/protoc"),
        // Builds the Redis clock shim (and links Rust itself).
        ("gcc", "/usr/bin/cc"),
    ] {
        if !present(file) {
            missing.push(package);
        }
    }
    missing
}
