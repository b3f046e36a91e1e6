//! The floors: what the same client library does for the least a lock can
//! cost on each backend, measured beside the driver in the same run.
//!
//! - Redis: `SET key value NX PX ttl`, then the compare-and-delete `EVAL`.
//! - Redlock: the same on every node at once.
//! - etcd: a put, then a delete.
//! - ZooKeeper: an ephemeral create, then a delete.
//! - PostgreSQL: a bare `INSERT` of one row, then its `DELETE` (prepared
//!   statements, as the driver's, on a table of the floor's own).
//!
//! A trivial round trip (`GET`, a range get, an `exists`, a `SELECT 1`) is
//! the floor of a handoff: a released lock cannot reach another client
//! faster than that.

use dlock_redis_protocol::calls::{Fenced, Scripts};
use dlock_redis_protocol::scripts;
use fred::prelude::{Builder, Client as Fred, ClientLike, Config as FredConfig, KeysInterface, LuaInterface};
use fred::types::{Expiration, SetOptions};
use zookeeper_client::{Acls, CreateMode};

/// The compare-and-delete release every Redis lock library sends.
const RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// How long the handoff floor waits for a subscription to take or a
/// release notice to come (on loopback, both take microseconds).
const NOTICE_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

/// `event`, which the handoff floor waits for, within [`NOTICE_WITHIN`].
async fn notice<T>(what: &str, event: impl std::future::Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(NOTICE_WITHIN, event)
        .await
        .map_err(|_| format!("the handoff floor waited for {what} for {NOTICE_WITHIN:?}"))
}

/// Waits until Redis counts a subscriber on `channel` (asked through
/// `client`), at most [`NOTICE_WITHIN`].
async fn subscribed(client: &Fred, channel: &str) -> Result<(), String> {
    use fred::prelude::PubsubInterface;
    dlock_testkit::wait_until(NOTICE_WITHIN, "the subscription to take", || async {
        // The reply is flat: channel, count, channel, count...
        let reply: Vec<fred::types::Value> = client
            .pubsub_numsub(channel)
            .await
            .map_err(|e| dlock_testkit::Failure(format!("PUBSUB NUMSUB {channel}: {e}")))?;
        Ok(reply.chunks(2).any(|pair| {
            pair[0].as_str().as_deref() == Some(channel)
                && pair.get(1).and_then(fred::types::Value::as_u64) > Some(0)
        }))
    })
    .await
    .map_err(|e| format!("{channel}: {e}"))
}

/// A raw client of one backend.
#[derive(Clone)]
pub(crate) enum Floor {
    /// One Redis server.
    Redis(Fred),
    /// Independent Redis nodes.
    Redlock(Vec<Fred>),
    /// etcd.
    Etcd(Box<etcd_client::Client>),
    /// ZooKeeper.
    Zk(zookeeper_client::Client),
    /// PostgreSQL.
    Postgres(std::sync::Arc<Pg>),
}

/// A raw tokio-postgres client, its prepared statements, and the
/// notifications its connection received (for the handoff floor).
pub(crate) struct Pg {
    client: tokio_postgres::Client,
    insert: tokio_postgres::Statement,
    delete: tokio_postgres::Statement,
    select: tokio_postgres::Statement,
    notices: tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<String>>,
}

