//! The conformance kit against `MemLock` behind `AnyLock`: the dynamic
//! dispatch layer keeps the contract too.

use std::sync::{Arc, Mutex, PoisonError};

use dlock_core::{AnyLock, LockKey, MemLock, Result};
use dlock_testkit::LockFactory;

#[derive(Clone, Default)]
struct AnyFactory {
    backend: MemLock,
    clients: Arc<Mutex<Vec<(AnyLock, MemLock)>>>,
}

impl LockFactory for AnyFactory {
    type Lock = AnyLock;

    fn name(&self) -> String {
        "any(mem)".to_owned()
    }

    async fn client(&self) -> Result<AnyLock> {
        let mem = self.backend.client();
        let any = AnyLock::new(mem.clone());
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((any.clone(), mem));
        Ok(any)
    }

    async fn crash(&self, client: &AnyLock) {
        let clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let (_, mem) = clients
            .iter()
            .find(|(any, _)| any.same_handle(client))
            .expect("a client of this factory");
        mem.crash();
    }

    async fn residue(&self, namespace: &str) -> Result<Vec<String>> {
        Ok(self
            .backend
            .keys_in_use(namespace)
            .into_iter()
            .map(|k| k.as_str().to_owned())
            .collect())
    }

    async fn contenders(&self, key: &LockKey) -> Result<Option<usize>> {
        Ok(Some(self.backend.contenders(key)))
    }
}

async fn factory() -> AnyFactory {
    AnyFactory::default()
}

dlock_testkit::conformance_tests!(factory);
