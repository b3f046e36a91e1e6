//! A contention workload for fault tests: clients take turns on one key,
//! recording everything in a [`History`], while the test injects faults.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey};
use tokio::task::JoinHandle;

use crate::history::{History, Op};

/// Clients contending for one key until each has held it `rounds` times.
#[derive(Debug)]
pub struct Contention {
    tasks: Vec<JoinHandle<Result<(), String>>>,
    grants: Arc<AtomicUsize>,
}

impl Contention {
    /// Starts one task per client. Each loops: acquire with `opts` (errors
    /// are recorded and retried after 100 ms), hold for `hold`, record a
    /// loss if `is_held()` turned false, release. Gives up (with an error)
    /// after `limit` without finishing.
    pub fn start<L: Lock>(
        clients: Vec<L>,
        key: &LockKey,
        rounds: usize,
        hold: Duration,
        opts: AcquireOptions,
        history: &History,
        limit: Duration,
    ) -> Self {
        let grants = Arc::new(AtomicUsize::new(0));
        let tasks = clients
            .into_iter()
            .enumerate()
            .map(|(id, lock)| {
                let (key, history, grants) = (key.clone(), history.clone(), Arc::clone(&grants));
                tokio::spawn(async move {
                    let name = key.as_str().to_owned();
                    let deadline = Instant::now() + limit;
                    let mut done = 0;
                    while done < rounds {
                        if Instant::now() >= deadline {
                            return Err(format!(
                                "client {id} held the lock only {done} of {rounds} times in {limit:?}"
                            ));
                        }
                        history.record(id, &name, Op::AcquireInvoke);
                        match lock.acquire(&key, opts).await {
                            Ok(g) => {
                                history.record(id, &name, Op::AcquireOk(g.token()));
                                grants.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(hold).await;
                                if !g.is_held() {
                                    history.record(id, &name, Op::Lost);
                                }
                                history.record(id, &name, Op::Release);
                                let _ = g.release().await;
                                done += 1;
                            }
                            Err(Error::Timeout { .. }) => history.record(id, &name, Op::AcquireFail),
                            Err(_) => {
                                history.record(id, &name, Op::AcquireUnknown);
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        Contention { tasks, grants }
    }

    /// Grants so far, over all clients.
    pub fn grants(&self) -> usize {
        self.grants.load(Ordering::SeqCst)
    }

    /// Waits until every client has finished its rounds.
    ///
    /// # Errors
    ///
    /// The first client's failure (out of time, or a panic).
    pub async fn finish(self) -> Result<(), String> {
        for t in self.tasks {
            t.await
                .map_err(|e| format!("a contending client panicked: {e}"))??;
        }
        Ok(())
    }
}
