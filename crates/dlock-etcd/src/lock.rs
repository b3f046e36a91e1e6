//! [`EtcdLock`]: connecting, sessions, acquiring.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::driver::endpoint_of;
use dlock_core::{
    AcquireOptions, Capabilities, Claim, Error, Fencing, Holder, Lock, LockKey, Result, Unreachable, Waiting,
};
use etcd_client::{Certificate, Client, ConnectOptions, TlsOptions};

use crate::config::EtcdConfig;
use crate::error::{BACKEND, is_lease_gone, map_err};
use crate::guard::{EtcdGuard, resign_in_background};
use crate::protocol::{self, Conn, Contender};
use crate::session::{MIN_TTL, Session, lease_seconds};
use dlock_core::driver::{OnDrop, queue};

/// The HTTP/2 ping interval on the connection to etcd while streams are
/// open (dead-connection detection: a silent member is given up after this
/// plus [`PING_TIMEOUT`]). etcd refuses pings closer than its
/// `--grpc-keepalive-min-time` (5 s by default) and closes the connection,
/// and every stream on it, after a few; pings with no stream open it
/// refuses whatever the interval, so none are sent then.
const KEEPALIVE_PING: Duration = Duration::from_secs(6);

/// How long a ping may go unanswered (at most; the request timeout if
/// shorter).
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// A lock backend on etcd. Cheap to clone (clones share the client and the
/// sessions).
///
/// # Sessions and TTLs
///
/// Guards taken with `auto_extend` (the default) live on a *session*: one
/// lease per distinct TTL (`AcquireOptions::ttl` in whole seconds, at least
/// 2), kept alive in the background at a third of its TTL and shared by all
/// of them. If this process dies, etcd frees their locks when that TTL runs
/// out. When a session's lease is lost (keep-alives fail past its deadline,
/// or it is revoked or expires), every guard on it fires `lost()` and the
/// next acquire opens a new session; the old guards never come back to life.
/// Each acquire writes its own key, `{prefix}{name}/{lease}-{n}`: Go's layout
/// (`{lease}`) plus a per-acquire suffix, so two acquires of one name through
/// one `EtcdLock` exclude each other, and an acquire never adopts a key that
/// an earlier, failed release left behind (such keys are deleted in the
/// background; the lease is the backstop).
///
/// An acquire without `auto_extend` gets a lease of its own with its TTL
/// (rounded up to whole seconds, at least 2), granted before its key is
/// written, and writes its key on it. The lease is kept alive while the
/// acquire waits (a wait may outlast the TTL), refreshed once at the grant
/// if it waited (so the TTL counts from the grant), and then kept alive no
/// further than the TTL: at the guard's deadline `lost()` fires and the
/// lease is revoked, so etcd frees the key then. Should this process die
/// first (or that revoke fail), the lease runs out by itself: up to a lease
/// TTL after its last keep-alive, which can be later than the guard's
/// deadline (by up to a third of the TTL; after an `extend` to a shorter
/// TTL, by up to the difference; across an etcd leader change, which gives
/// every lease its whole TTL again, by up to the TTL). `extend(ttl)` moves that deadline to `ttl` from now: a
/// keep-alive now, then as many as reach it (a `ttl` longer than the
/// lease's), or the revoke at it (a shorter one).
///
/// The key is written once, when the acquire enters the line, and never
/// again until it is deleted. Go's `recipes.RWMutex` orders contenders by
/// the keys' *modification* revisions: a key rewritten after a Go
/// contender entered (as moving it to another lease would) would put ours
/// behind it, and let a Go writer in beside our reader.
#[derive(Clone)]
pub struct EtcdLock {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    conn: Arc<Conn>,
    config: EtcdConfig,
    /// The shared, kept-alive sessions: one per lease TTL.
    sessions: Mutex<Vec<Arc<Session>>>,
    /// Held while a shared session is opened, so racing first acquires open
    /// one, not one each.
    opening: tokio::sync::Mutex<()>,
    host: String,
}

