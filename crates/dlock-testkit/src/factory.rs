//! [`LockFactory`]: how the kit gets independent clients of a driver and
//! injects its faults, and [`MemFactory`] for the in-process driver.

use std::future::Future;

use dlock_core::{LockKey, MemLock, Result};

/// What a driver gives the conformance kit.
///
/// Every call to [`client`](Self::client) must return an *independent*
/// client: for a network backend its own connections and session, standing in
/// for another process. Scenarios never wipe a server: each works in a random
/// key namespace and asks [`residue`](Self::residue) what it left.
pub trait LockFactory: Send + Sync + 'static {
    /// The driver's handle type.
    type Lock: dlock_core::Lock;

    /// A name for reports (`"mem"`, `"redis 127.0.0.1:6379"`, ...).
    fn name(&self) -> String;

    /// A new independent client.
    ///
    /// # Errors
    ///
    /// Whatever connecting reports.
    fn client(&self) -> impl Future<Output = Result<Self::Lock>> + Send;

    /// Makes `client` vanish without releasing anything, as a killed process
    /// would: its watchdogs stop, its guards' drops release nothing, its
    /// connections and sessions go silent. Its locks must then be freed by
    /// the backend's TTL.
    fn abandon(&self, client: &Self::Lock) -> impl Future<Output = ()> + Send;

    /// The keys starting with `namespace` that the backend still holds or has
    /// waiters for (lock keys, nodes, waiter keys...), as readable strings.
    ///
    /// # Errors
    ///
    /// Whatever listing reports.
    fn residue(&self, namespace: &str) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// How many clients contend for `key` (holder plus waiters), if the
    /// backend can tell; `None` otherwise. Backends that promise FIFO must
    /// tell, so the kit can queue waiters in a known order.
    ///
    /// # Errors
    ///
    /// Whatever listing reports.
    fn contenders(&self, key: &LockKey) -> impl Future<Output = Result<Option<usize>>> + Send {
        let _ = key;
        async { Ok(None) }
    }
}

/// The [`LockFactory`] of [`MemLock`]: one in-process backend, a new client
/// per call.
#[derive(Debug, Clone, Default)]
pub struct MemFactory {
    backend: MemLock,
}

impl MemFactory {
    /// A factory over a fresh in-process backend.
    pub fn new() -> Self {
        Self::default()
    }
}

impl LockFactory for MemFactory {
    type Lock = MemLock;

    fn name(&self) -> String {
        "mem".to_owned()
    }

    async fn client(&self) -> Result<MemLock> {
        Ok(self.backend.client())
    }

    async fn abandon(&self, client: &MemLock) {
        client.abandon().await;
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        Ok(self
            .backend
            .keys_in_use(namespace)
            .into_iter()
            .map(|k| k.as_str().to_owned())
            .collect())
    }

    async fn contenders(&self, key: &LockKey) -> Result<Option<usize>> {
        Ok(Some(self.backend.contenders(key)))
    }
}
