//! Redlock under node faults, on five real redis-servers behind fault
//! proxies: every subset of nodes down, partial grants, a silent node, a slow
//! fan-out, and a grant whose validity is used up.

use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey, Wait};
use dlock_redlock::{QuorumError, Redlock, RedlockConfig};
use dlock_testkit::launcher::{Fault, FaultProxy, Redis, redis::command};

const LIMIT: Duration = Duration::from_secs(20);

struct Nodes {
    servers: Redis,
    proxies: Vec<FaultProxy>,
}

impl Nodes {
    async fn start() -> Self {
        let servers = Redis::start_many(5).await.unwrap();
        let mut proxies = Vec::new();
        for addr in servers.addrs() {
            proxies.push(FaultProxy::start(addr).await.unwrap());
        }
        Nodes { servers, proxies }
    }

    /// The nodes behind their proxies, with a node time-out of a second.
    ///
    /// The default (50 ms) is for a production network; on a test machine
    /// whose two cores are shared with five servers, five proxies and other
    /// builds, a healthy node's reply can take longer than that, and a
    /// release seen to time out on every node would read as "no quorum"
    /// (seen under load). Faults here are resets (answered at once) or
    /// silences and delays measured against this same figure.
    fn config(&self) -> RedlockConfig {
        let mut config = RedlockConfig::new(self.proxies.iter().map(|p| format!("redis://{}", p.addr())));
        config.request_timeout = Duration::from_secs(1);
        config
    }

    /// The value of `key` on each real node (bypassing the proxies): the
    /// first line of the reply (`$-1` when absent).
    async fn values(&self, key: &str) -> Vec<String> {
        let mut out = Vec::new();
        for a in self.servers.addrs() {
            out.push(command(a, &["GET", key]).await.unwrap());
        }
        out
    }

    async fn holders(&self, key: &str) -> usize {
        self.values(key).await.iter().filter(|v| *v != "$-1").count()
    }
}

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

