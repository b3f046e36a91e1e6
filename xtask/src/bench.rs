//! `cargo xtask bench [--quick]`: every benchmark scenario for every
//! backend in one run (crate `dlock-bench`, release build), against local
//! servers; writes `BENCHMARKS.md` and `benchmarks.svg`.
//!
//! A full run writes them at the repository's root (they are committed);
//! `--quick` writes them under `target/bench/`. `cargo xtask test` runs
//! `--quick` from a debug build (so CI proves the benchmarks still run,
//! without building every dependency again optimized).

use crate::servers::Servers;
use crate::system::{cargo, ensure_packages};

/// Where a run writes its report.
fn out_dir(quick: bool) -> &'static str {
    if quick { "target/bench" } else { "." }
}

/// Builds the benchmarks (release), so compile time never runs against
/// the servers.
pub async fn build() -> Result<(), String> {
    cargo(&["build", "--release", "-p", "dlock-bench"], &[]).await
}

/// Runs the built benchmarks against servers whose endpoints are in `env`.
pub async fn run_with(env: &[(&'static str, String)], quick: bool) -> Result<(), String> {
    let mut args = vec!["run", "--release", "-q", "-p", "dlock-bench", "--"];
    if quick {
        args.push("--quick");
    }
    args.extend(["--out", out_dir(quick)]);
    cargo(&args, env).await
}

/// Builds what [`smoke`] runs.
pub async fn build_smoke() -> Result<(), String> {
    cargo(&["build", "-p", "dlock-bench"], &[]).await
}

/// The smoke run `cargo xtask test` makes: `--quick` from the test build's
/// profile, whose dependencies the tests have already built (a release
/// build of them took 6 of CI's 27 minutes). Its figures say only that
/// every scenario still runs; the report says it came from a debug build.
pub async fn smoke(env: &[(&'static str, String)]) -> Result<(), String> {
    let args = [
        "run",
        "-q",
        "-p",
        "dlock-bench",
        "--",
        "--quick",
        "--out",
        out_dir(true),
    ];
    cargo(&args, env).await
}

/// `cargo xtask bench`.
pub async fn run(args: &[String]) -> Result<(), String> {
    let mut quick = false;
    for a in args {
        match a.as_str() {
            "--quick" => quick = true,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: cargo xtask bench [--quick]"
                ));
            }
        }
    }
    ensure_packages()?;
    build().await?;
    let servers = Servers::start().await?;
    let result = run_with(&servers.env(), quick).await;
    drop(servers);
    result
}
