//! Building the reference programs: once per test binary, cached under the
//! cargo target directory across runs, offline.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::process::Command;
use tokio::sync::OnceCell;

use super::{ReferenceError, Result};

/// The reference programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Program {
    /// `reference/curator/Contender.java` on Apache Curator.
    Curator,
    /// `reference/go/contender.go` on etcd's Go client and recipes.
    GoEtcd,
}

const CURATOR_SOURCE: &str = include_str!("../../reference/curator/Contender.java");
const GO_SOURCE: &str = include_str!("../../reference/go/contender.go");

pub(super) const JAVA: &str = "/usr/bin/java";
const JAVAC: &str = "/usr/bin/javac";
const GO: &str = "/usr/bin/go";
/// Debian's Go sources (GOPATH layout), etcd's among them.
const GOCODE: &str = "/usr/share/gocode";
const ETCD_RECIPES: &str = "/usr/share/gocode/src/go.etcd.io/etcd/contrib/recipes";
const ETCD_VERSION_GO: &str = "/usr/share/gocode/src/go.etcd.io/etcd/version/version.go";
const CURATOR_RECIPES: &str = "/usr/share/java/curator-recipes.jar";
/// Curator's jars and what they need (the recipes jar's manifest names the
/// same ones).
const CURATOR_JARS: [&str; 7] = [
    CURATOR_RECIPES,
    "/usr/share/java/curator-framework.jar",
    "/usr/share/java/curator-client.jar",
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/zookeeper-jute.jar",
    "/usr/share/java/guava.jar",
    "/usr/share/java/slf4j-api.jar",
];
/// Silences slf4j's "no binding" warning when present (it comes with
/// `libslf4j-java`, which Curator's packages pull in).
const SLF4J_NOP: &str = "/usr/share/java/slf4j-nop.jar";

/// How long a first build may take (the Go program compiles etcd's client
/// and gRPC: about 15 s on an idle 2-core machine, more when it is busy).
const BUILD_LIMIT: Duration = Duration::from_secs(600);

impl Program {
    fn name(self) -> &'static str {
        match self {
            Program::Curator => "curator",
            Program::GoEtcd => "etcd-go",
        }
    }

    /// The Debian package behind each tool the program needs, and a file
    /// that package installs.
    fn needs(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Program::Curator => &[
                ("openjdk-17-jdk-headless", JAVAC),
                ("libcurator-recipes-java", CURATOR_RECIPES),
            ],
            Program::GoEtcd => &[("golang-go", GO), ("golang-etcd-server-dev", ETCD_RECIPES)],
        }
    }
}

/// The Debian packages `program` needs that look missing (by a file each
/// installs), with that file.
pub fn missing(program: Program) -> Vec<(&'static str, &'static str)> {
    program
        .needs()
        .iter()
        .copied()
        .filter(|(_, file)| !Path::new(file).exists())
        .collect()
}

/// FNV-1a: a cache key that is the same in every build of the kit.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.iter().chain(&[0xff]) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// What identifies a file for the cache key: its size and modification time.
fn stamp(path: &str) -> Vec<u8> {
    std::fs::metadata(path)
        .map(|m| format!("{path} {} {:?}", m.len(), m.modified().ok()))
        .unwrap_or_default()
        .into_bytes()
}

/// Where built programs are kept: `reference-clients/` in the cargo target
/// directory of the running test binary (`target/debug/deps/x` → `target`),
/// else the system's temporary directory.
fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("DLOCK_REFERENCE_DIR") {
        return PathBuf::from(dir);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let deps = exe.parent()?;
            (deps.file_name()? == "deps").then(|| deps.parent()?.parent().map(Path::to_path_buf))?
        })
        .unwrap_or_else(std::env::temp_dir)
        .join("reference-clients")
}

/// Once per program and test binary.
static CURATOR: OnceCell<std::result::Result<PathBuf, ReferenceError>> = OnceCell::const_new();
static GO_ETCD: OnceCell<std::result::Result<PathBuf, ReferenceError>> = OnceCell::const_new();

/// The directory of `program`, built (or found built) for this source and
/// toolchain.
pub(super) async fn built(program: Program) -> Result<PathBuf> {
    let cell = match program {
        Program::Curator => &CURATOR,
        Program::GoEtcd => &GO_ETCD,
    };
    cell.get_or_init(|| build(program)).await.clone()
}

