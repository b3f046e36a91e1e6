//! The conformance kit's factory for `Redlock`, over the five shared test
//! nodes of `cargo xtask test` (or private ones under plain `cargo test`).
#![allow(dead_code)]

use std::sync::Arc;

use dlock_core::Result;
use dlock_redlock::{Redlock, RedlockConfig};
use dlock_testkit::LockFactory;
use dlock_testkit::launcher::{Redis, shared};

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
        let config = RedlockConfig::new(endpoint.addresses.clone());
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

impl LockFactory for RedlockFactory {
    type Lock = Redlock;

    fn name(&self) -> String {
        format!("redlock x{}", self.config.nodes.len())
    }

    async fn client(&self) -> Result<Redlock> {
        Redlock::connect(self.config.clone()).await
    }

    async fn crash(&self, client: &Redlock) {
        client.abandon().await;
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        self.admin.held_keys(namespace).await
    }
}
