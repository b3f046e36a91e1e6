//! Several names at once: the [`MultiGuard`] of
//! [`Lock::acquire_all`](crate::Lock::acquire_all), generic over any
//! [`Guard`].

use std::time::Duration;

use futures::future::join_all;

use crate::{FencingToken, Guard, LockKey, LostSignal, LostTrigger, Result};

/// The guard of several names held together ([`Lock::acquire_all`](crate::Lock::acquire_all)): one
/// part per name, in name order.
///
/// It behaves as one guard: [`lost`](Self::lost) fires when any part is (or
/// may be) lost, [`is_held`](Self::is_held) is true only while every part
/// is, [`extend`](Self::extend) and [`release`](Self::release) act on all
/// of them, and dropping it drops every part (each a best-effort release).
/// Each part keeps its own fencing token ([`tokens`](Self::tokens)): a
/// resource guarded by one of the names checks that name's token.
#[must_use = "dropping the guard releases every name (best effort)"]
pub struct MultiGuard<G: Guard> {
    parts: Vec<G>,
    lost: LostSignal,
    /// Fires `lost` when any part's signal does.
    watch: tokio::task::JoinHandle<()>,
}

impl<G: Guard> MultiGuard<G> {
    /// Holds `parts` together, sorted by name: for a driver that takes a
    /// set its own way ([`driver::acquire_all`](crate::driver::acquire_all)
    /// is the usual way).
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (it starts the task that fires
    /// [`lost`](Self::lost) with any part's).
    pub fn from_parts(mut parts: Vec<G>) -> Self {
        parts.sort_by(|a, b| a.key().as_str().cmp(b.key().as_str()));
        Self::new(parts)
    }

    /// Holds `parts` together (their order is kept).
    pub(crate) fn new(parts: Vec<G>) -> Self {
        let (trigger, lost) = LostSignal::pair();
        let signals: Vec<LostSignal> = parts.iter().map(Guard::lost).collect();
        let watch = tokio::spawn(fire_on_any(signals, trigger));
        MultiGuard { parts, lost, watch }
    }

    /// The parts, one guard per name, in name order.
    pub fn parts(&self) -> &[G] {
        &self.parts
    }

    /// The names held, in name order.
    pub fn keys(&self) -> impl Iterator<Item = &LockKey> {
        self.parts.iter().map(Guard::key)
    }

    /// Each name's fencing token (`None` where the backend gives none), in
    /// name order.
    pub fn tokens(&self) -> impl Iterator<Item = (&LockKey, Option<FencingToken>)> {
        self.parts.iter().map(|g| (g.key(), g.token()))
    }

    /// Resolves when any part is, or may be, lost, and once the guard is
    /// released or dropped.
    pub fn lost(&self) -> LostSignal {
        self.lost.clone()
    }

    /// `true` while every part [is held](Guard::is_held).
    pub fn is_held(&self) -> bool {
        !self.lost.is_lost() && self.parts.iter().all(Guard::is_held)
    }

    /// Resets every part's TTL to `ttl` from now (concurrently).
    ///
    /// # Errors
    ///
    /// The first part's error in name order, as [`Guard::extend`] describes
    /// them; the other parts were extended or not independently.
    ///
    /// # Cancel safety
    ///
    /// As [`Guard::extend`], for each part.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        join_all(self.parts.iter().map(|g| g.extend(ttl)))
            .await
            .into_iter()
            .collect()
    }

    /// Gives every name back (concurrently; every part is released even if
    /// another fails).
    ///
    /// # Errors
    ///
    /// The first part's error in name order, as [`Guard::release`]
    /// describes them.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the parts not yet released, each of which
    /// schedules its best-effort release.
    pub async fn release(mut self) -> Result<()> {
        self.watch.abort();
        let parts = std::mem::take(&mut self.parts);
        join_all(parts.into_iter().map(Guard::release))
            .await
            .into_iter()
            .collect()
    }
}

impl<G: Guard> Drop for MultiGuard<G> {
    fn drop(&mut self) {
        // The watch held the trigger: the signal fires with it.
        self.watch.abort();
    }
}

impl<G: Guard> std::fmt::Debug for MultiGuard<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("keys", &self.keys().map(LockKey::as_str).collect::<Vec<_>>())
            .field("held", &self.is_held())
            .finish()
    }
}

