//! The protocol: Apache Curator's `InterProcessMutex`,
//! `InterProcessReadWriteLock` and `InterProcessSemaphoreV2` recipes.
//! Everything the driver does to ZooKeeper's tree is here.
//!
//! Read-write lock `NAME`: `_c_{uuid}-__READ__{sequence}` and
//! `_c_{uuid}-__WRIT__{sequence}` side by side in `{root}/NAME`, sorted by
//! sequence; a writer holds when first and watches its predecessor, a reader
//! holds when no writer comes before it and watches the first writer
//! ([`place_in`]). Semaphore `NAME`: a waiter holds the mutex
//! `{root}/NAME/locks` while its leases `{root}/NAME/leases/_c_{uuid}-lease-{sequence}`
//! (one per permit) wait for the leases directory to have at most `limit`
//! children ([`leases_fit`]).
//!
//! Lock `NAME` is the directory `{root}/NAME`. A contender creates an
//! EPHEMERAL_SEQUENTIAL child `_c_{uuid}-lock-{sequence}` (Curator's exact
//! naming, so Curator clients and dlock exclude each other), lists the
//! children, sorts them by the sequence suffix, and holds the lock if its own
//! comes first; otherwise it watches only its *immediate* predecessor and
//! looks again when that one goes (no herd). If the connection is lost while
//! creating, it looks for its own node by the uuid instead of creating a
//! second one. Missing parent directories are created as containers, which
//! the server removes once they are empty.
//!
//! The fencing token is the node's `czxid` (the transaction id that created
//! it): unlike the sequence suffix, which is per directory, 32-bit and reset
//! when the directory is recreated, it increases across the whole ensemble.

use std::time::Duration;

use dlock_core::driver::{Outcome, Refusal};
use dlock_core::{Error, Result};
use zookeeper_client::{Acls, Client, CreateMode, Stat};

use crate::config::ZkConfig;
use crate::error::{BACKEND, map_err};

/// The infix between uuid and sequence in Curator's lock node names.
pub(crate) const LOCK_NAME: &str = "-lock-";
/// Curator's `InterProcessReadWriteLock` names: a reader's and a writer's
/// node, `_c_{uuid}-__READ__{sequence}` and `_c_{uuid}-__WRIT__{sequence}`,
/// side by side under one directory.
pub(crate) const READ_NAME: &str = "__READ__";
pub(crate) const WRITE_NAME: &str = "__WRIT__";
/// Curator's `InterProcessSemaphoreV2` lease name infix.
pub(crate) const LEASE_NAME: &str = "-lease-";
/// The semaphore's directories under the name's: the mutex held while a
/// lease waits, and the leases.
pub(crate) const SEMAPHORE_LOCKS: &str = "locks";
pub(crate) const SEMAPHORE_LEASES: &str = "leases";
/// What our lease's data says after `host pid unix-ms`, for operators: the
/// mutex node it was made under (` under=_c_...-lock-0000000012`). The
/// views do not rely on it ([`waiting_lease`]): Curator's leases carry
/// no such tag.
pub(crate) const LEASE_UNDER: &str = "under=";

/// Which of Curator's recipes a node belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recipe {
    /// `InterProcessMutex`.
    Mutex,
    /// `InterProcessReadWriteLock`, reading.
    Read,
    /// `InterProcessReadWriteLock`, writing.
    Write,
    /// `InterProcessSemaphoreV2`'s lease, `_c_{uuid}-lease-{sequence}` in
    /// the name's `leases` directory.
    Lease,
}

impl Recipe {
    /// What follows `_c_{uuid}` in our node's name, before the sequence.
    fn infix(self) -> &'static str {
        match self {
            Recipe::Mutex => LOCK_NAME,
            Recipe::Read => "-__READ__",
            Recipe::Write => "-__WRIT__",
            Recipe::Lease => LEASE_NAME,
        }
    }

    /// The sequence of `name` if it is a contender of this recipe's
    /// directory (a reader's and a writer's nodes are contenders of the
    /// same read-write lock, sorted by their shared sequence).
    fn sequence(self, name: &str) -> Option<i64> {
        let seq = match self {
            Recipe::Mutex => name.rsplit_once(LOCK_NAME)?.1,
            Recipe::Lease => name.rsplit_once(LEASE_NAME)?.1,
            Recipe::Read | Recipe::Write => {
                let at = name.rfind(READ_NAME).or_else(|| name.rfind(WRITE_NAME))?;
                &name[at + READ_NAME.len()..]
            }
        };
        seq.parse().ok()
    }
}