impl EtcdLock {
    /// Connects to the cluster.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] as [`EtcdConfig::validate`], or an unreadable
    ///   CA file, or refused credentials;
    /// - [`Error::Unavailable`] if no endpoint answers within `connect_timeout`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the half-built client.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(config.request_timeout)
            // HTTP/2 pings no more often than etcd's default
            // `--grpc-keepalive-min-time` (5 s) allows, and only while
            // streams are open: etcd answers others by closing the
            // connection, and every keep-alive stream and watch on it.
            .with_keep_alive(KEEPALIVE_PING, PING_TIMEOUT.min(config.request_timeout))
            .with_keep_alive_while_idle(false)
            // A member cut off from its leader refuses (its data may be
            // stale; a watch on it could hang until the partition heals).
            .with_require_leader(true);
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            options = options.with_user(user.clone(), password.clone());
        } else if let Some(user) = &config.user {
            options = options.with_user(user.clone(), String::new());
        }
        if config.uses_tls() {
            let mut tls = TlsOptions::new();
            if let Some(path) = &config.ca_file {
                let pem = std::fs::read(path)
                    .map_err(|e| Error::InvalidConfig(format!("etcd CA file {}: {e}", path.display())))?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            options = options.with_tls(tls);
        }
        let endpoints: Vec<String> = config
            .endpoints
            .iter()
            .map(|e| {
                if e.contains("://") {
                    e.clone()
                } else if config.uses_tls() {
                    format!("https://{e}")
                } else {
                    format!("http://{e}")
                }
            })
            .collect();
        // Where, for messages: the endpoints without scheme or credentials.
        let where_ = endpoints
            .iter()
            .map(|e| endpoint_of(e))
            .collect::<Vec<_>>()
            .join(",");
        let client =
            match tokio::time::timeout(config.connect_timeout, Client::connect(&endpoints, Some(options)))
                .await
            {
                Ok(Ok(c)) => c,
                Ok(Err(e)) => {
                    return Err(match map_err(e) {
                        Error::Backend { source, .. } => Error::Unavailable {
                            backend: BACKEND,
                            source,
                        },
                        other => other,
                    }
                    .at(&where_));
                }
                Err(_) => {
                    return Err(Error::unavailable(
                        BACKEND,
                        Unreachable::because(
                            &where_,
                            format!("no endpoint answered within {:?}", config.connect_timeout),
                        ),
                    ));
                }
            };
        // Prove the cluster answers (connect is lazy for some transports).
        protocol::probe(&client, config.connect_timeout)
            .await
            .map_err(|e| e.at(&where_))?;
        Ok(EtcdLock {
            inner: Arc::new(Inner {
                conn: Arc::new(Conn {
                    client,
                    timeout: config.request_timeout,
                    abandoned: Arc::default(),
                }),
                config,
                sessions: Mutex::default(),
                opening: tokio::sync::Mutex::new(()),
                host: dlock_core::driver::host_name(),
            }),
        })
    }

    /// The configuration this handle was connected with.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The key prefix a lock name's contenders live under: `{prefix}{name}/`.
    pub fn lock_prefix(&self, key: &LockKey) -> String {
        format!("{}{}/", self.inner.config.key_prefix, key.as_str())
    }

    /// Every contender key (holders and waiters, with the key prefix)
    /// under `{prefix}{namespace}`: what etcd keeps, key by key (the names
    /// are [`keys_in_use`](Lock::keys_in_use)).
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when etcd fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    pub async fn contenders(&self, namespace: &str) -> Result<Vec<String>> {
        let prefix = format!("{}{namespace}", self.inner.config.key_prefix);
        protocol::keys_under(
            &self.inner.conn.client,
            &prefix,
            self.inner.config.request_timeout,
        )
        .await
    }

    fn is_abandoned(&self) -> bool {
        self.inner.conn.is_abandoned()
    }

    /// The shared, kept-alive session of this TTL for an acquire (a new one
    /// if there is none alive).
    pub(crate) async fn session(&self, ttl: Duration) -> Result<Arc<Session>> {
        let timeout = self.inner.config.request_timeout;
        let abandoned = Arc::clone(&self.inner.conn.abandoned);
        // Matched on the TTL asked for, not the one granted: a server that
        // grants another TTL must not get a new lease per acquire.
        let wanted = lease_seconds(ttl);
        let find = || {
            let mut sessions = self.inner.sessions.lock().unwrap_or_else(PoisonError::into_inner);
            sessions.retain(|s| s.is_alive());
            sessions
                .iter()
                .find(|s| s.asked_seconds == wanted)
                .map(Arc::clone)
        };
        if let Some(s) = find() {
            return Ok(s);
        }
        let _opening = self.inner.opening.lock().await;
        if let Some(s) = find() {
            return Ok(s);
        }
        let session = Session::open(&self.inner.conn.client, ttl, true, timeout, abandoned).await?;
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&session));
        Ok(session)
    }

    fn value(&self) -> String {
        dlock_core::driver::owner_detail(&self.inner.host)
    }
}

impl std::fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLock")
            .field("config", &self.inner.config)
            .field("abandoned", &self.is_abandoned())
            .finish()
    }
}

