//! [`ZkLock`]: sessions, keys to paths, acquiring.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dlock_core::{
    AcquireOptions, Capabilities, Claim, Error, Fencing, Holder, Lock, LockKey, Result, Wait, Waiting,
};
use zookeeper_client::Acls;

use crate::config::{ZkAcl, ZkConfig};
use crate::error::BACKEND;
use crate::guard::ZkGuard;
use crate::protocol::{self, Recipe};
use crate::session::{Session, delete_in_background};
use dlock_core::driver::{OnDrop, queue};

/// A lock backend on ZooKeeper. Cheap to clone (clones share the session).
///
/// # Sessions and TTLs
///
/// One ZooKeeper session per `ZkLock`, opened at connect and again after it
/// expires. A lock node is ephemeral: it lives as long as the session, so
/// with `auto_extend` (the default) a guard holds until released, and a
/// crashed holder's lock is freed when its session expires (the
/// `session_timeout` of [`ZkConfig`], as negotiated with the server). The
/// TTL of `AcquireOptions` is then not used.
///
/// Without `auto_extend` the guard gives the lock up itself after its TTL
/// (deleting its node and firing `lost()`), as the contract says; `extend`
/// moves that deadline.
///
/// While the connection is down (Curator's SUSPENDED) `is_held()` is false:
/// the holder cannot be sure; it turns true again if the connection comes
/// back soon enough. `lost()` fires no later than the moment the server may
/// expire the session and grant the lock to someone else: the session keeps
/// its own deadline, the send time of the last request the server answered
/// (a `sync` heartbeat every tenth of the session timeout) plus the timeout,
/// minus a tenth of it. The client library would report the expiry (LOST)
/// only at 7/5 of the timeout, after the server may already have granted the
/// lock elsewhere. A guard lost that way deletes its node in the background
/// if the session survived; the handle opens a new session for later
/// acquires. Tested: a holder cut off for 1.5x the session is `lost()`
/// before a waiter is granted (`tests/zk.rs`), and the safety run cuts a
/// client off for 1.5x the session while it holds (`tests/safety.rs`).
///
/// In an ensemble, the member a client talks to reports the client's
/// requests to the leader on its pings, every half tick; the margin (a tenth
/// of the timeout) assumes half a `tickTime` is no longer than that
/// (ZooKeeper's default `tickTime` of 2 s and this crate's default 10 s
/// session meet it exactly; shorter sessions need a shorter `tickTime`).
/// Not tested against a partition between members: the launcher's
/// ensemble shares one loopback network.
#[derive(Clone)]
pub struct ZkLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ZkConfig,
    session: tokio::sync::Mutex<Arc<Session>>,
    abandoned: Arc<AtomicBool>,
    host: String,
}

impl ZkLock {
    /// Connects a session.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] as [`ZkConfig::validate`], or refused
    ///   credentials;
    /// - [`Error::Unavailable`] if no server answers within `connect_timeout`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the half-built client.
    pub async fn connect(config: ZkConfig) -> Result<Self> {
        config.validate()?;
        let abandoned = Arc::new(AtomicBool::new(false));
        let session = Session::open(&config, Arc::clone(&abandoned)).await?;
        Ok(ZkLock {
            inner: Arc::new(Inner {
                config,
                session: tokio::sync::Mutex::new(session),
                abandoned,
                host: dlock_core::driver::host_name(),
            }),
        })
    }

    /// The configuration this handle was connected with.
    pub fn config(&self) -> &ZkConfig {
        &self.inner.config
    }