/// Runs one request with the request timeout; a timeout is
/// [`Error::Unavailable`].
pub(crate) async fn bounded<T>(
    timeout: Duration,
    request: impl Future<Output = std::result::Result<T, zookeeper_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(Error::unavailable(
            BACKEND,
            format!("no answer from zookeeper within {timeout:?}"),
        )),
    }
}

/// The sequence number of a lock node name (of any recipe), if it is one.
pub(crate) fn sequence(name: &str) -> Option<i64> {
    Recipe::Mutex
        .sequence(name)
        .or_else(|| Recipe::Read.sequence(name))
        .or_else(|| Recipe::Lease.sequence(name))
}

/// The mutex's lock nodes among `children`, in sequence order.
pub(crate) fn contenders(children: Vec<String>) -> Vec<String> {
    contenders_of(Recipe::Mutex, children)
}

/// `recipe`'s nodes among `children`, in sequence order.
pub(crate) fn contenders_of(recipe: Recipe, mut children: Vec<String>) -> Vec<String> {
    children.retain(|c| recipe.sequence(c).is_some());
    children.sort_by_key(|c| recipe.sequence(c).unwrap_or(i64::MAX));
    children
}

/// Creates our lock node under `dir` (creating `dir` as needed). Returns the
/// node's name and its `czxid`.
pub(crate) async fn create(
    client: &Client,
    recipe: Recipe,
    dir: &str,
    uuid: &str,
    data: &[u8],
    acls: Acls<'static>,
    timeout: Duration,
) -> Result<(String, i64)> {
    let infix = recipe.infix();
    let prefix = format!("{dir}/_c_{uuid}{infix}");
    for _ in 0..5 {
        let created = tokio::time::timeout(
            timeout,
            client.create(&prefix, data, &CreateMode::EphemeralSequential.with_acls(acls)),
        )
        .await;
        match created {
            Ok(Ok((stat, seq))) => return Ok((format!("_c_{uuid}{infix}{seq}"), stat.czxid)),
            Ok(Err(zookeeper_client::Error::NoNode)) => {
                let parents = CreateMode::Container.with_acls(Acls::anyone_all());
                bounded(timeout, client.mkdir(dir, &parents)).await?;
            }
            // The create may have happened: look for our node by its uuid.
            Ok(Err(zookeeper_client::Error::ConnectionLoss)) | Err(_) => {
                if let Some(found) = find_own(client, dir, uuid, timeout).await? {
                    return Ok(found);
                }
            }
            Ok(Err(e)) => return Err(map_err(e)),
        }
    }
    Err(Error::unavailable(
        BACKEND,
        format!("could not create a lock node under {dir}"),
    ))
}

/// Our node under `dir`, found by uuid (after a lost create).
pub(crate) async fn find_own(
    client: &Client,
    dir: &str,
    uuid: &str,
    timeout: Duration,
) -> Result<Option<(String, i64)>> {
    let children = match tokio::time::timeout(timeout, client.list_children(dir)).await {
        // No directory: no node of ours. Anything else is an error (a
        // clean-up must retry it, not conclude there is nothing to delete).
        Ok(Err(zookeeper_client::Error::NoNode)) => return Ok(None),
        Ok(r) => r.map_err(map_err)?,
        Err(_) => return Err(Error::unavailable(BACKEND, "no answer while listing")),
    };
    // The uuid is ours alone, whatever the recipe.
    let marker = format!("_c_{uuid}-");
    for name in children.into_iter().filter(|c| c.starts_with(&marker)) {
        if let Some(stat) = bounded(timeout, client.check_stat(&format!("{dir}/{name}"))).await? {
            return Ok(Some((name, stat.czxid)));
        }
    }
    Ok(None)
}

/// What looking at the queue found.
pub(crate) enum Place {
    /// Our node comes first: we hold the lock.
    First,
    /// Our node is not there any more (session expired, or deleted).
    Gone,
    /// This node is right before ours.
    After(String),
}

