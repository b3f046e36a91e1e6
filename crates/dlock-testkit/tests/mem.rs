//! The conformance kit against the reference driver, `MemLock`.

async fn factory() -> dlock_testkit::MemFactory {
    dlock_testkit::MemFactory::new()
}

dlock_testkit::conformance_tests!(factory);
