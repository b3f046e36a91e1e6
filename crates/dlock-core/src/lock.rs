//! The [`Lock`] trait: one required acquire ([`Lock::grant`]) and every
//! public acquire provided over it, the scoped [`Lock::with_lock`], and
//! what [`Lock::acquire_all`] does by default.

use std::future::Future;
use std::time::Instant;

use futures::future::join_all;

use crate::driver::wait_deadline;
use crate::{AcquireOptions, Capabilities, Claim, Error, Guard, Held, LockKey, Result, Wait};

/// A connected lock backend: a cheap-to-clone handle that many tasks share.
///
/// Implemented by every driver (`MemLock`, `RedisLock`, `EtcdLock`, ...) and by
/// [`AnyLock`](crate::AnyLock), the same contract behind dynamic dispatch.
/// Generic code takes `L: Lock`; code that picks its backend at run time holds
/// an `AnyLock`.
///
/// # Implementing it
///
/// A driver implements [`backend`](Self::backend),
/// [`capabilities`](Self::capabilities), [`abandon`](Self::abandon), one
/// acquire, [`grant`](Self::grant), which receives a [`Claim`], and (where
/// the backend can list them) [`holders`](Self::holders); every public
/// acquire method is provided here and goes through
/// [`acquire_claim`](Self::acquire_claim), which checks and traces once.
/// Drivers do not override the provided acquire methods (a driver with an
/// atomic multi-name grant may override [`acquire_all`](Self::acquire_all);
/// through an [`AnyLock`](crate::AnyLock) the provided one runs).
///
/// # What implementers must keep
///
/// - Mutual exclusion per key while holders are not paused past their TTL.
/// - With [`Fencing::Strict`](crate::Fencing::Strict): tokens strictly
///   increase per key in grant order, across all clients.
/// - A dropped `acquire` future leaves no lock held and no waiter, node or key
///   behind (clean-up may finish in the background).
/// - Release and extend by anyone but the owner are refused.
/// - No panic on any input or server reply: errors are [`Error`] variants.
///
/// The conformance kit (`dlock-testkit`) checks all of this against a driver.
pub trait Lock: Clone + Send + Sync + 'static {
    /// The guard a grant returns.
    type Guard: Guard;

    /// The backend's short name: `"mem"`, `"redis"`, `"redlock"`, `"etcd"`, `"zk"`.
    fn backend(&self) -> &'static str;

    /// What this backend promises (fencing, FIFO, waiting, shortest TTL).
    fn capabilities(&self) -> Capabilities;

    /// Silences this handle as if its process had died: nothing is
    /// released, renewals stop, guards' drops release nothing, and the
    /// backend frees its locks when their TTL, lease or session runs out.
    /// Later calls on the handle (and its clones) fail with
    /// [`Error::Unavailable`]. For tests, and for shutdown paths that must
    /// not block on the network.
    ///
    /// # Cancel safety
    ///
    /// The handle is marked abandoned at once; dropping the future may
    /// leave its connections to close on their own.
    fn abandon(&self) -> impl Future<Output = ()> + Send;

    /// The one acquire a driver implements: grants `claim` on `key`,
    /// waiting as `opts.wait` says. Callers use the provided methods
    /// ([`acquire`](Self::acquire), [`acquire_read`](Self::acquire_read),
    /// ..., or [`acquire_claim`](Self::acquire_claim)), which refuse what
    /// the backend's [`capabilities`](Self::capabilities) leave out, check
    /// the TTL and the permits, and trace the acquire ([`crate::trace`]),
    /// all once, here in the core. So a driver's `grant`:
    ///
    /// - only receives claims its capabilities offer (one it does not
    ///   offer may be answered with [`Claim::unsupported`]), permits with
    ///   `1 <= count <= limit`, and a TTL from one nanosecond to
    ///   [`AcquireOptions::MAX_TTL`](crate::AcquireOptions::MAX_TTL);
    /// - emits no `acquire` span of its own (it runs inside the core's),
    ///   only [`trace::queued`](crate::trace::queued) when it starts to
    ///   wait.
    ///
    /// A driver maps the claim to its own layout (names, nodes, rows) with
    /// one `match`; a new kind of claim is one more arm. Callers do not
    /// call `grant` directly: that skips the checks and the trace.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire) describes them.
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe as [`acquire`](Self::acquire) describes: the
    /// kit's cancellation scenarios check it.
    fn grant(
        &self,
        key: &LockKey,
        claim: Claim,
        opts: AcquireOptions,
    ) -> impl Future<Output = Result<Self::Guard>> + Send;

    /// Takes `claim` of `key`: [`acquire`](Self::acquire) for
    /// [`Claim::Mutex`], [`acquire_read`](Self::acquire_read) for
    /// [`Claim::Read`], and so on, for code that chooses the kind of lock
    /// at run time. Every acquire goes through here: the claim is checked
    /// ([`Claim::check`]; refused with no span, as a misuse), then the TTL
    /// (refused inside the span) and the acquire traced once
    /// ([`crate::trace`]) around the driver's [`grant`](Self::grant).
    ///
    /// # Errors
    ///
    /// As the method for the claim's kind says ([`acquire`](Self::acquire),
    /// [`acquire_read`](Self::acquire_read),
    /// [`acquire_permits`](Self::acquire_permits)).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    fn acquire_claim(
        &self,
        key: &LockKey,
        claim: Claim,
        opts: AcquireOptions,
    ) -> impl Future<Output = Result<Self::Guard>> + Send {
        // A claim the backend does not offer, or impossible permits, is
        // refused before the span opens: a misuse, not an acquire that failed.
        let checked = claim.check(self.backend(), &self.capabilities());
        // Boxed once, here: a driver's grant future is kilobytes, and every
        // layer above (the span, this future, the caller's) would copy it
        // whole on each move (measured: a third of a Redis cycle's client
        // instructions were those copies).
        let traced = checked.map(|()| {
            crate::trace::acquire(
                self.backend(),
                key,
                claim,
                &opts,
                Box::pin(self.grant(key, claim, opts)),
            )
        });
        async move {
            match traced {
                Ok(traced) => traced.await,
                Err(e) => Err(e),
            }
        }
    }

    /// Takes the lock on `key`, waiting as `opts.wait` says.
    ///
    /// The returned guard holds the lock until it is released, dropped, or
    /// lost (TTL ran out, session ended); with `opts.auto_extend` a watchdog
    /// renews it at `ttl / 3`.
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] when the wait ran out (at once for [`Wait::No`]
    ///   if the key is held), never earlier than asked;
    /// - [`Error::InvalidKey`] when the backend cannot store `key`;
    /// - [`Error::InvalidConfig`] for a TTL of zero or more than
    ///   [`AcquireOptions::MAX_TTL`](crate::AcquireOptions::MAX_TTL);
    /// - [`Error::Unavailable`] / [`Error::Backend`] when the backend failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any await point leaves no lock held
    /// and no waiter behind. Where clean-up needs I/O it runs in the
    /// background; the backend's TTL is the backstop if that fails too.
    fn acquire(
        &self,
        key: &LockKey,
        opts: AcquireOptions,
    ) -> impl Future<Output = Result<Self::Guard>> + Send {
        self.acquire_claim(key, Claim::Mutex, opts)
    }

    /// One try: `Ok(Some(guard))` if granted, `Ok(None)` if someone else holds
    /// `key`. `opts.wait` is ignored.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), except that a held key is `Ok(None)`,
    /// not [`Error::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    fn try_acquire(
        &self,
        key: &LockKey,
        opts: AcquireOptions,
    ) -> impl Future<Output = Result<Option<Self::Guard>>> + Send {
        async move {
            match self.acquire(key, opts.wait(Wait::No)).await {
                Ok(guard) => Ok(Some(guard)),
                Err(Error::Timeout { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        }
    }

    /// Takes `key` as a read-write lock, shared: any number of read grants
    /// hold together, none while a write grant holds, and a read waits
    /// behind a write that was waiting before it (a stream of readers
    /// cannot starve a writer). On Redis, whose readers have no queue, a
    /// write counts as waiting from its second attempt (made at once, as
    /// soon as it listens for releases): a read that arrives between a
    /// writer's first refusal and that second attempt may go first, and a
    /// write with [`Wait::No`] never holds reads back. Use a name for one kind of lock only: the
    /// layouts of read-write locks differ from mutexes' (as Curator's and
    /// etcd's do), so [`acquire`](Self::acquire) of the same name does not
    /// exclude it.
    ///
    /// Tokens: every grant of a read-write lock, read or write, takes the
    /// next number of one sequence per name, so write tokens strictly
    /// increase, and a read's token lies between those of the writes
    /// granted before and after it: a resource can tell whether a reader's
    /// view predates a write. Read tokens repeat nothing, but readers hold
    /// together: do not fence readers against each other.
    ///
    /// The guard behaves as a mutex's: TTL, `auto_extend`, `lost()`,
    /// `extend`, `release`, best-effort release on drop.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); [`Error::Unsupported`] where the
    /// backend offers no read-write locks ([`Capabilities::read_write`]).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    fn acquire_read(
        &self,
        key: &LockKey,
        opts: AcquireOptions,
    ) -> impl Future<Output = Result<Self::Guard>> + Send {
        self.acquire_claim(key, Claim::Read, opts)
    }

    /// Takes `key` as a read-write lock, exclusive: no other read or write
    /// grant holds meanwhile. See [`acquire_read`](Self::acquire_read) for
    /// names and tokens.
    ///
    /// # Errors
    ///
    /// As [`acquire_read`](Self::acquire_read).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    fn acquire_write(
        &self,
        key: &LockKey,
        opts: AcquireOptions,
    ) -> impl Future<Output = Result<Self::Guard>> + Send {
        self.acquire_claim(key, Claim::Write, opts)
    }

    /// Takes `count` of the `limit` permits of the semaphore `key`: never
    /// more than `limit` permits are held at once by the clients that use
    /// this `limit` (they must agree on it: each is admitted by its own).
    /// Waiters are served in order where the backend is FIFO; a waiter
    /// that needs more permits than are free holds back those behind it.
    /// Semaphore names are apart from mutex and read-write lock names.
    ///
    /// Tokens: each grant takes the next number of one sequence per name
    /// (never repeated), but permit holders hold together: the token
    /// identifies a grant, it does not fence one holder from another.
    ///
    /// ```
    /// use dlock_core::{AcquireOptions, Guard, Lock, LockKey, MemLock};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let lock = MemLock::new();
    /// let jobs = LockKey::new("nightly-export")?;
    /// let opts = AcquireOptions::default();
    /// // At most 3 exports at once across the fleet.
    /// let one = lock.acquire_permits(&jobs, 1, 3, opts).await?;
    /// let two_more = lock.acquire_permits(&jobs, 2, 3, opts).await?;
    /// assert!(lock.acquire_permits(&jobs, 1, 3, opts.wait(dlock_core::Wait::No)).await.is_err());
    /// one.release().await?;
    /// two_more.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); [`Error::InvalidConfig`] unless
    /// `1 <= count <= limit`; [`Error::Unsupported`] where the backend
    /// offers no semaphores ([`Capabilities::semaphores`]).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    fn acquire_permits(
        &self,
        key: &LockKey,
        count: u32,
        limit: u32,
        opts: AcquireOptions,
    ) -> impl Future<Output = Result<Self::Guard>> + Send {
        self.acquire_claim(key, Claim::Permits { count, limit }, opts)
    }

    /// Every holder of anything named `key`: the mutex's, the read-write
    /// lock's writer or readers, the semaphore's permit holders (waiters
    /// left out), each with its [`Role`](crate::Role). Empty when nobody
    /// holds. For operators and messages: by the time it is read it may be
    /// stale, so never decide with it who holds a lock.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the backend cannot list holders (the
    /// default: Redlock's nodes each know only their own part);
    /// [`Error::InvalidKey`], [`Error::Unavailable`] or [`Error::Backend`]
    /// as an acquire of `key` would meet them.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    fn holders(&self, key: &LockKey) -> impl Future<Output = Result<Vec<crate::Holder>>> + Send {
        let _ = key;
        unsupported(
            self.backend(),
            "listing holders",
            "the driver cannot tell who holds a name",
        )
    }

    /// The names in use that start with `prefix` (a plain string prefix of
    /// the name, without the handle's key prefix): every name with a
    /// holder, and, on backends whose waiters are entries on the server
    /// (etcd, ZooKeeper, [`MemLock`](crate::MemLock)), every name with a
    /// queued waiter; sorted, each once. For operators and tests (what a
    /// namespace still holds); like [`holders`](Self::holders), stale by
    /// the time it is read.
    ///
    /// ```
    /// use dlock_core::{AcquireOptions, Guard, Lock, LockKey, MemLock};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let lock = MemLock::new();
    /// let g = lock.acquire(&LockKey::new("jobs/7")?, AcquireOptions::default()).await?;
    /// assert_eq!(lock.keys_in_use("jobs/").await?, ["jobs/7"]);
    /// g.release().await?;
    /// assert!(lock.keys_in_use("jobs/").await?.is_empty());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] where the backend cannot list (the default);
    /// [`Error::Unavailable`] or [`Error::Backend`] when the backend fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    fn keys_in_use(&self, prefix: &str) -> impl Future<Output = Result<Vec<String>>> + Send {
        let _ = prefix;
        unsupported(
            self.backend(),
            "listing the names in use",
            "the driver cannot list names",
        )
    }

    /// The first holder [`holders`](Self::holders) lists (of a name used
    /// as one kind of lock, as names are meant to be: the mutex's holder,
    /// the writer, or the first reader or permit holder), `None` if nobody
    /// holds `key`.
    ///
    /// # Errors
    ///
    /// As [`holders`](Self::holders).
    ///
    /// # Cancel safety
    ///
    /// Read-only; safe to drop at any point.
    fn holder(&self, key: &LockKey) -> impl Future<Output = Result<Option<crate::Holder>>> + Send {
        async move { Ok(self.holders(key).await?.into_iter().next()) }
    }

    /// Acquires every name of `keys` together, or none of them: the names
    /// are taken one by one in one global order (by name, so two clients
    /// asking for `{a, b}` and `{b, a}` never deadlock), with `opts` for
    /// each, and `opts.wait` bounding the whole set, not each name. The
    /// [`MultiGuard`](crate::MultiGuard) holds one part per name.
    ///
    /// ```
    /// use dlock_core::{AcquireOptions, Lock, LockKey, MemLock};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let lock = MemLock::new();
    /// let (from, to) = (LockKey::new("account/17")?, LockKey::new("account/4")?);
    /// let both = lock.acquire_all(&[from, to], AcquireOptions::default()).await?;
    /// // ... move money between the two accounts ...
    /// both.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidKey`] when `keys` is empty or names a key twice;
    /// - otherwise the first failing part's error, as
    ///   [`acquire`](Self::acquire) describes them ([`Error::Timeout`]
    ///   names the key that could not be had in time), or [`Error::Lost`]
    ///   when a part taken earlier was lost before the last one was
    ///   granted. The parts already taken are released before it returns.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the parts already taken
    /// (each a best-effort release) and the part being acquired (cancel
    /// safe as [`acquire`](Self::acquire) is).
    fn acquire_all(
        &self,
        keys: &[LockKey],
        opts: AcquireOptions,
    ) -> impl Future<Output = Result<crate::MultiGuard<Self::Guard>>> + Send {
        acquire_all(self, keys, opts)
    }

    /// Takes the lock, runs `f` while holding it, and releases it.
    ///
    /// `f` receives a [`Held`] (key, token, lost signal). If the lock is lost
    /// before `f`'s future completes, that future is dropped (cancelled) at
    /// its next await point and the call returns [`Error::Lost`].
    ///
    /// # Errors
    ///
    /// - any error of [`acquire`](Self::acquire);
    /// - [`Error::Lost`] if the lock was lost while `f` ran;
    /// - the error of the final release: if the release finds the lock already
    ///   gone ([`Error::Lost`] / [`Error::NotHeld`]), `f`'s output is dropped,
    ///   since the lock may have been lost while `f` was still working.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops `f`'s future and the guard, whose `Drop`
    /// releases the lock on a best-effort basis (the TTL is the backstop).
    ///
    /// # Examples
    ///
    /// ```
    /// use dlock_core::{AcquireOptions, Lock, LockKey, MemLock};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock_core::Result<()> {
    /// let lock = MemLock::new();
    /// let key = LockKey::new("report:daily")?;
    /// let rows = lock
    ///     .with_lock(&key, AcquireOptions::default(), |held| async move {
    ///         assert!(held.token().is_some());
    ///         42 // ... the work done under the lock
    ///     })
    ///     .await?;
    /// assert_eq!(rows, 42);
    /// # Ok(())
    /// # }
    /// ```
    fn with_lock<F, Fut, T>(
        &self,
        key: &LockKey,
        opts: AcquireOptions,
        f: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(Held) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let guard = self.acquire(key, opts).await?;
            let lost = guard.lost();
            let held = Held {
                key: guard.key().clone(),
                token: guard.token(),
                lost: lost.clone(),
            };
            let work = f(held);
            let out = tokio::select! {
                biased;
                () = lost.wait() => None,
                out = work => Some(out),
            };
            match out {
                Some(out) => guard.release().await.map(|()| out),
                None => {
                    // Best effort: the lock is (or may be) gone already.
                    let _ = guard.release().await;
                    Err(Error::Lost {
                        key: key.as_str().to_owned(),
                    })
                }
            }
        }
    }
}