/// Where our node `me` stands among the contenders of `dir`: a mutex's or
/// a writer's node holds when it is first and watches its immediate
/// predecessor; a reader's holds when no writer's node comes before it, and
/// watches the first writer's (Curator's `readLockPredicate`).
pub(crate) async fn place(
    client: &Client,
    recipe: Recipe,
    dir: &str,
    me: &str,
    timeout: Duration,
) -> Result<Place> {
    let queue = contenders_of(recipe, bounded(timeout, client.list_children(dir)).await?);
    Ok(place_in(recipe, &queue, me))
}

/// [`place`] in a sorted queue.
pub(crate) fn place_in(recipe: Recipe, queue: &[String], me: &str) -> Place {
    let Some(mine) = queue.iter().position(|c| c == me) else {
        return Place::Gone;
    };
    if recipe == Recipe::Read {
        return match queue[..mine].iter().find(|c| c.contains(WRITE_NAME)) {
            None => Place::First,
            Some(writer) => Place::After(writer.clone()),
        };
    }
    match mine {
        0 => Place::First,
        i => Place::After(queue[i - 1].clone()),
    }
}

/// Waits until our node `me` is first under `dir`: watches the immediate
/// predecessor until it changes, then looks again. Returns when the look
/// that found us first was sent (the server answered it: the session lived).
///
/// # Errors
///
/// [`Error::Lost`] (with `key`) if our node disappears while we wait.
///
/// # Cancel safety
///
/// Cancel safe: dropping it drops the watch.
pub(crate) async fn wait_first(
    client: &Client,
    recipe: Recipe,
    dir: &str,
    me: &str,
    key: &str,
    timeout: Duration,
) -> Result<std::time::Instant> {
    let mut queued = false;
    loop {
        let sent = std::time::Instant::now();
        match place(client, recipe, dir, me, timeout).await? {
            Place::First => return Ok(sent),
            Place::Gone => return Err(Error::Lost { key: key.to_owned() }),
            Place::After(predecessor) => {
                if !std::mem::replace(&mut queued, true) {
                    dlock_core::trace::queued();
                }
                let path = format!("{dir}/{predecessor}");
                match tokio::time::timeout(timeout, client.get_and_watch_data(&path)).await {
                    Ok(Ok((_, _, watcher))) => {
                        watched(watcher).await?;
                    }
                    Ok(Err(zookeeper_client::Error::NoNode)) => {}
                    Ok(Err(e)) => return Err(map_err(e)),
                    Err(_) => return Err(Error::unavailable(BACKEND, "no answer while setting a watch")),
                }
            }
        }
    }
}

/// Waits for a one-time watch's event.
///
/// # Errors
///
/// [`Error::Unavailable`] when zookeeper-client's own task went (its
/// runtime shut down) before the event came: its `changed()` panics then
/// (the event's sender is gone), which is caught here, as the server out
/// of reach rather than a bug of the caller's.
///
/// # Cancel safety
///
/// Cancel safe: dropping it drops the watcher.
pub(crate) async fn watched(
    watcher: zookeeper_client::OneshotWatcher,
) -> Result<zookeeper_client::WatchedEvent> {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(watcher.changed())
        .catch_unwind()
        .await
        .map_err(|_| {
            Error::unavailable(
                BACKEND,
                "the ZooKeeper client's task is gone (its runtime shut down)",
            )
        })
}

/// What a semaphore's leases directory says about ours.
pub(crate) enum Fit {
    /// At most `limit` leases: ours hold.
    Yes,
    /// One of ours is gone (session expired, or deleted).
    Gone,
    /// Too many: this watch fires when the leases change.
    No(zookeeper_client::OneshotWatcher),
}

/// Whether our leases `mine` in `dir` are among at most `limit` leases.
pub(crate) async fn leases_fit(
    client: &Client,
    dir: &str,
    mine: &[String],
    limit: u32,
    timeout: Duration,
) -> Result<Fit> {
    let (children, watcher) = bounded(timeout, client.list_and_watch_children(dir)).await?;
    // Only leases count (Curator counts every child, so it is stricter,
    // never looser): another lock's nodes under this directory hold no
    // permit.
    let leases: std::collections::HashSet<&str> = children
        .iter()
        .filter(|c| c.starts_with("_c_") && Recipe::Lease.sequence(c).is_some())
        .map(String::as_str)
        .collect();
    if !mine.iter().all(|m| leases.contains(m.as_str())) {
        return Ok(Fit::Gone);
    }
    Ok(if leases.len() <= limit as usize {
        Fit::Yes
    } else {
        Fit::No(watcher)
    })
}