impl Pg {
    /// The bare `INSERT` of `key`'s row, owned by `owner`.
    async fn take(&self, key: &str, owner: &str) -> Result<(), String> {
        self.client
            .execute(&self.insert, &[&key, &owner])
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The `DELETE` of `key`'s row if `owner` owns it, notifying `channel`.
    async fn give_back(&self, key: &str, owner: &str, channel: &str) -> Result<(), String> {
        self.client
            .query(&self.delete, &[&key, &owner, &channel])
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// The PostgreSQL floor's table.
const PG_TABLE: &str = "dlock_bench_floor";

/// The parent of the ZooKeeper floor's nodes.
const ZK_DIR: &str = "/dlock-bench-floor";

async fn fred(url: &str) -> Result<Fred, String> {
    let config = FredConfig::from_url(url).map_err(|e| format!("{url}: {e}"))?;
    let client = Builder::from_config(config).build().map_err(|e| e.to_string())?;
    client.init().await.map_err(|e| format!("{url}: {e}"))?;
    Ok(client)
}

impl Floor {
    /// Redis at `url` (`redis://...`).
    pub(crate) async fn redis(url: &str) -> Result<Floor, String> {
        Ok(Floor::Redis(fred(url).await?))
    }

    /// Redlock nodes at `urls`.
    pub(crate) async fn redlock(urls: &[String]) -> Result<Floor, String> {
        let mut nodes = Vec::new();
        for u in urls {
            nodes.push(fred(u).await?);
        }
        Ok(Floor::Redlock(nodes))
    }

    /// etcd at `endpoints` (`http://...`).
    pub(crate) async fn etcd(endpoints: &[String]) -> Result<Floor, String> {
        let client = etcd_client::Client::connect(endpoints, None)
            .await
            .map_err(|e| format!("etcd {endpoints:?}: {e}"))?;
        Ok(Floor::Etcd(Box::new(client)))
    }

    /// ZooKeeper at `connect` (`host:port,...`).
    pub(crate) async fn zk(connect: &str) -> Result<Floor, String> {
        Ok(Floor::Zk(zk_with_dir(connect, ZK_DIR).await?))
    }

    /// PostgreSQL at `url` (`postgres://...`): its own connection, the
    /// floor's table made if absent.
    pub(crate) async fn postgres(url: &str) -> Result<Floor, String> {
        use futures::StreamExt;
        let err = |e: tokio_postgres::Error| format!("postgres: {e}");
        let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .map_err(err)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let tokio_postgres::AsyncMessage::Notification(n) = message {
                    let _ = tx.send(n.payload().to_owned());
                }
            }
        });
        // Two floors may create it at once: one of them may be told it
        // already exists.
        let create =
            format!("CREATE TABLE IF NOT EXISTS {PG_TABLE} (name TEXT PRIMARY KEY, value TEXT NOT NULL)");
        if let Err(e) = client.batch_execute(&create).await {
            let raced = e.code().is_some_and(|c| {
                *c == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
                    || *c == tokio_postgres::error::SqlState::DUPLICATE_TABLE
            });
            if !raced {
                return Err(err(e));
            }
        }
        let insert = client
            .prepare(&format!("INSERT INTO {PG_TABLE} (name, value) VALUES ($1, $2)"))
            .await
            .map_err(err)?;
        let delete = client
            .prepare(&format!(
                "WITH d AS (DELETE FROM {PG_TABLE} WHERE name = $1 AND value = $2 RETURNING name) \
                 SELECT pg_notify($3, name) FROM d"
            ))
            .await
            .map_err(err)?;
        let select = client.prepare("SELECT 1").await.map_err(err)?;
        Ok(Floor::Postgres(std::sync::Arc::new(Pg {
            client,
            insert,
            delete,
            select,
            notices: tokio::sync::Mutex::new(rx),
        })))
    }

