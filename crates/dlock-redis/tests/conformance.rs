//! The full conformance kit against a real redis-server.

mod common;

async fn factory() -> common::RedisFactory {
    common::RedisFactory::shared().await
}

dlock_testkit::conformance_tests!(factory, skip: [
    fifo_waiters,
    unoffered_primitives_are_refused,
]);
