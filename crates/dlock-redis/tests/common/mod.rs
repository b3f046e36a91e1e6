//! The conformance kit's factory for `RedisLock`, over the shared test
//! servers of `cargo xtask test` (or private ones under plain `cargo test`).
#![allow(dead_code)]

use std::sync::Arc;

use dlock_core::{Lock, Result};
use dlock_redis::{RedisConfig, RedisLock};
use dlock_testkit::launcher::{Redis, shared};
use dlock_testkit::link::{nowhere, repoint, socket_addr};
use dlock_testkit::{Link, Linked, LockFactory};

pub struct RedisFactory {
    pub config: RedisConfig,
    admin: RedisLock,
    /// Whether clients over a breakable link are offered: not on a Cluster,
    /// whose client finds the other masters itself (past any proxy).
    links: bool,
    _server: Option<Arc<Redis>>,
}

impl RedisFactory {
    pub async fn new(config: RedisConfig, server: Option<Redis>) -> Self {
        let admin = RedisLock::connect(config.clone())
            .await
            .expect("connect to the test redis");
        RedisFactory {
            config,
            admin,
            links: false,
            _server: server.map(Arc::new),
        }
    }

    /// Over the shared single Redis.
    pub async fn shared() -> Self {
        let endpoint = shared::redis().await.expect("a redis server for the tests");
        let mut factory = Self::new(
            RedisConfig::from_url(endpoint.addresses[0].clone()),
            endpoint.server,
        )
        .await;
        factory.links = true;
        factory
    }

    /// This factory's config, pointed at `addr` (credentials, database and
    /// options kept).
    fn config_at(&self, addr: std::net::SocketAddr) -> Result<RedisConfig> {
        Ok(RedisConfig {
            url: repoint(&self.config.url, addr)?,
            ..self.config.clone()
        })
    }
}

impl LockFactory for RedisFactory {
    type Lock = RedisLock;

    fn name(&self) -> String {
        format!("redis {}", self.config.url)
    }

    async fn client(&self) -> Result<RedisLock> {
        RedisLock::connect(self.config.clone()).await
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        self.admin.keys_in_use(namespace).await
    }

    fn breaks_links(&self) -> bool {
        self.links
    }

    async fn linked_client(&self) -> Result<Linked<RedisLock>> {
        let link = Link::to(&[socket_addr(&self.config.url)?]).await?;
        let lock = RedisLock::connect(self.config_at(link.addrs()[0])?).await?;
        Ok(Linked { lock, link })
    }

    async fn unreachable_client(&self) -> Result<RedisLock> {
        RedisLock::connect(self.config_at(nowhere(1)?[0])?).await
    }
}
