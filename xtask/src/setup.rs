//! `cargo xtask test`: system packages, checks, servers, tests.

use crate::servers::Servers;
use crate::system::{cargo, ensure_packages};

/// `cargo xtask test [-- ARGS]`.
pub async fn test(rest: &[String]) -> Result<(), String> {
    ensure_packages()?;
    cargo(&["fmt", "--all", "--", "--check"], &[]).await?;
    crate::cycles::run(&[])?;
    cargo(
        &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"],
        &[],
    )
    .await?;
    // Every intra-doc link resolves and every doc builds (docs.rs adds
    // `--cfg docsrs` on nightly for the feature badges; stable refuses it).
    cargo(
        &["doc", "--workspace", "--all-features", "--no-deps"],
        &[("RUSTDOCFLAGS", "-D warnings".to_owned())],
    )
    .await?;
    // Build before starting servers, so compile time does not count against them.
    cargo(&["test", "--workspace", "--no-run"], &[]).await?;
    crate::bench::build_smoke().await?;
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
        result = crate::bench::smoke(&env).await;
    }
    drop(servers);
    result?;
    // The facade alone, without the drivers the workspace build unifies in:
    // its feature-off paths ("enable the cargo feature ...") run only here.
    cargo(&["test", "-p", "distlock", "--tests"], &[]).await?;
    package().await
}

/// Packages every published crate as `cargo publish` would (in dependency
/// order, each verified by building it from its package against the others'),
/// so a missing file or a manifest crates.io would refuse fails CI.
pub async fn package() -> Result<(), String> {
    forget_stale_packages()?;
    let mut args = vec!["package", "--workspace", "--allow-dirty"];
    for unpublished in UNPUBLISHED {
        args.extend(["--exclude", unpublished]);
    }
    // The verification builds each packaged crate as its own workspace,
    // without ours: without debug info, as our dev profile builds
    // dependencies (it took twice as long with it).
    cargo(&args, &[("CARGO_PROFILE_DEV_DEBUG", "false".to_owned())]).await
}

/// Removes what an earlier `cargo package` of this workspace unpacked
/// into cargo's registry sources. Cargo verifies each package against the
/// others through a local registry it unpacks under
/// `$CARGO_HOME/registry/src/-<hash>/` (the hash is of the package
/// directory's path, the same every run), and reuses an unpacked
/// `name-version` it finds there: with the version unchanged, a second run
/// on the same machine built against the first run's sources.
fn forget_stale_packages() -> Result<(), String> {
    let home = match std::env::var_os("CARGO_HOME") {
        Some(home) => std::path::PathBuf::from(home),
        None => match std::env::var_os("HOME") {
            Some(home) => std::path::PathBuf::from(home).join(".cargo"),
            None => return Ok(()),
        },
    };
    let Ok(registries) = std::fs::read_dir(home.join("registry").join("src")) else {
        return Ok(());
    };
    let ours = workspace_packages()?;
    for registry in registries.flatten() {
        // Local registries only; crates.io's is named after its index.
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        for name in &ours {
            let unpacked = registry.path().join(name);
            if unpacked.exists() {
                std::fs::remove_dir_all(&unpacked)
                    .map_err(|e| format!("cannot remove {}: {e}", unpacked.display()))?;
            }
        }
    }
    Ok(())
}

/// `name-version` of every workspace crate, from the manifests.
fn workspace_packages() -> Result<Vec<String>, String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |p: &std::path::Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let workspace = read(&root.join("Cargo.toml"))?;
    let version = workspace
        .lines()
        .find_map(|l| l.trim().strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .ok_or("no workspace version in Cargo.toml")?
        .to_owned();
    let mut names = Vec::new();
    let crates = std::fs::read_dir(root.join("crates")).map_err(|e| e.to_string())?;
    for dir in crates.flatten() {
        let manifest = read(&dir.path().join("Cargo.toml"))?;
        if let Some(name) = manifest
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = \""))
            .and_then(|n| n.strip_suffix('"'))
        {
            names.push(format!("{name}-{version}"));
        }
    }
    Ok(names)
}

/// The workspace's crates with `publish = false`.
pub const UNPUBLISHED: [&str; 2] = ["dlock-bench", "xtask"];

#[cfg(test)]
mod tests {
    /// Every published crate is found by name and the workspace version
    /// (so a stale unpacked copy of it can be removed).
    #[test]
    fn workspace_packages_are_named_with_the_version() {
        let names = super::workspace_packages().unwrap();
        for name in [
            "dlock-core-0.1.0",
            "distlock-0.1.0",
            "dlock-testkit-0.1.0",
            "dlock-cli-0.1.0",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
        }
    }

    /// `UNPUBLISHED` is exactly the workspace's crates that say
    /// `publish = false`, so `cargo package` checks every other one.
    #[test]
    fn unpublished_is_what_the_manifests_say() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut unpublished = Vec::new();
        let mut manifests = vec![root.join("xtask/Cargo.toml")];
        for entry in std::fs::read_dir(root.join("crates")).unwrap() {
            manifests.push(entry.unwrap().path().join("Cargo.toml"));
        }
        for manifest in manifests {
            let text = std::fs::read_to_string(&manifest).unwrap();
            if text.lines().any(|l| l.trim() == "publish = false") {
                let name = text
                    .lines()
                    .find_map(|l| l.strip_prefix("name = \""))
                    .and_then(|rest| rest.strip_suffix('"'))
                    .unwrap()
                    .to_owned();
                unpublished.push(name);
            }
        }
        unpublished.sort();
        assert_eq!(unpublished, super::UNPUBLISHED);
    }
}
