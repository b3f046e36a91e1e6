//! [`Holder`]: who holds a name, as far as the backend can tell (the
//! operator views: [`Lock::holders`](crate::Lock::holders), `dlock holder`).

use std::time::{Duration, SystemTime};

use crate::Role;

/// One holder of a name, as the backend shows it: what
/// [`Lock::holders`](crate::Lock::holders) lists on every backend that can
/// list them. For operators and messages ("held by ..."), never for
/// deciding who holds a lock: by the time it is read, it may be stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// What it holds: the mutex, a read, the write, permits.
    pub role: Role,
    /// Where the backend keeps the grant: its key (Redis, etcd), node path
    /// (ZooKeeper) or `schema.table/name` row (PostgreSQL).
    pub id: String,
    /// What the holder wrote there, raw: `host:pid:...` or `host pid
    /// unix-ms` for a dlock holder, whatever another client writes (empty
    /// for `etcdctl lock`, a host name for ShedLock).
    pub detail: String,
    /// The holder's fencing token, where the backend has one and it is
    /// known (a Redis writer's own token is not stored: the name's latest
    /// token stands for it).
    pub token: Option<u64>,
    /// How much longer the grant lives without renewal, where the backend
    /// says.
    pub remaining: Option<Duration>,
    /// When it was acquired, where the holder wrote it (wall clock: for
    /// display only, never for validity).
    pub since: Option<SystemTime>,
}
