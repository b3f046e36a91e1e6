//! Scenarios 1 to 6 (7, the lock family, is in `family.rs`). Each returns its figures; nothing here judges them.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use distlock::{AcquireOptions, AnyLock, Guard, Lock, LockKey, Wait};
use futures::StreamExt;

use crate::floor::Floor;
use crate::peer::Peer;
use crate::stats::Lat;

/// Where a backend's peer connects.
pub(crate) enum PeerAt {
    /// rslock over these Redis URLs.
    Rslock(Vec<String>),
    /// etcd-client at these endpoints.
    Etcd(Vec<String>),
    /// zookeeper-client at this connect string.
    Zk(String),
}

/// One backend under test: the driver (through the facade, as users take
/// it) and the floor's raw client.
pub(crate) struct Backend {
    /// The peer library's client, made on demand.
    pub(crate) peer_at: Option<PeerAt>,
    /// `redis`, `redlock`, `etcd`, `zk`, `postgres`.
    pub(crate) name: &'static str,
    /// The dlock URL.
    pub(crate) url: String,
    /// The raw client library's floor.
    pub(crate) floor: Floor,
    /// A second raw client (the other side of a handoff).
    pub(crate) other: Floor,
    /// The raw URL of the one Redis server (for the handoff floor's
    /// subscriber), if that is the backend.
    pub(crate) redis_url: Option<String>,
}

impl Backend {
    /// A new independent client of the peer library, if there is a peer.
    pub(crate) async fn peer(&self) -> Result<Option<Peer>, String> {
        Ok(match &self.peer_at {
            None => None,
            Some(PeerAt::Rslock(urls)) => Some(Peer::rslock(urls)),
            Some(PeerAt::Etcd(endpoints)) => Some(Peer::etcd(endpoints).await?),
            Some(PeerAt::Zk(connect)) => Some(Peer::zk(connect).await?),
        })
    }

    /// A new independent client (its own connections or session).
    pub(crate) async fn client(&self) -> Result<AnyLock, String> {
        distlock::connect_url(&self.url)
            .await
            .map_err(|e| format!("{}: {e}", self.name))
    }
}

pub(crate) fn key(name: &str) -> LockKey {
    LockKey::new(format!("bench-{name}-{:x}", rand::random::<u32>())).expect("a valid key")
}

