//! The full conformance kit against a real etcd, FIFO scenario included.

mod common;

async fn factory() -> common::EtcdFactory {
    common::EtcdFactory::shared().await
}

dlock_testkit::conformance_tests!(factory, skip: [unoffered_primitives_are_refused]);