    /// The live session, opening a new one if the last one expired or is
    /// past its own deadline (the server may have expired it; its guards
    /// were told `lost()`, and it ends by itself).
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        if self.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this ZkLock was abandoned"));
        }
        let mut current = self.inner.session.lock().await;
        if self.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this ZkLock was abandoned"));
        }
        if !current.alive() || current.deadline() <= Instant::now() {
            *current = Session::open(&self.inner.config, Arc::clone(&self.inner.abandoned)).await?;
        }
        Ok(Arc::clone(&current))
    }

    /// The directory of lock `key`: `{root}/{key}`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for a key ZooKeeper cannot store as a path: an
    /// empty segment (`a//b`, a leading or trailing `/`), a `.` or `..`
    /// segment, or a character ZooKeeper forbids in names.
    pub fn lock_path(&self, key: &LockKey) -> Result<String> {
        let name = key.as_str();
        let bad_segment = name.split('/').find(|s| s.is_empty() || *s == "." || *s == "..");
        let bad_char = name
            .chars()
            .find(|&c| ('\u{e000}'..='\u{f8ff}').contains(&c) || ('\u{fff0}'..='\u{ffff}').contains(&c));
        if let Some(s) = bad_segment {
            return Err(Error::InvalidKey {
                reason: format!("{name:?} has the path segment {s:?}, which ZooKeeper cannot store"),
            });
        }
        if let Some(c) = bad_char {
            return Err(Error::InvalidKey {
                reason: format!("{name:?} has {c:?}, which ZooKeeper forbids in node names"),
            });
        }
        // A deeper segment is a child node of the lock directory above it:
        // named like a lock node, it would count as a contender there.
        let infixes = [protocol::LOCK_NAME, protocol::READ_NAME, protocol::WRITE_NAME];
        if let Some((s, infix)) = name
            .split('/')
            .skip(1)
            .find_map(|s| infixes.iter().find(|i| s.contains(*i)).map(|i| (s, i)))
        {
            return Err(Error::InvalidKey {
                reason: format!(
                    "{name:?} has the path segment {s:?}: under another lock's directory it would look like a contender ({infix:?})"
                ),
            });
        }
        Ok(format!("{}/{name}", self.inner.config.root))
    }

    /// The lock nodes (holders and waiters, full paths: a mutex's,
    /// a read-write lock's, a semaphore's `locks` nodes and leases) of every lock whose
    /// name starts with `namespace` and ends at a `/` boundary: everything
    /// under `{root}/{namespace}` when `namespace` ends with `/`: what
    /// ZooKeeper keeps, node by node (the names are
    /// [`keys_in_use`](Lock::keys_in_use)).
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when ZooKeeper fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    pub async fn contenders(&self, namespace: &str) -> Result<Vec<String>> {
        let client = self.session().await?.client()?;
        let timeout = self.inner.config.request_timeout;
        let start = match namespace.trim_end_matches('/') {
            "" => self.inner.config.root.clone(),
            ns => format!("{}/{ns}", self.inner.config.root),
        };
        protocol::lock_nodes_under(&client, start, timeout).await
    }

    pub(crate) fn is_abandoned(&self) -> bool {
        self.inner.abandoned.load(Ordering::SeqCst)
    }

    fn acls(&self) -> Acls<'static> {
        match self.inner.config.acl {
            ZkAcl::AnyoneAll => Acls::anyone_all(),
            ZkAcl::CreatorAll => Acls::creator_all(),
        }
    }

    fn data(&self) -> Vec<u8> {
        dlock_core::driver::owner_detail(&self.inner.host).into_bytes()
    }
}

/// Finds our node by uuid (the create's reply was not seen) and deletes
/// it, in the background, retrying as [`delete_in_background`].
fn delete_own_in_background(session: &Arc<Session>, dir: String, uuid: String) {
    if session.is_abandoned() {
        return;
    }
    let timeout = session.request_timeout;
    let (session, gone_session) = (Arc::clone(session), Arc::clone(session));
    dlock_core::driver::clean_up_in_background(
        format!("zookeeper: delete the node of {uuid} under {dir}"),
        None,
        move || gone_session.is_abandoned() || !gone_session.alive(),
        move || {
            let (session, dir, uuid) = (Arc::clone(&session), dir.clone(), uuid.clone());
            async move {
                let client = session.client()?;
                if let Some((name, _)) = protocol::find_own(&client, &dir, &uuid, timeout).await? {
                    // Already gone is done too.
                    let _gone = protocol::delete(&client, &format!("{dir}/{name}"), timeout).await?;
                }
                Ok(())
            }
        },
    );
}

