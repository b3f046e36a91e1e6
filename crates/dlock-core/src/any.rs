//! The dynamic-dispatch layer: [`AnyLock`] and [`AnyGuard`], built once here
//! so every driver gets them for free.
//!
//! [`Lock`] uses `impl Future` in its methods (no allocation per call for
//! generic users), which makes it not object safe. The private `DynLock` and
//! `DynGuard` traits box those futures; a blanket impl covers every `Lock`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::{
    AcquireOptions, Capabilities, Claim, FencingToken, Guard, Holder, Lock, LockKey, LostSignal, Result,
};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

trait DynLock: Send + Sync {
    fn backend(&self) -> &'static str;
    fn capabilities(&self) -> Capabilities;
    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>>>;
    fn keys_in_use<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>>>;
    fn abandon(&self) -> BoxFuture<'_, ()>;
    fn grant<'a>(
        &'a self,
        key: &'a LockKey,
        claim: Claim,
        opts: AcquireOptions,
    ) -> BoxFuture<'a, Result<AnyGuard>>;
}

impl<L: Lock> DynLock for L {
    fn backend(&self) -> &'static str {
        Lock::backend(self)
    }
    fn capabilities(&self) -> Capabilities {
        Lock::capabilities(self)
    }
    fn grant<'a>(
        &'a self,
        key: &'a LockKey,
        claim: Claim,
        opts: AcquireOptions,
    ) -> BoxFuture<'a, Result<AnyGuard>> {
        Box::pin(async move { Lock::grant(self, key, claim, opts).await.map(AnyGuard::new) })
    }
    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>>> {
        Box::pin(Lock::holders(self, key))
    }
    fn keys_in_use<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(Lock::keys_in_use(self, prefix))
    }
    fn abandon(&self) -> BoxFuture<'_, ()> {
        Box::pin(Lock::abandon(self))
    }
}

/// Any driver behind dynamic dispatch: what code that picks its backend at run
/// time (from config or a URL) holds. Cheap to clone.
///
/// ```
/// use dlock_core::{AcquireOptions, AnyLock, Guard, Lock, LockKey, MemLock};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// let lock: AnyLock = AnyLock::new(MemLock::new());
/// assert_eq!(lock.backend(), "mem");
/// let guard = lock.acquire(&LockKey::new("k")?, AcquireOptions::default()).await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct AnyLock(Arc<dyn DynLock>);

impl AnyLock {
    /// Puts a driver behind dynamic dispatch.
    pub fn new<L: Lock>(lock: L) -> Self {
        AnyLock(Arc::new(lock))
    }

    /// `true` when both handles are clones of one `AnyLock` (the same driver
    /// handle, hence the same client).
    pub fn same_handle(&self, other: &AnyLock) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for AnyLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AnyLock").field(&self.0.backend()).finish()
    }
}

impl Lock for AnyLock {
    type Guard = AnyGuard;

    fn backend(&self) -> &'static str {
        self.0.backend()
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    /// See [`Lock::grant`]: the driver's own. Every acquire method of
    /// an `AnyLock` is the provided one, which checks and traces once and
    /// then calls this.
    async fn grant(&self, key: &LockKey, claim: Claim, opts: AcquireOptions) -> Result<AnyGuard> {
        self.0.grant(key, claim, opts).await
    }

    /// See [`Lock::abandon`]: the driver's own.
    async fn abandon(&self) {
        self.0.abandon().await;
    }

    /// See [`Lock::holders`]: the driver's own.
    async fn holders(&self, key: &LockKey) -> Result<Vec<Holder>> {
        self.0.holders(key).await
    }

    /// See [`Lock::keys_in_use`]: the driver's own.
    async fn keys_in_use(&self, prefix: &str) -> Result<Vec<String>> {
        self.0.keys_in_use(prefix).await
    }
}

trait DynGuard: Send + Sync {
    fn key(&self) -> &LockKey;
    fn token(&self) -> Option<FencingToken>;
    fn lost(&self) -> LostSignal;
    fn is_held(&self) -> bool;
    fn extend(&self, ttl: Duration) -> BoxFuture<'_, Result<()>>;
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>>;
}

impl<G: Guard> DynGuard for G {
    fn key(&self) -> &LockKey {
        Guard::key(self)
    }
    fn token(&self) -> Option<FencingToken> {
        Guard::token(self)
    }
    fn lost(&self) -> LostSignal {
        Guard::lost(self)
    }
    fn is_held(&self) -> bool {
        Guard::is_held(self)
    }
    fn extend(&self, ttl: Duration) -> BoxFuture<'_, Result<()>> {
        Box::pin(Guard::extend(self, ttl))
    }
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<()>> {
        Box::pin(Guard::release(*self))
    }
}

/// The guard of an [`AnyLock`]: any driver's guard behind dynamic dispatch.
/// Dropping it drops the driver's guard (best-effort release).
#[must_use = "dropping the guard releases the lock (best effort)"]
pub struct AnyGuard(Box<dyn DynGuard>);

impl AnyGuard {
    /// Puts a driver's guard behind dynamic dispatch.
    pub fn new<G: Guard>(guard: G) -> Self {
        AnyGuard(Box::new(guard))
    }
}

impl std::fmt::Debug for AnyGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyGuard")
            .field("key", self.0.key())
            .field("token", &self.0.token())
            .finish()
    }
}

impl Guard for AnyGuard {
    fn key(&self) -> &LockKey {
        self.0.key()
    }
    fn token(&self) -> Option<FencingToken> {
        self.0.token()
    }
    fn lost(&self) -> LostSignal {
        self.0.lost()
    }
    fn is_held(&self) -> bool {
        self.0.is_held()
    }
    /// See [`Guard::extend`].
    fn extend(&self, ttl: Duration) -> impl Future<Output = Result<()>> + Send {
        self.0.extend(ttl)
    }
    /// See [`Guard::release`].
    fn release(self) -> impl Future<Output = Result<()>> + Send {
        self.0.release()
    }
}