/// One cycle of ours: acquire + release through `lock` with `opts`.
pub(crate) async fn ours<L: Lock>(lock: &L, key: &LockKey, opts: AcquireOptions) -> Result<(), String> {
    let g = lock.acquire(key, opts).await.map_err(|e| e.to_string())?;
    g.release().await.map_err(|e| e.to_string())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Scenario 1: one client, one key at a time, acquire + release, next to
/// the floor's cycle, interleaved (one of each in turn) so drift hits both.
pub(crate) struct Uncontended {
    pub(crate) ours: Lat,
    pub(crate) floor: Lat,
    /// The peer's name and cycles, where the backend has one.
    pub(crate) peer: Option<(&'static str, Lat)>,
}

pub(crate) async fn uncontended(b: &Backend, iterations: usize) -> Result<Uncontended, String> {
    let client = b.client().await?;
    let k = key("uncontended");
    let floor_key = format!("bench-floor-{:x}", rand::random::<u32>());
    let opts = AcquireOptions::default();
    let (mut ours, mut floor, mut peer_lat) = (Lat::default(), Lat::default(), Lat::default());
    let peer = b.peer().await?;
    let peer_key = format!("bench-peer-{:x}", rand::random::<u32>());
    let warmup = iterations / 10 + 5;
    for i in 0..warmup + iterations {
        if let Some(p) = &peer {
            let t = Instant::now();
            p.cycle(&peer_key).await?;
            if i >= warmup {
                peer_lat.record(t.elapsed());
            }
        }
        let t = Instant::now();
        let g = client
            .acquire(&k, opts)
            .await
            .map_err(|e| format!("{}: {e}", b.name))?;
        g.release().await.map_err(|e| format!("{}: {e}", b.name))?;
        let d = t.elapsed();
        let t = Instant::now();
        b.floor.cycle(&floor_key).await?;
        let f = t.elapsed();
        if i >= warmup {
            ours.record(d);
            floor.record(f);
        }
    }
    Ok(Uncontended {
        ours,
        floor,
        peer: peer.map(|p| (p.name(), peer_lat)),
    })
}

/// The floor of a handoff with raw clients (see [`crate::floor::handoff`]).
pub(crate) async fn handoff_floor(b: &Backend, iterations: usize) -> Result<Option<Lat>, String> {
    crate::floor::handoff(&b.floor, &b.other, b.redis_url.as_deref(), iterations).await
}

/// One trivial round trip.
pub(crate) async fn round_trip(b: &Backend, iterations: usize) -> Result<Lat, String> {
    let mut lat = Lat::default();
    for i in 0..iterations + 10 {
        let t = Instant::now();
        b.floor.round_trip().await?;
        if i >= 10 {
            lat.record(t.elapsed());
        }
    }
    Ok(lat)
}

/// Scenarios 2 and 4: `clients` independent clients loop on one key, each
/// holding `hold` and retrying at once, for `duration`.
pub(crate) struct HotKey {
    pub(crate) acquisitions_per_s: f64,
    /// From one client's release (its call) to a *different* client's grant.
    pub(crate) handoff: Lat,
    pub(crate) grants: Vec<u64>,
    pub(crate) errors: u64,
}

impl HotKey {
    /// Two rounds of the same scenario as one (rates averaged by time:
    /// the rounds are equally long; grants per client position summed).
    pub(crate) fn merged(a: HotKey, b: HotKey) -> HotKey {
        let mut handoff = a.handoff;
        handoff.add(&b.handoff);
        HotKey {
            acquisitions_per_s: (a.acquisitions_per_s + b.acquisitions_per_s) / 2.0,
            handoff,
            grants: a.grants.iter().zip(&b.grants).map(|(x, y)| x + y).collect(),
            errors: a.errors + b.errors,
        }
    }

    /// Fewest grants per client / most.
    pub(crate) fn fairness(&self) -> f64 {
        let min = self.grants.iter().copied().min().unwrap_or(0);
        let max = self.grants.iter().copied().max().unwrap_or(0);
        if max == 0 { 0.0 } else { min as f64 / max as f64 }
    }
}

pub(crate) async fn hot_key(
    b: &Backend,
    clients: usize,
    hold: Duration,
    duration: Duration,
) -> Result<HotKey, String> {
    let mut locks = Vec::new();
    for _ in 0..clients {
        locks.push(Contender::Ours(b.client().await?));
    }
    contend(locks, hold, duration).await
}

/// The same as [`hot_key`] with the backend's peer, if it has one.
pub(crate) async fn peer_hot_key(
    b: &Backend,
    clients: usize,
    hold: Duration,
    duration: Duration,
) -> Result<Option<HotKey>, String> {
    let mut peers = Vec::new();
    for _ in 0..clients {
        match b.peer().await? {
            Some(p) => peers.push(Contender::Peer(p)),
            None => return Ok(None),
        }
    }
    contend(peers, hold, duration).await.map(Some)
}

/// A client of the hot key: ours, or the peer's.
pub(crate) enum Contender {
    Ours(AnyLock),
    Peer(Peer),
}

enum Taken {
    Ours(distlock::AnyGuard),
    Peer(crate::peer::Held),
}

impl Contender {
    /// Takes `k`, waiting as its library waits; `Ok(None)` when it gave up
    /// (the peer's retries ran out): the caller tries again.
    async fn take(&self, k: &LockKey, opts: AcquireOptions) -> Result<Option<Taken>, String> {
        match self {
            Contender::Ours(lock) => lock
                .acquire(k, opts)
                .await
                .map(|g| Some(Taken::Ours(g)))
                .map_err(|e| e.to_string()),
            Contender::Peer(p) => Ok(p.lock(k.as_str()).await?.map(Taken::Peer)),
        }
    }

    async fn give(&self, taken: Taken) -> Result<(), String> {
        match (self, taken) {
            (Contender::Ours(_), Taken::Ours(g)) => g.release().await.map_err(|e| e.to_string()),
            (Contender::Peer(p), Taken::Peer(h)) => p.unlock(h).await,
            _ => Err("a lock given back to another client".to_owned()),
        }
    }
}

/// `contenders` loop on one key, each holding `hold` and trying again at
/// once, for `duration`.
async fn contend(contenders: Vec<Contender>, hold: Duration, duration: Duration) -> Result<HotKey, String> {
    let locks = contenders;
    let k = key("hot");
    let last_release: Arc<Mutex<Option<(usize, Instant)>>> = Arc::default();
    let handoff: Arc<Mutex<Lat>> = Arc::default();
    let opts = AcquireOptions::default().wait(Wait::For(Duration::from_secs(20)));
    let started = Instant::now();
    let stop = started + duration;
    let mut tasks = Vec::new();
    for (id, lock) in locks.into_iter().enumerate() {
        let (k, last_release, handoff) = (k.clone(), Arc::clone(&last_release), Arc::clone(&handoff));
        tasks.push(tokio::spawn(async move {
            let (mut grants, mut errors) = (0u64, 0u64);
            while Instant::now() < stop {
                let g = match lock.take(&k, opts).await {
                    Ok(Some(g)) => g,
                    Ok(None) => continue,
                    Err(_) => {
                        errors += 1;
                        continue;
                    }
                };
                let now = Instant::now();
                if let Some((from, at)) = *lock_ref(&last_release)
                    && from != id
                {
                    lock_ref(&handoff).record(now.saturating_duration_since(at));
                }
                grants += 1;
                // The work done under the lock.
                tokio::time::sleep(hold).await;
                *lock_ref(&last_release) = Some((id, Instant::now()));
                if lock.give(g).await.is_err() {
                    errors += 1;
                }
            }
            (grants, errors)
        }));
    }
    let mut grants = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (g, e) = t.await.map_err(|e| e.to_string())?;
        grants.push(g);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let handoff = lock(&handoff).clone();
    Ok(HotKey {
        acquisitions_per_s: grants.iter().sum::<u64>() as f64 / elapsed,
        handoff,
        grants,
        errors,
    })
}

fn lock_ref<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    lock(m)
}

/// Scenario 3: `tasks` tasks on distinct keys through one client, against
/// the floor's cycle at the same concurrency through one raw client.
pub(crate) struct ManyKeys {
    pub(crate) ours_per_s: f64,
    pub(crate) floor_per_s: f64,
}

pub(crate) async fn many_keys(b: &Backend, tasks: usize, duration: Duration) -> Result<ManyKeys, String> {
    let client = b.client().await?;
    let ours = {
        let started = Instant::now();
        let stop = started + duration;
        let mut handles = Vec::new();
        for i in 0..tasks {
            let (client, k) = (client.clone(), key(&format!("many-{i}")));
            handles.push(tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < stop {
                    if let Ok(g) = client.acquire(&k, AcquireOptions::default()).await
                        && g.release().await.is_ok()
                    {
                        n += 1;
                    }
                }
                n
            }));
        }
        let mut n = 0;
        for h in handles {
            n += h.await.map_err(|e| e.to_string())?;
        }
        n as f64 / started.elapsed().as_secs_f64()
    };
    let floor = {
        let started = Instant::now();
        let stop = started + duration;
        let mut handles = Vec::new();
        for i in 0..tasks {
            let floor = b.floor.clone();
            let k = format!("bench-floor-many-{i}-{:x}", rand::random::<u32>());
            handles.push(tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < stop {
                    if floor.cycle(&k).await.is_ok() {
                        n += 1;
                    }
                }
                n
            }));
        }
        let mut n = 0;
        for h in handles {
            n += h.await.map_err(|e| e.to_string())?;
        }
        n as f64 / started.elapsed().as_secs_f64()
    };
    Ok(ManyKeys {
        ours_per_s: ours,
        floor_per_s: floor,
    })
}