fn quorum_error(e: &Error) -> &QuorumError {
    match e {
        Error::Unavailable { source, .. } => source.downcast_ref::<QuorumError>().expect("a QuorumError"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// Waits until the handle's connections to the `up` nodes are established.
async fn await_connected(lock: &Redlock, up: &[bool]) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let status = lock.node_status();
        if status
            .iter()
            .zip(up)
            .all(|((_, connected), &up)| !up || *connected)
        {
            return;
        }
        assert!(Instant::now() < deadline, "nodes did not reconnect: {status:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subset_of_nodes_down() {
    let nodes = Nodes::start().await;
    let lock = Redlock::connect(nodes.config()).await.unwrap();
    let opts = AcquireOptions::default().ttl(Duration::from_secs(10));
    // Gray-code order: one node changes between consecutive subsets.
    for i in 0u32..32 {
        let down_mask = i ^ (i >> 1);
        let up: Vec<bool> = (0..5).map(|n| down_mask & (1 << n) == 0).collect();
        for (proxy, &is_up) in nodes.proxies.iter().zip(&up) {
            proxy.set(if is_up { Fault::None } else { Fault::Reset });
        }
        await_connected(&lock, &up).await;
        let ups = up.iter().filter(|&&u| u).count();
        let name = format!("subset-{down_mask:05b}");
        let k = key(&name);
        let redis_key = lock.redis_key(&k);
        match lock.acquire(&k, opts.wait(Wait::No)).await {
            Ok(g) => {
                assert!(
                    ups >= 3,
                    "granted with only {ups} nodes up ({down_mask:05b} down)"
                );
                assert!(nodes.holders(&redis_key).await >= 3);
                g.release().await.unwrap();
            }
            Err(e) => {
                assert!(ups < 3, "refused with {ups} nodes up ({down_mask:05b} down): {e}");
                let q = quorum_error(&e);
                assert_eq!(q.failures.len(), 5 - ups, "{q}");
                let text = e.to_string() + &q.to_string();
                assert!(
                    text.contains("unreachable") || text.contains("timed out"),
                    "{text}"
                );
            }
        }
        assert_eq!(
            nodes.holders(&redis_key).await,
            0,
            "a node still holds {name} after the attempt"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_grants_are_given_back() {
    let nodes = Nodes::start().await;
    let lock = Redlock::connect(nodes.config()).await.unwrap();
    let addrs = nodes.servers.addrs();

    // Two of five held under another value: three is still a quorum.
    let k = key("two-held");
    let rk = lock.redis_key(&k);
    for &a in &addrs[..2] {
        assert_eq!(
            command(a, &["SET", &rk, "someone-else", "PX", "30000"])
                .await
                .unwrap(),
            "+OK"
        );
    }
    let g = lock
        .acquire(
            &k,
            AcquireOptions::default().wait(Wait::For(Duration::from_millis(500))),
        )
        .await
        .unwrap();
    assert_eq!(nodes.holders(&rk).await, 5);
    g.release().await.unwrap();
    let values = nodes.values(&rk).await;
    assert_eq!(
        values[..2],
        ["$12", "$12"],
        "the other holder's values were touched"
    );
    assert_eq!(values[2..], ["$-1", "$-1", "$-1"]);

    // Three of five held: no quorum; the two granted are released.
    let k = key("three-held");
    let rk = lock.redis_key(&k);
    for &a in &addrs[..3] {
        command(a, &["SET", &rk, "someone-else", "PX", "30000"])
            .await
            .unwrap();
    }
    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let r = lock
        .acquire(&k, AcquireOptions::default().wait(Wait::For(wait)))
        .await;
    let took = started.elapsed();
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(
        took >= wait && took < wait + Duration::from_secs(2),
        "took {took:?}"
    );
    let values = nodes.values(&rk).await;
    assert_eq!(
        values[3..],
        ["$-1", "$-1"],
        "the two nodes we got were not released"
    );
    assert_eq!(values[..3], ["$12", "$12", "$12"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_does_not_hold_up_a_grant_and_costs_at_most_the_request_timeout() {
    let nodes = Nodes::start().await;
    let config = nodes.config();
    let request_timeout = config.request_timeout;
    let lock = Redlock::connect(config).await.unwrap();
    let k = key("blackhole");
    lock.acquire(&k, AcquireOptions::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap(); // warm up
    nodes.proxies[4].set(Fault::Blackhole);
    // Four answering nodes are a quorum: the grant does not wait for the fifth.
    let started = Instant::now();
    let g = lock
        .acquire(&k, AcquireOptions::default().wait(Wait::No))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < request_timeout,
        "the grant waited for the silent node: {took:?}"
    );
    // A release goes to every node: bounded by the node timeout.
    let started = Instant::now();
    g.release().await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= request_timeout,
        "the release skipped the silent node ({took:?})"
    );
    assert!(took < request_timeout + Duration::from_millis(500), "{took:?}");
    // With three silent nodes no quorum can answer: the acquire gives up
    // after the node timeout, not later.
    nodes.proxies[2].set(Fault::Blackhole);
    nodes.proxies[3].set(Fault::Blackhole);
    let started = Instant::now();
    let e = lock
        .acquire(&k, AcquireOptions::default().wait(Wait::No))
        .await
        .expect_err("no quorum answers");
    let took = started.elapsed();
    let q = quorum_error(&e);
    assert_eq!(q.got, 2, "{q}");
    assert_eq!(
        nodes.holders(&lock.redis_key(&k)).await,
        0,
        "the 2 grants were not given back"
    );
    assert!(
        took >= request_timeout,
        "did not wait for the silent nodes at all ({took:?})"
    );
    assert!(
        took < request_timeout * 2 + Duration::from_millis(500),
        "silent nodes stalled the acquire: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_fan_out_in_parallel() {
    let nodes = Nodes::start().await;
    let lock = Redlock::connect(nodes.config()).await.unwrap();
    let k = key("fan-out");
    lock.acquire(&k, AcquireOptions::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap(); // warm up
    // 50 ms each way on every node: 100 ms per round trip.
    let delay = Duration::from_millis(50);
    for p in &nodes.proxies {
        p.set(Fault::Delay(delay));
    }
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let started = Instant::now();
        let g = lock
            .acquire(&k, AcquireOptions::default().wait(Wait::No))
            .await
            .unwrap();
        best = best.min(started.elapsed());
        for p in &nodes.proxies {
            p.set(Fault::None);
        }
        g.release().await.unwrap();
        for p in &nodes.proxies {
            p.set(Fault::Delay(delay));
        }
    }
    // One at a time would take 5 x 100 ms; in parallel, one round trip
    // (the margin of 300 ms is for a busy machine's scheduling).
    assert!(best >= delay * 2, "the delay did not apply: {best:?}");
    assert!(
        best < delay * 2 + Duration::from_millis(300),
        "the nodes were asked one after another: {best:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_validity_is_used_up_is_refused_and_released() {
    let nodes = Nodes::start().await;
    let mut config = nodes.config();
    config.request_timeout = Duration::from_secs(2);
    let lock = Redlock::connect(config).await.unwrap();
    let k = key("too-slow");
    let rk = lock.redis_key(&k);
    lock.acquire(&k, AcquireOptions::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap(); // warm up
    // Three nodes (a quorum) answer after 400 ms: the round outlives a
    // 300 ms TTL.
    for p in &nodes.proxies[..3] {
        p.set(Fault::Delay(Duration::from_millis(200)));
    }
    let r = lock
        .acquire(
            &k,
            AcquireOptions::default()
                .ttl(Duration::from_millis(300))
                .wait(Wait::No),
        )
        .await;
    let e = r.expect_err("a grant without validity");
    let q = quorum_error(&e);
    assert!(q.validity_used_up, "{q}");
    assert_eq!(
        nodes.holders(&rk).await,
        0,
        "the used-up grant was not released everywhere"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_names_the_first_queued_waiter_on_every_node() {
    use dlock_redis_protocol::scripts;
    use fred::prelude::{Builder, ClientLike, Config, EventInterface, LuaInterface, PubsubInterface};
    let nodes = Nodes::start().await;
    // Queueing and naming are under test, not timeouts: a node timeout a
    // busy machine keeps (with the default 50 ms, attempts skipped on a
    // starved client are not even sent).
    let mut config = nodes.config();
    config.request_timeout = Duration::from_millis(500);
    let holder = Redlock::connect(config.clone()).await.unwrap();
    let k = key("queue");
    let lock_key = holder.redis_key(&k);
    let queue_key = scripts::companion_key(&lock_key, scripts::QUEUE_SUFFIX);
    let mut raws = Vec::new();
    for a in nodes.servers.addrs() {
        let raw = Builder::from_config(Config::from_url(&format!("redis://{a}")).unwrap())
            .build()
            .unwrap();
        raw.init().await.unwrap();
        raws.push(raw);
    }
    let queues = async |raws: &[fred::prelude::Client]| {
        let mut all = Vec::new();
        for raw in raws {
            let q: Vec<String> = raw
                .eval(
                    "return redis.call('ZRANGE', KEYS[1], 0, -1)",
                    vec![queue_key.as_str()],
                    Vec::<String>::new(),
                )
                .await
                .unwrap();
            all.push(q);
        }
        all
    };
    let g = holder.acquire(&k, AcquireOptions::default()).await.unwrap();
    // The nodes the holder got (a quorum, not always all: a grant does not
    // wait for the rest). Waiters queue where the key is held; on a node
    // it is not, a waiter's attempt wins that node for the moment (and
    // gives it back), and no release there would name anyone.
    let values = nodes.values(&lock_key).await;
    let held: Vec<usize> = (0..values.len()).filter(|&n| values[n] != "$-1").collect();
    assert!(held.len() >= 3, "{held:?}");
    let on_held =
        |all: Vec<Vec<String>>| -> Vec<Vec<String>> { held.iter().map(|&n| all[n].clone()).collect() };
    // Notices from a node the holder holds (one release names its own
    // queue's first waiter).
    let observer = Builder::from_config(
        Config::from_url(&format!("redis://{}", nodes.servers.addrs()[held[0]])).unwrap(),
    )
    .build_subscriber_client()
    .unwrap();
    observer.init().await.unwrap();
    let mut notices = observer.message_rx();
    observer.subscribe(scripts::channel(&lock_key)).await.unwrap();

    let mut tasks = Vec::new();
    for i in 0..2 {
        let w = Redlock::connect(config.clone()).await.unwrap();
        let k2 = k.clone();
        tasks.push(tokio::spawn(async move {
            let g = w
                .acquire(&k2, AcquireOptions::default().wait(Wait::For(LIMIT)))
                .await;
            (w, g)
        }));
        let deadline = Instant::now() + LIMIT;
        loop {
            let now = on_held(queues(&raws).await);
            if now.iter().all(|q| q.len() == i + 1) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "waiter {i} did not queue on every node the holder holds ({held:?}): {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let order = on_held(queues(&raws).await);
    assert!(
        order.iter().all(|q| *q == order[0]),
        "the nodes queued differently: {order:?}"
    );
    g.release().await.unwrap();
    let notice = tokio::time::timeout(LIMIT, notices.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        notice.value.as_string().unwrap(),
        order[0][0],
        "the notice did not name the first waiter"
    );
    // Both waiters get the lock in turn; each grant takes the waiter out of
    // every node's queue.
    let mut rest = tasks;
    while !rest.is_empty() {
        let (done, _, others) = futures::future::select_all(rest).await;
        rest = others;
        let (_w, g) = done.unwrap();
        g.expect("a waiter's grant").release().await.unwrap();
    }
    let deadline = Instant::now() + LIMIT;
    while !queues(&raws).await.iter().all(Vec::is_empty) {
        assert!(
            Instant::now() < deadline,
            "queues not empty: {:?}",
            queues(&raws).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The guard's local deadline uses the configured drift, as the acquire's
/// validity does: with a drift factor of 0.4, a 2 s grant is valid for at
/// most 1.2 s, and `is_held()` must say so (it used the core 1 %).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_uses_the_configured_drift() {
    let nodes = Nodes::start().await;
    let mut config = nodes.config();
    config.drift_factor = 0.4;
    let lock = Redlock::connect(config).await.unwrap();
    let ttl = Duration::from_secs(2);
    let sent = Instant::now();
    let g = lock
        .acquire(
            &key("drift"),
            AcquireOptions::default().ttl(ttl).auto_extend(false),
        )
        .await
        .unwrap();
    // ttl - drift = 2 s - (0.8 s + 2 ms), counted from before the send.
    let valid_until = sent + ttl - ttl.mul_f64(0.4);
    while Instant::now() < valid_until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!g.is_held(), "held past the validity the acquire computed");
    tokio::time::timeout(LIMIT, g.lost().wait())
        .await
        .expect("lost() past the validity");
}

/// Nodes that are not there read as one sentence per node (where, and why),
/// a password never shows, and a bad node URL is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_down_and_a_bad_url_read_as_sentences() {
    let addrs = dlock_testkit::link::nowhere(3).unwrap();
    let nodes: Vec<String> = addrs.iter().map(|a| format!("redis://:hunter2@{a}")).collect();
    let key = LockKey::new("down").unwrap();
    let shown = match Redlock::connect(RedlockConfig::new(nodes)).await {
        Err(e) => e.to_string(),
        Ok(lock) => lock
            .try_acquire(&key, AcquireOptions::default())
            .await
            .expect_err("no node answers")
            .to_string(),
    };
    eprintln!("{shown}");
    assert!(shown.starts_with("redlock unavailable: "), "{shown}");
    for a in &addrs {
        assert!(shown.contains(&a.to_string()), "{a} not named: {shown}");
    }
    assert!(!shown.contains("hunter2") && !shown.contains("Os {"), "{shown}");
    let e = Redlock::connect(RedlockConfig::new(["redis://a b", "redis://h:1", "redis://h:2"]))
        .await
        .expect_err("not a URL");
    assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
    assert_eq!(e.to_string().matches("invalid configuration").count(), 1, "{e}");
}

/// A guard costs a slot in its handle's keeper, not a task: 20 guards with
/// auto-extend add at most the one keeper task, and they are all renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keeper_task_renews_every_guard_of_a_handle() {
    let nodes = Nodes::start().await;
    let lock = Redlock::connect(nodes.config()).await.unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();
    let warm = LockKey::new(format!("warm-{:x}", rand::random::<u64>())).unwrap();
    lock.acquire(&warm, AcquireOptions::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = metrics.num_alive_tasks();
    let ttl = Duration::from_millis(600);
    let mut guards = Vec::new();
    for i in 0..20 {
        let k = LockKey::new(format!("kept-{i}-{:x}", rand::random::<u64>())).unwrap();
        guards.push(
            lock.acquire(&k, AcquireOptions::default().ttl(ttl))
                .await
                .unwrap(),
        );
    }
    let during = metrics.num_alive_tasks();
    assert!(
        during <= before + 1,
        "{before} tasks before 20 guards, {during} with them"
    );
    tokio::time::sleep(ttl * 3).await;
    assert!(guards.iter().all(Guard::is_held), "a guard was not renewed");
    for g in guards {
        g.release().await.unwrap();
    }
}

/// The handle and its guards gone, every node's connection closes at
/// once: the keeper (asleep until the first renewal, 10 s away) holds no
/// connection open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_close_with_the_last_user() {
    let servers = Redis::start_many(5).await.unwrap();
    let clients = || -> usize {
        servers
            .addrs()
            .iter()
            .map(|a| {
                let out = std::process::Command::new("redis-cli")
                    .args([
                        "-h",
                        &a.ip().to_string(),
                        "-p",
                        &a.port().to_string(),
                        "info",
                        "clients",
                    ])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .find_map(|l| l.strip_prefix("connected_clients:"))
                    .and_then(|n| n.trim().parse::<usize>().ok())
                    .unwrap()
            })
            .sum()
    };
    let before = clients(); // redis-cli itself, once per node
    let lock = Redlock::connect(RedlockConfig::new(
        servers.addrs().iter().map(|a| format!("redis://{a}")),
    ))
    .await
    .unwrap();
    let k = LockKey::new(format!("closes-{:x}", rand::random::<u64>())).unwrap();
    let g = lock.acquire(&k, AcquireOptions::default()).await.unwrap();
    assert!(clients() > before);
    g.release().await.unwrap();
    drop(lock);
    let deadline = Instant::now() + Duration::from_secs(5);
    while clients() != before {
        assert!(
            Instant::now() < deadline,
            "{} connections outlived the handle and its guard",
            clients() - before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An outage of every node: the scripts loaded first (as on any node in
/// use: a script unknown to a node is sent again by a caller, not by fred's
/// queue), then `count` acquires of `name/i` with `opts`, each cut after
/// `cut(i)` (`None`: run to its end, which must be `Unavailable`); the
/// nodes return `past` after the last. Returns the keys a node holds once
/// a later request has been answered by every node (each node's
/// connection writes in order: anything kept back was written before it,
/// and holds its key for a whole TTL, far longer than the check takes).
async fn taken_after_an_outage(
    nodes: &Nodes,
    lock: &Redlock,
    name: &str,
    opts: AcquireOptions,
    count: u64,
    cut: impl Fn(u64) -> Option<Duration>,
    past: Duration,
) -> Vec<String> {
    await_connected(lock, &[true; 5]).await;
    let probe = key(&format!("{name}/probe"));
    lock.acquire(&probe, opts).await.unwrap().release().await.unwrap();
    for p in &nodes.proxies {
        p.set(Fault::Reset);
    }
    let mut keys = Vec::new();
    let mut last = Instant::now();
    for i in 0..count {
        let k = key(&format!("{name}/{i}"));
        if let Some(cut) = cut(i) {
            let _ = tokio::time::timeout(cut, lock.acquire(&k, opts)).await;
        } else {
            let r = tokio::time::timeout(LIMIT, lock.acquire(&k, opts)).await.unwrap();
            assert!(
                matches!(r, Err(Error::Unavailable { .. })),
                "attempt {i} in an outage: {r:?}"
            );
        }
        keys.push(lock.redis_key(&k));
        last = Instant::now();
    }
    tokio::time::sleep_until((last + past).into()).await;
    for p in &nodes.proxies {
        p.set(Fault::None);
    }
    await_connected(lock, &[true; 5]).await;
    let g = tokio::time::timeout(LIMIT, lock.acquire(&probe, opts.wait(Wait::For(LIMIT))))
        .await
        .unwrap()
        .unwrap();
    g.release().await.unwrap();
    let mut taken = Vec::new();
    for k in &keys {
        let n = nodes.holders(k).await;
        if n > 0 {
            taken.push(format!("{k} on {n} nodes"));
        }
    }
    taken
}

/// A request the handle gave up on while every node was out of reach is
/// never sent once the nodes are back. fred queues commands while it
/// reconnects and writes them when it is connected again, unless its own
/// timeout marked them: an acquire script cut by anything else (a time-out
/// of the driver's that fired first) took its key, for the whole TTL, after
/// the outage — long after the attempt's give-back had stopped retrying (the
/// kit's `unreachable_backend_is_unavailable` found such a key left behind
/// in CI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_up_during_an_outage_is_not_sent_when_the_nodes_return() {
    let nodes = Nodes::start().await;
    let mut config = nodes.config();
    // Many attempts in a short outage, each cut at the node time-out.
    config.request_timeout = Duration::from_millis(20);
    let lock = Redlock::connect(config).await.unwrap();
    let opts = AcquireOptions::default()
        .ttl(Duration::from_secs(60))
        .wait(Wait::No);
    // A failed attempt gives back in the background for a second at most:
    // past that, only a request sent late could take a key.
    let past = Duration::from_millis(1500);
    let taken = taken_after_an_outage(&nodes, &lock, "outage", opts, 40, |_| None, past).await;
    assert!(
        taken.is_empty(),
        "taken after the outage by requests given up during it: {taken:?}"
    );
}

/// An acquire cancelled while every node is away, in an outage that
/// outlasts its TTL (so its clean-up has given up), takes nothing when the
/// nodes return: each node's request runs until fred's own time-out marks
/// it, whoever stopped waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_cancelled_in_an_outage_longer_than_its_ttl_takes_nothing_afterwards() {
    let nodes = Nodes::start().await;
    let mut config = nodes.config();
    config.request_timeout = Duration::from_millis(200);
    let timeout = config.request_timeout;
    let lock = Redlock::connect(config).await.unwrap();
    let ttl = Duration::from_secs(1);
    let opts = AcquireOptions::default().ttl(ttl).wait(Wait::No);
    // Cut before the node time-out: the caller lets go. The clean-ups
    // release until each attempt's TTL has passed, and each of their
    // requests is marked after the node time-out: past both, only a
    // request written late could take a key.
    let cut = |i| Some(Duration::from_millis(1 + 3 * i));
    let past = ttl + timeout * 3 + Duration::from_secs(1);
    let taken = taken_after_an_outage(&nodes, &lock, "cut", opts, 10, cut, past).await;
    assert!(
        taken.is_empty(),
        "taken after the outage by acquires cancelled during it: {taken:?}"
    );
}