/// What a provided operator view answers where the driver offers none.
fn unsupported<T: Send>(
    backend: &'static str,
    what: &'static str,
    why: &'static str,
) -> impl Future<Output = Result<T>> + Send {
    std::future::ready(Err(Error::Unsupported { backend, what, why }))
}

/// What [`Lock::acquire_all`] does unless a driver overrides it: every key
/// of `keys` in one global order (by name), waiting at most `opts.wait` in
/// all. For a driver that overrides it for some sets (say, one script for
/// names on one server) and falls back to this for the rest.
///
/// # Errors
///
/// As [`Lock::acquire_all`].
///
/// # Cancel safety
///
/// As [`Lock::acquire_all`].
pub async fn acquire_all<L: Lock>(
    lock: &L,
    keys: &[LockKey],
    opts: AcquireOptions,
) -> Result<crate::MultiGuard<L::Guard>> {
    let started = Instant::now();
    let mut order: Vec<&LockKey> = keys.iter().collect();
    order.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
    if order.is_empty() {
        return Err(Error::InvalidKey {
            reason: "acquire_all needs at least one key".to_owned(),
        });
    }
    if let Some(twice) = order.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::InvalidKey {
            reason: format!("{:?} is named twice", twice[0].as_str()),
        });
    }
    let deadline = wait_deadline(opts.wait, started);
    let mut parts = Vec::with_capacity(order.len());
    for key in order {
        // One wait for the whole set: each part gets what is left of it.
        let wait = match (opts.wait, deadline) {
            (Wait::For(_), Some(at)) => Wait::For(at.saturating_duration_since(Instant::now())),
            (wait, _) => wait,
        };
        match lock.acquire(key, opts.wait(wait)).await {
            Ok(guard) => parts.push(guard),
            Err(e) => {
                release_all(parts).await;
                return Err(e);
            }
        }
    }
    // A part taken first may have been lost while a later one was awaited.
    if let Some(gone) = parts.iter().find(|g| !g.is_held()) {
        let key = gone.key().as_str().to_owned();
        release_all(parts).await;
        return Err(Error::Lost { key });
    }
    Ok(crate::multi::MultiGuard::new(parts))
}

/// Releases every part, concurrently, ignoring the outcomes (their TTLs
/// free whatever a failed release left).
async fn release_all<G: Guard>(parts: Vec<G>) {
    drop(join_all(parts.into_iter().map(Guard::release)).await);
}
