//! The conformance kit against the reference driver, `MemLock`.

async fn factory() -> dlock_testkit::MemFactory {
    dlock_testkit::MemFactory::new()
}

dlock_testkit::conformance_tests!(factory, skip: [
    // In process: no network link to break.
    cancelled_acquire_in_flight_leaves_nothing,
    unreachable_backend_is_unavailable,
    failed_release_is_not_ok,
    dead_link_fires_lost_in_time,
    cancelled_on_a_dead_link_is_not_replayed,
    unoffered_primitives_are_refused,
]);
