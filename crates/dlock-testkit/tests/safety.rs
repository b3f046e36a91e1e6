//! The holder-pause nemesis bites: without the fence, a holder paused past
//! its TTL overwrites newer holders' increments (lost updates, detected);
//! with the fence, nothing stale is accepted and nothing is lost.

use std::time::Duration;

use dlock_core::{LockKey, MemLock};
use dlock_testkit::safety::{SafetyPlan, run};

fn plan(fence: bool) -> SafetyPlan {
    SafetyPlan {
        duration: Duration::from_secs(3),
        ttl: Duration::from_millis(150),
        pause_every: 3,
        fence,
    }
}

fn clients() -> Vec<MemLock> {
    let backend = MemLock::new();
    (0..3).map(|_| backend.client()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_fence_a_paused_holder_loses_updates() {
    let report = run(clients(), &LockKey::new("register").unwrap(), plan(false)).await;
    eprintln!("unfenced: {report}");
    assert!(report.pauses > 0, "{report}");
    assert!(report.lost_updates > 0, "the nemesis did not bite: {report}");
    assert!(!report.is_safe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_fence_nothing_stale_is_accepted_and_nothing_lost() {
    let report = run(clients(), &LockKey::new("register").unwrap(), plan(true)).await;
    eprintln!("fenced: {report}");
    assert!(report.pauses > 0, "{report}");
    assert!(report.rejected > 0, "no stale write was even attempted: {report}");
    assert!(report.is_safe(), "{report}");
    assert_eq!(report.register, report.accepted, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn residue_names_what_is_left_and_when_it_is_gone() {
    use dlock_core::{AcquireOptions, Lock};
    use dlock_testkit::{LockFactory, MemFactory, safety::residue};

    let factory = MemFactory::new();
    let lock = factory.client().await.unwrap();
    let key = LockKey::new("residue/held").unwrap();
    let guard = lock
        .acquire(&key, AcquireOptions::default().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let left = residue(&factory, "residue", Duration::from_millis(200)).await;
    assert_eq!(left.at_drain.len(), 1, "{left:?}");
    assert_eq!(left.cleared_after, None, "{left}");
    assert_eq!(left.left, left.at_drain, "{left}");
    assert!(left.to_string().contains("1 still left"), "{left}");
    // A lock given up by TTL is residue until the TTL runs out.
    factory.abandon(&lock).await;
    drop(guard);
    let short = factory.client().await.unwrap();
    let g = short
        .acquire(
            &LockKey::new("residue/ttl").unwrap(),
            AcquireOptions::default()
                .ttl(Duration::from_millis(300))
                .auto_extend(false),
        )
        .await
        .unwrap();
    factory.abandon(&short).await;
    drop(g);
    let gone = residue(&factory, "residue/ttl", Duration::from_secs(10)).await;
    assert_eq!(gone.at_drain.len(), 1, "{gone:?}");
    assert!(gone.cleared_after.is_some(), "{gone}");
    assert!(gone.left.is_empty(), "{gone}");
}

/// The family run counts from the clients' own view: the reference keeps
/// both invariants (and really shares), and the planted over-admitting
/// semaphore and a writer that ignores readers are caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn family_runs_count_what_breaks_and_only_that() {
    use dlock_testkit::broken::{Flaw, NaiveLock};
    use dlock_testkit::safety::{FamilyWorkload, NoFaults, Schedule, run_family_with_faults};

    let plan = SafetyPlan {
        duration: Duration::from_secs(2),
        ttl: Duration::from_secs(2),
        pause_every: 0,
        fence: false,
    };
    let calm = || Schedule {
        kinds: Vec::new(),
        calm: plan.duration,
        fault: Duration::ZERO,
    };
    let key = LockKey::new("family").unwrap();
    let semaphore = FamilyWorkload::Semaphore { limit: 2 };
    for workload in [semaphore, FamilyWorkload::ReadWrite] {
        let backend = MemLock::new();
        let clients = (0..4).map(|_| backend.client()).collect();
        let (report, _) = run_family_with_faults(clients, &key, workload, plan, NoFaults, calm()).await;
        eprintln!("mem: {report}");
        assert!(report.is_safe(), "{report}");
        assert!(report.most_at_once >= 2, "nobody shared: {report}");
        assert!(report.grants > 20, "{report}");
    }
    for (flaw, workload) in [
        (Flaw::SemaphoreOverAdmits, semaphore),
        (Flaw::WriterIgnoresReaders, FamilyWorkload::ReadWrite),
    ] {
        let backend = NaiveLock::new(flaw);
        let clients = (0..4).map(|_| backend.client()).collect();
        let (report, _) = run_family_with_faults(clients, &key, workload, plan, NoFaults, calm()).await;
        eprintln!("{flaw:?}: {report}");
        assert!(!report.is_safe(), "{flaw:?} was not caught: {report}");
        assert!(report.to_string().contains("first: "), "{report}");
    }
}