/// Our sequential node in the queue of `dir`.
struct Node<'a> {
    client: &'a zookeeper_client::Client,
    recipe: Recipe,
    dir: &'a str,
    name: &'a str,
    path: &'a str,
    key: &'a str,
    timeout: std::time::Duration,
}

impl queue::Place for Node<'_> {
    /// Waits until our node comes first (by the recipe's rule), watching
    /// the node before it.
    async fn wait_turn(&self) -> Result<bool> {
        protocol::wait_first(
            self.client,
            self.recipe,
            self.dir,
            self.name,
            self.key,
            self.timeout,
        )
        .await
        .map(|_| true)
    }

    /// Deletes our node.
    async fn withdraw(&self) -> Result<()> {
        protocol::delete(self.client, self.path, self.timeout)
            .await
            .map(drop)
    }
}

impl std::fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkLock")
            .field("config", &self.inner.config)
            .field("abandoned", &self.is_abandoned())
            .finish()
    }
}

impl Lock for ZkLock {
    type Guard = ZkGuard;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    /// Strict fencing (czxid), FIFO, notified; the shortest TTL is the
    /// session timeout: a crashed holder is freed no sooner.
    fn capabilities(&self) -> Capabilities {
        let timeout = self
            .inner
            .session
            .try_lock()
            .ok()
            .and_then(|s| s.timeout())
            .unwrap_or(self.inner.config.session_timeout);
        Capabilities::new(Fencing::Strict, true, Waiting::Notified, timeout)
            .with_read_write()
            .with_semaphores()
            .with_holders()
    }

    /// See [`Lock::abandon`].
    /// Drops the connection without closing the session or deleting
    /// anything, as if this process had died: the server deletes this
    /// handle's nodes when the session times out.
    ///
    /// # Cancel safety
    ///
    /// Nothing is awaited: the handle is marked abandoned at once, and the
    /// current session's connection dropped at once; a session being opened
    /// meanwhile (or kept by a guard) drops its connection at its first use
    /// after, its heartbeat's at the latest.
    async fn abandon(&self) {
        self.inner.abandoned.store(true, Ordering::SeqCst);
        if let Ok(session) = self.inner.session.try_lock() {
            session.abandon();
        }
    }

    /// See [`Lock::keys_in_use`]: the names with a node, a holder's or a
    /// waiter's, of any layout (mutex, read-write lock, semaphore; a name
    /// ending in `/locks` or `/leases` reads as the semaphore's).
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when ZooKeeper fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    async fn keys_in_use(&self, prefix: &str) -> Result<Vec<String>> {
        // The deepest directory every such name is under.
        let dir = prefix.rsplit_once('/').map_or("", |(dir, _)| dir);
        let root = format!("{}/", self.inner.config.root);
        let nodes = self.contenders(dir).await?;
        Ok(dlock_core::driver::names(
            nodes
                .iter()
                .filter_map(|n| n.strip_prefix(root.as_str()))
                .filter_map(protocol::name_of)
                .filter(|name| name.starts_with(prefix)),
        ))
    }

