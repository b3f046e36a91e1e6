//! The conformance kit's factory for `EtcdLock`, over the shared test etcd
//! of `cargo xtask test` (or a private one under plain `cargo test`).
#![allow(dead_code)]

use std::sync::Arc;

use dlock_core::{Lock, LockKey, Result};
use dlock_etcd::{EtcdConfig, EtcdLock};
use dlock_testkit::launcher::{Etcd, shared};
use dlock_testkit::link::{nowhere, repoint, socket_addr};
use dlock_testkit::{Link, Linked, LockFactory};

pub struct EtcdFactory {
    pub config: EtcdConfig,
    pub admin: EtcdLock,
    _server: Option<Arc<Etcd>>,
}

impl EtcdFactory {
    pub async fn new(config: EtcdConfig, server: Option<Etcd>) -> Self {
        let admin = EtcdLock::connect(config.clone())
            .await
            .expect("connect to the test etcd");
        EtcdFactory {
            config,
            admin,
            _server: server.map(Arc::new),
        }
    }

    pub async fn shared() -> Self {
        let endpoint = shared::etcd().await.expect("an etcd for the tests");
        Self::new(EtcdConfig::new(endpoint.addresses.clone()), endpoint.server).await
    }
}

impl EtcdFactory {
    /// This factory's config, its endpoints at `addrs` (scheme and path
    /// kept).
    fn config_at(&self, addrs: &[std::net::SocketAddr]) -> Result<EtcdConfig> {
        let endpoints = self
            .config
            .endpoints
            .iter()
            .zip(addrs)
            .map(|(url, addr)| repoint(url, *addr))
            .collect::<Result<_>>()?;
        Ok(EtcdConfig {
            endpoints,
            ..self.config.clone()
        })
    }
}

impl LockFactory for EtcdFactory {
    type Lock = EtcdLock;

    fn name(&self) -> String {
        format!("etcd {:?}", self.config.endpoints)
    }

    async fn client(&self) -> Result<EtcdLock> {
        EtcdLock::connect(self.config.clone()).await
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        self.admin.keys_in_use(namespace).await
    }

    fn breaks_links(&self) -> bool {
        true
    }

    async fn linked_client(&self) -> Result<Linked<EtcdLock>> {
        let upstreams = self
            .config
            .endpoints
            .iter()
            .map(|e| socket_addr(e))
            .collect::<Result<Vec<_>>>()?;
        let link = Link::to(&upstreams).await?;
        let lock = EtcdLock::connect(self.config_at(&link.addrs())?).await?;
        Ok(Linked { lock, link })
    }

    async fn unreachable_client(&self) -> Result<EtcdLock> {
        EtcdLock::connect(self.config_at(&nowhere(self.config.endpoints.len())?)?).await
    }

    async fn contenders(&self, key: &LockKey) -> Result<Option<usize>> {
        let pfx = self.admin.lock_prefix(key);
        let ns = pfx.strip_prefix(&self.config.key_prefix).unwrap_or(&pfx);
        let keys = self.admin.contenders(ns).await?;
        // Direct children only: `{prefix}{name}/{lease}`.
        Ok(Some(
            keys.iter()
                .filter(|k| k.strip_prefix(&pfx).is_some_and(|rest| !rest.contains('/')))
                .count(),
        ))
    }
}
