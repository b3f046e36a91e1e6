//! Shared servers for a test run.
//!
//! `cargo xtask test` starts one Redis, five independent Redis instances, a
//! three-master Redis Cluster, one etcd and one ZooKeeper before running the tests, and tells the tests where
//! they are through these variables:
//!
//! | variable | value |
//! |---|---|
//! | `DLOCK_TEST_REDIS` | `redis://127.0.0.1:PORT` |
//! | `DLOCK_TEST_REDIS_NODES` | five such URLs, comma-separated |
//! | `DLOCK_TEST_REDIS_CLUSTER` | `redis-cluster://127.0.0.1:P1?node=127.0.0.1:P2&node=...` (3 masters) |
//! | `DLOCK_TEST_ETCD` | `http://127.0.0.1:PORT` (comma-separated if several) |
//! | `DLOCK_TEST_ZK` | `127.0.0.1:PORT` (comma-separated if several) |
//! | `DLOCK_TEST_POSTGRES` | `postgres://dlock@127.0.0.1:PORT/dlock` |
//!
//! Under plain `cargo test` the variables are absent, and each call here
//! starts a private server through the launcher instead, kept alive by the
//! returned [`Endpoint`]. Under CI (`CI` set) an absent variable is an error:
//! a test that needs a server must fail loudly, never skip.

use super::{Etcd, LaunchError, Postgres, Redis, ZooKeeper};

/// The environment variable naming the shared single Redis.
pub const REDIS_VAR: &str = "DLOCK_TEST_REDIS";
/// The environment variable naming the shared independent Redis nodes.
pub const REDIS_NODES_VAR: &str = "DLOCK_TEST_REDIS_NODES";
/// The environment variable naming the shared Redis Cluster (a
/// `redis-cluster://` URL).
pub const REDIS_CLUSTER_VAR: &str = "DLOCK_TEST_REDIS_CLUSTER";
/// The environment variable naming the shared etcd.
pub const ETCD_VAR: &str = "DLOCK_TEST_ETCD";
/// The environment variable naming the shared ZooKeeper.
pub const ZK_VAR: &str = "DLOCK_TEST_ZK";
/// The environment variable naming the shared PostgreSQL.
pub const POSTGRES_VAR: &str = "DLOCK_TEST_POSTGRES";
/// How many Redis nodes `cargo xtask test` starts for Redlock.
pub const REDIS_NODES: usize = 5;

/// Where a server is, and (when started here) the server itself.
#[derive(Debug)]
pub struct Endpoint<S> {
    /// The addresses (URLs, or `host:port` for ZooKeeper).
    pub addresses: Vec<String>,
    /// The private server when this process started it; `None` when shared.
    pub server: Option<S>,
}

fn from_env(var: &str) -> Result<Option<Vec<String>>, LaunchError> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => Ok(Some(v.split(',').map(|s| s.trim().to_owned()).collect())),
        _ if std::env::var_os("CI").is_some() => Err(LaunchError(format!(
            "{var} is not set under CI: run the tests with `cargo xtask test`, which starts the servers"
        ))),
        _ => Ok(None),
    }
}

/// The shared single Redis, or a private one.
///
/// # Errors
///
/// Under CI without the variable, or if a private server cannot start.
pub async fn redis() -> Result<Endpoint<Redis>, LaunchError> {
    if let Some(addresses) = from_env(REDIS_VAR)? {
        return Ok(Endpoint {
            addresses,
            server: None,
        });
    }
    let server = Redis::start().await?;
    Ok(Endpoint {
        addresses: server.urls(),
        server: Some(server),
    })
}

/// The shared independent Redis nodes, or private ones.
///
/// # Errors
///
/// As [`redis`].
pub async fn redis_nodes() -> Result<Endpoint<Redis>, LaunchError> {
    if let Some(addresses) = from_env(REDIS_NODES_VAR)? {
        return Ok(Endpoint {
            addresses,
            server: None,
        });
    }
    let server = Redis::start_many(REDIS_NODES).await?;
    Ok(Endpoint {
        addresses: server.urls(),
        server: Some(server),
    })
}

/// The shared Redis Cluster (3 masters), or a private one.
///
/// # Errors
///
/// As [`redis`].
pub async fn redis_cluster() -> Result<Endpoint<Redis>, LaunchError> {
    if let Some(addresses) = from_env(REDIS_CLUSTER_VAR)? {
        return Ok(Endpoint {
            addresses,
            server: None,
        });
    }
    let server = Redis::start_cluster(3).await?;
    let url = server
        .cluster_url()
        .ok_or_else(|| LaunchError("a cluster without a cluster URL".to_owned()))?;
    Ok(Endpoint {
        addresses: vec![url],
        server: Some(server),
    })
}

/// The shared etcd, or a private one.
///
/// # Errors
///
/// As [`redis`].
pub async fn etcd() -> Result<Endpoint<Etcd>, LaunchError> {
    if let Some(addresses) = from_env(ETCD_VAR)? {
        return Ok(Endpoint {
            addresses,
            server: None,
        });
    }
    let server = Etcd::start().await?;
    Ok(Endpoint {
        addresses: server.endpoints(),
        server: Some(server),
    })
}

/// The shared ZooKeeper, or a private one.
///
/// # Errors
///
/// As [`redis`].
pub async fn zk() -> Result<Endpoint<ZooKeeper>, LaunchError> {
    if let Some(addresses) = from_env(ZK_VAR)? {
        return Ok(Endpoint {
            addresses,
            server: None,
        });
    }
    let server = ZooKeeper::start().await?;
    Ok(Endpoint {
        addresses: vec![server.connect_string()],
        server: Some(server),
    })
}

/// The shared PostgreSQL, or a private one.
///
/// # Errors
///
/// As [`redis`].
pub async fn postgres() -> Result<Endpoint<Postgres>, LaunchError> {
    if let Some(addresses) = from_env(POSTGRES_VAR)? {
        return Ok(Endpoint {
            addresses,
            server: None,
        });
    }
    let server = Postgres::start().await?;
    Ok(Endpoint {
        addresses: vec![server.url()],
        server: Some(server),
    })
}