/// The children of `dir` (none if it does not exist).
async fn children_of(client: &Client, dir: &str, timeout: Duration) -> Result<Vec<String>> {
    match tokio::time::timeout(timeout, client.list_children(dir)).await {
        Ok(Err(zookeeper_client::Error::NoNode)) => Ok(Vec::new()),
        Ok(r) => r.map_err(map_err),
        Err(_) => Err(Error::unavailable(BACKEND, "no answer while listing")),
    }
}

/// A node's data and stat (`None` if it is gone).
async fn read_node(client: &Client, path: &str, timeout: Duration) -> Result<Option<(Vec<u8>, Stat)>> {
    match tokio::time::timeout(timeout, client.get_data(path)).await {
        Ok(Ok(found)) => Ok(Some(found)),
        Ok(Err(zookeeper_client::Error::NoNode)) => Ok(None),
        Ok(Err(e)) => Err(map_err(e)),
        Err(_) => Err(Error::unavailable(BACKEND, "no answer while reading")),
    }
}

/// Every node under the name's directory `dir` that holds now, with what
/// it holds: the mutex's first node; the read-write lock's first node if
/// it is a writer's, else its readers before the first writer; the
/// semaphore's leases (one permit each, as Curator's), except the waiter's
/// ([`waiting_lease`]). Each as (role, full path, data, stat).
pub(crate) async fn holding(
    client: &Client,
    dir: &str,
    timeout: Duration,
) -> Result<Vec<(dlock_core::Role, String, Vec<u8>, Stat)>> {
    use dlock_core::Role;
    let children = children_of(client, dir, timeout).await?;
    let mut candidates: Vec<(Role, String)> = Vec::new();
    if let Some(first) = contenders_of(Recipe::Mutex, children.clone()).into_iter().next() {
        candidates.push((Role::Mutex, format!("{dir}/{first}")));
    }
    let rw = contenders_of(Recipe::Read, children);
    for (i, name) in rw.iter().enumerate() {
        let writer = name.contains(WRITE_NAME);
        if writer && i == 0 {
            candidates.push((Role::Write, format!("{dir}/{name}")));
        }
        if writer {
            break;
        }
        candidates.push((Role::Read, format!("{dir}/{name}")));
    }
    // The waiter holding `{dir}/locks`: its node's session and czxid.
    let locks = format!("{dir}/{SEMAPHORE_LOCKS}");
    let mut waiter = None;
    for first in contenders(children_of(client, &locks, timeout).await?) {
        if let Some((_, stat)) = read_node(client, &format!("{locks}/{first}"), timeout).await? {
            waiter = Some(stat);
            break;
        }
    }
    let leases = format!("{dir}/{SEMAPHORE_LEASES}");
    for name in contenders_of(Recipe::Lease, children_of(client, &leases, timeout).await?) {
        candidates.push((Role::Permits(1), format!("{leases}/{name}")));
    }
    let mut found = Vec::new();
    for (role, path) in candidates {
        let Some((data, stat)) = read_node(client, &path, timeout).await? else {
            continue;
        };
        let waits = role == Role::Permits(1) && waiter.as_ref().is_some_and(|w| waiting_lease(w, &stat));
        if !waits {
            found.push((role, path, data, stat));
        }
    }
    Ok(found)
}

/// Whether a lease (`lease`, its stat) is the waiter's whose node is first
/// in the semaphore's `locks` mutex (`mutex`, its stat): made by the same
/// session after that node. A waiter, Curator's or ours, creates its leases
/// while it holds that mutex, and only then; a lease its session made
/// before (an earlier grant it still holds) is older than the node. The
/// lease may also be a moment from holding (it fits and its mutex is about
/// to go): it is left out until it does.
///
/// (Recognising a waiter's lease by a tag in its data, as dlock once did,
/// missed Curator's waiters: Curator writes the client's address there.)
pub(crate) fn waiting_lease(mutex: &Stat, lease: &Stat) -> bool {
    lease.ephemeral_owner != 0 && lease.ephemeral_owner == mutex.ephemeral_owner && lease.czxid > mutex.czxid
}