impl Lock for EtcdLock {
    type Guard = EtcdGuard;

    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(Fencing::Strict, true, Waiting::Notified, MIN_TTL)
            .with_read_write()
            .with_semaphores()
            .with_holders()
    }

    /// See [`Lock::abandon`].
    /// Drops everything without releasing: sessions stop keeping their leases
    /// alive and revoke nothing, guards' drops delete nothing; etcd frees the
    /// locks when the leases expire. As if this process had died.
    ///
    /// # Cancel safety
    ///
    /// The handle is marked abandoned at once.
    async fn abandon(&self) {
        self.inner.conn.abandoned.store(true, Ordering::SeqCst);
        self.inner
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// See [`Lock::keys_in_use`]: the names with a contender key, a
    /// holder's or a waiter's, of any layout (mutex, read-write lock,
    /// semaphore; a name ending in `/read`, `/write` or `/sem/N/M` reads as
    /// the layout's).
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when etcd fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    async fn keys_in_use(&self, prefix: &str) -> Result<Vec<String>> {
        let key_prefix = &self.inner.config.key_prefix;
        let keys = self.contenders(prefix).await?;
        Ok(dlock_core::driver::names(
            keys.iter()
                .filter_map(|k| k.strip_prefix(key_prefix.as_str()))
                .filter_map(protocol::name_of)
                // `jobs` has keys under `jobs/`, and `a` under `a/r...`.
                .filter(|name| name.starts_with(prefix)),
        ))
    }

    /// See [`Lock::holders`]: every holder of anything named `key`, in
    /// create order: the mutex's first contender, the read-write lock's
    /// write or reads, the semaphore's keys that fit their limit (waiters
    /// are left out; a key under `sem/` of another layout takes every
    /// permit, shown as `Role::Permits(u32::MAX)`, and holds when it is
    /// first). `id` is the holder's key (`{prefix}{name}/{lease:x}-{n:x}`,
    /// its lease in hex and a per-acquire number), `token` its create
    /// revision, `detail` its value (`host pid unix-ms` when dlock wrote
    /// it; `etcdctl lock` writes an empty value). etcd does not say how
    /// long a lease has left without a call per lease: `remaining` is
    /// `None`.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] / [`Error::Backend`] when etcd fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    async fn holders(&self, key: &LockKey) -> Result<Vec<Holder>> {
        let found = protocol::holding(
            &self.inner.conn.client,
            &self.lock_prefix(key),
            self.inner.config.request_timeout,
        )
        .await?;
        Ok(found
            .into_iter()
            .map(|(role, kv)| {
                let detail = String::from_utf8_lossy(kv.value()).into_owned();
                Holder {
                    role,
                    id: String::from_utf8_lossy(kv.key()).into_owned(),
                    since: dlock_core::driver::Owner::from_detail(&detail).and_then(|o| o.since()),
                    detail,
                    token: u64::try_from(kv.create_revision()).ok(),
                    remaining: None,
                }
            })
            .collect())
    }

    /// See [`Lock::grant`]. Every claim is a key on the session's lease,
    /// unique per acquire; its create revision is the token. The layouts:
    ///
    /// - **Mutex** ([`Claim::Mutex`]): Go's `concurrency.Mutex`: the Mutex transaction,
    ///   then (if not first) a watch on the immediate predecessor until
    ///   every earlier contender is gone, then a check that our own key
    ///   survived the wait.
    /// - **Read** ([`Claim::Read`]): Go's `recipes.RWMutex` layout, reading (a key
    ///   `{prefix}NAME/read/…`; it holds when no key under
    ///   `{prefix}NAME/write` was created before it, and watches the latest
    ///   that was).
    /// - **Write** ([`Claim::Write`]): the same layout, writing (a key
    ///   `{prefix}NAME/write/…`; it holds when no key of the name, read or
    ///   write, was created before it).
    /// - **Permits** ([`Claim::Permits`]): a key `{prefix}NAME/sem/{count}/{limit}/…`; it
    ///   holds when the counts of the keys created before it, plus its own,
    ///   are at most `limit` (so waiters are served in order, and one that
    ///   needs more holds back those behind it). etcd has no semaphore
    ///   recipe of its own; this layout is dlock's. A waiter looks again on
    ///   every release of the name (any release may admit it).
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] when the wait ran out (our key is deleted first);
    /// - [`Error::Lost`] when our lease ended while we waited;
    /// - [`Error::Unavailable`] when etcd has no quorum or cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call deletes its contender key in the
    /// background (by create revision, or by lease if the transaction's reply
    /// was not seen); its lease is the backstop.
    async fn grant(&self, key: &LockKey, claim: Claim, opts: AcquireOptions) -> Result<EtcdGuard> {
        self.take(Contender::from(claim), key, opts).await
    }
}