    /// See [`Lock::holders`]: every holder of anything named `key`: the
    /// mutex's first node, the read-write lock's writer or readers, the
    /// semaphore's leases (one permit each, as Curator's semaphore counts
    /// them; a waiter's are left out). `id` is the node's full path,
    /// `token` its `czxid`, `detail` its data (`host pid unix-ms` when
    /// dlock wrote it). A node lives as long as its session: `remaining`
    /// is `None`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] as [`ZkLock::lock_path`];
    /// [`Error::Unavailable`] / [`Error::Backend`] when ZooKeeper fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    async fn holders(&self, key: &LockKey) -> Result<Vec<Holder>> {
        let dir = self.lock_path(key)?;
        let client = self.session().await?.client()?;
        let found = protocol::holding(&client, &dir, self.inner.config.request_timeout).await?;
        Ok(found
            .into_iter()
            .map(|(role, node, data, stat)| {
                let detail = String::from_utf8_lossy(&data).into_owned();
                Holder {
                    role,
                    id: node,
                    since: dlock_core::driver::Owner::from_detail(&detail).and_then(|o| o.since()),
                    detail,
                    token: u64::try_from(stat.czxid).ok(),
                    remaining: None,
                }
            })
            .collect())
    }

    /// See [`Lock::grant`]: Curator's recipes (see the crate docs), which
    /// Curator clients and this crate share. The token is our node's
    /// `czxid` (for permits, the first lease's).
    ///
    /// - **Mutex** ([`Claim::Mutex`]): `InterProcessMutex`.
    /// - **Read** ([`Claim::Read`]): `InterProcessReadWriteLock`, reading (a
    ///   `_c_{uuid}-__READ__{sequence}` node in the name's directory; it
    ///   holds when no writer's node comes before it, and watches the first
    ///   writer's).
    /// - **Write** ([`Claim::Write`]): `InterProcessReadWriteLock`, writing (a
    ///   `_c_{uuid}-__WRIT__{sequence}` node; it holds when first among
    ///   readers' and writers' nodes, and watches its immediate
    ///   predecessor).
    /// - **Permits** ([`Claim::Permits`]): `InterProcessSemaphoreV2`. While it waits, the
    ///   acquire holds the mutex `{name}/locks` (so waiters are served in
    ///   order); it creates one lease `{name}/leases/_c_{uuid}-lease-{sequence}`
    ///   per permit and holds when the leases directory has at most `limit`
    ///   children (watching it otherwise), then gives the mutex back.
    ///   Curator clients with the same limit and this crate share the
    ///   count. Only lease nodes count (Curator counts every child of the
    ///   leases directory: stricter, never looser). The mutex
    ///   `{name}/locks` is this semaphore's: do not name another lock so.
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] when the wait ran out (our node is deleted first);
    /// - [`Error::Lost`] when our node vanished while we waited (the session
    ///   expired);
    /// - [`Error::Unavailable`] when ZooKeeper cannot be reached or has no
    ///   quorum; [`Error::InvalidKey`] as [`ZkLock::lock_path`];
    /// - [`Error::InvalidConfig`] for more than 1024 permits at once (a
    ///   node each). With [`Wait::No`] a call for permits is refused while
    ///   another acquirer holds the `locks` mutex, even with permits free
    ///   (Curator does the same).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call deletes its nodes (and, for permits, its
    /// mutex node) in the background (found by uuid if the create's reply
    /// was not seen); session expiry is the backstop.
    async fn grant(&self, key: &LockKey, claim: Claim, opts: AcquireOptions) -> Result<ZkGuard> {
        match claim {
            Claim::Mutex => self.take(Recipe::Mutex, key, opts).await,
            Claim::Read => self.take(Recipe::Read, key, opts).await,
            Claim::Write => self.take(Recipe::Write, key, opts).await,
            Claim::Permits { count, .. } if count > MAX_PERMITS_AT_ONCE => {
                Err(Error::InvalidConfig(format!(
                    "zookeeper takes at most {MAX_PERMITS_AT_ONCE} permits in one grant (one node each), not {count}"
                )))
            }
            Claim::Permits { count, limit } => self.take_permits(key, count, limit, opts).await,
        }
    }
}

/// The most permits one zk grant takes (a lease node each).
const MAX_PERMITS_AT_ONCE: u32 = 1024;