/// Scenario 5: Redlock's acquire latency with the nodes behind fault
/// proxies: all healthy, one delayed, one blackholed.
pub(crate) struct FanOut {
    pub(crate) request_timeout: Duration,
    pub(crate) delay: Duration,
    pub(crate) healthy: Lat,
    pub(crate) delayed: Lat,
    pub(crate) blackholed: Lat,
}

pub(crate) async fn fan_out(node_urls: &[String], iterations: usize) -> Result<FanOut, String> {
    use dlock_testkit::launcher::{Fault, FaultProxy};
    let mut proxies = Vec::new();
    for u in node_urls {
        let addr: std::net::SocketAddr = u
            .trim_start_matches("redis://")
            .parse()
            .map_err(|e| format!("{u}: {e}"))?;
        proxies.push(FaultProxy::start(addr).await.map_err(|e| e.to_string())?);
    }
    let config = dlock_redlock::RedlockConfig::new(proxies.iter().map(|p| format!("redis://{}", p.addr())));
    let request_timeout = config.request_timeout;
    let client = dlock_redlock::Redlock::connect(config)
        .await
        .map_err(|e| format!("redlock: {e}"))?;
    // The delayed node's round trip gains 5 ms: 2.5 ms each way.
    let delay = Duration::from_millis(5);
    let run = async |fault: Fault, n: usize| -> Result<Lat, String> {
        proxies[0].set(fault);
        let k = key("fan-out");
        let mut lat = Lat::default();
        for i in 0..n + 5 {
            let t = Instant::now();
            let g = client
                .acquire(&k, AcquireOptions::default())
                .await
                .map_err(|e| format!("redlock: {e}"))?;
            let d = t.elapsed();
            let _ = g.release().await;
            if i >= 5 {
                lat.record(d);
            }
        }
        Ok(lat)
    };
    let healthy = run(Fault::None, iterations).await?;
    let delayed = run(Fault::Delay(delay / 2), iterations).await?;
    let blackholed = run(Fault::Blackhole, iterations / 3 + 1).await?;
    proxies[0].set(Fault::None);
    Ok(FanOut {
        request_timeout,
        delay,
        healthy,
        delayed,
        blackholed,
    })
}

