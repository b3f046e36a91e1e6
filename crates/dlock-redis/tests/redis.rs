//! Redis-specific behaviour against real servers: restarts, interop with
//! plain `SET NX PX` locks, bad servers and bad input, operator views, and
//! the connection budget.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock_core::driver::Owner;
use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey, Wait};

fn info(value: &str) -> Option<Owner> {
    Owner::from_value(value)
}
use dlock_redis::{RedisConfig, RedisLock};
use dlock_testkit::launcher::{Redis, redis::command};

const LIMIT: Duration = Duration::from_secs(30);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

fn ns() -> String {
    format!("t{:x}/", rand::random::<u64>())
}

async fn connect(server: &Redis, prefix: &str) -> RedisLock {
    RedisLock::connect(RedisConfig::from_url(server.url()).key_prefix(prefix))
        .await
        .unwrap()
}

fn addr(server: &Redis) -> SocketAddr {
    server.addrs()[0]
}

/// Acquires, retrying while the client reconnects, within [`LIMIT`].
async fn acquire_when_reachable(lock: &RedisLock, k: &LockKey) -> dlock_redis::RedisGuard {
    let deadline = Instant::now() + LIMIT;
    loop {
        match lock.acquire(k, AcquireOptions::default().wait(Wait::No)).await {
            Ok(g) => return g,
            Err(Error::Unavailable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("acquire after restart: {e:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_restart_without_persistence() {
    let mut server = Redis::start().await.unwrap();
    let lock = connect(&server, "dlock:").await;
    let k = key("restart");
    let g = lock.acquire(&k, AcquireOptions::default()).await.unwrap();
    let t1 = g.token().unwrap();
    g.release().await.unwrap();
    server.members()[0].restart().await.unwrap();
    // Nothing survived the restart, the counter included.
    assert_eq!(command(addr(&server), &["DBSIZE"]).await.unwrap(), ":0");
    let g = acquire_when_reachable(&lock, &k).await;
    let t2 = g.token().unwrap();
    assert!(t2 > t1, "token went from {t1} to {t2} across a restart");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_set_nx_px_locks_and_dlock_exclude_each_other() {
    let server = Redis::start().await.unwrap();
    let a = addr(&server);
    let lock = connect(&server, "").await;
    let name = format!("{}job", ns());
    let k = key(&name);
    let opts = AcquireOptions::default().ttl(Duration::from_secs(10));

    // Another client's lock blocks dlock, and dlock can tell who holds it.
    assert_eq!(
        command(a, &["SET", &name, "other-client", "NX", "PX", "10000"])
            .await
            .unwrap(),
        "+OK"
    );
    assert!(lock.try_acquire(&k, opts).await.unwrap().is_none());
    let holder = lock.holder(&k).await.unwrap().unwrap();
    assert_eq!(holder.detail, "other-client");
    assert!(info(&holder.detail).is_none());
    assert!(holder.remaining.is_some_and(|r| r <= Duration::from_secs(10)));
    assert_eq!(command(a, &["DEL", &name]).await.unwrap(), ":1");

    // dlock's lock blocks the other client's SET NX.
    let g = lock.acquire(&k, opts).await.unwrap();
    assert_eq!(
        command(a, &["SET", &name, "other-client", "NX", "PX", "10000"])
            .await
            .unwrap(),
        "$-1"
    );
    g.release().await.unwrap();
    assert_eq!(command(a, &["EXISTS", &name]).await.unwrap(), ":0");

    // A release after expiry never deletes a value dlock did not write.
    let g = lock
        .acquire(&k, opts.ttl(Duration::from_millis(200)).auto_extend(false))
        .await
        .unwrap();
    tokio::time::timeout(LIMIT, g.lost().wait()).await.unwrap();
    let deadline = Instant::now() + LIMIT;
    while command(a, &["SET", &name, "newcomer", "NX", "PX", "10000"])
        .await
        .unwrap()
        != "+OK"
    {
        assert!(Instant::now() < deadline, "the expired key never went away");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(matches!(g.release().await, Err(Error::NotHeld { .. })));
    assert_eq!(
        command(a, &["GET", &name]).await.unwrap(),
        "$8",
        "the newcomer's value was touched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_down_is_unavailable_within_the_connect_timeout() {
    let port = dlock_testkit::launcher::free_ports(1).unwrap()[0];
    let config = RedisConfig::from_url(format!("redis://127.0.0.1:{port}"))
        .timeouts(Duration::from_millis(500), Duration::from_millis(500));
    let started = Instant::now();
    let r = RedisLock::connect(config).await;
    let took = started.elapsed();
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    assert!(
        took < Duration::from_millis(500) + Duration::from_secs(2),
        "took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_goes_down_makes_calls_unavailable() {
    let mut server = Redis::start().await.unwrap();
    let lock = RedisLock::connect(
        RedisConfig::from_url(server.url()).timeouts(Duration::from_secs(2), Duration::from_millis(500)),
    )
    .await
    .unwrap();
    server.members()[0].kill().unwrap();
    let r = lock.acquire(&key("down"), AcquireOptions::default()).await;
    assert!(matches!(r, Err(Error::Unavailable { .. })), "{r:?}");
    assert!(matches!(
        lock.holder(&key("down")).await,
        Err(Error::Unavailable { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_key_of_another_type_is_a_backend_error() {
    let server = Redis::start().await.unwrap();
    let a = addr(&server);
    let lock = connect(&server, "").await;
    command(a, &["HSET", "a-hash", "f", "v"]).await.unwrap();
    command(a, &["RPUSH", "a-list", "x"]).await.unwrap();
    for name in ["a-hash", "a-list"] {
        let r = lock
            .acquire(&key(name), AcquireOptions::default().wait(Wait::No))
            .await;
        assert!(matches!(r, Err(Error::Backend { .. })), "{name}: {r:?}");
        let r = lock.try_acquire(&key(name), AcquireOptions::default()).await;
        assert!(matches!(r, Err(Error::Backend { .. })), "{name}: {r:?}");
    }
    // Untouched.
    assert_eq!(command(a, &["TYPE", "a-hash"]).await.unwrap(), "+hash");
    assert_eq!(command(a, &["LLEN", "a-list"]).await.unwrap(), ":1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_urls_are_invalid_config() {
    for url in [
        "http://127.0.0.1:6379",
        "127.0.0.1:6379",
        "redis://127.0.0.1:port",
        "",
    ] {
        match RedisLock::connect(RedisConfig::from_url(url)).await {
            Err(Error::InvalidConfig(msg)) => assert!(msg.contains("redis URL"), "{url}: {msg}"),
            other => panic!("{url}: expected InvalidConfig, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_names_this_process_and_the_token() {
    let server = Redis::start().await.unwrap();
    let lock = connect(&server, "dlock:").await;
    let k = key("who");
    assert!(lock.holder(&k).await.unwrap().is_none());
    let g = lock
        .acquire(&k, AcquireOptions::default().ttl(Duration::from_secs(20)))
        .await
        .unwrap();
    let h = lock.holder(&k).await.unwrap().unwrap();
    let info = info(&h.detail).unwrap();
    assert_eq!(info.pid, std::process::id());
    assert!(!info.host.is_empty());
    assert!(h.remaining.unwrap() <= Duration::from_secs(20));
    assert_eq!(lock.fence_counter(&k).await.unwrap(), g.token().map(|t| t.get()));
    assert!(h.since.is_some());
    assert_eq!(lock.keys_in_use("").await.unwrap(), vec!["who".to_owned()]);
    g.release().await.unwrap();
    assert!(lock.keys_in_use("").await.unwrap().is_empty());
}

/// One command connection and one subscriber connection per `RedisLock`,
/// whatever the number of keys, guards and waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_command_and_one_subscriber_connection_per_handle() {
    let server = Redis::start().await.unwrap();
    let port = addr(&server).port().to_string();
    let clients = || {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port, "info", "clients"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse::<usize>().ok())
            .unwrap()
    };
    let before = clients(); // counts redis-cli itself
    let holder = connect(&server, "dlock:").await;
    let waiter = connect(&server, "dlock:").await;
    assert_eq!(clients(), before + 4);
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(
            holder
                .acquire(&key(&format!("k{i}")), AcquireOptions::default())
                .await
                .unwrap(),
        );
    }
    let mut waits = Vec::new();
    for i in 0..5 {
        let (w, k) = (waiter.clone(), key(&format!("k{i}")));
        waits.push(tokio::spawn(async move {
            w.acquire(&k, AcquireOptions::default()).await
        }));
    }
    let deadline = Instant::now() + LIMIT;
    // Wait until all five waiters subscribed (their channels show up).
    loop {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port, "pubsub", "numsub"])
            .args((0..5).map(|i| format!("dlock:released:dlock:k{i}")))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.lines().filter(|l| l.trim() == "1").count() == 5 {
            break;
        }
        assert!(Instant::now() < deadline, "waiters never subscribed: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(clients(), before + 4, "connections grew with keys or waiters");
    for g in guards {
        g.release().await.unwrap();
    }
    for w in waits {
        w.await.unwrap().unwrap().release().await.unwrap();
    }
    drop((holder, waiter));
    // Closed with the last user; the keeper (asleep until the first
    // renewal, 10 s away) does not keep them open.
    let deadline = Instant::now() + Duration::from_secs(5);
    while clients() != before {
        assert!(
            Instant::now() < deadline,
            "{} connections outlived their handles and guards",
            clients() - before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The queued waiter ids of `lock_key`, oldest first (read with a script,
/// since the launcher's `command` returns only a reply's first line).
async fn queue(client: &fred::prelude::Client, lock_key: &str) -> Vec<String> {
    use fred::prelude::LuaInterface;
    let q =
        dlock_redis_protocol::scripts::companion_key(lock_key, dlock_redis_protocol::scripts::QUEUE_SUFFIX);
    client
        .eval(
            "return redis.call('ZRANGE', KEYS[1], 0, -1)",
            vec![q],
            Vec::<String>::new(),
        )
        .await
        .unwrap()
}

/// A plain fred client of `server`, connected.
async fn raw_client(server: &Redis) -> fred::prelude::Client {
    use fred::prelude::{Builder, ClientLike, Config};
    let c = Builder::from_config(Config::from_url(&server.url()).unwrap())
        .build()
        .unwrap();
    c.init().await.unwrap();
    c
}

/// A fred subscriber client of `server`, connected.
async fn subscriber_client(server: &Redis) -> fred::clients::SubscriberClient {
    use fred::prelude::{Builder, ClientLike, Config};
    let c = Builder::from_config(Config::from_url(&server.url()).unwrap())
        .build_subscriber_client()
        .unwrap();
    c.init().await.unwrap();
    c
}

/// Waits until `cond` holds, within [`LIMIT`].
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_first_live_waiter_not_all() {
    use fred::prelude::{EventInterface, PubsubInterface};
    let server = Redis::start().await.unwrap();
    let prefix = ns();
    let k = key("herd");
    let holder = connect(&server, &prefix).await;
    let lock_key = holder.redis_key(&k).unwrap();
    let raw = raw_client(&server).await;
    let observer = subscriber_client(&server).await;
    let mut notices = observer.message_rx();
    observer
        .subscribe(dlock_redis_protocol::scripts::channel(&lock_key))
        .await
        .unwrap();

    let g = holder.acquire(&k, AcquireOptions::default()).await.unwrap();
    // Three waiters, each its own client, queued one after another.
    let mut waiters = Vec::new();
    let mut tasks = Vec::new();
    // Waiters with a 300 ms command timeout: their window (after which a
    // silent one counts as gone) is 2 x (150 ms + 2 x 300 ms) = 1.5 s.
    let waiter_config = RedisConfig::from_url(server.url())
        .key_prefix(&prefix)
        .timeouts(Duration::from_secs(5), Duration::from_millis(300));
    for i in 0..3 {
        let w = RedisLock::connect(waiter_config.clone()).await.unwrap();
        let (w2, k2) = (w.clone(), k.clone());
        tasks.push(tokio::spawn(async move {
            w2.acquire(&k2, AcquireOptions::default().wait(Wait::For(LIMIT)))
                .await
        }));
        waiters.push(w);
        until("the waiter queued", async || {
            queue(&raw, &lock_key).await.len() == i + 1
        })
        .await;
    }
    let order = queue(&raw, &lock_key).await;
    assert_eq!(order.len(), 3);
    assert!(
        order
            .iter()
            .all(|id| dlock_redis_protocol::scripts::is_waiter_id(id)),
        "{order:?}"
    );

    // A waiter gone silent (its client abandoned, no more attempts) is
    // skipped once it has not been seen for a while; here: the first one.
    // (The wait is the staleness threshold itself passing, not settling.)
    waiters[0].abandon().await;
    tasks.remove(0).abort();
    tokio::time::sleep(Duration::from_millis(1600)).await;
    g.release().await.unwrap();
    let notice = tokio::time::timeout(LIMIT, notices.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        notice.value.as_string().unwrap(),
        order[1],
        "the notice did not name the first live waiter"
    );
    // The two live waiters get the lock in turn (the named one first,
    // unless the other's poll barged in: Redis locks are not FIFO), and a
    // grant takes the waiter out of the queue; the gone one was dropped.
    let mut granted = Vec::new();
    while !tasks.is_empty() {
        let (done, _, rest) = futures::future::select_all(tasks).await;
        tasks = rest;
        let g = done.unwrap().expect("a live waiter's grant");
        granted.push(queue(&raw, &lock_key).await);
        g.release().await.unwrap();
    }
    assert_eq!(granted.len(), 2);
    assert_eq!(granted[0].len(), 1, "{granted:?}");
    assert!(granted[1].is_empty(), "{granted:?}");
    assert!(
        !granted[0].contains(&order[0]),
        "the gone waiter is still queued: {granted:?}"
    );
    // With nobody waiting, the last release told everyone.
    let mut last = String::new();
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(200), notices.recv()).await {
        last = n.value.as_string().unwrap();
    }
    assert_eq!(last, "*");

    // A waiter that gives up leaves the queue.
    let g = holder.acquire(&k, AcquireOptions::default()).await.unwrap();
    let quitter = connect(&server, &prefix).await;
    let r = quitter
        .acquire(
            &k,
            AcquireOptions::default().wait(Wait::For(Duration::from_millis(300))),
        )
        .await;
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    until("the quitter left the queue", async || {
        queue(&raw, &lock_key).await.is_empty()
    })
    .await;
    g.release().await.unwrap();
}

/// `WAIT`s until every write `master` took so far reached `replicas`
/// replicas, within [`LIMIT`].
async fn replicated(master: SocketAddr, replicas: usize) {
    let want = format!(":{replicas}");
    let deadline = Instant::now() + LIMIT;
    loop {
        // `WAIT` counts the replicas that acknowledged every write so far.
        if command(master, &["WAIT", &replicas.to_string(), "500"])
            .await
            .ok()
            .as_deref()
            == Some(want.as_str())
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{master} not replicated within {LIMIT:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_failover_to_a_replica_that_missed_the_last_grant() {
    use dlock_testkit::launcher::{Fault, FaultProxy};
    let servers = Redis::start_many(2).await.unwrap();
    let (master, replica) = (servers.addrs()[0], servers.addrs()[1]);
    // The replica reaches its master through a proxy, so the link can be cut.
    let link = FaultProxy::start(master).await.unwrap();
    let port = link.addr().port().to_string();
    assert_eq!(
        command(replica, &["REPLICAOF", "127.0.0.1", &port])
            .await
            .unwrap(),
        "+OK"
    );
    let connect_to = |addr: SocketAddr| {
        RedisLock::connect(RedisConfig::from_url(format!("redis://{addr}")).key_prefix("dlock:"))
    };
    let old = connect_to(master).await.unwrap();
    let k = key("failover");
    let g = old.acquire(&k, AcquireOptions::default()).await.unwrap();
    let t1 = g.token().unwrap();
    g.release().await.unwrap();
    replicated(master, 1).await;
    // The replica now has the counter at t1; the next grant does not reach it
    // (asynchronous replication: the master acknowledges before the replica has it).
    link.set(Fault::Blackhole);
    let g = old.acquire(&k, AcquireOptions::default()).await.unwrap();
    let t2 = g.token().unwrap();
    assert!(t2 > t1);
    g.release().await.unwrap();
    // The master is gone; the replica is promoted.
    drop(old);
    assert_eq!(
        command(replica, &["REPLICAOF", "NO", "ONE"]).await.unwrap(),
        "+OK"
    );
    let new = connect_to(replica).await.unwrap();
    let g = new.acquire(&k, AcquireOptions::default()).await.unwrap();
    let t3 = g.token().unwrap();
    assert!(
        t3 > t2,
        "token {t3} granted after the failover is not above {t2}, granted before it: a FenceGate admits both"
    );
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_restart_from_a_snapshot_older_than_the_last_grant() {
    let mut server = Redis::start().await.unwrap();
    let lock = connect(&server, "dlock:").await;
    let k = key("snapshot");
    let g = lock.acquire(&k, AcquireOptions::default()).await.unwrap();
    let t1 = g.token().unwrap();
    g.release().await.unwrap();
    // The snapshot has the counter at t1 (as an RDB point or an everysec AOF would).
    assert_eq!(command(addr(&server), &["SAVE"]).await.unwrap(), "+OK");
    let g = lock.acquire(&k, AcquireOptions::default()).await.unwrap();
    let t2 = g.token().unwrap();
    assert!(t2 > t1);
    g.release().await.unwrap();
    server.members()[0].kill().unwrap();
    server.members()[0].restart().await.unwrap();
    // The counter came back from the snapshot, stale.
    assert_ne!(command(addr(&server), &["DBSIZE"]).await.unwrap(), ":0");
    let g = acquire_when_reachable(&lock, &k).await;
    let t3 = g.token().unwrap();
    assert!(
        t3 > t2,
        "token {t3} after a restart from a snapshot is not above {t2}, granted before it"
    );
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_counter_that_is_not_a_token_refuses_the_grant() {
    let server = dlock_testkit::launcher::shared::redis().await.unwrap();
    let url = server.addresses[0].clone();
    let a: SocketAddr = url.trim_start_matches("redis://").parse().unwrap();
    let prefix = ns();
    let lock = RedisLock::connect(RedisConfig::from_url(url).key_prefix(&prefix))
        .await
        .unwrap();
    for (i, bad) in ["nan", "-5", "inf", "9007199254740993"].into_iter().enumerate() {
        let k = key(&format!("bad-counter-{i}"));
        let lock_key = lock.redis_key(&k).unwrap();
        let fence = dlock_redis_protocol::scripts::fence_key(&lock_key).unwrap();
        assert_eq!(command(a, &["SET", &fence, bad]).await.unwrap(), "+OK");
        let r = lock.acquire(&k, AcquireOptions::default().wait(Wait::No)).await;
        assert!(matches!(r, Err(Error::Backend { .. })), "{bad}: {r:?}");
        // Nothing was granted, and the counter was left as it was.
        assert_eq!(command(a, &["EXISTS", &lock_key]).await.unwrap(), ":0", "{bad}");
        command(a, &["DEL", &fence]).await.unwrap();
    }
}

/// A name whose key could be another lock's fence counter or queue is
/// refused: `{u}a:dlock-fence` *is* the fence counter of `{u}a`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_collide_with_the_layout_are_invalid() {
    let server = dlock_testkit::launcher::shared::redis().await.unwrap();
    let lock = RedisLock::connect(RedisConfig::from_url(server.addresses[0].clone()).key_prefix(""))
        .await
        .unwrap();
    let ns = ns();
    for name in [
        format!("{{{ns}}}a:dlock-fence"),
        format!("{{dlock:{ns}a}}:dlock-queue"),
        format!("{ns}a:dlock-seen"),
    ] {
        let r = lock.try_acquire(&key(&name), AcquireOptions::default()).await;
        assert!(
            matches!(r, Err(Error::InvalidKey { .. })),
            "{name}: {:?}",
            r.map(|g| g.is_some())
        );
    }
}

/// A waiter that crashed behind a live one is pruned by the live one's next
/// attempt, not only once it reaches the head of the queue: a busy key's
/// queue does not grow with every client that ever died waiting on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiter_behind_a_live_one_leaves_the_queue() {
    use dlock_redis_protocol::scripts::{SEEN_SUFFIX, companion_key};
    use fred::prelude::LuaInterface;
    let server = Redis::start().await.unwrap();
    let prefix = ns();
    let k = key("crowded");
    let holder = connect(&server, &prefix).await;
    let lock_key = holder.redis_key(&k).unwrap();
    let raw = raw_client(&server).await;

    let g = holder.acquire(&k, AcquireOptions::default()).await.unwrap();
    let live = connect(&server, &prefix).await;
    let (l2, k2) = (live.clone(), k.clone());
    let waiting = tokio::spawn(async move {
        l2.acquire(&k2, AcquireOptions::default().wait(Wait::For(LIMIT)))
            .await
    });
    until("the live waiter queued", async || {
        queue(&raw, &lock_key).await.len() == 1
    })
    .await;
    // Crashed waiters behind it: queued after it, last seen long ago (what
    // a client that died mid-wait leaves behind).
    let q = companion_key(&lock_key, dlock_redis_protocol::scripts::QUEUE_SUFFIX);
    let seen = companion_key(&lock_key, SEEN_SUFFIX);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as f64;
    // All three in one script, with the count: the live waiter's attempts
    // (which prune) cannot come in between.
    let queued: i64 = raw
        .eval(
            "for i = 1, 3 do \
               local id = string.format('w%024x', 3735879680 + i); \
               redis.call('ZADD', KEYS[1], ARGV[1], id); \
               redis.call('ZADD', KEYS[2], 1, id) \
             end; \
             return redis.call('ZCARD', KEYS[1])",
            vec![q.clone(), seen.clone()],
            vec![format!("{}", now_ms + 60_000.0)],
        )
        .await
        .unwrap();
    assert_eq!(queued, 4);
    until("the crashed waiters left the queue", async || {
        queue(&raw, &lock_key).await.len() == 1
    })
    .await;
    let seen_left: i64 = raw
        .eval(
            "return redis.call('ZCARD', KEYS[1])",
            vec![seen.clone()],
            Vec::<String>::new(),
        )
        .await
        .unwrap();
    assert_eq!(seen_left, 1, "their last-seen times stayed");
    g.release().await.unwrap();
    waiting.await.unwrap().unwrap().release().await.unwrap();
}

/// A waiter that gives up a key's subscription (the last of this handle's
/// waiters on it) while a new one takes it: the new one stays subscribed,
/// whatever order the two reach the server in. (On one thread the
/// unsubscribe left behind runs only while the new waiter subscribes: the
/// order that lost the subscription.)
#[tokio::test(flavor = "current_thread")]
async fn a_new_waiter_keeps_the_subscription_the_last_one_gave_up() {
    use dlock_redis_protocol::notices::Waiters;
    use fred::prelude::ClientLike;
    let server = Redis::start().await.unwrap();
    let port = addr(&server).port().to_string();
    let numsub = |channel: &str| {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port, "pubsub", "numsub", channel])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .map(|n| n.trim().to_owned())
            .unwrap()
    };
    let subscriber = subscriber_client(&server).await;
    let (waiters, tasks) = Waiters::start(vec![subscriber.clone()], Duration::from_secs(5));
    for round in 0..5 {
        let channel = format!("{}released:{round}", ns());
        let first = waiters.wait_on(channel.clone(), None).await;
        assert_eq!(numsub(&channel), "1");
        drop(first);
        let second = waiters.wait_on(channel.clone(), None).await;
        // Whatever the handle sent before this answer has been answered.
        let _: () = subscriber.ping(None).await.unwrap();
        let _: () = subscriber.ping(None).await.unwrap();
        assert_eq!(numsub(&channel), "1", "round {round}: the subscription was lost");
        drop(second);
        until("the last waiter's unsubscribe", async || numsub(&channel) == "0").await;
    }
    tasks.iter().for_each(|t| t.abort());
}

/// A server that is not there and a bad URL each read as one sentence
/// naming the backend, where, and why (no client library's debug dump), and
/// a password never shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_and_a_bad_url_read_as_sentences() {
    let addr = dlock_testkit::link::nowhere(1).unwrap()[0];
    let e = RedisLock::connect(RedisConfig::from_url(format!("redis://:hunter2@{addr}/0")))
        .await
        .expect_err("nothing listens there");
    assert_eq!(
        e.to_string(),
        format!("redis at {addr} unavailable: connection refused")
    );
    assert!(matches!(e, Error::Unavailable { .. }));
    let e = RedisLock::connect(RedisConfig::from_url("redis://a b"))
        .await
        .expect_err("not a URL");
    assert_eq!(
        e.to_string(),
        "invalid configuration: redis URL redis://a b: invalid domain character"
    );
}

/// A guard costs a slot in its handle's keeper, not a task: 50 guards with
/// auto-extend add at most the one keeper task, and they are all renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keeper_task_renews_every_guard_of_a_handle() {
    let server = Redis::start().await.unwrap();
    let lock = connect(&server, &ns()).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    // Warm up: every connection and subscription task is running.
    lock.acquire(&key("warm"), AcquireOptions::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = metrics.num_alive_tasks();
    let ttl = Duration::from_millis(600);
    let mut guards = Vec::new();
    for i in 0..50 {
        let opts = AcquireOptions::default().ttl(ttl);
        guards.push(lock.acquire(&key(&format!("k{i}")), opts).await.unwrap());
    }
    let during = metrics.num_alive_tasks();
    assert!(
        during <= before + 1,
        "{before} tasks before 50 guards, {during} with them"
    );
    // Three TTLs later every guard still holds: the one task renewed them all.
    tokio::time::sleep(ttl * 3).await;
    assert!(guards.iter().all(Guard::is_held), "a guard was not renewed");
    for g in guards {
        g.release().await.unwrap();
    }
}

/// The operator views know the read-write lock and the semaphore: every
/// holder of a name is listed with what it holds, and the name is in use
/// while any of them holds. A writer that crashed while waiting holds new
/// readers back only until its window runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_and_semaphore_holders_are_listed_and_a_crashed_writers_mark_lapses() {
    use dlock_core::Role;
    let server = Redis::start().await.unwrap();
    // The default request timeout (2 s) gives a waiter a window of 8.3 s.
    let config = RedisConfig::from_url(server.url());
    let (a, b) = (
        RedisLock::connect(config.clone()).await.unwrap(),
        RedisLock::connect(config.clone()).await.unwrap(),
    );
    let k = key("family");
    let opts = AcquireOptions::default().ttl(Duration::from_secs(20));
    let r1 = a.acquire_read(&k, opts).await.unwrap();
    let r2 = b.acquire_read(&k, opts).await.unwrap();
    let p = a.acquire_permits(&k, 2, 3, opts).await.unwrap();
    let holders = a.holders(&k).await.unwrap();
    let roles: Vec<Role> = holders.iter().map(|h| h.role).collect();
    assert_eq!(roles, [Role::Read, Role::Read, Role::Permits(2)], "{holders:?}");
    for h in &holders {
        assert_eq!(info(&h.detail).unwrap().pid, std::process::id());
        assert!(h.remaining.unwrap() <= Duration::from_secs(20));
        assert_eq!(a.fence_counter(&k).await.unwrap(), p.token().map(|t| t.get()));
    }
    assert_eq!(a.keys_in_use("").await.unwrap(), vec!["family".to_owned()]);
    // The sets live exactly as long as their last member.
    for set in ["{dlock:family}:dlock-readers", "{dlock:family}:dlock-permits"] {
        let pttl = command(addr(&server), &["PTTL", set]).await.unwrap();
        let ms: i64 = pttl.trim_start_matches(':').parse().unwrap();
        assert!((1..=20_000).contains(&ms), "{set}: PTTL {pttl}");
    }

    // A writer waits (marked), then its process dies.
    let w = RedisLock::connect(config).await.unwrap();
    let waiting = tokio::spawn({
        let (w, k) = (w.clone(), k.clone());
        async move { w.acquire_write(&k, opts.wait(Wait::Forever)).await.map(drop) }
    });
    let wwait = "{dlock:family}:dlock-wwait";
    until("the writer's waiting mark", async || {
        command(addr(&server), &["ZCARD", wwait]).await.unwrap() == ":1"
    })
    .await;
    w.abandon().await;
    waiting.abort();
    let now = opts.wait(Wait::No);
    assert!(
        matches!(b.acquire_read(&k, now).await, Err(Error::Timeout { .. })),
        "a reader came in past a waiting writer's mark"
    );
    until(
        "a reader once the dead writer's window ran out",
        async || match b.acquire_read(&k, now).await {
            Ok(g) => g.release().await.is_ok(),
            Err(Error::Timeout { .. }) => false,
            Err(e) => panic!("{e:?}"),
        },
    )
    .await;
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    p.release().await.unwrap();
    assert!(a.holders(&k).await.unwrap().is_empty());
    assert!(a.keys_in_use("").await.unwrap().is_empty());
}

/// The tokens `holders()` lists for the holders of `k` that `pick` picks,
/// sorted.
async fn listed_tokens(
    lock: &RedisLock,
    k: &LockKey,
    pick: fn(&dlock_core::Role) -> bool,
) -> Vec<Option<u64>> {
    let mut tokens: Vec<Option<u64>> = lock
        .holders(k)
        .await
        .unwrap()
        .into_iter()
        .filter(|h| pick(&h.role))
        .map(|h| h.token)
        .collect();
    tokens.sort_unstable();
    tokens
}

/// `holders()` lists every reader with its own token, the one its guard
/// reports — not the name's latest grant's for all of them — and a later
/// grant to someone else does not change it. A reader's member carries its
/// token, and its release and extend still find it (with the token, and,
/// as after a lost grant reply, by its plain value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_list_each_reader_with_its_own_token() {
    use dlock_core::Role;
    use dlock_redis_protocol::scripts::{self, READERS_SUFFIX, companion_key};
    use fred::prelude::LuaInterface;
    let server = Redis::start().await.unwrap();
    let prefix = ns();
    let (a, b, c) = (
        connect(&server, &prefix).await,
        connect(&server, &prefix).await,
        connect(&server, &prefix).await,
    );
    let k = key("readers");
    let opts = AcquireOptions::default().ttl(Duration::from_secs(20));
    let token = |g: &dlock_redis::RedisGuard| g.token().map(|t| t.get());
    let reads = |r: &Role| *r == Role::Read;

    let r1 = a.acquire_read(&k, opts).await.unwrap();
    // Someone else's grant of the name between the two reads.
    c.acquire_read(&k, opts).await.unwrap().release().await.unwrap();
    let r2 = b.acquire_read(&k, opts).await.unwrap();
    let (t1, t2) = (token(&r1), token(&r2));
    assert!(t1.is_some() && t1 < t2, "{t1:?} then {t2:?}");
    assert_eq!(listed_tokens(&c, &k, reads).await, [t1, t2]);
    for h in c.holders(&k).await.unwrap() {
        assert_eq!(info(&h.detail).unwrap().pid, std::process::id(), "{}", h.detail);
    }

    // A later grant to someone else moves the name's counter, not theirs.
    let later = c.acquire_read(&k, opts).await.unwrap();
    let t3 = token(&later);
    assert!(t3 > t2);
    let holders = a.holders(&k).await.unwrap();
    assert!(
        !holders.is_empty() && a.fence_counter(&k).await.unwrap() == t3,
        "{holders:?}"
    );
    assert_eq!(listed_tokens(&a, &k, reads).await, [t1, t2, t3]);
    r1.extend(Duration::from_secs(20)).await.unwrap();
    assert_eq!(listed_tokens(&a, &k, reads).await, [t1, t2, t3]);

    // A grant whose reply was lost is released by its plain value (the
    // token unknown): the release script finds the member.
    let plain = holders.iter().find(|h| h.token == t3).unwrap().detail.clone();
    let readers = companion_key(&a.redis_key(&k).unwrap(), READERS_SUFFIX);
    let raw = raw_client(&server).await;
    let released: i64 = raw
        .eval(
            scripts::MEMBER_RELEASE,
            vec![readers.clone()],
            vec![plain, "dlock:test-channel".to_owned(), "1".to_owned()],
        )
        .await
        .unwrap();
    assert_eq!(released, 1);
    assert_eq!(listed_tokens(&a, &k, reads).await, [t1, t2]);
    assert!(matches!(later.release().await, Err(Error::Lost { .. })));

    // A reader granted before tokens were stored shows none, not a wrong one.
    let old = "dlock1 0123456789abcdef0123456789abcdef old-host 7 1700000000000";
    let _: i64 = raw
        .eval(
            "return redis.call('ZADD', KEYS[1], string.format('%.0f', redis.call('TIME')[1] * 1000 + 20000), ARGV[1])",
            vec![readers.clone()],
            vec![old.to_owned()],
        )
        .await
        .unwrap();
    assert_eq!(listed_tokens(&a, &k, reads).await, [None, t1, t2]);
    let old_holder = a
        .holders(&k)
        .await
        .unwrap()
        .into_iter()
        .find(|h| h.token.is_none())
        .unwrap();
    assert_eq!(
        (
            old_holder.detail.as_str(),
            info(&old_holder.detail).unwrap().host.as_str()
        ),
        (old, "old-host")
    );
    let _: i64 = raw
        .eval(
            "return redis.call('ZREM', KEYS[1], ARGV[1])",
            vec![readers],
            vec![old.to_owned()],
        )
        .await
        .unwrap();

    r1.release().await.unwrap();
    assert_eq!(listed_tokens(&a, &k, reads).await, [t2]);
    r2.release().await.unwrap();
    assert!(a.holders(&k).await.unwrap().is_empty());
}

/// `holders()` lists every permit holder with the token its own guard
/// reports (a grant's number: permits hold together, it fences nothing),
/// not the name's latest grant's, and a later grant to someone else does
/// not change it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_list_each_permit_holder_with_its_own_token() {
    use dlock_core::Role;
    let server = Redis::start().await.unwrap();
    let prefix = ns();
    let (a, b, c) = (
        connect(&server, &prefix).await,
        connect(&server, &prefix).await,
        connect(&server, &prefix).await,
    );
    let k = key("permits");
    let opts = AcquireOptions::default().ttl(Duration::from_secs(20));
    let token = |g: &dlock_redis::RedisGuard| g.token().map(|t| t.get());
    let permits = |r: &Role| matches!(r, Role::Permits(_));

    let p1 = a.acquire_permits(&k, 1, 4, opts).await.unwrap();
    c.acquire_permits(&k, 1, 4, opts)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let p2 = b.acquire_permits(&k, 2, 4, opts).await.unwrap();
    let (t1, t2) = (token(&p1), token(&p2));
    assert!(t1.is_some() && t1 < t2, "{t1:?} then {t2:?}");
    assert_eq!(listed_tokens(&c, &k, permits).await, [t1, t2]);

    // A later grant to someone else moves the name's counter, not theirs.
    let later = c.acquire_permits(&k, 1, 4, opts).await.unwrap();
    let t3 = token(&later);
    assert!(t3 > t2);
    let holders = a.holders(&k).await.unwrap();
    assert!(
        !holders.is_empty() && a.fence_counter(&k).await.unwrap() == t3,
        "{holders:?}"
    );
    assert_eq!(listed_tokens(&a, &k, permits).await, [t1, t2, t3]);
    for (t, role) in [
        (t1, Role::Permits(1)),
        (t2, Role::Permits(2)),
        (t3, Role::Permits(1)),
    ] {
        let h = holders.iter().find(|h| h.token == t).unwrap();
        assert_eq!(h.role, role, "{h:?}");
        assert_eq!(info(&h.detail).unwrap().pid, std::process::id(), "{h:?}");
    }
    // Full: 1 + 2 + 1 of 4, counted from the members that carry tokens.
    assert!(matches!(
        a.acquire_permits(&k, 1, 4, opts.wait(Wait::No)).await,
        Err(Error::Timeout { .. })
    ));
    p2.extend(Duration::from_secs(20)).await.unwrap();

    p1.release().await.unwrap();
    assert_eq!(listed_tokens(&a, &k, permits).await, [t2, t3]);
    later.release().await.unwrap();
    p2.release().await.unwrap();
    assert!(a.holders(&k).await.unwrap().is_empty());
}

/// An acquire cancelled while Redis is away, in an outage that outlasts
/// its TTL and the request time-out (so its clean-up has given up), takes
/// nothing when Redis is back: the request runs until fred's own time-out
/// marks it, whoever stopped waiting for it (fred writes a queued command
/// it has not marked once it has reconnected).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cancelled_in_an_outage_takes_nothing_afterwards() {
    use dlock_testkit::launcher::{Fault, FaultProxy};
    let server = Redis::start().await.unwrap();
    let link = FaultProxy::start(addr(&server)).await.unwrap();
    let mut config = RedisConfig::from_url(format!("redis://{}", link.addr())).key_prefix("dlock:");
    config.request_timeout = Duration::from_millis(200);
    let lock = RedisLock::connect(config.clone()).await.unwrap();
    let ttl = Duration::from_secs(1);
    let opts = AcquireOptions::default().ttl(ttl).wait(Wait::No);
    // The scripts loaded, as on any server in use.
    let probe = key("cut/probe");
    lock.acquire(&probe, opts).await.unwrap().release().await.unwrap();
    link.set(Fault::Reset);
    let mut keys = Vec::new();
    let mut last = Instant::now();
    for i in 0..10u64 {
        let k = key(&format!("cut/{i}"));
        // Cut before the request time-out: the caller lets go.
        let _ = tokio::time::timeout(Duration::from_millis(1 + 3 * i), lock.acquire(&k, opts)).await;
        keys.push(lock.redis_key(&k).unwrap());
        last = Instant::now();
    }
    // The clean-ups release until each attempt's TTL has passed, and each
    // of their requests is marked after the request time-out: past both,
    // only a request written late could take a key.
    let past = ttl + config.request_timeout * 3 + Duration::from_secs(1);
    tokio::time::sleep_until((last + past).into()).await;
    link.set(Fault::None);
    // Requests are written in order once the client is back: anything kept
    // back went before this probe (and holds its key for a whole TTL, far
    // longer than the check below takes).
    acquire_when_reachable(&lock, &probe)
        .await
        .release()
        .await
        .unwrap();
    let mut taken = Vec::new();
    for k in &keys {
        let v = command(addr(&server), &["GET", k]).await.unwrap();
        if v != "$-1" {
            taken.push(k.clone());
        }
    }
    assert!(
        taken.is_empty(),
        "taken after the outage by acquires cancelled during it: {taken:?}"
    );
}

/// An acquire after Redis lost its scripts (a restart, `SCRIPT FLUSH`)
/// loads them again and is granted; so is the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_lost_by_the_server_are_loaded_again() {
    let server = Redis::start().await.unwrap();
    let lock = connect(&server, "dlock:").await;
    let k = key("flushed");
    let opts = AcquireOptions::default().wait(Wait::No);
    lock.acquire(&k, opts).await.unwrap().release().await.unwrap();
    assert_eq!(command(addr(&server), &["SCRIPT", "FLUSH"]).await.unwrap(), "+OK");
    let g = lock.acquire(&k, opts).await.unwrap();
    assert_eq!(command(addr(&server), &["SCRIPT", "FLUSH"]).await.unwrap(), "+OK");
    g.release().await.unwrap();
    let g = lock.try_acquire(&k, opts).await.unwrap();
    assert!(
        g.is_some(),
        "the key is held after a release over flushed scripts"
    );
}