impl ZkLock {
    /// `count` leases of the semaphore `key`, at most `limit` in all.
    ///
    /// A waiter holds the semaphore's `locks` mutex while its leases wait,
    /// so that no second waiter adds leases that together with ours could
    /// never fit. If that mutex node goes while we wait (an operator's
    /// delete, a silent spell that ends just short of the session timeout)
    /// we give our leases back and start again, within the same wait:
    /// otherwise two waiters whose counts do not fit together would wait on
    /// each other forever.
    async fn take_permits(
        &self,
        key: &LockKey,
        count: u32,
        limit: u32,
        opts: AcquireOptions,
    ) -> Result<ZkGuard> {
        let started = Instant::now();
        loop {
            if let Some(guard) = self.take_permits_once(key, count, limit, opts, started).await? {
                return Ok(guard);
            }
        }
    }

    /// One try of [`take_permits`](Self::take_permits): `None` when the
    /// `locks` mutex went while we waited (our leases are given back).
    async fn take_permits_once(
        &self,
        key: &LockKey,
        count: u32,
        limit: u32,
        opts: AcquireOptions,
        started: Instant,
    ) -> Result<Option<ZkGuard>> {
        let dir = self.lock_path(key)?;
        let leases = format!("{dir}/{}", protocol::SEMAPHORE_LEASES);
        let mutex_key = LockKey::new(format!("{}/{}", key.as_str(), protocol::SEMAPHORE_LOCKS))?;
        let timed_out = || Error::Timeout {
            key: key.as_str().to_owned(),
        };
        // What is left of the caller's wait (a try after the mutex went
        // starts its clock where the first did).
        let left = match opts.wait {
            Wait::For(d) => Wait::For(d.saturating_sub(started.elapsed())),
            other => other,
        };
        // The mutex is ours only while we wait: kept by the session.
        let mutex = self
            .take(Recipe::Mutex, &mutex_key, opts.auto_extend(true).wait(left))
            .await
            .map_err(|e| match e {
                Error::Timeout { .. } => timed_out(),
                e => e,
            })?;
        let session = Arc::clone(&mutex.session);
        let client = session.client()?;
        let timeout = self.inner.config.request_timeout;
        // Leases of an acquire that ends without a grant go (by uuid while
        // a create's reply is not in).
        let mut cleanup = OnDrop::new(Vec::<(String, Option<String>)>::new(), |made| {
            for (uuid, name) in made {
                match name {
                    Some(name) => delete_in_background(&session, format!("{leases}/{name}")),
                    None => delete_own_in_background(&session, leases.clone(), uuid),
                }
            }
        });
        let mut mine = Vec::new();
        let mut czxids = Vec::new();
        // Each lease names the mutex node it was made under, for operators
        // (the views tell a waiter's leases by session and czxid:
        // `protocol::waiting_lease`, which Curator's waiters meet too).
        let mutex_node = mutex.node().rsplit('/').next().unwrap_or_default().to_owned();
        let mut data = self.data();
        data.extend_from_slice(format!(" {}{mutex_node}", protocol::LEASE_UNDER).as_bytes());
        for _ in 0..count {
            let uuid = uuid::Uuid::new_v4().to_string();
            cleanup.state_mut().push((uuid.clone(), None));
            let sent = Instant::now();
            let (name, czxid) = protocol::create(
                &client,
                Recipe::Lease,
                &leases,
                &uuid,
                &data,
                self.acls(),
                timeout,
            )
            .await?;
            session.answered(sent);
            if let Some(last) = cleanup.state_mut().last_mut() {
                last.1 = Some(name.clone());
            }
            mine.push(name);
            czxids.push(czxid);
        }
        let mutex_path = mutex.node().to_owned();
        // Ok(false): the mutex went while we waited.
        let waited: Result<bool> = async {
            loop {
                match protocol::leases_fit(&client, &leases, &mine, limit, timeout).await? {
                    protocol::Fit::Yes => return Ok(true),
                    protocol::Fit::Gone => {
                        return Err(Error::Lost {
                            key: key.as_str().to_owned(),
                        });
                    }
                    protocol::Fit::No(watcher) => {
                        if opts.wait == Wait::No {
                            return Err(timed_out());
                        }
                        dlock_core::trace::queued();
                        let mutex_gone = protocol::node_deleted(|| session.client().ok(), &mutex_path);
                        let changed = async {
                            tokio::select! {
                                event = protocol::watched(watcher) => Some(event),
                                () = mutex_gone => None,
                            }
                        };
                        match dlock_core::driver::within_wait(opts.wait, started, changed).await {
                            None => return Err(timed_out()),
                            Some(None) => return Ok(false),
                            Some(Some(event)) => {
                                event?;
                            }
                        }
                    }
                }
            }
        }
        .await;
        let waited = waited.and_then(|fit| {
            if session.alive() {
                Ok(fit)
            } else {
                Err(Error::Lost {
                    key: key.as_str().to_owned(),
                })
            }
        });
        // The mutex goes now, granted or not (if that fails, its drop
        // deletes it in the background).
        drop(dlock_core::Guard::release(mutex).await);
        let given_back = match waited {
            Ok(true) => None,
            Ok(false) => Some(Ok(None)),
            Err(e) => Some(Err(e)),
        };
        if let Some(out) = given_back {
            // Not granted: our leases go now too, so that a next try does
            // not count them; what fails here the clean-up retries.
            let mut gone = true;
            for name in &mine {
                gone &= protocol::delete(&client, &format!("{leases}/{name}"), timeout)
                    .await
                    .is_ok();
            }
            if gone {
                cleanup.disarm();
            }
            return out;
        }
        cleanup.disarm();
        let mut nodes = mine
            .into_iter()
            .zip(czxids)
            .map(|(name, czxid)| (format!("{leases}/{name}"), czxid));
        let Some((first, czxid)) = nodes.next() else {
            return Err(Error::InvalidConfig("a semaphore grant of no permits".to_owned()));
        };
        Ok(Some(
            ZkGuard::new(key.clone(), first, czxid, session, opts).with_more(nodes.collect()),
        ))
    }

