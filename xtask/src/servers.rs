//! The shared local servers: started for `cargo xtask test` and
//! `cargo xtask servers`.

use dlock_testkit::launcher::shared::{
    ETCD_VAR, POSTGRES_VAR, REDIS_CLUSTER_VAR, REDIS_NODES, REDIS_NODES_VAR, REDIS_VAR, ZK_VAR,
};
use dlock_testkit::launcher::{Etcd, Postgres, Redis, ZooKeeper};

/// One of each server the tests share. Dropping it stops them all.
pub struct Servers {
    redis: Redis,
    redis_nodes: Redis,
    redis_cluster: Redis,
    etcd: Etcd,
    zk: ZooKeeper,
    postgres: Postgres,
}

impl Servers {
    /// Starts them all (concurrently) and waits until each is ready.
    pub async fn start() -> Result<Self, String> {
        let (redis, redis_nodes, redis_cluster, etcd, zk, postgres) = tokio::join!(
            Redis::start(),
            Redis::start_many(REDIS_NODES),
            Redis::start_cluster(3),
            Etcd::start(),
            ZooKeeper::start(),
            Postgres::start()
        );
        Ok(Servers {
            redis: redis.map_err(|e| e.to_string())?,
            redis_nodes: redis_nodes.map_err(|e| e.to_string())?,
            redis_cluster: redis_cluster.map_err(|e| e.to_string())?,
            etcd: etcd.map_err(|e| e.to_string())?,
            zk: zk.map_err(|e| e.to_string())?,
            postgres: postgres.map_err(|e| e.to_string())?,
        })
    }

    /// A dlock URL per backend: `mem://` and one for each server.
    pub fn urls(&self) -> Vec<String> {
        let strip = |u: &str| {
            u.trim_start_matches("redis://")
                .trim_start_matches("http://")
                .to_owned()
        };
        let nodes: Vec<String> = self.redis_nodes.urls().iter().map(|u| strip(u)).collect();
        let etcd: Vec<String> = self.etcd.endpoints().iter().map(|u| strip(u)).collect();
        vec![
            "mem://".to_owned(),
            self.redis.url(),
            format!("redlock://{}", nodes.join(",")),
            format!("etcd://{}", etcd.join(",")),
            format!("zk://{}", self.zk.connect_string()),
            self.postgres.url(),
        ]
    }

    /// The environment variables that point tests at these servers.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (REDIS_VAR, self.redis.url()),
            (REDIS_NODES_VAR, self.redis_nodes.urls().join(",")),
            (
                REDIS_CLUSTER_VAR,
                self.redis_cluster.cluster_url().unwrap_or_default(),
            ),
            (ETCD_VAR, self.etcd.endpoints().join(",")),
            (ZK_VAR, self.zk.connect_string()),
            (POSTGRES_VAR, self.postgres.url()),
        ]
    }
}

/// `cargo xtask servers`.
pub async fn run() -> Result<(), String> {
    crate::system::ensure_packages()?;
    let servers = Servers::start().await?;
    println!("local servers (stopped on Ctrl-C):");
    for (var, value) in servers.env() {
        println!("export {var}={value}");
    }
    tokio::signal::ctrl_c().await.map_err(|e| e.to_string())?;
    drop(servers);
    println!("stopped");
    Ok(())
}
