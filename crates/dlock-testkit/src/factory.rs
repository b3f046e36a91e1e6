//! [`LockFactory`]: how the kit gets independent clients of a driver and
//! injects its faults, and [`MemFactory`] for the in-process driver.

use std::future::Future;

use dlock_core::{Error, LockKey, MemLock, Result};

use crate::link::Linked;

/// What a driver gives the conformance kit.
///
/// Every call to [`client`](Self::client) must return an *independent*
/// client: for a network backend its own connections and session, standing in
/// for another process. Scenarios never wipe a server: each works in a random
/// key namespace and asks [`residue`](Self::residue) what it left.
///
/// **Links.** A network driver's factory also says [`breaks_links`]
/// (`true`) and implements [`linked_client`] (a client whose every connection
/// goes through a [`Link`](crate::Link) the kit slows down, silences, resets
/// and heals) and [`unreachable_client`] (a client of a backend that is not
/// there). The link scenarios use them to check what a broken network does
/// to a driver: a cancelled acquire in flight, `Error::Unavailable` instead
/// of `Ok(None)` or `Timeout`, a release that cannot be confirmed, renewals
/// that go unanswered. A factory that leaves `breaks_links` `false` (an
/// in-process driver) has those scenarios skipped, and the skip shows.
///
/// [`breaks_links`]: Self::breaks_links
/// [`linked_client`]: Self::linked_client
/// [`unreachable_client`]: Self::unreachable_client
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
    ///
    /// The default is the driver's own [`Lock::abandon`](dlock_core::Lock::abandon).
    fn abandon(&self, client: &Self::Lock) -> impl Future<Output = ()> + Send {
        dlock_core::Lock::abandon(client)
    }

    /// What the backend still keeps for the names starting with
    /// `namespace`, as readable strings: a driver's factory usually answers
    /// with its handle's [`Lock::keys_in_use`](dlock_core::Lock::keys_in_use).
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

    /// Whether [`linked_client`](Self::linked_client) and
    /// [`unreachable_client`](Self::unreachable_client) give clients. Every
    /// network driver's factory must say `true`; the default `false` skips
    /// the link scenarios (visibly).
    fn breaks_links(&self) -> bool {
        false
    }

    /// A new independent client configured as [`client`](Self::client)'s,
    /// except that every connection it makes goes through a new link: for a
    /// network driver, [`Link::to`](crate::Link::to) with every server
    /// address the client would use (all nodes, all endpoints), and the
    /// client pointed at [`Link::addrs`](crate::Link::addrs) instead.
    ///
    /// # Errors
    ///
    /// Whatever starting the link or connecting reports. The default (for
    /// factories whose [`breaks_links`](Self::breaks_links) is `false`)
    /// always fails.
    fn linked_client(&self) -> impl Future<Output = Result<Linked<Self::Lock>>> + Send {
        async { Err(Error::InvalidConfig(NO_LINKS.to_owned())) }
    }

    /// A new client configured as [`client`](Self::client)'s, except that it
    /// points at a backend that is not there: every server address replaced
    /// by one of [`nowhere`](crate::link::nowhere) (closed loopback ports).
    ///
    /// # Errors
    ///
    /// Whatever connecting reports: a driver that connects eagerly fails
    /// here, and the kit checks that this is `Error::Unavailable` within the
    /// driver's connect timeout. The default always fails with
    /// `Error::InvalidConfig`.
    fn unreachable_client(&self) -> impl Future<Output = Result<Self::Lock>> + Send {
        async { Err(Error::InvalidConfig(NO_LINKS.to_owned())) }
    }
}

const NO_LINKS: &str = "this factory breaks no links (breaks_links is false)";

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

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        dlock_core::Lock::keys_in_use(&self.backend, namespace).await
    }

    async fn contenders(&self, key: &LockKey) -> Result<Option<usize>> {
        Ok(Some(self.backend.contenders(key)))
    }
}
