//! # dlock-testkit
//!
//! The conformance kit every dlock driver runs, and the tools it needs:
//!
//! - [`LockFactory`]: how the kit gets independent clients of a driver and
//!   injects faults; [`MemFactory`] for the in-process driver.
//! - [`scenarios`]: the contract, one `pub async fn` per property, and
//!   [`conformance_tests!`] to expand them into one test each.
//! - [`history`]: a recorder and checker of concurrent histories (overlapping
//!   holds, token order, stale fenced writes).
//! - [`broken`]: deliberately broken drivers the kit must catch.
//! - [`workload`]: clients contending under faults, recorded for the checker.
//! - [`safety`]: the fenced register workload with the holder-pause nemesis.
//! - [`launcher`]: real `redis-server`, etcd and ZooKeeper processes on free
//!   loopback ports, plus a TCP fault proxy.
//!
//! A new driver's test file is a factory function and one macro call (see
//! [`conformance_tests!`]); `tests/mem.rs` in this crate is the example.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod broken;
mod factory;
pub mod history;
pub mod launcher;
mod outcome;
mod runner;
pub mod safety;
pub mod scenarios;
pub mod workload;

pub use factory::{LockFactory, MemFactory};
pub use outcome::{Failure, Outcome, Verdict, wait_until, within};
pub use runner::{
    SCENARIO_LIMIT, Scenario, ScenarioFuture, all_scenarios, run_all, run_one, run_scenario_test,
};
