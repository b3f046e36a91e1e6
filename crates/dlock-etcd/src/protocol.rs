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
//! they and dlock exclude each other (Go's prefix is our `{prefix}NAME`). Like them, lock
//! names where one is a path prefix of the other (`a` and `a/b`) contend.
//!
//! Read-write lock `NAME`: the layout of Go's `experimental/recipes`
//! `RWMutex`: a reader writes `{prefix}NAME/read/…`, a writer
//! `{prefix}NAME/write/…` ([`Contender`]), each on its lease, by the same
//! transaction; a writer waits until no key under `{prefix}NAME/` was
//! created before its own, a reader until no key under
//! `{prefix}NAME/write` was, each watching the latest such key only. (Keys
//! of a mutex of the same name would count as a writer's predecessors: use
//! a name for one kind of lock.) Go orders these contenders by the keys'
//! *modification* revisions, we by their creation: the two agree because a
//! contender key is written once, by [`enter`], and never again (no lease
//! moves, no value updates) until it is deleted.
//!
//! Semaphore `NAME` (etcd has no recipe; this layout is dlock's): a key
//! `{prefix}NAME/sem/{count}/{limit}/…` per grant, on its lease; it holds when the
//! counts of the keys created before it, plus its own, are at most the
//! limit ([`wait_for_permits`]). A key there of another layout, or with a
//! count above its limit, takes every permit ([`Share`]: fail closed).
//!
//! Every request goes through [`bounded`]: the request timeout, and a
//! request whose connection failed under it sent again on a fresh one
//! ([`Resend`]).
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

use crate::error::{BACKEND, Unanswered, map_err, unanswered};

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
    match get(client, b"dlock-probe", count_only, timeout).await {
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
    let resp = get(client, prefix.as_bytes(), keys_only, timeout).await?;
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

/// The lock name a contender key (without the handle's key prefix)
/// belongs to: `NAME/{lease}-{n}` (Go's mutex: `NAME/{lease}`),
/// `NAME/read/…`, `NAME/write/…` or `NAME/sem/{count}/{limit}/…`.
pub(crate) fn name_of(key: &str) -> Option<&str> {
    let (dir, _) = key.rsplit_once('/')?;
    if let Some(name) = dir.strip_suffix("/read").or_else(|| dir.strip_suffix("/write")) {
        return Some(name);
    }
    let mut up = dir.rsplitn(4, '/');
    if let (Some(limit), Some(count), Some("sem"), Some(name)) = (up.next(), up.next(), up.next(), up.next())
        && limit.parse::<u32>().is_ok()
        && count.parse::<u32>().is_ok()
    {
        return Some(name);
    }
    Some(dir)
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

impl From<dlock_core::Claim> for Contender {
    fn from(claim: dlock_core::Claim) -> Self {
        match claim {
            dlock_core::Claim::Mutex => Contender::Mutex,
            dlock_core::Claim::Read => Contender::Read,
            dlock_core::Claim::Write => Contender::Write,
            dlock_core::Claim::Permits { count, limit } => Contender::Permits { count, limit },
        }
    }
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
    // Not sent again once it may have reached etcd: that would grant a
    // second lease (the first left to run out unused).
    let granted = bounded(timeout, Resend::IfUnsent, || {
        let mut client = client.clone();
        async move { client.lease_grant(seconds, None).await }
    })
    .await?;
    let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0).max(1));
    Ok((granted.id(), ttl))
}

/// Revokes a lease, deleting every key attached to it.
pub(crate) async fn revoke_lease(client: &Client, lease: i64, timeout: Duration) -> Result<()> {
    // Not sent again once it may have reached etcd: a second revoke of a
    // revoked lease is an error ("lease not found").
    bounded(timeout, Resend::IfUnsent, || {
        let mut client = client.clone();
        async move { client.lease_revoke(lease).await }
    })
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

/// Whether a request may be sent again when its connection failed under it
/// ([`Unanswered`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Only if it never left this process: a request that does something
    /// else, or answers otherwise, when applied twice (a lease grant or
    /// revoke, a delete whose answer says whether it deleted, a write of the
    /// caller's value).
    IfUnsent,
    /// Also if etcd may have applied it unseen: reads, and writes that
    /// find, a second time, what the first did and answer alike (the Mutex
    /// transaction on a key of our own lease and attempt).
    Idempotent,
}

