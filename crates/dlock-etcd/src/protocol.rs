//! The protocol: etcd's `concurrency.Mutex` recipe, step by step. Everything
//! the driver does to etcd's keys is here.
//!
//! A contender for lock `NAME` writes `{prefix}NAME/{lease:x}-{n:x}` (its
//! lease in hex and a per-acquire number: [`contender_key`]), attached to
//! its lease, in a transaction that creates it only if absent
//! (`create_revision == 0`) and reads the first creator under the prefix.
//! The key with the lowest create revision holds the lock; that revision is
//! the fencing token. A waiter watches only its *immediate* predecessor (the
//! highest create revision below its own) for deletion, then looks again —
//! never the whole prefix, so a release wakes one waiter, not a herd. After
//! waking it checks that its own key still exists (etcd issue #11456: a
//! waiter whose lease expired must not report a grant).
//!
//! This is the layout of Go's `concurrency.Mutex` and of `etcdctl lock`, so
//! with an empty prefix they and dlock exclude each other. Like them, lock
//! names where one is a path prefix of the other (`a` and `a/b`) contend.
//!
//! Read-write lock `NAME`: the layout of Go's `experimental/recipes`
//! `RWMutex`: a reader writes `{prefix}NAME/read/…`, a writer
//! `{prefix}NAME/write/…` ([`Contender`]), each on its lease, by the same
//! transaction; a writer waits until no key under `{prefix}NAME/` was
//! created before its own, a reader until no key under
//! `{prefix}NAME/write` was, each watching the latest such key only. (Keys
//! of a mutex of the same name would count as a writer's predecessors: use
//! a name for one kind of lock.)
//!
//! Semaphore `NAME` (etcd has no recipe; this layout is dlock's): a key
//! `{prefix}NAME/sem/{count}/{limit}/…` per grant, on its lease; it holds when the
//! counts of the keys created before it, plus its own, are at most the
//! limit ([`wait_for_permits`]).
//!
//! Leases (grant, revoke, the keep-alive stream) are here too: this is the
//! only file that talks to etcd.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::driver::{Outcome, Refusal};
use dlock_core::{Error, Result};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse,
};

use crate::error::{BACKEND, map_err};

/// What a handle and its guards share to talk to etcd: the client, the
/// request timeout, and whether the handle was abandoned (then nothing more
/// is sent: as if the process had died).
pub(crate) struct Conn {
    pub(crate) client: Client,
    pub(crate) timeout: Duration,
    pub(crate) abandoned: Arc<AtomicBool>,
}

impl Conn {
    pub(crate) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }
}

/// A read that proves the cluster answers (connecting is lazy for some
/// transports); any failure is [`Error::Unavailable`].
pub(crate) async fn probe(client: &Client, timeout: Duration) -> Result<()> {
    let count_only = GetOptions::new().with_count_only();
    match bounded(timeout, client.clone().get("dlock-probe", Some(count_only))).await {
        Ok(_) => Ok(()),
        Err(Error::Backend { source, .. }) => Err(Error::Unavailable {
            backend: BACKEND,
            source,
        }),
        Err(other) => Err(other),
    }
}

/// Every key under `prefix` (keys only).
pub(crate) async fn keys_under(client: &Client, prefix: &str, timeout: Duration) -> Result<Vec<String>> {
    let keys_only = GetOptions::new().with_prefix().with_keys_only();
    let resp = bounded(timeout, client.clone().get(prefix, Some(keys_only))).await?;
    Ok(resp
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect())
}

/// The key a contender writes: Go's layout (`{lease:x}` under the lock's
/// prefix) plus a per-acquire number, so two acquires of one name through
/// one lease are two contenders.
pub(crate) fn contender_key(pfx: &str, lease: i64, attempt: u64) -> String {
    format!("{pfx}{lease:x}-{attempt:x}")
}

/// What a contender takes of a name under the lock prefix `pfx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contender {
    /// `concurrency.Mutex`.
    Mutex,
    /// `recipes.RWMutex`, reading.
    Read,
    /// `recipes.RWMutex`, writing.
    Write,
    /// `count` of a semaphore's `limit` permits: a key
    /// `{prefix}NAME/sem/{count}/{limit}/…`; it holds when the counts of the keys
    /// created before it, plus its own, are at most `limit`.
    Permits { count: u32, limit: u32 },
}