/// Deletes our node; [`Refusal::Expired`] if it was already gone (our
/// node's path is ours alone: nobody else's node can be there).
pub(crate) async fn delete(client: &Client, path: &str, timeout: Duration) -> Result<Outcome> {
    match tokio::time::timeout(timeout, client.delete(path, None)).await {
        Ok(Ok(())) => Ok(Ok(())),
        Ok(Err(zookeeper_client::Error::NoNode)) => Ok(Err(Refusal::Expired)),
        Ok(Err(e)) => Err(map_err(e)),
        Err(_) => Err(Error::unavailable(BACKEND, "no answer while deleting")),
    }
}

/// Connects a new session (a detached one: dropping the last handle does
/// not close it).
pub(crate) async fn connect(config: &ZkConfig) -> Result<Client> {
    let mut connector = Client::connector()
        .with_session_timeout(config.session_timeout)
        // Also how long the library waits for a silent server before it
        // reconnects: at most 3/10 of the session, so a short outage
        // (detected, one failed attempt, reconnected) heals before the
        // session's own deadline at 9/10.
        .with_connection_timeout(config.connect_timeout.min(config.session_timeout * 3 / 10))
        // Dropping the last handle must not close the session: a crash is
        // simulated that way (`abandon`), and a closed session would look
        // like a clean release to everyone else.
        .with_detached();
    if let (Some(user), Some(password)) = (&config.user, &config.password) {
        connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
    }
    // Where, for messages: the servers, without the chroot.
    let where_ = config.connect.split('/').next().unwrap_or_default().to_owned();
    match tokio::time::timeout(config.connect_timeout, connector.connect(&config.connect)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(match map_err(e) {
            Error::Backend { source, .. } => Error::Unavailable {
                backend: BACKEND,
                source,
            },
            other => other,
        }
        .at(&where_)),
        Err(_) => Err(Error::unavailable(
            BACKEND,
            dlock_core::Unreachable::because(
                &where_,
                format!("no server answered within {:?}", config.connect_timeout),
            ),
        )),
    }
}

/// A sync of the root: it goes through the leader, so an answer means the
/// ensemble (not just a member cut off from it) still hears this session.
pub(crate) async fn sync(client: &Client, timeout: Duration) -> Result<()> {
    bounded(timeout, client.sync("/")).await
}