/// Fires `trigger` when any of `signals` fires.
async fn fire_on_any(signals: Vec<LostSignal>, trigger: LostTrigger) {
    if signals.is_empty() {
        // Nothing to lose: only the guard's drop fires it.
        return std::future::pending().await;
    }
    let waits = signals.iter().map(|s| Box::pin(s.wait()));
    futures::future::select_all(waits).await;
    trigger.fire();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AcquireOptions, Error, Lock, MemLock, Wait};
    use std::time::Instant;

    fn key(name: &str) -> LockKey {
        LockKey::new(name).unwrap()
    }

    const LONG: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn bad_key_lists_are_refused() {
        let lock = MemLock::new();
        let opts = AcquireOptions::default();
        assert!(matches!(
            lock.acquire_all(&[], opts).await,
            Err(Error::InvalidKey { .. })
        ));
        let e = lock
            .acquire_all(&[key("a"), key("b"), key("a")], opts)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("\"a\" is named twice"), "{e}");
        // Nothing was taken on the way.
        assert!(lock.keys_in_use("").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn parts_come_in_name_order_with_their_tokens() {
        let lock = MemLock::new();
        let g = lock
            .acquire_all(&[key("c"), key("a"), key("b")], AcquireOptions::default())
            .await
            .unwrap();
        let keys: Vec<&str> = g.keys().map(LockKey::as_str).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert!(g.tokens().all(|(_, t)| t.is_some()));
        assert!(g.is_held());
        g.release().await.unwrap();
        assert!(lock.keys_in_use("").await.unwrap().is_empty());
    }

    /// One part lost is the whole guard lost; its release still gives back
    /// every part it can.
    #[tokio::test]
    async fn one_part_lost_is_the_guard_lost() {
        let (a, b) = (MemLock::new(), MemLock::new());
        let b = b.client();
        let a2 = a.client();
        let short = AcquireOptions::default()
            .auto_extend(false)
            .ttl(Duration::from_millis(crate::MEM_MIN_TTL.as_millis() as u64 + 100));
        let x = a.acquire(&key("x"), short).await.unwrap();
        let y = a
            .acquire(&key("y"), AcquireOptions::default().ttl(LONG))
            .await
            .unwrap();
        let g = MultiGuard::new(vec![x, y]);
        let lost = g.lost();
        tokio::time::timeout(LONG, lost.wait()).await.unwrap();
        assert!(!g.is_held());
        assert!(g.release().await.is_err(), "x was lost");
        // y was given back.
        assert!(
            a2.try_acquire(&key("y"), AcquireOptions::default())
                .await
                .unwrap()
                .is_some()
        );
        drop(b);
    }

    #[tokio::test]
    async fn a_dropped_guard_fires_lost_and_frees_every_name() {
        let lock = MemLock::new();
        let other = lock.client();
        let g = lock
            .acquire_all(&[key("a"), key("b")], AcquireOptions::default())
            .await
            .unwrap();
        let lost = g.lost();
        drop(g);
        tokio::time::timeout(LONG, lost.wait()).await.unwrap();
        let again = tokio::time::timeout(
            LONG,
            other.acquire_all(
                &[key("b"), key("a")],
                AcquireOptions::default().wait(Wait::Forever),
            ),
        )
        .await
        .unwrap()
        .unwrap();
        again.release().await.unwrap();
    }

    /// All or nothing: a set with one name held elsewhere leaves the others
    /// free, within the one wait.
    #[tokio::test]
    async fn all_or_nothing_within_the_wait() {
        let lock = MemLock::new();
        let holder = lock.client();
        let held = holder
            .acquire(&key("b"), AcquireOptions::default())
            .await
            .unwrap();
        let wait = Duration::from_millis(200);
        let started = Instant::now();
        let e = lock
            .acquire_all(
                &[key("a"), key("b"), key("c")],
                AcquireOptions::default().wait(Wait::For(wait)),
            )
            .await
            .unwrap_err();
        assert!(matches!(&e, Error::Timeout { key } if key == "b"), "{e}");
        assert!(started.elapsed() >= wait);
        assert_eq!(lock.keys_in_use("").await.unwrap(), ["b"]);
        held.release().await.unwrap();
    }

    /// Two clients taking the same names in opposite orders, many times,
    /// concurrently: never a deadlock (each would time out).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn crossed_sets_do_not_deadlock() {
        let lock = MemLock::new();
        let opts = AcquireOptions::default().wait(Wait::For(LONG));
        let mut tasks = Vec::new();
        for names in [["x", "y"], ["y", "x"]] {
            let lock = lock.client();
            tasks.push(tokio::spawn(async move {
                let keys = names.map(key);
                for _ in 0..200 {
                    let g = lock.acquire_all(&keys, opts).await.unwrap();
                    tokio::task::yield_now().await;
                    g.release().await.unwrap();
                }
            }));
        }
        for t in tasks {
            tokio::time::timeout(LONG, t).await.unwrap().unwrap();
        }
    }
}
