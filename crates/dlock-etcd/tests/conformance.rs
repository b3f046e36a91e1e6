//! The full conformance kit against a real etcd, FIFO scenario included.

mod common;

async fn factory() -> common::EtcdFactory {
    common::EtcdFactory::shared().await
}

dlock_testkit::conformance_tests!(factory, skip: [
    semaphore_admits_up_to_its_limit,
    semaphore_never_over_admits,
    semaphore_expired_permit_passes_on,
]);
