//! The conformance kit against Redlock on five real redis-servers (the
//! fencing scenarios report "skipped": Redlock gives no tokens, by design).

mod common;

use dlock_core::Lock;

async fn factory() -> common::RedlockFactory {
    common::RedlockFactory::shared().await
}

dlock_testkit::conformance_tests!(factory, skip: [
    fifo_waiters,
    tokens_increase_across_clients,
    fenced_stale_write_rejected,
    read_write_readers_share_writers_exclude,
    read_write_waiting_writer_not_starved,
    read_write_expired_reader_lets_the_writer_in,
    semaphore_admits_up_to_its_limit,
    semaphore_never_over_admits,
    semaphore_expired_permit_passes_on,
]);

/// Redlock refuses semaphores and says why (a count across a quorum).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_are_refused_with_the_reason() {
    let f = common::RedlockFactory::shared().await;
    let lock = dlock_testkit::LockFactory::client(&f).await.unwrap();
    let e = lock
        .acquire_permits(
            &dlock_core::LockKey::new("sem").unwrap(),
            1,
            3,
            dlock_core::AcquireOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, dlock_core::Error::Unsupported { .. }), "{e:?}");
    assert!(e.to_string().contains("quorum"), "{e}");
}
