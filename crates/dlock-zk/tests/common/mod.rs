//! The conformance kit's factory for `ZkLock`, over the shared test
//! ZooKeeper of `cargo xtask test` (or a private one under plain `cargo
//! test`).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Lock, LockKey, Result};
use dlock_testkit::launcher::{ZooKeeper, shared};
use dlock_testkit::link::{nowhere, socket_addr};
use dlock_testkit::{Link, Linked, LockFactory};
use dlock_zk::{ZkConfig, ZkLock};

/// Short sessions: a crashed holder is freed within this.
pub const SESSION: Duration = Duration::from_secs(2);

pub struct ZkFactory {
    pub config: ZkConfig,
    pub admin: ZkLock,
    _server: Option<Arc<ZooKeeper>>,
}

impl ZkFactory {
    pub async fn new(config: ZkConfig, server: Option<ZooKeeper>) -> Self {
        let admin = ZkLock::connect(config.clone())
            .await
            .expect("connect to the test zookeeper");
        ZkFactory {
            config,
            admin,
            _server: server.map(Arc::new),
        }
    }

    pub async fn shared() -> Self {
        let endpoint = shared::zk().await.expect("a zookeeper for the tests");
        Self::new(
            ZkConfig::new(endpoint.addresses[0].clone()).session_timeout(SESSION),
            endpoint.server,
        )
        .await
    }
}

impl ZkFactory {
    /// This factory's config, its servers at `addrs` (a chroot kept).
    fn config_at(&self, addrs: &[std::net::SocketAddr]) -> ZkConfig {
        let connect = &self.config.connect;
        let chroot = connect.find('/').map_or("", |i| &connect[i..]);
        let hosts: Vec<_> = addrs.iter().map(ToString::to_string).collect();
        ZkConfig {
            connect: format!("{}{chroot}", hosts.join(",")),
            ..self.config.clone()
        }
    }

    fn upstreams(&self) -> Result<Vec<std::net::SocketAddr>> {
        let hosts = self.config.connect.split('/').next().unwrap_or_default();
        hosts.split(',').map(socket_addr).collect()
    }
}

impl LockFactory for ZkFactory {
    type Lock = ZkLock;

    fn name(&self) -> String {
        format!("zk {}", self.config.connect)
    }

    async fn client(&self) -> Result<ZkLock> {
        ZkLock::connect(self.config.clone()).await
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        self.admin.keys_in_use(namespace).await
    }

    fn breaks_links(&self) -> bool {
        true
    }

    async fn linked_client(&self) -> Result<Linked<ZkLock>> {
        let link = Link::to(&self.upstreams()?).await?;
        let lock = ZkLock::connect(self.config_at(&link.addrs())).await?;
        Ok(Linked { lock, link })
    }

    async fn unreachable_client(&self) -> Result<ZkLock> {
        ZkLock::connect(self.config_at(&nowhere(self.upstreams()?.len())?)).await
    }

    async fn contenders(&self, key: &LockKey) -> Result<Option<usize>> {
        let dir = self.admin.lock_path(key)?;
        let nodes = self.admin.contenders(key.as_str()).await?;
        Ok(Some(
            nodes
                .iter()
                .filter(|n| n.rsplit_once('/').is_some_and(|(d, _)| d == dir))
                .count(),
        ))
    }
}
