//! Interoperability with redis-py itself: `redis.lock.Lock` of Debian's
//! `python3-redis` (its version printed at the start of the run), in a
//! Python process on Debian's `/usr/bin/python3`, contends with our
//! clients for the same Redis key: the one `RedisLock::redis_key` names
//! (our prefix and the name), which redis-py's `Lock` takes as it is.
//!
//! A fixed-order scenario both ways, with our default prefix and with none:
//! each side is refused while the other holds and granted once it
//! releases, each side sees the other's holder, and our waiter behind
//! redis-py is granted after redis-py's release, which announces nothing,
//! by its own poll. And a free run: two of our clients and two redis-py
//! contenders (threads of one Python process) loop on one lock, every hold
//! recorded on the test's clock and checked: never two holders at once.

use std::time::{Duration, Instant};

use dlock_core::driver::Owner;
use dlock_core::{AcquireOptions, Guard, Lock, LockKey, Role, Wait};

fn info(value: &str) -> Option<Owner> {
    Owner::from_value(value)
}
use dlock_redis::{RedisConfig, RedisLock};
use dlock_testkit::launcher::{Redis, shared};
use dlock_testkit::reference::Holds;
use dlock_testkit::reference::python::RedisPy;

const LIMIT: Duration = Duration::from_secs(30);
/// How long the free run lasts.
const RUN: Duration = Duration::from_millis(1500);
/// The holds' TTL in the free run (no hold comes near it).
const TTL: Duration = Duration::from_secs(10);
/// How often redis-py's blocking acquire tries again (the `Lock`'s
/// `sleep`): its default of 0.1 s would give it few chances in a short run
/// against our waiters, which a release of ours wakes at once.
const PY_POLL: Duration = Duration::from_millis(5);
/// How soon our waiter is granted after redis-py released: its poll (at
/// most 150 ms) and an attempt, with room for a busy machine — far below
/// the holder's TTL ([`LIMIT`]), the other way it could have got in.
const POLLED_WITHIN: Duration = Duration::from_secs(2);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

fn unique(name: &str) -> String {
    format!("py-{name}-{:x}", rand::random::<u64>())
}

fn opts() -> AcquireOptions {
    AcquireOptions::default().ttl(LIMIT).wait(Wait::For(LIMIT))
}

/// A hold's length: a few milliseconds of "work".
fn work() -> Duration {
    Duration::from_micros(rand::random_range(500..4_000))
}

/// Polls `cond` until it holds, for at most [`LIMIT`].
async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The shared Redis (kept alive while a private one) and a redis-py process.
struct Setup {
    url: String,
    py: RedisPy,
    _server: Option<Redis>,
}

async fn setup() -> Setup {
    let endpoint = shared::redis().await.expect("a redis server for the tests");
    let url = endpoint.addresses[0].clone();
    let py = RedisPy::start(&url, PY_POLL).await.unwrap();
    Setup {
        url,
        py,
        _server: endpoint.server,
    }
}

async fn connect(url: &str, prefix: &str) -> RedisLock {
    RedisLock::connect(RedisConfig::from_url(url).key_prefix(prefix))
        .await
        .unwrap()
}

/// How many of our waiters are queued on `lock_key` (they are, from their
/// second attempt on), read with a plain client.
async fn queued(url: &str, lock_key: &str) -> i64 {
    use dlock_redis_protocol::scripts::{QUEUE_SUFFIX, companion_key};
    use fred::prelude::{Builder, ClientLike, Config, LuaInterface};
    let c = Builder::from_config(Config::from_url(url).unwrap())
        .build()
        .unwrap();
    c.init().await.unwrap();
    let n = c
        .eval(
            "return redis.call('ZCARD', KEYS[1])",
            vec![companion_key(lock_key, QUEUE_SUFFIX)],
            Vec::<String>::new(),
        )
        .await
        .unwrap();
    c.quit().await.unwrap();
    n
}

/// Nothing of `k` is left: no lock key, ours or redis-py's.
async fn nothing_left(lock: &RedisLock, k: &LockKey) {
    until("nothing left behind", async || {
        lock.keys_in_use(k.as_str()).await.unwrap().is_empty()
    })
    .await;
}

/// The Redis key of `k`, as redis-py is given it: our prefix and the name.
fn redis_key(ours: &RedisLock, k: &LockKey) -> String {
    let name = ours.redis_key(k).unwrap();
    assert_eq!(name, format!("{}{}", ours.config().key_prefix, k.as_str()));
    name
}

