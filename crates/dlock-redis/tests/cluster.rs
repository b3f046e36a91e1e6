//! The full conformance kit against a three-master Redis Cluster: lock keys
//! spread over slots, each sharing its slot with its fence counter.

mod common;

use dlock_redis::RedisConfig;
use dlock_testkit::launcher::shared;

async fn factory() -> common::RedisFactory {
    let endpoint = shared::redis_cluster()
        .await
        .expect("a redis cluster for the tests");
    common::RedisFactory::new(
        RedisConfig::from_url(endpoint.addresses[0].clone()),
        endpoint.server,
    )
    .await
}

// No FIFO; and no links: a Cluster client finds the other masters itself,
// past any proxy in front of the first one.
dlock_testkit::conformance_tests!(factory, skip: [
    fifo_waiters,
    unoffered_primitives_are_refused,
    cancelled_acquire_in_flight_leaves_nothing,
    failed_release_is_not_ok,
    unreachable_backend_is_unavailable,
    dead_link_fires_lost_in_time,
    cancelled_on_a_dead_link_is_not_replayed,
]);

/// Keys of one namespace really do land on different masters (so the kit
/// above exercised several slots), and a key with `}` but no hash tag is
/// refused on a cluster rather than failing with CROSSSLOT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_spread_over_masters_and_untaggable_keys_are_refused() {
    use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey};
    let f = factory().await;
    let lock = dlock_redis::RedisLock::connect(f.config.clone()).await.unwrap();
    let mut slots = std::collections::BTreeSet::new();
    for i in 0..16 {
        let key = LockKey::new(format!("spread/{i}")).unwrap();
        let g = lock.acquire(&key, AcquireOptions::default()).await.unwrap();
        slots.insert(crc16_slot(&lock.redis_key(&key).unwrap()) * 3 / 16384);
        g.release().await.unwrap();
    }
    assert!(slots.len() >= 2, "16 keys all landed on one third of the slots");
    let bad = LockKey::new("a}b").unwrap();
    assert!(matches!(
        lock.acquire(&bad, AcquireOptions::default()).await,
        Err(Error::InvalidKey { .. })
    ));
}

/// Redis Cluster's key slot (CRC16/XMODEM of the hash tag or key, mod 16384).
fn crc16_slot(key: &str) -> u16 {
    let tagged = dlock_redis::scripts::hash_tag(key).unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}
