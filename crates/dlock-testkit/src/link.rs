//! [`Link`]: the connection between one client and its backend, which the
//! kit can slow down, silence, reset and heal; and [`nowhere`], addresses of
//! a backend that is not there.
//!
//! A network driver's factory makes a link with [`Link::to`] (one
//! [`FaultProxy`] per server address, all switched together) and a client
//! that connects to [`Link::addrs`] instead of the servers' own addresses. An
//! in-process driver that wants the link scenarios (the kit's own
//! [`broken`](crate::broken) driver) makes an [`Link::in_process`] one and
//! consults [`Link::watch`] on every call.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use dlock_core::{Error, Result};
use tokio::sync::watch;

use crate::launcher::{Fault, FaultProxy};

const BACKEND: &str = "testkit";

/// One client's link to its backend. Dropping it resets and closes every
/// connection through it.
#[derive(Debug)]
pub struct Link {
    fault: Arc<watch::Sender<Fault>>,
    proxies: Vec<FaultProxy>,
}

/// A client and the link it talks through: what
/// [`LockFactory::linked_client`](crate::LockFactory::linked_client) returns.
#[derive(Debug)]
pub struct Linked<L> {
    /// The client; every connection it makes goes through `link`.
    pub lock: L,
    /// The link the kit breaks and heals.
    pub link: Link,
}

impl Link {
    /// A link to servers at `upstreams` (loopback only): one fault proxy per
    /// address, all switched together, healthy at first.
    ///
    /// # Errors
    ///
    /// `Error::Backend` if a proxy cannot start (no free port, or an address
    /// not on loopback).
    pub async fn to(upstreams: &[SocketAddr]) -> Result<Link> {
        let fault = Arc::new(watch::channel(Fault::None).0);
        let mut proxies = Vec::with_capacity(upstreams.len());
        for &upstream in upstreams {
            let proxy = FaultProxy::start_switched(upstream, Arc::clone(&fault))
                .await
                .map_err(|e| Error::backend(BACKEND, e))?;
            proxies.push(proxy);
        }
        Ok(Link { fault, proxies })
    }

    /// A link with no proxies, for an in-process driver that applies the
    /// fault to its own calls ([`watch`](Self::watch)).
    pub fn in_process() -> Link {
        Link {
            fault: Arc::new(watch::channel(Fault::None).0),
            proxies: Vec::new(),
        }
    }

    /// Where the client must connect: one address per upstream, in order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.proxies.iter().map(FaultProxy::addr).collect()
    }

    /// Switches the fault on every connection through the link, at once.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Back to a healthy link. (Connections reset or blackholed meanwhile
    /// stay broken: the client has to notice and reconnect.)
    pub fn heal(&self) {
        self.set(Fault::None);
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// The fault switch, for an in-process driver to follow.
    pub fn watch(&self) -> watch::Receiver<Fault> {
        self.fault.subscribe()
    }
}

/// `n` distinct loopback addresses where nothing listens: each a port held
/// bound (not listening) by this process for as long as it runs, so a
/// connection is refused and no server started meanwhile can take the port.
/// Later calls reuse the same ports.
///
/// # Errors
///
/// `Error::Backend` if the OS hands out no port.
pub fn nowhere(n: usize) -> Result<Vec<SocketAddr>> {
    static HELD: Mutex<Vec<(SocketAddr, tokio::net::TcpSocket)>> = Mutex::new(Vec::new());
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    while held.len() < n {
        let socket = tokio::net::TcpSocket::new_v4().map_err(|e| Error::backend(BACKEND, e))?;
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .map_err(|e| Error::backend(BACKEND, e))?;
        let addr = socket.local_addr().map_err(|e| Error::backend(BACKEND, e))?;
        held.push((addr, socket));
    }
    Ok(held.iter().take(n).map(|(addr, _)| *addr).collect())
}

/// The `host:port` of an address written as a URL (`redis://127.0.0.1:6379`,
/// `http://127.0.0.1:2379/`) or bare (`127.0.0.1:2181`).
///
/// # Errors
///
/// `Error::InvalidConfig` if it names no numeric loopback socket address.
pub fn socket_addr(address: &str) -> Result<SocketAddr> {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let host_port = rest.split('/').next().unwrap_or(rest);
    host_port
        .parse::<SocketAddr>()
        .ok()
        .filter(|a| a.ip().is_loopback())
        .ok_or_else(|| Error::InvalidConfig(format!("not a loopback host:port: {address}")))
}

/// `address` (a URL or a bare `host:port`, as [`socket_addr`] reads it) with
/// its host and port replaced by `to`; credentials, database, path and
/// options kept. How a factory points a client's config at a [`Link`].
///
/// # Errors
///
/// As [`socket_addr`].
pub fn repoint(address: &str, to: SocketAddr) -> Result<String> {
    Ok(address.replacen(&socket_addr(address)?.to_string(), &to.to_string(), 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_urls_and_bare_pairs() {
        for (text, port) in [
            ("redis://127.0.0.1:6379", 6379),
            ("redis://:secret@127.0.0.1:7000/2", 7000),
            ("http://127.0.0.1:2379/", 2379),
            ("127.0.0.1:2181", 2181),
        ] {
            assert_eq!(socket_addr(text).unwrap().port(), port, "{text}");
        }
        for bad in ["redis://example.com:6379", "10.0.0.1:1", "nothing", ""] {
            assert!(socket_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn repointing_keeps_everything_but_the_host_and_port() {
        let to: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(
            repoint("redis://:pw@127.0.0.1:6379/2", to).unwrap(),
            "redis://:pw@127.0.0.1:9/2"
        );
        assert_eq!(
            repoint("http://127.0.0.1:2379", to).unwrap(),
            "http://127.0.0.1:9"
        );
        assert!(repoint("redis://example.com:6379", to).is_err());
    }

    #[test]
    fn nowhere_refuses_connections_on_distinct_held_ports() {
        let a = nowhere(3).unwrap();
        assert_eq!(a.len(), 3);
        assert!(a.iter().all(|s| s.ip().is_loopback()));
        assert!(a[0] != a[1] && a[1] != a[2] && a[0] != a[2]);
        assert_eq!(nowhere(2).unwrap(), a[..2], "the same ports again");
        for addr in &a {
            let e = std::net::TcpStream::connect(addr).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{addr}");
            assert!(
                std::net::TcpListener::bind(addr).is_err(),
                "{addr} could be taken"
            );
        }
    }
}
