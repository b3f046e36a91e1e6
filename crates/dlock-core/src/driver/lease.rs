//! [`Lease`]: what every guard of a lease backend (a key or row with a
//! TTL, renewed by the client: Redis, Redlock, PostgreSQL) keeps of its
//! grant, once.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::checks::check_ttl;
use super::keeper::{Keeper, Kept};
use super::outcome::Outcome;
use super::time::Drift;
use super::validity::Validity;
use crate::{Error, LockKey, LostSignal, Result};

/// A leased grant as its guard holds it: the local deadline and lost
/// signal ([`Validity`]), its slot in the handle's [`Keeper`] (which
/// renews it with `auto_extend` and fires `lost()` at the deadline), and
/// whether it was given back. The guard keeps what is its backend's own
/// (the connection, the stored value) and calls this for the rest:
/// [`is_held`](Self::is_held), [`extend`](Self::extend), and
/// [`stop`](Self::stop) / [`released`](Self::released) / [`dropped`](Self::dropped)
/// as it releases or is dropped.
#[derive(Debug)]
pub struct Lease {
    backend: &'static str,
    key: LockKey,
    lost: LostSignal,
    validity: Arc<Validity>,
    kept: Kept,
    released: bool,
}

/// The connection of a lease backend's handle, as its leases see it.
pub trait LeaseHome: Send + Sync + 'static {
    /// The backend's name, for events and errors.
    const BACKEND: &'static str;

    /// The keeper of the handle's guards.
    fn keeper(&self) -> &Keeper;

    /// The handle was abandoned ([`Lock::abandon`](crate::Lock::abandon)).
    fn is_abandoned(&self) -> bool;
}

/// How a grant was made: when its request was sent, for how long, with
/// what drift, and whether the keeper renews it.
#[derive(Debug, Clone, Copy)]
pub struct Granted {
    /// When the request that granted it was sent.
    pub sent: Instant,
    /// The TTL granted.
    pub ttl: Duration,
    /// The drift its local deadline allows for.
    pub drift: Drift,
    /// The keeper renews it at `ttl / 3`.
    pub auto_extend: bool,
}

impl Granted {
    /// A grant sent at `sent` for `ttl`, as `opts` asked (its
    /// `auto_extend`), with the default drift.
    pub fn new(sent: Instant, ttl: Duration, opts: &crate::AcquireOptions) -> Self {
        Granted {
            sent,
            ttl,
            drift: Drift::DEFAULT,
            auto_extend: opts.auto_extend,
        }
    }

    /// The same with another drift.
    pub fn with_drift(self, drift: Drift) -> Self {
        Granted { drift, ..self }
    }
}

impl Lease {
    /// The lease of a grant of `key` on the handle whose connection is
    /// `conn`, kept by its keeper: `renew(conn)` sends one renewal (for the
    /// granted TTL). The keeper holds the connection weakly (a handle and
    /// its guards all gone close it, whenever the keeper looks next) and
    /// keeps nothing once the handle was abandoned.
    pub fn keep<C, R, Fut>(conn: &Arc<C>, key: &LockKey, granted: Granted, renew: R) -> Lease
    where
        C: LeaseHome,
        R: Fn(Arc<C>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Outcome>> + Send + 'static,
    {
        let Granted {
            sent,
            ttl,
            drift,
            auto_extend,
        } = granted;
        let backend = C::BACKEND;
        let (validity, lost) = Validity::of_key(backend, key, sent, ttl, drift);
        let (to_renew, to_check): (Weak<C>, Weak<C>) = (Arc::downgrade(conn), Arc::downgrade(conn));
        let kept = conn.keeper().keep(
            Arc::clone(&validity),
            ttl,
            auto_extend,
            sent,
            Box::new(move || {
                let renewal = to_renew.upgrade().map(&renew);
                Box::pin(async move {
                    match renewal {
                        Some(renewal) => renewal.await,
                        None => Err(Error::unavailable(backend, "the lock handle is gone")),
                    }
                })
            }),
            move || to_check.upgrade().is_none_or(|c| c.is_abandoned()),
        );
        Lease {
            backend,
            key: key.clone(),
            lost,
            validity,
            kept,
            released: false,
        }
    }

    /// The name held.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The guard's lost signal.
    pub fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// The grant's local deadline and signal.
    pub fn validity(&self) -> &Validity {
        &self.validity
    }

    /// `true` while the signal has not fired, the local deadline is ahead
    /// and the handle (`abandoned` says) was not abandoned.
    pub fn is_held(&self, abandoned: bool) -> bool {
        !self.lost.is_lost() && !abandoned && self.validity.is_valid()
    }

    /// A guard's [`extend`](crate::Guard::extend): checks the TTL and the
    /// handle (`abandoned`), raises the TTL to the backend's `min_ttl`,
    /// then, holding the renewal permit, sends `send(ttl)`: a confirmed
    /// extend moves the local deadline (from the send), a refusal fires
    /// `lost()`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a TTL of zero or more than
    /// [`AcquireOptions::MAX_TTL`](crate::AcquireOptions::MAX_TTL);
    /// [`Error::Unavailable`] when abandoned; [`Error::Lost`] /
    /// [`Error::NotHeld`] for a refusal; `send`'s own errors.
    ///
    /// # Cancel safety
    ///
    /// As `send`'s: the local deadline moves only on a confirmed extend.
    pub async fn extend<F, Fut>(
        &self,
        ttl: Duration,
        min_ttl: Duration,
        abandoned: bool,
        send: F,
    ) -> Result<()>
    where
        F: FnOnce(Duration) -> Fut,
        Fut: Future<Output = Result<Outcome>>,
    {
        check_ttl(self.backend, ttl)?;
        if abandoned {
            return Err(Error::unavailable(self.backend, "this lock handle was abandoned"));
        }
        let ttl = ttl.max(min_ttl);
        let _permit = self.validity.renewal().await;
        let sent = Instant::now();
        let outcome = send(ttl).await?;
        match outcome {
            Ok(()) => {
                self.validity.renewed(sent, ttl);
                self.kept.moved();
            }
            Err(refusal) => self.validity.lose(refusal.why()),
        }
        outcome.map_err(|r| r.into_error(&self.key))
    }

    /// A release starts: the keeper renews it no more.
    pub fn stop(&self) {
        self.kept.stop();
    }

    /// The release was answered (or can never be: the handle was
    /// abandoned): nothing to give back on drop; the signal fires.
    pub fn released(&mut self) {
        self.released = true;
        self.validity.fire_lost();
    }

    /// The guard is dropped: the keeper stops, and the signal fires now
    /// (not with the keeper's slot, whenever it looks next). `true` when
    /// the grant was not given back, so the guard releases it in the
    /// background.
    pub fn dropped(&mut self) -> bool {
        self.kept.stop();
        self.validity.fire_lost();
        !self.released
    }
}