/// How many times one request is sent again at most (each time on the
/// channel's fresh connection: tonic reconnects one whose connection
/// failed).
const RESENDS: u32 = 2;

/// Runs one etcd request, made by `send` for each try, within the request
/// timeout (for all tries together, from the first).
///
/// A try whose connection failed under it is sent again (up to [`RESENDS`]
/// times): one that never left this process always, one that may have
/// reached etcd only when `resend` is [`Resend::Idempotent`]. A caller who
/// cancelled nothing must not hear `Unavailable` because the HTTP/2
/// connection its request was queued on closed (reset by the network, or
/// given up by keep-alive) before the request went out, while a fresh
/// connection would have carried it: a request is queued on the channel's
/// current connection before hyper learns that the connection is gone.
async fn bounded<T, F>(timeout: Duration, resend: Resend, mut send: impl FnMut() -> F) -> Result<T>
where
    F: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let tries = async {
        let mut resent = 0;
        loop {
            // Boxed: etcd-client's request futures are large, and every
            // caller's future would carry one per call site.
            let e = match Box::pin(send()).await {
                Ok(answer) => return Ok(answer),
                Err(e) => e,
            };
            let again = match unanswered(&e) {
                Some(Unanswered::NotSent) => true,
                Some(Unanswered::Cut) => resend == Resend::Idempotent,
                None => false,
            };
            if !again || resent == RESENDS {
                return Err(map_err(e));
            }
            resent += 1;
        }
    };
    within(timeout, tries).await
}

/// Waits for `answer` (a reply on a stream) within the request timeout.
async fn within<T>(timeout: Duration, answer: impl Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(timeout, answer).await {
        Ok(r) => r,
        Err(_) => Err(Error::unavailable(
            BACKEND,
            format!("no answer from etcd within {timeout:?}"),
        )),
    }
}

/// A range read (sent again whenever its connection failed: a read).
async fn get(
    client: &Client,
    key: &[u8],
    options: GetOptions,
    timeout: Duration,
) -> Result<etcd_client::GetResponse> {
    bounded(timeout, Resend::Idempotent, || {
        let (mut client, options) = (client.clone(), options.clone());
        async move { client.get(key, Some(options)).await }
    })
    .await
}

/// A transaction; sent again after its connection failed only as `resend`
/// says.
async fn txn(
    client: &Client,
    txn: &Txn,
    resend: Resend,
    timeout: Duration,
) -> Result<etcd_client::TxnResponse> {
    bounded(timeout, resend, || {
        let (mut client, txn) = (client.clone(), txn.clone());
        async move { client.txn(txn).await }
    })
    .await
}

/// Opens a watch (sent again whenever its connection failed: a watch that
/// was opened and never seen is closed with its connection).
async fn watch(
    client: &Client,
    key: &[u8],
    options: Option<etcd_client::WatchOptions>,
    timeout: Duration,
) -> Result<etcd_client::WatchStream> {
    bounded(timeout, Resend::Idempotent, || {
        let (mut client, options) = (client.clone(), options.clone());
        async move { client.watch(key, options).await }
    })
    .await
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
    // Sent again after its connection failed, it finds the key it may have
    // created (the key is ours alone: our lease and attempt) and answers
    // as the first would have.
    let resp = self::txn(client, &txn, Resend::Idempotent, timeout).await?;
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
        let resp = txn(client, &look, Resend::Idempotent, timeout).await?;
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
        let mut stream = watch(client, &key, None, timeout).await?;
        let started_at = match within(timeout, async { stream.message().await.map_err(map_err) }).await? {
            Some(created) if created.created() && !created.canceled() => {
                created.header().map_or(i64::MAX, |h| h.revision())
            }
            // Refused or ended: look again.
            _ => continue,
        };
        if started_at > seen_at {
            let now = get(client, &key, GetOptions::new(), timeout).await?;
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

/// What a key under a semaphore's prefix (`{prefix}NAME/sem/`) takes of
/// it, read from its name.
///
/// Fail closed: a key there that is not one dlock writes (`{count}/{limit}/{id}`
/// with `count <= limit`, both `u32`) takes every permit. It cannot be
/// counted without a guess, and a guess that counts too little admits more
/// holders than a limit allows (a count of `u64::MAX` once wrapped the sum
/// and let two holders into a limit of 1). Such a key holds when no permit
/// is taken before it and keeps every later contender waiting until it is
/// deleted; the operator views show it as holding [`Share::ALL`] permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Share {
    /// `count` of `limit` permits.
    Permits { count: u32, limit: u32 },
    /// Every permit: a key of another layout, or a count above its limit.
    All,
}

impl Share {
    /// The count the operator views show for [`Share::All`].
    const ALL: u32 = u32::MAX;

    /// The share of a key whose name under the semaphore's prefix is `rest`.
    fn parse(rest: &str) -> Share {
        let mut parts = rest.split('/');
        let (Some(count), Some(limit), Some(id), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Share::All;
        };
        match (count.parse::<u32>(), limit.parse::<u32>()) {
            (Ok(count), Ok(limit)) if count <= limit && !id.is_empty() => Share::Permits { count, limit },
            _ => Share::All,
        }
    }

    /// The share of `key`, a key under `sem` (a key that is not UTF-8 is not
    /// one of ours).
    fn of(sem: &str, key: &[u8]) -> Share {
        std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.strip_prefix(sem))
            .map_or(Share::All, Share::parse)
    }

    /// The permits it takes, for the operator views.
    fn count(self) -> u32 {
        match self {
            Share::Permits { count, .. } => count,
            Share::All => Share::ALL,
        }
    }
}

