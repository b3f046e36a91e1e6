//! Scenario 7: the lock family. The uncontended cycle of each primitive
//! next to the mutex's, and shared holding: clients reading at once, and
//! clients sharing a semaphore's permits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, AnyLock, Guard, Lock, LockKey, Wait};

use crate::scenarios::{Backend, key};
use crate::stats::Lat;

/// The primitives measured, in the report's order.
pub(crate) const PRIMITIVES: [&str; 5] = ["mutex", "read", "write", "1 of 3 permits", "2 names at once"];

/// The clients of the shared-holding runs.
pub(crate) const SHARING_CLIENTS: usize = 4;

/// What scenario 7 measured on one backend.
pub(crate) struct Family {
    /// Acquire + release per primitive of [`PRIMITIVES`] (`None`: the
    /// backend does not offer it).
    pub(crate) cycles: Vec<Option<Lat>>,
    /// [`SHARING_CLIENTS`] clients reading one name, each holding
    /// [`crate::HOLD`] and reading again at once: grants per second, and
    /// the most readers seen at once.
    pub(crate) readers: Option<(f64, usize)>,
    /// The same on one permit of a semaphore of 2.
    pub(crate) permits: Option<(f64, usize)>,
}

/// One acquire + release of primitive `p` (of [`PRIMITIVES`]).
async fn cycle(client: &AnyLock, p: usize, k: &LockKey, k2: &LockKey) -> distlock::Result<()> {
    let opts = AcquireOptions::default();
    match p {
        0 => client.acquire(k, opts).await?.release().await,
        1 => client.acquire_read(k, opts).await?.release().await,
        2 => client.acquire_write(k, opts).await?.release().await,
        3 => client.acquire_permits(k, 1, 3, opts).await?.release().await,
        _ => {
            client
                .acquire_all(&[k.clone(), k2.clone()], opts)
                .await?
                .release()
                .await
        }
    }
}

/// Scenario 7 on `b`: `iterations` cycles of every offered primitive, in
/// turn, then the two shared-holding runs of `duration` each.
pub(crate) async fn family(b: &Backend, iterations: usize, duration: Duration) -> Result<Family, String> {
    let client = b.client().await?;
    let caps = client.capabilities();
    let offered = |p: usize| match p {
        1 | 2 => caps.read_write,
        3 => caps.semaphores,
        _ => true,
    };
    let names: Vec<(LockKey, LockKey)> = (0..PRIMITIVES.len())
        .map(|_| (key("family"), key("family")))
        .collect();
    let mut cycles: Vec<Option<Lat>> = (0..PRIMITIVES.len())
        .map(|p| offered(p).then(Lat::default))
        .collect();
    let warmup = iterations / 10 + 5;
    let fail = |e: distlock::Error| format!("{}: {e}", b.name);
    for i in 0..warmup + iterations {
        for (p, (k, k2)) in names.iter().enumerate() {
            let Some(lat) = &mut cycles[p] else { continue };
            let t = Instant::now();
            cycle(&client, p, k, k2).await.map_err(fail)?;
            if i >= warmup {
                lat.record(t.elapsed());
            }
        }
    }
    let readers = match caps.read_write {
        true => Some(sharing(b, duration, None).await?),
        false => None,
    };
    let permits = match caps.semaphores {
        true => Some(sharing(b, duration, Some(2)).await?),
        false => None,
    };
    Ok(Family {
        cycles,
        readers,
        permits,
    })
}

/// [`SHARING_CLIENTS`] clients loop on one name (reads, or one permit of
/// `limit`) for `duration`: grants per second, most holders at once.
async fn sharing(b: &Backend, duration: Duration, limit: Option<u32>) -> Result<(f64, usize), String> {
    let k = key("sharing");
    let (holding, most, grants, errors) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let started = Instant::now();
    let stop = started + duration;
    let opts = AcquireOptions::default().wait(Wait::For(Duration::from_secs(20)));
    let mut tasks = Vec::new();
    for _ in 0..SHARING_CLIENTS {
        let client = b.client().await?;
        let (k, holding, most, grants, errors) = (
            k.clone(),
            Arc::clone(&holding),
            Arc::clone(&most),
            Arc::clone(&grants),
            Arc::clone(&errors),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let taken = match limit {
                    None => client.acquire_read(&k, opts).await,
                    Some(limit) => client.acquire_permits(&k, 1, limit, opts).await,
                };
                let g = match taken {
                    Ok(g) => g,
                    Err(e) => {
                        // A broken primitive fails the run, not hides in it.
                        if errors.fetch_add(1, Ordering::SeqCst) > 100 {
                            return Err(e.to_string());
                        }
                        continue;
                    }
                };
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                grants.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(crate::HOLD).await;
                holding.fetch_sub(1, Ordering::SeqCst);
                let _ = g.release().await;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{}: {e}", b.name))?;
    }
    if grants.load(Ordering::SeqCst) == 0 {
        return Err(format!("{}: no grant in {duration:?} of sharing", b.name));
    }
    #[allow(clippy::cast_precision_loss)]
    let per_s = grants.load(Ordering::SeqCst) as f64 / started.elapsed().as_secs_f64();
    Ok((per_s, most.load(Ordering::SeqCst)))
}