impl Contender {
    /// The contender's key (unique per acquire, as [`contender_key`]).
    pub(crate) fn key(self, pfx: &str, lease: i64, attempt: u64) -> String {
        match self {
            Contender::Mutex => contender_key(pfx, lease, attempt),
            Contender::Read => format!("{pfx}read/{lease:x}-{attempt:x}"),
            Contender::Write => format!("{pfx}write/{lease:x}-{attempt:x}"),
            // The limit is in the key too, for the operator views (a key
            // holds by its own limit).
            Contender::Permits { count, limit } => format!("{pfx}sem/{count}/{limit}/{lease:x}-{attempt:x}"),
        }
    }

    /// The prefix whose earlier keys the contender waits out: every key of
    /// the name for a mutex or a writer, the writers' for a reader.
    pub(crate) fn waits_on(self, pfx: &str) -> String {
        match self {
            Contender::Mutex | Contender::Write => pfx.to_owned(),
            Contender::Read => format!("{pfx}write"),
            Contender::Permits { .. } => format!("{pfx}sem/"),
        }
    }
}

/// A granted lease: its id and the TTL etcd granted (which may differ from
/// the one asked for).
pub(crate) async fn grant_lease(client: &Client, seconds: i64, timeout: Duration) -> Result<(i64, Duration)> {
    let granted = bounded(timeout, client.clone().lease_grant(seconds, None)).await?;
    let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0).max(1));
    Ok((granted.id(), ttl))
}

/// Revokes a lease, deleting every key attached to it.
pub(crate) async fn revoke_lease(client: &Client, lease: i64, timeout: Duration) -> Result<()> {
    bounded(timeout, client.clone().lease_revoke(lease))
        .await
        .map(drop)
}

/// One keep-alive stream of a lease.
pub(crate) struct KeepAlive {
    keeper: etcd_client::LeaseKeeper,
    replies: etcd_client::LeaseKeepAliveStream,
}

/// What opening a keep-alive stream, or one keep-alive on it, found.
pub(crate) enum Renewal<T> {
    /// Alive: the stream, or the TTL the lease has again.
    Alive(T),
    /// The lease is gone (expired or revoked): etcd said TTL 0.
    Gone,
    /// No answer (the stream could not be opened or ended): try again
    /// while the deadline allows.
    Failed,
}

impl KeepAlive {
    /// Opens a keep-alive stream on `lease` (which sends its first
    /// keep-alive).
    pub(crate) async fn open(client: &Client, lease: i64) -> Renewal<Self> {
        match client.clone().lease_keep_alive(lease).await {
            Ok((keeper, replies)) => Renewal::Alive(KeepAlive { keeper, replies }),
            // The client's word for a first reply of TTL 0 (retrying it
            // until the deadline kept a revoked lease "held" for a TTL).
            Err(etcd_client::Error::LeaseKeepAliveError(_)) => Renewal::Gone,
            Err(_) => Renewal::Failed,
        }
    }

    /// One keep-alive and its answer: the lease's TTL again.
    pub(crate) async fn renew(&mut self) -> Renewal<Duration> {
        if self.keeper.keep_alive().await.is_err() {
            return Renewal::Failed;
        }
        match self.replies.message().await {
            Ok(Some(reply)) if reply.ttl() > 0 => {
                Renewal::Alive(Duration::from_secs(u64::try_from(reply.ttl()).unwrap_or(0)))
            }
            // TTL 0: the lease expired or was revoked.
            Ok(Some(_)) => Renewal::Gone,
            Ok(None) | Err(_) => Renewal::Failed,
        }
    }
}

/// Runs one etcd request with the request timeout.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    request: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(Error::unavailable(
            BACKEND,
            format!("no answer from etcd within {timeout:?}"),
        )),
    }
}

fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

fn ranges(r: &[TxnOpResponse], i: usize) -> Option<&[KeyValue]> {
    match r.get(i)? {
        TxnOpResponse::Get(g) => Some(g.kvs()),
        _ => None,
    }
}