/// Scenario 6, in a child process of its own: the resident memory before
/// and after `guards` guards are held at once with auto-extend through one
/// client. Returns (before, after) in bytes.
pub(crate) async fn memory(url: &str, guards: usize) -> Result<(u64, u64), String> {
    let client = distlock::connect_url(url).await.map_err(|e| e.to_string())?;
    // One round first, so the connection's own buffers are in the baseline.
    let g = client
        .acquire(&key("memory-warmup"), AcquireOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    g.release().await.map_err(|e| e.to_string())?;
    let before = rss()?;
    let prefix = format!("bench-memory-{:x}", rand::random::<u32>());
    let held: Vec<_> = futures::stream::iter(0..guards)
        .map(|i| {
            let (client, k) = (
                client.clone(),
                LockKey::new(format!("{prefix}-{i}")).expect("a valid key"),
            );
            async move {
                client
                    .acquire(&k, AcquireOptions::default().auto_extend(true))
                    .await
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let after = rss()?;
    let mut guards_held = Vec::new();
    for g in held {
        guards_held.push(g.map_err(|e| e.to_string())?);
    }
    futures::stream::iter(guards_held)
        .for_each_concurrent(64, |g| async move {
            let _ = g.release().await;
        })
        .await;
    Ok((before, after))
}

/// This process's resident set size, from `/proc/self/status`.
fn rss() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| "no VmRSS in /proc/self/status".to_owned())
}
