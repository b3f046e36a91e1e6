//! `cargo xtask demo`: the contention demo (`crates/distlock/examples/contention.rs`)
//! on every backend whose server this machine can start, in one table.

use dlock_testkit::launcher::missing_packages;

use crate::servers::Servers;
use crate::system::cargo;

/// `cargo xtask demo`.
///
/// A newcomer's first look should show the distributed backends: when the
/// servers' packages are missing, the demo installs them as `cargo xtask
/// test` does (root, with apt-get), and runs every backend; where it cannot
/// (not root), it runs the in-process backend and says the one command that
/// would install the rest.
pub async fn run() -> Result<(), String> {
    if !missing_packages().is_empty()
        && let Err(how) = crate::system::ensure_packages()
    {
        eprintln!(
            "xtask demo: the servers are not installed, so this runs on the in-process backend only.\n\
             xtask demo: {how}\n\
             xtask demo: then `cargo xtask demo` runs every backend."
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
