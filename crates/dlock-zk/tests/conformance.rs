//! The full conformance kit against a real ZooKeeper, FIFO scenario included.

mod common;

async fn factory() -> common::ZkFactory {
    common::ZkFactory::shared().await
}

dlock_testkit::conformance_tests!(factory, skip: [
    read_write_readers_share_writers_exclude,
    read_write_waiting_writer_not_starved,
    read_write_expired_reader_lets_the_writer_in,
    semaphore_admits_up_to_its_limit,
    semaphore_never_over_admits,
    semaphore_expired_permit_passes_on,
]);
