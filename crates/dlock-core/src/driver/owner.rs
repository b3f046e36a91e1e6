//! What a holder writes about itself, and how it is read back: the one
//! writer and parser of owner values, in the two forms drivers store.
//!
//! - **A value** (Redis, Redlock, PostgreSQL): `dlock1 <nonce> <host> <pid>
//!   <unix ms>`, where `nonce` is 128 random bits in hex. It is unique per
//!   grant: release and extend compare it, so it must never repeat.
//! - **A detail** (etcd, ZooKeeper): `<host> <pid> <unix ms>`, written
//!   beside a key or node that already identifies the grant (its lease,
//!   its session), for operators only.
//!
//! The time is the wall clock when the holder acquired, for display only
//! ([`Holder::since`](crate::Holder::since)), never for validity.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The first word of every value [`owner_value`] writes (its format's
/// version).
pub const VALUE_TAG: &str = "dlock1";

/// Who holds, as a holder wrote it: [`Owner::from_value`] or
/// [`Owner::from_detail`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The value's random nonce (hex); `None` in a detail.
    pub nonce: Option<String>,
    /// The holder's host name ([`host_name`](super::host_name)).
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// When the holder acquired, as Unix milliseconds (wall clock).
    pub since_unix_ms: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A fresh owner value for a grant, by this process on `host`: unique per
/// call (128 random bits).
pub fn owner_value(host: &str) -> String {
    let nonce: u128 = rand::random();
    format!(
        "{VALUE_TAG} {nonce:032x} {host} {} {}",
        std::process::id(),
        now_ms()
    )
}

/// The owner detail this process on `host` writes beside a grant that its
/// key or node already identifies.
pub fn owner_detail(host: &str) -> String {
    format!("{host} {} {}", std::process::id(), now_ms())
}

impl Owner {
    /// Reads a value [`owner_value`] wrote; `None` for anything else (a
    /// value another client set).
    pub fn from_value(value: &str) -> Option<Owner> {
        let mut parts = value.split(' ');
        if parts.next()? != VALUE_TAG {
            return None;
        }
        let nonce = parts.next()?.to_owned();
        let host = parts.next()?.to_owned();
        let pid = parts.next()?.parse().ok()?;
        let since_unix_ms = parts.next()?.parse().ok()?;
        if parts.next().is_some() || nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(Owner {
            nonce: Some(nonce),
            host,
            pid,
            since_unix_ms,
        })
    }

    /// Reads a detail [`owner_detail`] wrote (words after the third are
    /// ignored); `None` for anything else.
    pub fn from_detail(detail: &str) -> Option<Owner> {
        let mut parts = detail.split(' ');
        let host = parts
            .next()
            .filter(|h| !h.is_empty() && *h != VALUE_TAG)?
            .to_owned();
        let pid = parts.next()?.parse().ok()?;
        let since_unix_ms = parts.next()?.parse().ok()?;
        Some(Owner {
            nonce: None,
            host,
            pid,
            since_unix_ms,
        })
    }

    /// When the holder acquired (wall clock, display only).
    pub fn since(&self) -> Option<SystemTime> {
        UNIX_EPOCH.checked_add(Duration::from_millis(self.since_unix_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_foreign_values_are_not_ours() {
        let v = owner_value("host-1");
        let owner = Owner::from_value(&v).unwrap();
        assert_eq!(owner.host, "host-1");
        assert_eq!(owner.pid, std::process::id());
        assert!(owner.since().is_some());
        assert_ne!(
            Owner::from_value(&owner_value("host-1")).unwrap().nonce,
            owner.nonce
        );
        for foreign in [
            "",
            "locked",
            "dlock1",
            "dlock1 xyz h 1 2",
            "dlock1 00000000000000000000000000000000 h x 2",
            "dlock1 0000000000000000000000000000000g h 1 2",
            "dlock1 00000000000000000000000000000000 h 1 2 more",
        ] {
            assert_eq!(Owner::from_value(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn details_round_trip_and_values_are_not_details() {
        let d = owner_detail("h");
        let owner = Owner::from_detail(&d).unwrap();
        assert_eq!(
            (owner.host.as_str(), owner.pid, owner.nonce),
            ("h", std::process::id(), None)
        );
        assert_eq!(Owner::from_detail("h 1 2 more").unwrap().since_unix_ms, 2);
        for foreign in ["", "h", "h 1", "h x 2", "h 1 x", &owner_value("h")] {
            assert_eq!(Owner::from_detail(foreign), None, "{foreign:?}");
        }
    }

    #[test]
    fn values_do_not_repeat() {
        let values: std::collections::HashSet<String> = (0..10_000).map(|_| owner_value("h")).collect();
        assert_eq!(values.len(), 10_000);
    }
}
