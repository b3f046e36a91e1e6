//! `cargo xtask`: the project's commands.
//!
//! - `cargo xtask test [-- ARGS]`: install missing system packages (as root,
//!   with apt-get; otherwise print the command), check formatting, lints
//!   and module cycles,
//!   start the shared test servers, run every test of the workspace, stop the
//!   servers. This is what CI runs.
//! - `cargo xtask demo`: workers contend for a few keys on every backend this
//!   build can reach, guard a shared record with a `FenceGate`, and print a
//!   report.
//! - `cargo xtask servers`: start the local servers, print their endpoints,
//!   stop them on Ctrl-C.
//! - `cargo xtask cycles`: no module imports a module that imports it
//!   back, in any crate (part of `test`).
//! - `cargo xtask safety [--backend B] [--seconds S]`: the drivers' safety
//!   runs, longer; writes `RELIABILITY.md` from their report lines.
//! - `cargo xtask bench [--quick]`: every benchmark scenario for every
//!   backend in one run; writes `BENCHMARKS.md` and `benchmarks.svg`.

mod bench;
mod cycles;
mod demo;
mod safety;
mod servers;
mod setup;
mod system;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test [-- CARGO_TEST_ARGS]  install missing packages, check fmt and clippy,
                             start servers, run every test, stop servers
  demo                       workers contending for locks, with a report
  servers                    start local servers and print their endpoints
  bench [--quick]            every benchmark, every backend, one run; writes
                             BENCHMARKS.md and benchmarks.svg (--quick: smaller,
                             under target/bench/)
  cycles [DIR]               check that no module imports a module that
                             imports it back, in any crate
  safety [--backend B] [--seconds S]
                             the drivers' safety runs, S seconds each (default 600);
                             B: redis, redlock, etcd, zk, processes (clients as
                             separate OS processes); writes RELIABILITY.md";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(command) = args.first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("xtask: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match command.as_str() {
        "test" => runtime.block_on(setup::test(rest)),
        "demo" => runtime.block_on(demo::run()),
        "servers" => runtime.block_on(servers::run()),
        "safety" => runtime.block_on(safety::run(rest)),
        "bench" => runtime.block_on(bench::run(rest)),
        "cycles" => cycles::run(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {command}: {e}");
            ExitCode::FAILURE
        }
    }
}