impl EtcdLock {
    /// Takes `key` as `how`'s contender.
    async fn take(&self, how: Contender, key: &LockKey, opts: AcquireOptions) -> Result<EtcdGuard> {
        if self.is_abandoned() {
            return Err(Error::unavailable(BACKEND, "this EtcdLock was abandoned"));
        }
        let started = Instant::now();
        let timeout = self.inner.config.request_timeout;
        let client = &self.inner.conn.client;
        let pfx = self.lock_prefix(key);
        let ttl = opts.ttl.max(MIN_TTL);
        // Without auto-extend, a lease of our own, granted before the key
        // is written on it and kept alive while we wait (a wait may outlast
        // the TTL); after the grant, held for the TTL only (below).
        let waits_on = how.waits_on(&pfx);
        let mut retried = false;
        let (session, my_key, mut cleanup, my_rev, first) = loop {
            let session = if opts.auto_extend {
                self.session(ttl).await?
            } else {
                let abandoned = Arc::clone(&self.inner.conn.abandoned);
                Session::open(client, ttl, false, timeout, abandoned).await?
            };
            let lease = session.lease;
            let my_key = how.key(&pfx, lease, session.next_attempt());
            // An acquire that ends without a grant (an error, a timeout, a
            // dropped future) deletes its contender key: by create revision,
            // or by lease while the transaction's reply is not in.
            let conn = &self.inner.conn;
            let (k, s) = (my_key.clone(), Arc::clone(&session));
            let cleanup = OnDrop::new(None, move |my_rev| resign_in_background(conn, k, my_rev, &s));
            match protocol::enter(client, &waits_on, &my_key, lease, &self.value(), timeout).await {
                Ok((my_rev, first)) => break (session, my_key, cleanup, my_rev, first),
                // The lease went before the keep-alive noticed (a revoke):
                // the session is over (its guards are told), and the next
                // try opens another. Nothing was written.
                Err(e) if is_lease_gone(&e) && !retried => {
                    retried = true;
                    cleanup.disarm();
                    session.validity().lose(dlock_core::trace::why::SESSION_ENDED);
                }
                Err(e) => return Err(e),
            }
        };
        *cleanup.state_mut() = Some(my_rev);
        // A semaphore key may hold with others before it.
        let first = first || protocol::permits_fit_now(client, &waits_on, my_rev, how, timeout).await?;
        let place = Contending {
            conn: &self.inner.conn,
            how,
            waits_on: &waits_on,
            my_key: &my_key,
            my_rev,
            session: &session,
        };
        let cleanup = queue::wait_turn(&place, key, first, opts.wait, started, cleanup).await?;
        // etcd #11456: only a key that survived the wait may take the lock.
        if !first && !session.is_alive() {
            return Err(Error::Lost {
                key: key.as_str().to_owned(),
            });
        }
        if !opts.auto_extend {
            // Our TTL from the grant: one keep-alive now if we waited (the
            // lease was granted before the wait), else from the lease's
            // grant, just before the key's. No write: our key keeps its
            // place (see the type's docs).
            let held = if first {
                session.hold_from_last(ttl);
                Ok(())
            } else {
                // On an error here the clean-up (armed) deletes the key.
                session.hold_for(ttl).await?
            };
            if held.is_err() || !session.is_alive() {
                return Err(Error::Lost {
                    key: key.as_str().to_owned(),
                });
            }
        }
        cleanup.disarm();
        Ok(EtcdGuard::new(
            Arc::clone(&self.inner.conn),
            key.clone(),
            my_key,
            my_rev,
            session,
        ))
    }
}

/// Our contender key in the queue under `waits_on`.
struct Contending<'a> {
    conn: &'a Conn,
    how: Contender,
    waits_on: &'a str,
    my_key: &'a str,
    my_rev: i64,
    session: &'a Session,
}

impl queue::Place for Contending<'_> {
    /// Waits for our predecessors to go, or for our own lease to end (then
    /// our key is gone: `Ok(false)`, whatever the predecessors do).
    async fn wait_turn(&self) -> Result<bool> {
        dlock_core::trace::queued();
        let ended = self.session.lost();
        let (client, timeout) = (&self.conn.client, self.conn.timeout);
        let (pfx, my_key, my_rev) = (self.waits_on, self.my_key, self.my_rev);
        // Boxed: the acquire future stays small (a debug build's test
        // thread has a 2 MiB stack).
        let waited = Box::pin(async move {
            match self.how {
                Contender::Permits { count, limit } => {
                    protocol::wait_for_permits(client, pfx, my_key, my_rev, count, limit, timeout).await
                }
                _ => protocol::wait_for_predecessors(client, pfx, my_key, my_rev, timeout).await,
            }
        });
        tokio::select! {
            r = waited => r,
            () = ended.wait() => Ok(false),
        }
    }

    /// Deletes our key if it is still the one we wrote.
    async fn withdraw(&self) -> Result<()> {
        protocol::resign(&self.conn.client, self.my_key, self.my_rev, self.conn.timeout)
            .await
            .map(drop)
    }
}