/// The Mutex transaction: create `my_key` on `lease` unless it exists, and
/// read the first creator under `pfx` (the prefix whose earlier keys we
/// wait out: [`Contender::waits_on`]). Returns our create revision and
/// whether we hold the lock (no key under `pfx` was created before ours).
pub(crate) async fn enter(
    client: &Client,
    pfx: &str,
    my_key: &str,
    lease: i64,
    value: &str,
    timeout: Duration,
) -> Result<(i64, bool)> {
    let txn = Txn::new()
        .when([Compare::create_revision(my_key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(my_key, value, Some(PutOptions::new().with_lease(lease))),
            TxnOp::get(pfx, Some(first_created())),
        ])
        .or_else([TxnOp::get(my_key, None), TxnOp::get(pfx, Some(first_created()))]);
    let resp = bounded(timeout, client.clone().txn(txn)).await?;
    let responses = resp.op_responses();
    let my_rev = if resp.succeeded() {
        resp.header()
            .map(|h| h.revision())
            .ok_or_else(|| Error::backend(BACKEND, "a transaction reply without a header"))?
    } else {
        ranges(&responses, 0)
            .and_then(|kvs| kvs.first())
            .map(KeyValue::create_revision)
            .ok_or_else(|| Error::backend(BACKEND, "our lock key vanished inside a transaction"))?
    };
    let owner = ranges(&responses, 1).and_then(|kvs| kvs.first());
    Ok((my_rev, owner.is_none_or(|kv| kv.create_revision() >= my_rev)))
}

/// Waits until no key under `pfx` was created before `my_rev`: watches the
/// immediate predecessor's deletion, then looks again. Returns whether
/// `my_key` still exists with our create revision then (etcd #11456: a
/// waiter whose lease expired meanwhile must not report a grant); the last
/// look and that check are one read-only transaction.
///
/// # Cancel safety
///
/// Cancel safe: dropping it drops the watch.
pub(crate) async fn wait_for_predecessors(
    client: &Client,
    pfx: &str,
    my_key: &str,
    my_rev: i64,
    timeout: Duration,
) -> Result<bool> {
    let predecessor = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_max_create_revision(my_rev - 1)
        .with_limit(1);
    let look = Txn::new().and_then([TxnOp::get(pfx, Some(predecessor)), TxnOp::get(my_key, None)]);
    loop {
        let resp = bounded(timeout, client.clone().txn(look.clone())).await?;
        let responses = resp.op_responses();
        let Some(kv) = ranges(&responses, 0).and_then(|kvs| kvs.first()) else {
            let mine = ranges(&responses, 1).and_then(|kvs| kvs.first());
            return Ok(mine.is_some_and(|kv| kv.create_revision() == my_rev));
        };
        let seen_at = resp.header().map_or(0, |h| h.revision());
        let (key, created) = (kv.key().to_vec(), kv.create_revision());
        // A watch from "now", not from `seen_at`: a watch that starts in
        // the past is caught up by etcd's background sync, every 100 ms,
        // which on a busy key cost most handoffs up to 100 ms. Whatever
        // happened between the get and the watch's start is checked below.
        let mut stream = bounded(timeout, client.clone().watch(key.clone(), None)).await?;
        let started_at = match bounded(timeout, stream.message()).await? {
            Some(created) if created.created() && !created.canceled() => {
                created.header().map_or(i64::MAX, |h| h.revision())
            }
            // Refused or ended: look again.
            _ => continue,
        };
        if started_at > seen_at {
            let now = bounded(timeout, client.clone().get(key.clone(), None)).await?;
            if now.kvs().first().is_none_or(|kv| kv.create_revision() != created) {
                continue;
            }
        }
        // Until the predecessor is deleted (or the watch ends: then look again).
        'watch: loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    if resp.canceled() || resp.events().iter().any(|e| e.event_type() == EventType::Delete) {
                        break 'watch;
                    }
                }
                Ok(None) | Err(_) => break 'watch,
            }
        }
    }
}