/// Every lock node (`_c_…-lock-…`) in the tree under `start`, sorted.
pub(crate) async fn lock_nodes_under(
    client: &Client,
    start: String,
    timeout: Duration,
) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let mut stack = vec![start];
    while let Some(dir) = stack.pop() {
        let children = match tokio::time::timeout(timeout, client.list_children(&dir)).await {
            Ok(Ok(c)) => c,
            Ok(Err(zookeeper_client::Error::NoNode)) => continue,
            Ok(Err(e)) => return Err(map_err(e)),
            Err(_) => return Err(Error::unavailable(BACKEND, "no answer while listing")),
        };
        for child in children {
            let path = format!("{dir}/{child}");
            if sequence(&child).is_some() && child.starts_with("_c_") {
                found.push(path);
            } else {
                stack.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The lock name a node (its path under the root) belongs to:
/// `NAME/_c_…` (a mutex, a read-write lock), `NAME/locks/_c_…` or
/// `NAME/leases/_c_…` (a semaphore).
pub(crate) fn name_of(node: &str) -> Option<&str> {
    let (dir, _) = node.rsplit_once('/')?;
    Some(
        dir.strip_suffix(&format!("/{SEMAPHORE_LOCKS}"))
            .or_else(|| dir.strip_suffix(&format!("/{SEMAPHORE_LEASES}")))
            .unwrap_or(dir),
    )
}

/// Whether our node is still there and still ours (the same `czxid`), read
/// after a sync through the leader: a member cut off from it would answer
/// from what it last knew.
pub(crate) async fn still_ours(client: &Client, path: &str, czxid: i64, timeout: Duration) -> Result<bool> {
    bounded(timeout, client.sync(path)).await?;
    let exists = bounded(timeout, client.check_stat(path)).await?;
    Ok(exists.is_some_and(|s| s.czxid == czxid))
}

/// Resolves when the node at `path` is deleted (by anyone), through
/// `client()`'s client; pending while no client can be had (the session's
/// own signal covers expiry). No client is kept across the wait: an
/// abandoned handle must drop its connection (that is how a crash is
/// simulated).
pub(crate) async fn node_deleted(client: impl Fn() -> Option<Client>, path: &str) {
    loop {
        let Some(c) = client() else {
            return std::future::pending().await;
        };
        let looked = c.check_and_watch_stat(path).await;
        drop(c);
        match looked {
            Ok((None, _)) => return,
            Ok((Some(_), watcher)) => match watched(watcher).await {
                Ok(event) if event.event_type == zookeeper_client::EventType::NodeDeleted => return,
                Ok(_) => {}
                // The client is gone with its runtime: the guards' task
                // goes with it.
                Err(_) => return std::future::pending().await,
            },
            Err(zookeeper_client::Error::NoNode) => return,
            // Connection trouble: look again shortly (the session signal
            // reports expiry).
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Curator's read-write predicates: a writer must be first; a reader
    /// holds unless a writer comes before it, and then watches the first.
    #[test]
    fn read_write_places_follow_curator() {
        let queue = contenders_of(
            Recipe::Read,
            vec![
                "_c_w2-__WRIT__0000000004".to_owned(),
                "_c_r1-__READ__0000000001".to_owned(),
                "_c_m-lock-0000000000".to_owned(),
                "_c_r2-__READ__0000000002".to_owned(),
                "_c_w1-__WRIT__0000000003".to_owned(),
                "_c_r3-__READ__0000000005".to_owned(),
            ],
        );
        assert_eq!(queue.len(), 5, "a mutex node is not a read-write contender");
        let first = |p: Place| matches!(p, Place::First);
        let after = |p: Place| match p {
            Place::After(n) => n,
            _ => String::new(),
        };
        assert!(first(place_in(Recipe::Read, &queue, "_c_r1-__READ__0000000001")));
        assert!(first(place_in(Recipe::Read, &queue, "_c_r2-__READ__0000000002")));
        assert_eq!(
            after(place_in(Recipe::Write, &queue, "_c_w1-__WRIT__0000000003")),
            "_c_r2-__READ__0000000002"
        );
        assert_eq!(
            after(place_in(Recipe::Write, &queue, "_c_w2-__WRIT__0000000004")),
            "_c_w1-__WRIT__0000000003"
        );
        assert_eq!(
            after(place_in(Recipe::Read, &queue, "_c_r3-__READ__0000000005")),
            "_c_w1-__WRIT__0000000003"
        );
        assert!(matches!(
            place_in(Recipe::Read, &queue, "_c_gone-__READ__0000000009"),
            Place::Gone
        ));
    }

    /// A waiter's lease: its session's, made after its node in `locks`.
    #[test]
    fn a_waiters_lease_is_its_sessions_after_its_mutex_node() {
        let stat = |owner: i64, czxid: i64| Stat {
            czxid,
            mzxid: czxid,
            pzxid: czxid,
            ctime: 0,
            mtime: 0,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner: owner,
            data_length: 0,
            num_children: 0,
        };
        let mutex = stat(7, 100);
        assert!(waiting_lease(&mutex, &stat(7, 101)));
        // Held: made before the node (an earlier grant of the same session).
        assert!(!waiting_lease(&mutex, &stat(7, 99)));
        // Another session's.
        assert!(!waiting_lease(&mutex, &stat(8, 101)));
        // Not ephemeral.
        assert!(!waiting_lease(&stat(0, 100), &stat(0, 101)));
    }

    #[test]
    fn sorts_curator_names_by_sequence() {
        let names = vec![
            "_c_b-lock-0000000003".to_owned(),
            "unrelated".to_owned(),
            "_c_a-lock-0000000001".to_owned(),
            "_c_c-lock-0000000002".to_owned(),
        ];
        assert_eq!(
            contenders(names),
            [
                "_c_a-lock-0000000001",
                "_c_c-lock-0000000002",
                "_c_b-lock-0000000003"
            ]
        );
        assert_eq!(sequence("_c_x-lock-0000000042"), Some(42));
        assert_eq!(sequence("_c_x-__READ__0000000043"), Some(43));
        assert_eq!(sequence("_c_x-__WRIT__0000000044"), Some(44));
        assert_eq!(sequence("_c_x-lease-0000000045"), Some(45));
        assert_eq!(sequence("lock-x"), None);
    }
}
