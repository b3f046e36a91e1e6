//! The conformance kit's factory for `RedisLock`, over the shared test
//! servers of `cargo xtask test` (or private ones under plain `cargo test`).
#![allow(dead_code)]

use std::sync::Arc;

use dlock_core::Result;
use dlock_redis::{RedisConfig, RedisLock};
use dlock_testkit::LockFactory;
use dlock_testkit::launcher::{Redis, shared};

pub struct RedisFactory {
    pub config: RedisConfig,
    admin: RedisLock,
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
            _server: server.map(Arc::new),
        }
    }

    /// Over the shared single Redis.
    pub async fn shared() -> Self {
        let endpoint = shared::redis().await.expect("a redis server for the tests");
        Self::new(
            RedisConfig::from_url(endpoint.addresses[0].clone()),
            endpoint.server,
        )
        .await
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

    async fn abandon(&self, client: &RedisLock) {
        client.abandon().await;
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        self.admin.keys_in_use(namespace).await
    }
}
