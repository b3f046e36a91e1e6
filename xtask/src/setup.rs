//! `cargo xtask test`: system packages, checks, servers, tests.

use std::process::Stdio;

use dlock_testkit::launcher::missing_packages;
use tokio::process::Command;

use crate::servers::Servers;

/// Installs the missing Debian packages when root; otherwise explains how.
pub fn ensure_packages() -> Result<(), String> {
    let missing = missing_packages();
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(" ");
    if !nix::unistd::Uid::effective().is_root() {
        return Err(format!(
            "missing system packages: {list}\ninstall them with:\n  sudo apt-get update && sudo apt-get install -y {list}"
        ));
    }
    eprintln!("xtask: installing {list}");
    let run = |args: &[&str]| -> Result<(), String> {
        let status = std::process::Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("apt-get {} failed: {status}", args.join(" ")))
        }
    };
    run(&["update", "-q"])?;
    let mut install = vec!["install", "-y", "-q"];
    install.extend(missing.iter().copied());
    run(&install)?;
    let still = missing_packages();
    if !still.is_empty() {
        return Err(format!(
            "still missing after apt-get install: {}",
            still.join(" ")
        ));
    }
    Ok(())
}

/// Runs cargo with `args` (and extra environment), stopping it on Ctrl-C.
pub async fn cargo(args: &[&str], env: &[(&'static str, String)]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    eprintln!("xtask: cargo {}", args.join(" "));
    let mut child = Command::new(cargo)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    tokio::select! {
        status = child.wait() => {
            let status = status.map_err(|e| e.to_string())?;
            if status.success() { Ok(()) } else { Err(format!("cargo {} failed: {status}", args.join(" "))) }
        }
        _ = tokio::signal::ctrl_c() => {
            let _ = child.kill().await;
            Err("interrupted".to_owned())
        }
    }
}

/// `cargo xtask test [-- ARGS]`.
pub async fn test(rest: &[String]) -> Result<(), String> {
    ensure_packages()?;
    cargo(&["fmt", "--all", "--", "--check"], &[]).await?;
    cargo(
        &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"],
        &[],
    )
    .await?;
    // Build before starting servers, so compile time does not count against them.
    cargo(&["test", "--workspace", "--no-run"], &[]).await?;
    crate::bench::build().await?;
    let servers = Servers::start().await?;
    let env = servers.env();
    for (k, v) in &env {
        eprintln!("xtask: {k}={v}");
    }
    let mut args = vec!["test", "--workspace"];
    let extra: Vec<&str> = rest
        .iter()
        .skip_while(|a| *a == "--")
        .map(String::as_str)
        .collect();
    if !extra.is_empty() {
        args.push("--");
        args.extend(extra);
    }
    let mut result = cargo(&args, &env).await;
    if result.is_ok() {
        // The benchmarks must still run (their numbers are not judged here).
        result = crate::bench::run_with(&env, true).await;
    }
    drop(servers);
    result?;
    // The facade alone, without the drivers the workspace build unifies in:
    // its feature-off paths ("enable the cargo feature ...") run only here.
    cargo(&["test", "-p", "dlock", "--tests"], &[]).await
}
