//! The conformance kit against Redlock on five real redis-servers (the
//! fencing scenarios report "skipped": Redlock gives no tokens, by design).

mod common;

async fn factory() -> common::RedlockFactory {
    common::RedlockFactory::shared().await
}

dlock_testkit::conformance_tests!(factory, skip: [
    fifo_waiters,
    tokens_increase_across_clients,
    fenced_stale_write_rejected,
]);