    /// Takes `key` by `recipe`'s node.
    async fn take(&self, recipe: Recipe, key: &LockKey, opts: AcquireOptions) -> Result<ZkGuard> {
        let started = Instant::now();
        let dir = self.lock_path(key)?;
        let session = self.session().await?;
        let client = session.client()?;
        let timeout = self.inner.config.request_timeout;
        let uuid = uuid::Uuid::new_v4().to_string();
        // An acquire that ends without a grant (an error, a timeout, a
        // dropped future) deletes its node; by uuid while the create's reply
        // is not in.
        let mut cleanup = OnDrop::new(None, |node: Option<String>| match node {
            Some(name) => delete_in_background(&session, format!("{dir}/{name}")),
            None => delete_own_in_background(&session, dir.clone(), uuid.clone()),
        });
        let sent = Instant::now();
        let (name, czxid) =
            protocol::create(&client, recipe, &dir, &uuid, &self.data(), self.acls(), timeout).await?;
        session.answered(sent);
        *cleanup.state_mut() = Some(name.clone());
        let path = format!("{dir}/{name}");
        // Without a wait, one look at the queue says whether we hold;
        // with one, the recipe's wait looks first.
        let first = match opts.wait {
            Wait::No => match protocol::place(&client, recipe, &dir, &name, timeout).await? {
                protocol::Place::First => true,
                protocol::Place::Gone => {
                    return Err(Error::Lost {
                        key: key.as_str().to_owned(),
                    });
                }
                protocol::Place::After(_) => false,
            },
            _ => false,
        };
        let node = Node {
            client: &client,
            recipe,
            dir: &dir,
            name: &name,
            path: &path,
            key: key.as_str(),
            timeout,
        };
        let cleanup = queue::wait_turn(&node, key, first, opts.wait, started, cleanup).await?;
        // Only writes and syncs (answered through the leader) move the
        // session's deadline; the create did, above. A read answered by a
        // member cut off from its leader proves nothing.
        if !session.alive() {
            return Err(Error::Lost {
                key: key.as_str().to_owned(),
            });
        }
        cleanup.disarm();
        Ok(ZkGuard::new(key.clone(), path, czxid, session, opts))
    }
}