/// The fixed order, with our clients on `prefix`.
async fn fixed_order(prefix: &str) {
    let s = setup().await;
    let ours = connect(&s.url, prefix).await;
    let k = key(&unique("fixed"));
    let name = redis_key(&ours, &k);
    let (p1, p2) = (s.py.contender("p1"), s.py.contender("p2"));

    // redis-py holds: we are refused, and see its holder.
    let value = p1
        .try_acquire(&name, LIMIT)
        .await
        .unwrap()
        .expect("redis-py is granted a free lock");
    assert!(
        ours.try_acquire(&k, opts()).await.unwrap().is_none(),
        "dlock was granted {name:?} while redis-py held it"
    );
    let listed = ours.holders(&k).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|h| (h.role, h.id.as_str(), h.detail.as_str()))
            .collect::<Vec<_>>(),
        [(Role::Mutex, name.as_str(), value.as_str())],
        "our view of redis-py's holder: {listed:?}"
    );
    assert!(
        info(&listed[0].detail).is_none(),
        "redis-py's value read as ours: {listed:?}"
    );
    assert!(
        listed[0].remaining.is_some_and(|r| r <= LIMIT),
        "redis-py's TTL: {listed:?}"
    );

    // redis-py released: we are granted at once.
    p1.release().await.unwrap();
    let g = ours
        .try_acquire(&k, opts())
        .await
        .unwrap()
        .expect("dlock is granted once redis-py released");

    // We hold: redis-py is refused (also after our extend) and sees a holder.
    assert_eq!(
        p2.try_acquire(&name, LIMIT).await.unwrap(),
        None,
        "redis-py was granted {name:?} while dlock held it"
    );
    assert!(p2.locked(&name).await.unwrap(), "redis-py does not see our hold");
    g.extend(LIMIT).await.unwrap();
    assert_eq!(p2.try_acquire(&name, LIMIT).await.unwrap(), None);

    // We released: redis-py is granted at once.
    g.release().await.unwrap();
    let value = p2
        .try_acquire(&name, LIMIT)
        .await
        .unwrap()
        .expect("redis-py is granted once dlock released");

    // Our waiter behind redis-py: refused and queued, then granted by its
    // own poll once redis-py released (which publishes nothing), long
    // before redis-py's TTL would have let it in.
    let waiter = tokio::spawn({
        let (lock, k) = (ours.clone(), k.clone());
        async move { lock.acquire(&k, opts()).await }
    });
    until("our waiter queued behind redis-py", async || {
        queued(&s.url, &name).await == 1
    })
    .await;
    assert!(!waiter.is_finished(), "our waiter ended while redis-py held");
    assert_eq!(
        ours.holder(&k).await.unwrap().map(|h| h.detail),
        Some(value),
        "redis-py is the holder our waiter waits for"
    );
    p2.release().await.unwrap();
    let released = Instant::now();
    let g = tokio::time::timeout(POLLED_WITHIN, waiter)
        .await
        .unwrap_or_else(|_| {
            panic!("our waiter was not granted within {POLLED_WITHIN:?} of redis-py's release")
        })
        .unwrap()
        .unwrap();
    let waited = released.elapsed();
    assert!(g.is_held());
    assert_eq!(p1.try_acquire(&name, LIMIT).await.unwrap(), None);
    assert!(p1.locked(&name).await.unwrap());
    g.release().await.unwrap();
    assert!(
        !p1.locked(&name).await.unwrap(),
        "our release is seen by redis-py"
    );
    assert_eq!(queued(&s.url, &name).await, 0, "our waiter left the queue");
    s.py.close().await;
    nothing_left(&ours, &k).await;
    eprintln!("our waiter was granted {waited:?} after redis-py released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_excludes_redis_py_both_ways() {
    fixed_order("dlock:").await;
}

/// No prefix: redis-py's lock on the bare name, the plain case.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_excludes_redis_py_both_ways_without_a_prefix() {
    fixed_order("").await;
}

/// Two of ours and two redis-py contenders loop on one lock for [`RUN`],
/// each hold recorded from the moment its holder was seen holding to the
/// moment its release was asked for (both ends favour the holder, so an
/// overlap found is a real one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_free_run_with_redis_py() {
    let s = setup().await;
    let admin = connect(&s.url, "dlock:").await;
    let k = key(&unique("free"));
    let name = redis_key(&admin, &k);
    let holds = Holds::new();
    let until = Instant::now() + RUN;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 1..=2 {
        let lock = connect(&s.url, "dlock:").await;
        let (holds, k, who) = (holds.clone(), k.clone(), format!("dlock-{n}"));
        tasks.spawn(async move {
            let fail = |e: dlock_core::Error| format!("{who}: {e}");
            let opts = AcquireOptions::default().ttl(TTL).wait(Wait::For(LIMIT));
            while Instant::now() < until {
                let g = lock.acquire(&k, opts).await.map_err(fail)?;
                let span = holds.begin(&who, Role::Mutex, g.token().map(|t| t.get()));
                tokio::time::sleep(work()).await;
                g.extend(TTL).await.map_err(fail)?;
                tokio::time::sleep(work()).await;
                if !g.is_held() {
                    return Err(format!("{who}: a grant was lost while held"));
                }
                holds.end(span);
                g.release().await.map_err(fail)?;
            }
            Ok::<(), String>(())
        });
    }
    for id in ["p1", "p2"] {
        let (them, holds, name) = (s.py.contender(id), holds.clone(), name.clone());
        tasks.spawn(async move {
            let who = them.who();
            while Instant::now() < until {
                let granted = them.acquire(&name, TTL, LIMIT).await.map_err(|e| e.to_string())?;
                if granted.is_none() {
                    return Err(format!("{who}: not granted within {LIMIT:?}"));
                }
                let span = holds.begin(&who, Role::Mutex, None);
                tokio::time::sleep(work() * 2).await;
                holds.end(span);
                // Fails (LockNotOwnedError) if its value was gone.
                them.release().await.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
    let report = holds.check(1);
    eprintln!("free run with redis-py: {report}");
    assert!(report.is_ok(), "{report}");
    assert!(
        report.holds_by("dlock") >= 2 && report.holds_by("redis-py") >= 2,
        "both kinds must hold, and more than once: {report}"
    );
    s.py.close().await;
    nothing_left(&admin, &k).await;
}
