//! The conformance kit's factory for `Redlock`, over the five shared test
//! nodes of `cargo xtask test` (or private ones under plain `cargo test`).
#![allow(dead_code)]

use std::sync::Arc;

use dlock_core::{Lock, Result};
use dlock_redlock::{Redlock, RedlockConfig};
use dlock_testkit::launcher::{Redis, shared};
use dlock_testkit::link::{nowhere, repoint, socket_addr};
use dlock_testkit::{Link, Linked, LockFactory};

pub struct RedlockFactory {
    pub config: RedlockConfig,
    admin: Redlock,
    _servers: Option<Arc<Redis>>,
}

impl RedlockFactory {
    pub async fn shared() -> Self {
        let endpoint = shared::redis_nodes()
            .await
            .expect("five redis nodes for the tests");
        // A node timeout a busy 2-core machine keeps, servers and tests on
        // the same cores (the default 50 ms is for a quiet network: under
        // load every node timed out, or a give-back was skipped and left a
        // key to its TTL).
        let mut config = RedlockConfig::new(endpoint.addresses.clone());
        config.request_timeout = std::time::Duration::from_millis(200);
        let admin = Redlock::connect(config.clone())
            .await
            .expect("connect to the test nodes");
        RedlockFactory {
            config,
            admin,
            _servers: endpoint.server.map(Arc::new),
        }
    }
}

impl RedlockFactory {
    /// This factory's config, its nodes at `addrs` (credentials, database
    /// and options kept).
    fn config_at(&self, addrs: &[std::net::SocketAddr]) -> Result<RedlockConfig> {
        let nodes = self
            .config
            .nodes
            .iter()
            .zip(addrs)
            .map(|(url, addr)| repoint(url, *addr))
            .collect::<Result<_>>()?;
        Ok(RedlockConfig {
            nodes,
            ..self.config.clone()
        })
    }
}

impl LockFactory for RedlockFactory {
    type Lock = Redlock;

    fn name(&self) -> String {
        format!("redlock x{}", self.config.nodes.len())
    }

    async fn client(&self) -> Result<Redlock> {
        Redlock::connect(self.config.clone()).await
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        self.admin.keys_in_use(namespace).await
    }

    fn breaks_links(&self) -> bool {
        true
    }

    /// All five nodes behind one link: they fail together.
    async fn linked_client(&self) -> Result<Linked<Redlock>> {
        let upstreams = self
            .config
            .nodes
            .iter()
            .map(|n| socket_addr(n))
            .collect::<Result<Vec<_>>>()?;
        let link = Link::to(&upstreams).await?;
        let lock = Redlock::connect(self.config_at(&link.addrs())?).await?;
        Ok(Linked { lock, link })
    }

    async fn unreachable_client(&self) -> Result<Redlock> {
        Redlock::connect(self.config_at(&nowhere(self.config.nodes.len())?)?).await
    }
}
