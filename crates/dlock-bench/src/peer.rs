//! The peers: what a user would pick instead of dlock on each backend,
//! measured beside it in the same run, on the same servers.
//!
//! - Redis and Redlock: `rslock` (`LockManager` over one node, or the five
//!   Redlock nodes): `lock` (one `SET NX PX` per node) and `unlock` (the
//!   compare-and-delete script per node). No fencing token, no waiter
//!   notice: a waiter retries after a random delay.
//! - etcd: `etcd-client`'s `lock` / `unlock`, the server's v3lock service
//!   (the Go `concurrency.Mutex` run inside etcd), on one lease granted
//!   for the run (as a user would keep one alive).
//! - ZooKeeper: `zookeeper-client`'s `lock` with Curator's layout
//!   (`LockPrefix::new_curator`), released by deleting its node.

use std::time::Duration;

use zookeeper_client::{Acls, CreateMode, LockOptions, LockPrefix};

/// The TTL the peers' locks get (they are released long before).
const TTL: Duration = Duration::from_secs(30);

/// The parent of the ZooKeeper peer's lock directories.
const ZK_DIR: &str = "/dlock-bench-peer";

/// One peer client.
#[derive(Clone)]
pub(crate) enum Peer {
    /// rslock over one or more independent Redis nodes.
    Rslock(rslock::LockManager),
    /// etcd-client's v3lock calls, on a lease of the run.
    Etcd(Box<etcd_client::Client>, i64),
    /// zookeeper-client's Curator-layout lock.
    Zk(zookeeper_client::Client),
}

/// A lock a peer holds, to give back.
pub(crate) enum Held {
    Rslock(rslock::Lock),
    Etcd(Vec<u8>),
    Zk(String),
}

impl Peer {
    /// The peer's name in the report.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Peer::Rslock(_) => "rslock",
            Peer::Etcd(..) => "etcd-client lock (v3lock)",
            Peer::Zk(_) => "zookeeper-client lock (Curator layout)",
        }
    }

    /// rslock over `urls` (`redis://...`).
    pub(crate) fn rslock(urls: &[String]) -> Peer {
        Peer::Rslock(rslock::LockManager::new(urls.to_vec()))
    }

    /// etcd-client at `endpoints`, with a lease that outlives the run.
    pub(crate) async fn etcd(endpoints: &[String]) -> Result<Peer, String> {
        let mut client = etcd_client::Client::connect(endpoints, None)
            .await
            .map_err(|e| format!("etcd {endpoints:?}: {e}"))?;
        let lease = client
            .lease_grant(3600, None)
            .await
            .map_err(|e| format!("etcd lease: {e}"))?
            .id();
        Ok(Peer::Etcd(Box::new(client), lease))
    }

    /// zookeeper-client at `connect`.
    pub(crate) async fn zk(connect: &str) -> Result<Peer, String> {
        Ok(Peer::Zk(crate::floor::zk_with_dir(connect, ZK_DIR).await?))
    }

    /// One try at `key` (`Ok(None)`: held by someone else), for the hot key;
    /// etcd's and ZooKeeper's calls wait in line instead (their only way).
    pub(crate) async fn lock(&self, key: &str) -> Result<Option<Held>, String> {
        match self {
            Peer::Rslock(m) => match m.lock(key.as_bytes(), TTL).await {
                Ok(lock) => Ok(Some(Held::Rslock(lock))),
                Err(rslock::LockError::Unavailable) => Ok(None),
                Err(e) => Err(format!("rslock: {e:?}")),
            },
            Peer::Etcd(c, lease) => {
                let mut c = (**c).clone();
                let options = etcd_client::LockOptions::new().with_lease(*lease);
                let held = c
                    .lock(key, Some(options))
                    .await
                    .map_err(|e| format!("etcd lock: {e}"))?;
                Ok(Some(Held::Etcd(held.key().to_vec())))
            }
            Peer::Zk(c) => {
                let dir = format!("{ZK_DIR}/{}", key.replace('/', "_"));
                let prefix = LockPrefix::new_curator(&dir, "lock-").map_err(|e| e.to_string())?;
                let options = LockOptions::new(Acls::anyone_all())
                    .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
                    .map_err(|e| e.to_string())?;
                let lock = c
                    .lock(prefix, b"", options)
                    .await
                    .map_err(|e| format!("zookeeper lock: {e}"))?;
                let path = lock.lock_path().to_owned();
                // Its drop would delete the node in a background task; the
                // release below deletes it in the foreground instead, so a
                // cycle includes it (the guard's few bytes are not freed).
                std::mem::forget(lock);
                Ok(Some(Held::Zk(path)))
            }
        }
    }

    /// Gives `held` back.
    pub(crate) async fn unlock(&self, held: Held) -> Result<(), String> {
        match (self, held) {
            (Peer::Rslock(m), Held::Rslock(lock)) => {
                m.unlock(&lock).await;
                Ok(())
            }
            (Peer::Etcd(c, _), Held::Etcd(key)) => (**c)
                .clone()
                .unlock(key)
                .await
                .map(drop)
                .map_err(|e| format!("etcd unlock: {e}")),
            (Peer::Zk(c), Held::Zk(path)) => c
                .delete(&path, None)
                .await
                .map_err(|e| format!("zookeeper delete: {e}")),
            _ => Err("a lock given back to another kind of peer".to_owned()),
        }
    }

    /// Acquire (retrying at once while held) and release.
    pub(crate) async fn cycle(&self, key: &str) -> Result<(), String> {
        loop {
            if let Some(held) = self.lock(key).await? {
                return self.unlock(held).await;
            }
        }
    }
}
