//! The launcher's own tests: every topology starts, answers a real request
//! and stops; killed members restart; paused members stop answering until
//! resumed; the fault proxy delays, blackholes, resets and pauses as told.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use dlock_testkit::launcher::{Etcd, Fault, FaultProxy, Redis, ZooKeeper, etcd, redis, shared, zk};

const LIMIT: Duration = Duration::from_secs(60);

async fn refuses(addr: SocketAddr) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_err()
}

/// Waits for a condition with a deadline (never a fixed sleep).
async fn until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_single_answers_and_stops() {
    let mut r = Redis::start().await.unwrap();
    let addr = r.addrs()[0];
    assert!(r.url().starts_with("redis://127.0.0.1:"));
    assert_eq!(redis::command(addr, &["SET", "k", "v"]).await.unwrap(), "+OK");
    assert_eq!(redis::command(addr, &["GET", "k"]).await.unwrap(), "$1");
    let pid = r.members()[0].pid().unwrap();
    drop(r);
    assert!(refuses(addr).await, "redis still answers after drop");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists() || {
            // A zombie would still have /proc; the launcher reaps, so it must be gone.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_err()
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_five_nodes_kill_restart_pause() {
    let mut r = Redis::start_many(5).await.unwrap();
    let addrs = r.addrs();
    assert_eq!(addrs.len(), 5);
    for &a in &addrs {
        assert_eq!(redis::command(a, &["PING"]).await.unwrap(), "+PONG");
    }
    // Independent: a key on one is not on another.
    redis::command(addrs[0], &["SET", "only-here", "1"])
        .await
        .unwrap();
    assert_eq!(
        redis::command(addrs[1], &["EXISTS", "only-here"]).await.unwrap(),
        ":0"
    );

    r.members()[2].kill().unwrap();
    assert!(redis::command(addrs[2], &["PING"]).await.is_err());
    assert_eq!(redis::command(addrs[1], &["PING"]).await.unwrap(), "+PONG");
    r.members()[2].restart().await.unwrap();
    assert_eq!(redis::command(addrs[2], &["PING"]).await.unwrap(), "+PONG");

    // No persistence: a restart forgets.
    r.members()[0].restart().await.unwrap();
    assert_eq!(
        redis::command(addrs[0], &["EXISTS", "only-here"]).await.unwrap(),
        ":0"
    );

    r.members()[3].pause().unwrap();
    let err = redis::command(addrs[3], &["PING"]).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    r.members()[3].resume().unwrap();
    assert_eq!(redis::command(addrs[3], &["PING"]).await.unwrap(), "+PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_forms_and_routes() {
    let mut r = Redis::start_cluster(3).await.unwrap();
    let url = r.cluster_url().unwrap();
    assert!(
        url.starts_with("redis-cluster://127.0.0.1:") && url.matches("node=").count() == 2,
        "{url}"
    );
    // Keys land on different masters: a key on the wrong node gets MOVED.
    let addrs = r.addrs();
    let mut moved = 0;
    for &a in &addrs {
        let reply = redis::command(a, &["SET", "some-key", "1"]).await.unwrap();
        if reply.starts_with("-MOVED") {
            moved += 1;
        } else {
            assert_eq!(reply, "+OK");
        }
    }
    assert_eq!(moved, 2, "exactly one master owns the slot");
    r.members()[1].kill().unwrap();
    assert!(redis::command(addrs[1], &["PING"]).await.is_err());
    r.members()[1].restart().await.unwrap();
    assert_eq!(redis::command(addrs[1], &["PING"]).await.unwrap(), "+PONG");
    assert!(Redis::start_many(1).await.unwrap().cluster_url().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_single_member() {
    let e = Etcd::start().await.unwrap();
    let endpoints = e.endpoints();
    assert_eq!(endpoints.len(), 1);
    assert_eq!(
        e.etcdctl(&[0], &["put", "dlock-test", "v1"]).unwrap().trim(),
        "OK"
    );
    let got = e
        .etcdctl(&[0], &["get", "dlock-test", "--print-value-only"])
        .unwrap();
    assert_eq!(got.trim(), "v1");
    let addr: SocketAddr = endpoints[0].trim_start_matches("http://").parse().unwrap();
    drop(e);
    assert!(!etcd::healthy(addr).await);
    assert!(refuses(addr).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_three_members_survive_one_down() {
    let mut e = Etcd::start_cluster(3).await.unwrap();
    e.etcdctl(&[0], &["put", "k", "v1"]).unwrap();
    assert_eq!(
        e.etcdctl(&[2], &["get", "k", "--print-value-only"])
            .unwrap()
            .trim(),
        "v1"
    );

    e.members()[1].kill().unwrap();
    // Two of three still make a quorum (after a new election if the leader died).
    until("a write with one member down", async || {
        e.etcdctl(&[0, 2], &["put", "k", "v2"]).is_ok()
    })
    .await;
    e.members()[1].restart().await.unwrap();
    let addr1 = e.members()[1].addr();
    until("the restarted member to be healthy", async || {
        etcd::healthy(addr1).await
    })
    .await;
    assert_eq!(
        e.etcdctl(&[1], &["get", "k", "--print-value-only"])
            .unwrap()
            .trim(),
        "v2"
    );

    let addr2 = e.members()[2].addr();
    e.members()[2].pause().unwrap();
    assert!(!etcd::healthy(addr2).await, "a paused member answered");
    e.members()[2].resume().unwrap();
    until("the resumed member to be healthy", async || {
        etcd::healthy(addr2).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_standalone() {
    let z = ZooKeeper::start().await.unwrap();
    let connect = z.connect_string();
    let addr: SocketAddr = connect.parse().unwrap();
    assert_eq!(zk::mode(addr).await.as_deref(), Some("standalone"));
    let out = zk::cli(&connect, &["create", "/dlock-test", "hello"]).unwrap();
    assert!(out.contains("Created /dlock-test"), "{out}");
    let out = zk::cli(&connect, &["get", "/dlock-test"]).unwrap();
    assert!(out.contains("hello"), "{out}");
    drop(z);
    assert!(zk::mode(addr).await.is_none());
    assert!(refuses(addr).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_ensemble_elects_a_new_leader() {
    let mut z = ZooKeeper::start_ensemble(3).await.unwrap();
    let addrs: Vec<SocketAddr> = z.members().iter().map(|m| m.addr()).collect();
    let mut modes = Vec::new();
    for &a in &addrs {
        modes.push(zk::mode(a).await.unwrap());
    }
    modes.sort();
    assert_eq!(modes, ["follower", "follower", "leader"]);
    let out = zk::cli(&addrs[0].to_string(), &["create", "/dlock-ens", "x"]).unwrap();
    assert!(out.contains("Created"), "{out}");

    let leader = z.leader().await.unwrap();
    z.members()[leader].kill().unwrap();
    let others: Vec<SocketAddr> = (0..3).filter(|&i| i != leader).map(|i| addrs[i]).collect();
    until("a new leader among the other two", async || {
        let mut has = false;
        for &a in &others {
            has |= zk::mode(a).await.as_deref() == Some("leader");
        }
        has
    })
    .await;
    let out = zk::cli(&others[0].to_string(), &["get", "/dlock-ens"]).unwrap();
    assert!(out.contains('x'), "{out}");
    z.members()[leader].restart().await.unwrap();
    assert_eq!(zk::mode(addrs[leader]).await.as_deref(), Some("follower"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_delays_blackholes_resets_and_pauses() {
    let r = Redis::start().await.unwrap();
    let proxy = FaultProxy::start(r.addrs()[0]).await.unwrap();
    let via = proxy.addr();
    assert_eq!(redis::command(via, &["PING"]).await.unwrap(), "+PONG");

    let d = Duration::from_millis(150);
    proxy.set(Fault::Delay(d));
    let t = Instant::now();
    assert_eq!(redis::command(via, &["PING"]).await.unwrap(), "+PONG");
    assert!(
        t.elapsed() >= d * 2,
        "a delayed round trip took only {:?}",
        t.elapsed()
    );

    proxy.set(Fault::Blackhole);
    let err = redis::command(via, &["PING"]).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    // The server itself is fine.
    assert_eq!(redis::command(r.addrs()[0], &["PING"]).await.unwrap(), "+PONG");

    proxy.set(Fault::None);
    assert_eq!(redis::command(via, &["PING"]).await.unwrap(), "+PONG");

    proxy.set(Fault::Reset);
    let err = redis::command(via, &["PING"]).await.unwrap_err();
    assert_ne!(
        err.kind(),
        std::io::ErrorKind::TimedOut,
        "a reset should fail fast: {err}"
    );

    proxy.set(Fault::Pause);
    let pending = tokio::spawn(async move { redis::command(via, &["PING"]).await });
    let observed = Instant::now() + Duration::from_millis(300);
    while Instant::now() < observed {
        assert!(!pending.is_finished(), "a reply crossed a paused proxy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.set(Fault::None);
    assert_eq!(pending.await.unwrap().unwrap(), "+PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_reset_cuts_open_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let r = Redis::start().await.unwrap();
    let proxy = FaultProxy::start(r.addrs()[0]).await.unwrap();
    let mut s = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"PING\r\n").await.unwrap();
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"+PONG\r\n");
    proxy.set(Fault::Reset);
    let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap();
    assert!(
        matches!(r, Ok(0) | Err(_)),
        "the open connection survived a reset: {r:?}"
    );
    assert!(
        FaultProxy::start("10.0.0.1:6379".parse().unwrap()).await.is_err(),
        "the proxy forwarded off loopback"
    );
}

/// A connection that lost data to a blackhole is reset when the blackhole
/// ends (its byte stream has a hole); one that lost nothing carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_resets_what_a_blackhole_cut_a_hole_in() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn ping(s: &mut tokio::net::TcpStream) -> std::io::Result<[u8; 7]> {
        s.write_all(b"PING\r\n").await?;
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).await?;
        Ok(buf)
    }
    let r = Redis::start().await.unwrap();
    let proxy = FaultProxy::start(r.addrs()[0]).await.unwrap();
    let mut holed = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    let mut intact = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(&ping(&mut holed).await.unwrap(), b"+PONG\r\n");
    assert_eq!(&ping(&mut intact).await.unwrap(), b"+PONG\r\n");
    proxy.set(Fault::Blackhole);
    let swallowed = tokio::time::timeout(Duration::from_millis(300), ping(&mut holed)).await;
    assert!(swallowed.is_err(), "a reply crossed a blackhole: {swallowed:?}");
    proxy.set(Fault::None);
    let mut buf = [0u8; 7];
    let r = tokio::time::timeout(Duration::from_secs(5), holed.read(&mut buf))
        .await
        .unwrap();
    assert!(
        matches!(r, Ok(0) | Err(_)),
        "a connection that lost data survived the blackhole: {r:?}"
    );
    assert_eq!(&ping(&mut intact).await.unwrap(), b"+PONG\r\n");
}

/// The shared servers of `cargo xtask test` (or private ones under plain
/// `cargo test`) answer real requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_servers_answer() {
    let r = shared::redis().await.unwrap();
    let addr: SocketAddr = r.addresses[0].trim_start_matches("redis://").parse().unwrap();
    assert_eq!(redis::command(addr, &["PING"]).await.unwrap(), "+PONG");

    let nodes = shared::redis_nodes().await.unwrap();
    assert_eq!(nodes.addresses.len(), shared::REDIS_NODES);
    for url in &nodes.addresses {
        let a: SocketAddr = url.trim_start_matches("redis://").parse().unwrap();
        assert_eq!(redis::command(a, &["PING"]).await.unwrap(), "+PONG");
    }

    let c = shared::redis_cluster().await.unwrap();
    assert!(c.addresses[0].starts_with("redis-cluster://"));

    let e = shared::etcd().await.unwrap();
    let key = format!("dlock-shared-{}", rand::random::<u32>());
    etcd::etcdctl(&e.addresses, &["put", &key, "1"]).unwrap();
    etcd::etcdctl(&e.addresses, &["del", &key]).unwrap();

    let z = shared::zk().await.unwrap();
    let first: SocketAddr = z.addresses[0].split(',').next().unwrap().parse().unwrap();
    assert!(zk::mode(first).await.is_some());
}

/// Reads `TIME`'s seconds from an instance (the launcher's `command` gives
/// the reply's first line only, so this talks RESP itself).
async fn server_seconds(addr: SocketAddr) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"*1\r\n$4\r\nTIME\r\n").await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    // *2 $N secs $M micros: five CRLF-terminated lines.
    while got.windows(2).filter(|w| *w == b"\r\n").count() < 5 {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8(got).unwrap();
    text.split("\r\n").nth(2).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_clock_jumps_expire_keys_on_that_instance_only() {
    let r = Redis::start_many_with_clocks(2).await.unwrap();
    let addrs = r.addrs();
    for &a in &addrs {
        assert_eq!(
            redis::command(a, &["SET", "k", "v", "PX", "60000"])
                .await
                .unwrap(),
            "+OK"
        );
    }
    let before = server_seconds(addrs[0]).await;
    r.jump_clock(0, Duration::from_secs(120)).unwrap();
    let after = server_seconds(addrs[0]).await;
    assert!(after >= before + 120, "TIME moved from {before} to {after} only");
    // The key's 60 s are over on the jumped instance, not on the other one.
    assert_eq!(redis::command(addrs[0], &["GET", "k"]).await.unwrap(), "$-1");
    assert_eq!(redis::command(addrs[1], &["GET", "k"]).await.unwrap(), "$1");
    let other = server_seconds(addrs[1]).await;
    assert!(
        other < before + 60,
        "the other instance's clock moved too: {other}"
    );
    assert!(r.jump_clock(2, Duration::from_secs(1)).is_err());
    assert!(
        Redis::start()
            .await
            .unwrap()
            .jump_clock(0, Duration::from_secs(1))
            .is_err()
    );
}