/// The permits taken once `share` is added to `taken` (saturating:
/// [`Share::All`], or counts that add up past `u64`, take everything).
fn plus(taken: u64, share: Share) -> u64 {
    match share {
        Share::Permits { count, .. } => taken.saturating_add(u64::from(count)),
        Share::All => u64::MAX,
    }
}

/// The permits taken by `shares`.
fn taken_by(shares: impl IntoIterator<Item = Share>) -> u64 {
    shares.into_iter().fold(0, plus)
}

/// Whether `share` holds after `taken` permits are taken by the keys before
/// it: its count fits its own limit with them; [`Share::All`] only when
/// nothing is taken.
fn fits(taken: u64, share: Share) -> bool {
    match share {
        Share::Permits { count, limit } => taken.saturating_add(u64::from(count)) <= u64::from(limit),
        Share::All => taken == 0,
    }
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
        let resp = txn(client, &look, Resend::Idempotent, timeout).await?;
        let responses = resp.op_responses();
        let mine = ranges(&responses, 1).and_then(|kvs| kvs.first());
        if mine.is_none_or(|kv| kv.create_revision() != my_rev) {
            return Ok(false);
        }
        let earlier = ranges(&responses, 0).unwrap_or_default();
        let taken = taken_by(earlier.iter().map(|kv| Share::of(sem, kv.key())));
        if fits(taken, Share::Permits { count, limit }) {
            return Ok(true);
        }
        let seen_at = resp.header().map_or(0, |h| h.revision());
        // Deletions after the look (none is missed: the watch starts there).
        let opts = etcd_client::WatchOptions::new()
            .with_prefix()
            .with_start_revision(seen_at + 1);
        let mut stream = watch(client, sem.as_bytes(), Some(opts), timeout).await?;
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
    let resp = get(client, sem.as_bytes(), earlier, timeout).await?;
    let taken = taken_by(resp.kvs().iter().map(|kv| Share::of(sem, kv.key())));
    Ok(fits(taken, Share::Permits { count, limit }))
}

/// Whether `my_key` still exists with our create revision.
pub(crate) async fn still_ours(
    client: &Client,
    my_key: &str,
    my_rev: i64,
    timeout: Duration,
) -> Result<bool> {
    let resp = get(client, my_key.as_bytes(), GetOptions::new(), timeout).await?;
    Ok(resp
        .kvs()
        .first()
        .is_some_and(|kv| kv.create_revision() == my_rev))
}

/// Runs a transaction guarded by our create revision whose else branch
/// reads our key: done, or which refusal (someone else's key there, or none).
async fn guarded(client: &Client, txn: &Txn, resend: Resend, timeout: Duration) -> Result<Outcome> {
    let resp = self::txn(client, txn, resend, timeout).await?;
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
    // Not sent again once it may have reached etcd: a second try after a
    // delete that was done finds no key, which reads as "expired".
    guarded(client, &txn, Resend::IfUnsent, timeout).await
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
    self::txn(client, &txn, Resend::Idempotent, timeout)
        .await
        .map(drop)
}