/// How many permits a semaphore key under `sem` (`{prefix}NAME/sem/`)
/// holds or waits for: the number in its name (0 for a key not of ours).
fn permits_of(sem: &str, key: &[u8]) -> u64 {
    std::str::from_utf8(key)
        .ok()
        .and_then(|k| k.strip_prefix(sem))
        .and_then(|rest| rest.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Waits until the permits of the keys under `sem` created before
/// `my_rev`, plus our `count`, are at most `limit`: looks, and while they
/// are not, watches the prefix for a deletion and looks again (every
/// waiter looks on every release: a semaphore's release may admit any of
/// them). Returns whether `my_key` still exists with our create revision
/// then (as [`wait_for_predecessors`]).
///
/// # Cancel safety
///
/// Cancel safe: dropping it drops the watch.
pub(crate) async fn wait_for_permits(
    client: &Client,
    sem: &str,
    my_key: &str,
    my_rev: i64,
    count: u32,
    limit: u32,
    timeout: Duration,
) -> Result<bool> {
    let earlier = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_max_create_revision(my_rev - 1);
    let look = Txn::new().and_then([TxnOp::get(sem, Some(earlier)), TxnOp::get(my_key, None)]);
    loop {
        let resp = bounded(timeout, client.clone().txn(look.clone())).await?;
        let responses = resp.op_responses();
        let mine = ranges(&responses, 1).and_then(|kvs| kvs.first());
        if mine.is_none_or(|kv| kv.create_revision() != my_rev) {
            return Ok(false);
        }
        let taken: u64 = ranges(&responses, 0)
            .unwrap_or_default()
            .iter()
            .map(|kv| permits_of(sem, kv.key()))
            .sum();
        if taken + u64::from(count) <= u64::from(limit) {
            return Ok(true);
        }
        let seen_at = resp.header().map_or(0, |h| h.revision());
        // Deletions after the look (none is missed: the watch starts there).
        let opts = etcd_client::WatchOptions::new()
            .with_prefix()
            .with_start_revision(seen_at + 1);
        let mut stream = bounded(timeout, client.clone().watch(sem, Some(opts))).await?;
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled() || resp.events().iter().any(|e| e.event_type() == EventType::Delete) {
                break;
            }
        }
    }
}

/// One look for a semaphore key: whether it holds now (`how` must be
/// [`Contender::Permits`]; any other holds only when first).
pub(crate) async fn permits_fit_now(
    client: &Client,
    sem: &str,
    my_rev: i64,
    how: Contender,
    timeout: Duration,
) -> Result<bool> {
    let Contender::Permits { count, limit } = how else {
        return Ok(false);
    };
    let earlier = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_max_create_revision(my_rev - 1);
    let resp = bounded(timeout, client.clone().get(sem, Some(earlier))).await?;
    let taken: u64 = resp.kvs().iter().map(|kv| permits_of(sem, kv.key())).sum();
    Ok(taken + u64::from(count) <= u64::from(limit))
}

/// Whether `my_key` still exists with our create revision.
pub(crate) async fn still_ours(
    client: &Client,
    my_key: &str,
    my_rev: i64,
    timeout: Duration,
) -> Result<bool> {
    let resp = bounded(timeout, client.clone().get(my_key, None)).await?;
    Ok(resp
        .kvs()
        .first()
        .is_some_and(|kv| kv.create_revision() == my_rev))
}

/// Runs a transaction guarded by our create revision whose else branch
/// reads our key: done, or which refusal (someone else's key there, or none).
async fn guarded(client: &Client, txn: Txn, timeout: Duration) -> Result<Outcome> {
    let resp = bounded(timeout, client.clone().txn(txn)).await?;
    if resp.succeeded() {
        return Ok(Ok(()));
    }
    let there = ranges(&resp.op_responses(), 0).is_some_and(|kvs| !kvs.is_empty());
    Ok(Err(if there {
        Refusal::HeldByOther
    } else {
        Refusal::Expired
    }))
}

/// Deletes `my_key` if it still has our create revision.
pub(crate) async fn resign(client: &Client, my_key: &str, my_rev: i64, timeout: Duration) -> Result<Outcome> {
    let txn = Txn::new()
        .when([Compare::create_revision(my_key, CompareOp::Equal, my_rev)])
        .and_then([TxnOp::delete(my_key, None)])
        .or_else([TxnOp::get(my_key, None)]);
    guarded(client, txn, timeout).await
}

/// Deletes `my_key` if it is still attached to `lease` (when our create
/// revision is not known yet: a dropped transaction).
pub(crate) async fn resign_by_lease(
    client: &Client,
    my_key: &str,
    lease: i64,
    timeout: Duration,
) -> Result<()> {
    let txn = Txn::new()
        .when([Compare::lease(my_key, CompareOp::Equal, lease)])
        .and_then([TxnOp::delete(my_key, None)]);
    bounded(timeout, client.clone().txn(txn)).await.map(drop)
}

/// Moves `my_key` to `lease` (keeping its value and create revision) if it
/// still has our create revision. Returns what was found otherwise.
pub(crate) async fn move_to_lease(
    client: &Client,
    my_key: &str,
    my_rev: i64,
    lease: i64,
    timeout: Duration,
) -> Result<Outcome> {
    let txn = Txn::new()
        .when([Compare::create_revision(my_key, CompareOp::Equal, my_rev)])
        .and_then([TxnOp::put(
            my_key,
            "",
            Some(PutOptions::new().with_lease(lease).with_ignore_value()),
        )])
        .or_else([TxnOp::get(my_key, None)]);
    guarded(client, txn, timeout).await
}

/// The current holder under `pfx`: the key with the lowest create revision.
/// Every contender under `pfx` that holds now, with what it holds, in
/// create order: the mutex's first key; a read-write lock's first key if
/// it is a write, else its reads created before its first write; a
/// semaphore's keys whose counts, with those created before them, fit their
/// own limit (waiters and foreign keys left out).
pub(crate) async fn holding(
    client: &Client,
    pfx: &str,
    timeout: Duration,
) -> Result<Vec<(dlock_core::Role, KeyValue)>> {
    use dlock_core::Role;
    let all = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let resp = bounded(timeout, client.clone().get(pfx, Some(all))).await?;
    // As the acquire decides (`Contender::waits_on`): a mutex key or a
    // write holds when no key under the prefix came before it, a read when
    // no key starting with `write` did, a semaphore's when the counts
    // before it and its own fit its limit.
    let (mut any_seen, mut writer_seen, mut taken) = (false, false, 0u64);
    let mut found = Vec::new();
    for kv in resp.kvs() {
        let Some(rest) = std::str::from_utf8(kv.key())
            .ok()
            .and_then(|k| k.strip_prefix(pfx))
        else {
            continue;
        };
        let segments: Vec<&str> = rest.split('/').collect();
        let role = match segments.as_slice() {
            ["read", _] => (!writer_seen).then_some(Role::Read),
            ["write", _] => (!any_seen).then_some(Role::Write),
            ["sem", count, limit, _] => match (count.parse::<u32>(), limit.parse::<u32>()) {
                (Ok(count), Ok(limit)) => {
                    taken += u64::from(count);
                    (taken <= u64::from(limit)).then_some(Role::Permits(count))
                }
                _ => None,
            },
            [_] => (!any_seen).then_some(Role::Mutex),
            _ => None,
        };
        if let Some(role) = role {
            found.push((role, kv.clone()));
        }
        any_seen = true;
        writer_seen |= rest.starts_with("write");
    }
    Ok(found)
}

pub(crate) async fn holder(client: &Client, pfx: &str, timeout: Duration) -> Result<Option<KeyValue>> {
    let resp = bounded(timeout, client.clone().get(pfx, Some(first_created()))).await?;
    Ok(resp.kvs().first().cloned())
}

/// A write that happens only while we hold the lock: `Txn(If
/// create_revision(my_key) == my_rev, Then put(key, value))`.
pub(crate) async fn put_if_owner(
    client: &Client,
    my_key: &str,
    my_rev: i64,
    key: &[u8],
    value: &[u8],
    timeout: Duration,
) -> Result<bool> {
    let txn = Txn::new()
        .when([Compare::create_revision(my_key, CompareOp::Equal, my_rev)])
        .and_then([TxnOp::put(key, value, None)]);
    Ok(bounded(timeout, client.clone().txn(txn)).await?.succeeded())
}