    /// The least a lock can do: take `key` (TTL 30 s where there is one)
    /// and give it back.
    pub(crate) async fn cycle(&self, key: &str) -> Result<(), String> {
        let value = "floor-holder";
        let err = |e: &dyn std::fmt::Display| e.to_string();
        match self {
            Floor::Redis(c) => set_and_release(c, key, value).await,
            Floor::Redlock(nodes) => {
                let sets = nodes.iter().map(|c| async move {
                    c.set::<(), _, _>(
                        key,
                        value,
                        Some(Expiration::PX(30_000)),
                        Some(SetOptions::NX),
                        false,
                    )
                    .await
                });
                for r in futures::future::join_all(sets).await {
                    r.map_err(|e| err(&e))?;
                }
                let dels = nodes
                    .iter()
                    .map(|c| c.eval::<i64, _, _, _>(RELEASE, vec![key], vec![value]));
                for r in futures::future::join_all(dels).await {
                    r.map_err(|e| err(&e))?;
                }
                Ok(())
            }
            Floor::Etcd(c) => {
                let mut c = (**c).clone();
                c.put(key, value, None).await.map_err(|e| err(&e))?;
                c.delete(key, None).await.map_err(|e| err(&e))?;
                Ok(())
            }
            Floor::Zk(c) => {
                let path = format!("{ZK_DIR}/{}", key.replace('/', "_"));
                c.create(
                    &path,
                    value.as_bytes(),
                    &CreateMode::Ephemeral.with_acls(Acls::anyone_all()),
                )
                .await
                .map_err(|e| err(&e))?;
                c.delete(&path, None).await.map_err(|e| err(&e))
            }
            Floor::Postgres(pg) => {
                pg.take(key, value).await?;
                // No one listens on this channel: the notice costs what the
                // driver's release costs.
                pg.give_back(key, value, PG_TABLE).await
            }
        }
    }

    /// One trivial round trip.
    pub(crate) async fn round_trip(&self) -> Result<(), String> {
        let err = |e: &dyn std::fmt::Display| e.to_string();
        match self {
            Floor::Redis(c) => c
                .get::<Option<String>, _>("dlock-bench-rtt")
                .await
                .map(drop)
                .map_err(|e| err(&e)),
            Floor::Redlock(nodes) => nodes[0]
                .get::<Option<String>, _>("dlock-bench-rtt")
                .await
                .map(drop)
                .map_err(|e| err(&e)),
            Floor::Etcd(c) => c
                .clone()
                .get("dlock-bench-rtt", None)
                .await
                .map(drop)
                .map_err(|e| err(&e)),
            Floor::Zk(c) => c.check_stat(ZK_DIR).await.map(drop).map_err(|e| err(&e)),
            Floor::Postgres(pg) => pg
                .client
                .query(&pg.select, &[])
                .await
                .map(drop)
                .map_err(|e| err(&e)),
        }
    }
}

