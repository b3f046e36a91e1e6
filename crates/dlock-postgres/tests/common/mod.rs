//! The conformance kit's factory for `PostgresLock`, over the shared test
//! server of `cargo xtask test` (or a private one under plain `cargo test`).
#![allow(dead_code)]

use std::sync::Arc;

use dlock_core::{Lock, Result};
use dlock_postgres::{PostgresConfig, PostgresLock};
use dlock_testkit::launcher::{Postgres, shared};
use dlock_testkit::link::{nowhere, repoint, socket_addr};
use dlock_testkit::{Link, Linked, LockFactory};

pub struct PostgresFactory {
    pub config: PostgresConfig,
    admin: PostgresLock,
    _server: Option<Arc<Postgres>>,
}

impl PostgresFactory {
    pub async fn new(config: PostgresConfig, server: Option<Postgres>) -> Self {
        let admin = PostgresLock::connect(config.clone())
            .await
            .expect("connect to the test postgres");
        PostgresFactory {
            config,
            admin,
            _server: server.map(Arc::new),
        }
    }

    /// Over the shared server.
    pub async fn shared() -> Self {
        let endpoint = shared::postgres().await.expect("a postgres server for the tests");
        Self::new(
            PostgresConfig::from_url(endpoint.addresses[0].clone()),
            endpoint.server,
        )
        .await
    }

    fn config_at(&self, addr: std::net::SocketAddr) -> Result<PostgresConfig> {
        Ok(PostgresConfig {
            url: repoint(&self.config.url, addr)?,
            ..self.config.clone()
        })
    }
}

impl LockFactory for PostgresFactory {
    type Lock = PostgresLock;

    fn name(&self) -> String {
        format!("postgres {:?}", self.config)
    }

    async fn client(&self) -> Result<PostgresLock> {
        PostgresLock::connect(self.config.clone()).await
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        self.admin.keys_in_use(namespace).await
    }

    fn breaks_links(&self) -> bool {
        true
    }

    async fn linked_client(&self) -> Result<Linked<PostgresLock>> {
        let link = Link::to(&[socket_addr(&self.config.url)?]).await?;
        let lock = PostgresLock::connect(self.config_at(link.addrs()[0])?).await?;
        Ok(Linked { lock, link })
    }

    async fn unreachable_client(&self) -> Result<PostgresLock> {
        PostgresLock::connect(self.config_at(nowhere(1)?[0])?).await
    }
}
