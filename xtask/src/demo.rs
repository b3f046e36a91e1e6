//! `cargo xtask demo`: the contention demo (`crates/distlock/examples/contention.rs`)
//! on every backend whose server this machine can start, in one table.

use dlock_testkit::launcher::missing_packages;

use crate::servers::Servers;
use crate::setup::cargo;

/// `cargo xtask demo`.
pub async fn run() -> Result<(), String> {
    let missing = missing_packages();
    if !missing.is_empty() {
        eprintln!(
            "xtask demo: {} not installed; running on the in-process backend only (`cargo xtask test` installs them)",
            missing.join(", ")
        );
        return cargo(
            &[
                "run",
                "--quiet",
                "-p",
                "distlock",
                "--example",
                "contention",
                "--",
                "mem://",
            ],
            &[],
        )
        .await;
    }
    let servers = Servers::start().await?;
    let mut args = vec![
        "run".to_owned(),
        "--quiet".to_owned(),
        "-p".to_owned(),
        "distlock".to_owned(),
        "--features".to_owned(),
        "full".to_owned(),
        "--example".to_owned(),
        "contention".to_owned(),
        "--".to_owned(),
    ];
    args.extend(servers.urls());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = cargo(&args, &[]).await;
    drop(servers);
    result
}
