//! The full conformance kit against a real ZooKeeper, FIFO scenario included.

mod common;

async fn factory() -> common::ZkFactory {
    common::ZkFactory::shared().await
}

dlock_testkit::conformance_tests!(factory, skip: [unoffered_primitives_are_refused]);