/// A ZooKeeper client at `connect`, with the persistent node `dir` made
/// if it is not there (the floor's and the peer's parent).
pub(crate) async fn zk_with_dir(connect: &str, dir: &str) -> Result<zookeeper_client::Client, String> {
    let client = zookeeper_client::Client::connect(connect)
        .await
        .map_err(|e| format!("zookeeper {connect}: {e}"))?;
    match client
        .create(dir, b"", &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
    {
        Ok(_) | Err(zookeeper_client::Error::NodeExists) => Ok(client),
        Err(e) => Err(format!("zookeeper {connect}: creating {dir}: {e}")),
    }
}

async fn set_and_release(c: &Fred, key: &str, value: &str) -> Result<(), String> {
    c.set::<(), _, _>(
        key,
        value,
        Some(Expiration::PX(30_000)),
        Some(SetOptions::NX),
        false,
    )
    .await
    .map_err(|e| e.to_string())?;
    c.eval::<i64, _, _, _>(RELEASE, vec![key], vec![value])
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// The floor of a handoff, with two raw clients of the same library: A
/// holds, B waits the way a lock client would (Redis: subscribed to a
/// channel; etcd: a watch on A's key; ZooKeeper: an exists-watch on A's
/// node); A releases (Redis: the compare-and-delete plus a `PUBLISH`; etcd
/// and ZooKeeper: a delete), B is told and takes it (`SET NX PX`, a put, a
/// create; PostgreSQL: B `LISTEN`s, A's delete notifies, B inserts).
/// Measured from A's release call to B's grant. Redlock: `None`.
pub(crate) async fn handoff(
    floor: &Floor,
    other: &Floor,
    sub_url: Option<&str>,
    n: usize,
) -> Result<Option<crate::stats::Lat>, String> {
    use std::time::Instant;
    let mut lat = crate::stats::Lat::default();
    let key = format!("bench-handoff-{:x}", rand::random::<u32>());
    let err = |e: &dyn std::fmt::Display| e.to_string();
    match (floor, other) {
        (Floor::Redis(a), Floor::Redis(b)) => {
            use fred::prelude::{EventInterface, PubsubInterface};
            let url = sub_url.ok_or("the handoff floor needs the Redis URL")?;
            let config = FredConfig::from_url(url).map_err(|e| err(&e))?;
            let sub = Builder::from_config(config)
                .build_subscriber_client()
                .map_err(|e| err(&e))?;
            sub.init().await.map_err(|e| err(&e))?;
            let channel = format!("{key}:released");
            let mut rx = sub.message_rx();
            // fred's SUBSCRIBE returns once written, before Redis has read
            // it: a release published meanwhile would reach nobody.
            sub.subscribe(channel.as_str()).await.map_err(|e| err(&e))?;
            subscribed(a, &channel).await?;
            let publish_release = "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]); redis.call('publish', ARGV[2], '1'); return 1 else return 0 end";
            for i in 0..n + 5 {
                a.set::<(), _, _>(
                    &key,
                    "a",
                    Some(Expiration::PX(30_000)),
                    Some(SetOptions::NX),
                    false,
                )
                .await
                .map_err(|e| err(&e))?;
                let t = Instant::now();
                a.eval::<i64, _, _, _>(publish_release, vec![key.as_str()], vec!["a", channel.as_str()])
                    .await
                    .map_err(|e| err(&e))?;
                notice("the release notice", rx.recv())
                    .await?
                    .map_err(|e| err(&e))?;
                let got: Option<String> = b
                    .set(
                        &key,
                        "b",
                        Some(Expiration::PX(30_000)),
                        Some(SetOptions::NX),
                        false,
                    )
                    .await
                    .map_err(|e| err(&e))?;
                let d = t.elapsed();
                if got.is_none() {
                    return Err("the handoff floor's SET NX failed".into());
                }
                b.eval::<i64, _, _, _>(RELEASE, vec![key.as_str()], vec!["b"])
                    .await
                    .map_err(|e| err(&e))?;
                if i >= 5 {
                    lat.record(d);
                }
            }
            let _ = sub.quit().await;
            Ok(Some(lat))
        }
        (Floor::Etcd(a), Floor::Etcd(b)) => {
            let (mut a, mut b) = ((**a).clone(), (**b).clone());
            for i in 0..n + 5 {
                a.put(key.as_str(), "a", None).await.map_err(|e| err(&e))?;
                let mut stream = b.watch(key.as_str(), None).await.map_err(|e| err(&e))?;
                // The watch is in place once etcd says it was created.
                notice("the etcd watch's creation", stream.message())
                    .await?
                    .map_err(|e| err(&e))?;
                let t = Instant::now();
                a.delete(key.as_str(), None).await.map_err(|e| err(&e))?;
                loop {
                    let m = notice("the etcd delete event", stream.message())
                        .await?
                        .map_err(|e| err(&e))?
                        .ok_or("the watch ended")?;
                    if m.events()
                        .iter()
                        .any(|e| e.event_type() == etcd_client::EventType::Delete)
                    {
                        break;
                    }
                }
                b.put(key.as_str(), "b", None).await.map_err(|e| err(&e))?;
                let d = t.elapsed();
                b.delete(key.as_str(), None).await.map_err(|e| err(&e))?;
                if i >= 5 {
                    lat.record(d);
                }
            }
            Ok(Some(lat))
        }
        (Floor::Zk(a), Floor::Zk(b)) => {
            let path = format!("{ZK_DIR}/{key}");
            let mode = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
            for i in 0..n + 5 {
                a.create(&path, b"a", &mode).await.map_err(|e| err(&e))?;
                let (_, watcher) = b.check_and_watch_stat(&path).await.map_err(|e| err(&e))?;
                let t = Instant::now();
                a.delete(&path, None).await.map_err(|e| err(&e))?;
                notice("the ZooKeeper delete event", watcher.changed()).await?;
                b.create(&path, b"b", &mode).await.map_err(|e| err(&e))?;
                let d = t.elapsed();
                b.delete(&path, None).await.map_err(|e| err(&e))?;
                if i >= 5 {
                    lat.record(d);
                }
            }
            Ok(Some(lat))
        }
        (Floor::Postgres(a), Floor::Postgres(b)) => {
            let channel = format!("dlock_bench_{}", rand::random::<u32>());
            b.client
                .batch_execute(&format!("LISTEN {channel}"))
                .await
                .map_err(|e| err(&e))?;
            let mut notices = b.notices.lock().await;
            for i in 0..n + 5 {
                a.take(&key, "a").await?;
                let t = Instant::now();
                a.give_back(&key, "a", &channel).await?;
                notice("the release notice", notices.recv())
                    .await?
                    .ok_or("the handoff floor's connection ended")?;
                b.take(&key, "b").await?;
                let d = t.elapsed();
                b.give_back(&key, "b", &channel).await?;
                // B's own release notified B too: take that notice away.
                notice("the own release notice", notices.recv())
                    .await?
                    .ok_or("the handoff floor's connection ended")?;
                if i >= 5 {
                    lat.record(d);
                }
            }
            drop(notices);
            b.client
                .batch_execute(&format!("UNLISTEN {channel}"))
                .await
                .map_err(|e| err(&e))?;
            Ok(Some(lat))
        }
        _ => Ok(None),
    }
}

/// Our two scripts and nothing else, through the floor's raw client: what
/// the server and the client library cost for our protocol.
pub(crate) async fn scripts_alone(c: &Fred, scripts: &Scripts, key: &str) -> Result<(), String> {
    let fence = scripts::fence_key(key).unwrap_or_else(|| format!("{{{key}}}{}", scripts::FENCE_SUFFIX));
    let value = "breakdown-holder";
    match scripts
        .acquire(c, key, &fence, value, std::time::Duration::from_secs(30), None)
        .await
        .map_err(|e| e.to_string())?
    {
        Fenced::Granted(_) => {}
        Fenced::Held(_) => return Err(format!("{key}: held by someone else")),
    }
    let released = scripts.release(c, key, value).await.map_err(|e| e.to_string())?;
    if released == 1 {
        Ok(())
    } else {
        Err(format!("{key}: release answered {released}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_testkit::launcher::{Fault, FaultProxy, shared};

    /// The handoff floor's subscriber reaches Redis late (its bytes held
    /// 200 ms by a proxy): fred's SUBSCRIBE has returned long before Redis
    /// reads it, so a release published at once would reach nobody, and
    /// the floor waited for its notice for ever. It waits for the
    /// subscription to take first.
    #[tokio::test]
    async fn the_handoff_floor_waits_for_its_subscription_to_take() {
        let redis = shared::redis().await.unwrap();
        let url = &redis.addresses[0];
        let upstream: std::net::SocketAddr = url.trim_start_matches("redis://").parse().unwrap();
        let proxy = FaultProxy::start(upstream).await.unwrap();
        proxy.set(Fault::Delay(std::time::Duration::from_millis(200)));
        let (a, b) = (Floor::redis(url).await.unwrap(), Floor::redis(url).await.unwrap());
        let via_proxy = format!("redis://{}", proxy.addr());
        let lat = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            handoff(&a, &b, Some(&via_proxy), 2),
        )
        .await
        .expect("the handoff floor ends")
        .unwrap()
        .expect("a Redis handoff floor");
        assert_eq!(lat.count(), 2);
    }
}
