//! The full conformance kit against a real PostgreSQL server.

mod common;

async fn factory() -> common::PostgresFactory {
    common::PostgresFactory::shared().await
}

// Not FIFO; read-write locks and semaphores are not offered yet.
dlock_testkit::conformance_tests!(factory, skip: [
    fifo_waiters,
    read_write_readers_share_writers_exclude,
    read_write_waiting_writer_not_starved,
    read_write_expired_reader_lets_the_writer_in,
    semaphore_admits_up_to_its_limit,
    semaphore_never_over_admits,
    semaphore_expired_permit_passes_on,
]);