async fn build(program: Program) -> Result<PathBuf> {
    let absent = missing(program);
    if !absent.is_empty() {
        let list: Vec<String> = absent
            .iter()
            .map(|(package, file)| format!("{package} (no {file})"))
            .collect();
        let packages: Vec<&str> = absent.iter().map(|(p, _)| *p).collect();
        return Err(ReferenceError(format!(
            "the {} reference client cannot be built: missing Debian package(s) {}; install them \
             (`apt-get install -y {}`) or run `cargo xtask test`, which does",
            program.name(),
            list.join(", "),
            packages.join(" ")
        )));
    }
    let key = match program {
        Program::Curator => fnv(&[CURATOR_SOURCE.as_bytes(), &stamp(JAVAC), &stamp(CURATOR_RECIPES)]),
        Program::GoEtcd => fnv(&[GO_SOURCE.as_bytes(), &stamp(GO), &stamp(ETCD_VERSION_GO)]),
    };
    let root = cache_root();
    let done = root.join(format!("{}-{key:016x}", program.name()));
    if done.join("built").exists() {
        return Ok(done);
    }
    let io = |what: &str, e: std::io::Error| {
        ReferenceError(format!(
            "building the {} reference client: {what}: {e}",
            program.name()
        ))
    };
    std::fs::create_dir_all(&root).map_err(|e| io(&root.display().to_string(), e))?;
    // Built aside, then renamed: another test binary building the same
    // program meanwhile finds either nothing or a whole build.
    let work = tempfile::Builder::new()
        .prefix(&format!("{}-", program.name()))
        .tempdir_in(&root)
        .map_err(|e| io("a work directory", e))?;
    let out = work.path().join("out");
    std::fs::create_dir_all(&out).map_err(|e| io("out", e))?;
    let mut cmd = match program {
        Program::Curator => {
            let src = work.path().join("Contender.java");
            std::fs::write(&src, CURATOR_SOURCE).map_err(|e| io("the source", e))?;
            let mut c = Command::new(JAVAC);
            c.args([
                "-nowarn",
                "-encoding",
                "UTF-8",
                "-implicit:none",
                "-sourcepath",
                "",
            ])
            .arg("-cp")
            .arg(CURATOR_JARS.join(":"))
            .arg("-d")
            .arg(&out)
            .arg(&src);
            c
        }
        Program::GoEtcd => {
            let pkg = work.path().join("gopath/src/dlockref/contender");
            std::fs::create_dir_all(&pkg).map_err(|e| io("the GOPATH", e))?;
            std::fs::write(pkg.join("main.go"), GO_SOURCE).map_err(|e| io("the source", e))?;
            let mut c = Command::new(GO);
            c.args(["build", "-o"])
                .arg(out.join("contender"))
                .arg("dlockref/contender")
                .env("GO111MODULE", "off")
                .env(
                    "GOPATH",
                    format!("{}:{GOCODE}", work.path().join("gopath").display()),
                )
                .env("GOCACHE", root.join("go-build-cache"))
                .env("GOPROXY", "off")
                .env("GOFLAGS", "")
                .env("GOENV", "off")
                .env("CGO_ENABLED", "0");
            c
        }
    };
    cmd.kill_on_drop(true);
    let output = match tokio::time::timeout(BUILD_LIMIT, cmd.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(io("running the compiler", e)),
        Err(_) => {
            return Err(ReferenceError(format!(
                "the {} reference client did not build within {BUILD_LIMIT:?}",
                program.name()
            )));
        }
    };
    if !output.status.success() {
        return Err(ReferenceError(format!(
            "the {} reference client did not build ({}): {}{}",
            program.name(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    std::fs::write(out.join("built"), "").map_err(|e| io("the marker", e))?;
    if std::fs::rename(&out, &done).is_err() && !done.join("built").exists() {
        return Err(ReferenceError(format!(
            "the {} reference client built, but could not be kept at {}",
            program.name(),
            done.display()
        )));
    }
    Ok(done)
}

/// The Curator program's class path.
pub(super) fn curator_classpath(dir: &Path) -> String {
    let mut path = vec![dir.display().to_string()];
    path.extend(CURATOR_JARS.iter().map(|j| (*j).to_owned()));
    if Path::new(SLF4J_NOP).exists() {
        path.push(SLF4J_NOP.to_owned());
    }
    path.join(":")
}

/// Writes `reference client (NAME): VERSION` once per name and process, to
/// the process's standard error itself (the test harness captures only
/// `print!` and `eprint!`), so the run's log shows what ran. The kit calls
/// it for the programs it starts; a test calls it for a reference client
/// it runs itself (e.g. `etcdctl`).
pub fn announce(name: &str, version: &str) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(PoisonError::into_inner);
    if said.get_or_insert_with(HashSet::new).insert(name.to_owned()) {
        let _ = writeln!(std::io::stderr(), "reference client ({name}): {version}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_follow_every_part() {
        assert_eq!(fnv(&[b"a", b"b"]), fnv(&[b"a", b"b"]));
        assert_ne!(fnv(&[b"a", b"b"]), fnv(&[b"ab"]));
        assert_ne!(fnv(&[b"a"]), fnv(&[b"b"]));
    }

    #[test]
    fn every_need_names_a_package_and_an_absolute_file() {
        for program in [Program::Curator, Program::GoEtcd] {
            for (package, file) in program.needs() {
                assert!(!package.is_empty() && file.starts_with('/'), "{program:?}");
            }
        }
    }
}