/// What a key under a lock name's prefix is, by its name there (`rest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `{id}`: a mutex contender (dlock's, Go's, `etcdctl lock`'s).
    Mutex,
    /// `read/{id}`.
    Read,
    /// `write/{id}`.
    Write,
    /// `sem/…`: a semaphore's, with its share (fail closed: [`Share`]).
    Permits(Share),
    /// Anything else (a contender of a longer name: `a/b/{id}` under `a/`).
    Other,
}

impl Kind {
    fn of(rest: &str) -> Kind {
        if let Some(sem) = rest.strip_prefix("sem/") {
            return Kind::Permits(Share::parse(sem));
        }
        let mut parts = rest.split('/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(_), None, _) => Kind::Mutex,
            (Some("read"), Some(_), None) => Kind::Read,
            (Some("write"), Some(_), None) => Kind::Write,
            _ => Kind::Other,
        }
    }
}

/// Every contender under `pfx` that holds now, with what it holds, in
/// create order: the mutex's first key; a read-write lock's first key if
/// it is a write, else its reads created before its first write; a
/// semaphore's keys whose counts, with those created before them, fit their
/// own limit (waiters left out; a key under `sem/` of another layout takes
/// every permit: [`Share`]).
pub(crate) async fn holding(
    client: &Client,
    pfx: &str,
    timeout: Duration,
) -> Result<Vec<(dlock_core::Role, KeyValue)>> {
    use dlock_core::Role;
    let all = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let resp = get(client, pfx.as_bytes(), all, timeout).await?;
    // As the acquire decides (`Contender::waits_on`): a mutex key or a
    // write holds when no key under the prefix came before it, a read when
    // no key starting with `write` did, a semaphore's when the counts
    // before it and its own fit its limit.
    let (mut any_seen, mut writer_seen, mut permits) = (false, false, 0u64);
    let mut found = Vec::new();
    for kv in resp.kvs() {
        let Some(rest) = std::str::from_utf8(kv.key())
            .ok()
            .and_then(|k| k.strip_prefix(pfx))
        else {
            continue;
        };
        let role = match Kind::of(rest) {
            Kind::Read => (!writer_seen).then_some(Role::Read),
            Kind::Write => (!any_seen).then_some(Role::Write),
            Kind::Permits(share) => {
                let holds = fits(permits, share);
                permits = plus(permits, share);
                holds.then_some(Role::Permits(share.count()))
            }
            // A key of a longer name (`jobs/nightly/…` under `jobs/`) keeps
            // a mutex of this name out when it comes first, as Go's
            // layout has it: it is the holder a waiter waits for.
            Kind::Mutex | Kind::Other => (!any_seen).then_some(Role::Mutex),
        };
        if let Some(role) = role {
            found.push((role, kv.clone()));
        }
        any_seen = true;
        writer_seen |= rest.starts_with("write");
    }
    Ok(found)
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
    // Not sent again once it may have reached etcd: the caller's value
    // could overwrite one written since.
    Ok(self::txn(client, &txn, Resend::IfUnsent, timeout)
        .await?
        .succeeded())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use tonic::{Code, Status};

    /// hyper's `Canceled` as tonic reports it: queued on a connection that
    /// closed before taking it.
    fn not_sent() -> etcd_client::Error {
        let mut status = Status::cancelled("operation was canceled");
        status.set_source(Arc::new(io::Error::other("connection closed")));
        etcd_client::Error::GRpcStatus(status)
    }

    /// The connection reset under a request that may have reached etcd.
    fn cut() -> etcd_client::Error {
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        etcd_client::Error::GRpcStatus(Status::from_error(Box::new(reset)))
    }

    /// etcd's own answer.
    fn answered() -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(Status::new(Code::Unavailable, "etcdserver: no leader"))
    }

    /// `bounded` over tries that fail as `failures` say, in turn, then
    /// answer 7: its result and how many tries were sent.
    async fn sent(resend: Resend, failures: &[fn() -> etcd_client::Error]) -> (Result<u32>, usize) {
        let mut tries = 0;
        let r = bounded(Duration::from_secs(30), resend, || {
            tries += 1;
            std::future::ready(failures.get(tries - 1).map_or(Ok(7), |failure| Err(failure())))
        })
        .await;
        (r, tries)
    }

    #[tokio::test]
    async fn a_request_never_sent_is_sent_again_whatever_it_does() {
        for resend in [Resend::IfUnsent, Resend::Idempotent] {
            let (r, tries) = sent(resend, &[not_sent]).await;
            assert_eq!((r.ok(), tries), (Some(7), 2), "{resend:?}");
        }
    }

    #[tokio::test]
    async fn a_request_cut_on_its_way_is_sent_again_only_if_idempotent() {
        let (r, tries) = sent(Resend::IfUnsent, &[cut]).await;
        assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
        assert_eq!(tries, 1);
        let (r, tries) = sent(Resend::Idempotent, &[cut, not_sent]).await;
        assert_eq!((r.ok(), tries), (Some(7), 3));
    }

    #[tokio::test]
    async fn resends_are_bounded_and_answers_are_final() {
        let (r, tries) = sent(Resend::Idempotent, &[not_sent as fn() -> etcd_client::Error; 10]).await;
        assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
        assert_eq!(tries, 1 + RESENDS as usize);
        let (r, tries) = sent(Resend::Idempotent, &[answered]).await;
        assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
        assert_eq!(tries, 1);
    }

    #[test]
    fn a_semaphore_key_of_ours_takes_its_count() {
        assert_eq!(Share::parse("1/2/6f-0"), Share::Permits { count: 1, limit: 2 });
        assert_eq!(
            Share::parse(&format!("{0}/{0}/6f-0", u32::MAX)),
            Share::Permits {
                count: u32::MAX,
                limit: u32::MAX
            }
        );
        assert_eq!(
            Share::of("dlock/n/sem/", b"dlock/n/sem/3/5/6f-1"),
            Share::Permits { count: 3, limit: 5 }
        );
    }

    #[test]
    fn any_other_key_under_a_semaphore_takes_every_permit() {
        for rest in [
            // The key of the report: a count past u32 (and at u64::MAX).
            "18446744073709551615/1/zz",
            "4294967296/4294967296/zz",
            // A count above its own limit.
            "2/1/zz",
            // Numbers that do not parse, and other shapes.
            "-1/1/zz",
            "one/1/zz",
            "1/one/zz",
            "1/2",
            "1/2/",
            "1/2/zz/more",
            "",
        ] {
            assert_eq!(Share::parse(rest), Share::All, "{rest:?}");
        }
        assert_eq!(Share::of("dlock/n/sem/", b"dlock/n/sem/\xff/1/zz"), Share::All);
        assert_eq!(Share::All.count(), Share::ALL);
    }

    #[test]
    fn counts_add_up_without_overflow_and_fail_closed() {
        let one_of_one = Share::Permits { count: 1, limit: 1 };
        let huge = Share::of("dlock/ovf/sem/", b"dlock/ovf/sem/18446744073709551615/1/zz");
        // Behind the huge key nobody fits, whoever holds with it.
        assert!(!fits(taken_by([huge]), one_of_one));
        assert!(!fits(taken_by([huge, one_of_one]), one_of_one));
        // It holds when it is first, and only then.
        assert!(fits(taken_by([]), huge));
        assert!(!fits(taken_by([Share::Permits { count: 1, limit: 9 }]), huge));
        // Counts that add up past u64 saturate.
        let most = Share::Permits {
            count: u32::MAX,
            limit: u32::MAX,
        };
        assert_eq!(plus(u64::MAX - 1, most), u64::MAX);
        assert!(!fits(u64::MAX - 1, most));
        // And what fits, fits.
        assert!(fits(taken_by([]), one_of_one));
        assert!(!fits(taken_by([one_of_one]), one_of_one));
        let two_of_three = Share::Permits { count: 2, limit: 3 };
        assert!(fits(
            taken_by([Share::Permits { count: 1, limit: 3 }]),
            two_of_three
        ));
    }

    #[test]
    fn keys_under_a_name_are_told_apart_by_their_layout() {
        assert_eq!(Kind::of("6f-0"), Kind::Mutex);
        assert_eq!(Kind::of("6f"), Kind::Mutex);
        assert_eq!(Kind::of("read/6f-0"), Kind::Read);
        assert_eq!(Kind::of("write/6f-0"), Kind::Write);
        assert_eq!(
            Kind::of("sem/2/3/6f-0"),
            Kind::Permits(Share::Permits { count: 2, limit: 3 })
        );
        assert_eq!(Kind::of("sem/x"), Kind::Permits(Share::All));
        assert_eq!(Kind::of("b/6f-0"), Kind::Other);
        assert_eq!(Kind::of("read/a/6f-0"), Kind::Other);
    }
}
