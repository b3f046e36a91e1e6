//! What every command needs of the machine: its packages, and cargo.

use std::process::Stdio;

use dlock_testkit::launcher::missing_packages;
use tokio::process::Command;

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
    let started = std::time::Instant::now();
    let mut child = Command::new(cargo)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    tokio::select! {
        status = child.wait() => {
            let status = status.map_err(|e| e.to_string())?;
            eprintln!("xtask: cargo {} took {:.0?}", args.first().unwrap_or(&""), started.elapsed());
            if status.success() { Ok(()) } else { Err(format!("cargo {} failed: {status}", args.join(" "))) }
        }
        _ = tokio::signal::ctrl_c() => {
            let _ = child.kill().await;
            Err("interrupted".to_owned())
        }
    }
}
