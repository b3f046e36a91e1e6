//! The conformance kit against `MemLock` behind `AnyLock`: the dynamic
//! dispatch layer keeps the contract too.

use dlock_core::{AnyLock, LockKey, Result};
use dlock_testkit::{LockFactory, MemFactory};

#[derive(Clone, Default)]
struct AnyFactory {
    inner: MemFactory,
}

impl LockFactory for AnyFactory {
    type Lock = AnyLock;

    fn name(&self) -> String {
        "any(mem)".to_owned()
    }

    async fn client(&self) -> Result<AnyLock> {
        // Abandoned through AnyLock's own forwarding (the factory default).
        Ok(AnyLock::new(self.inner.client().await?))
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        self.inner.residue(namespace).await
    }

    async fn contenders(&self, key: &LockKey) -> Result<Option<usize>> {
        self.inner.contenders(key).await
    }
}

async fn factory() -> AnyFactory {
    AnyFactory::default()
}

dlock_testkit::conformance_tests!(factory, skip: [
    // In process: no network link to break.
    cancelled_acquire_in_flight_leaves_nothing,
    unreachable_backend_is_unavailable,
    failed_release_is_not_ok,
    dead_link_fires_lost_in_time,
    cancelled_on_a_dead_link_is_not_replayed,
    unoffered_primitives_are_refused,
]);
