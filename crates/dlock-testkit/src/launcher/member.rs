//! [`Member`]: one server process that can be killed, restarted, paused and
//! resumed, and is stopped when dropped.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::LaunchError;

/// How to tell a member is up: a probe run until it succeeds or times out.
pub(crate) type Probe = fn(SocketAddr) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

/// One server process. Dropping it kills the process (by pid) and reaps it.
pub struct Member {
    name: String,
    addr: SocketAddr,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    probe: Probe,
    ready_within: Duration,
    child: Option<Child>,
    paused: bool,
    envs: Vec<(String, String)>,
    /// Whether a restart whose process exits before it is ready is tried
    /// again (until the readiness deadline).
    retry_start: bool,
    /// Whether the server is a tree of processes (a postmaster and its
    /// backends) that faults must reach as a whole.
    tree: bool,
    /// The uid and gid the process runs as, and the directory it starts
    /// in (none: ours).
    user: Option<((u32, u32), PathBuf)>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .field("pid", &self.pid())
            .finish()
    }
}

impl Member {
    pub(crate) fn new(
        name: String,
        addr: SocketAddr,
        program: impl Into<PathBuf>,
        args: Vec<String>,
        log: PathBuf,
        probe: Probe,
        ready_within: Duration,
    ) -> Self {
        Member {
            name,
            addr,
            program: program.into(),
            args,
            log,
            probe,
            ready_within,
            child: None,
            paused: false,
            envs: Vec::new(),
            retry_start: false,
            tree: false,
            user: None,
        }
    }

    /// Makes a restart try again when the new process exits before it is
    /// ready (see [`restart`](Self::restart)).
    pub(crate) fn retrying_start(mut self) -> Self {
        self.retry_start = true;
        self
    }

    /// Makes pause, resume and kill reach every process the server started
    /// (PostgreSQL's backends each serve a connection on their own: a
    /// stopped postmaster alone leaves every open connection answered).
    pub(crate) fn faulted_as_a_tree(mut self) -> Self {
        self.tree = true;
        self
    }

    /// Runs the process as this uid and gid (a server that refuses root),
    /// started in `dir` (one that user may enter).
    pub(crate) fn run_as(mut self, ids: (u32, u32), dir: PathBuf) -> Self {
        self.user = Some((ids, dir));
        self
    }

    /// Sets an environment variable for the process (from its next start).
    pub(crate) fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// The member's name (`redis-0`, `etcd-2`, `zk-1`...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client address (always on 127.0.0.1).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `true` while the process runs (paused counts as running).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Starts the process without waiting for it to be ready.
    pub(crate) fn spawn(&mut self) -> Result<(), LaunchError> {
        if self.child.is_some() {
            return Ok(());
        }
        let log = File::options().create(true).append(true).open(&self.log)?;
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(((uid, gid), dir)) = &self.user {
            std::os::unix::process::CommandExt::uid(&mut command, *uid);
            std::os::unix::process::CommandExt::gid(&mut command, *gid);
            command.current_dir(dir);
        }
        let child = command.spawn().map_err(|e| {
            LaunchError(format!(
                "{}: cannot run {}: {e}",
                self.name,
                self.program.display()
            ))
        })?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    /// Waits until the member answers its readiness probe.
    ///
    /// # Errors
    ///
    /// If it does not within its deadline, or its process exits; the error
    /// carries the tail of its log.
    pub async fn wait_ready(&mut self) -> Result<(), LaunchError> {
        let deadline = Instant::now() + self.ready_within;
        loop {
            if (self.probe)(self.addr).await {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Err(self.failure(&format!("exited with {status} before it was ready")));
            }
            if Instant::now() >= deadline {
                return Err(self.failure(&format!("not ready within {:?}", self.ready_within)));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn failure(&self, what: &str) -> LaunchError {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        if tail.is_empty() {
            // A server that could not write a line (Redis with a cluster
            // config to save, on a full disk) exits with nothing to show.
            return LaunchError(format!(
                "{} on {}: {what}; its log {} is empty{}",
                self.name,
                self.addr,
                self.log.display(),
                free_space(&self.log)
            ));
        }
        LaunchError(format!(
            "{} on {}: {what}; log tail:\n{}",
            self.name,
            self.addr,
            tail.join("\n")
        ))
    }

    fn signal(&self, signal: Signal) -> Result<(), LaunchError> {
        let pid = self
            .pid()
            .ok_or_else(|| LaunchError(format!("{} is not running", self.name)))?;
        let pid = i32::try_from(pid).map_err(|_| LaunchError(format!("pid {pid} out of range")))?;
        kill(Pid::from_raw(pid), signal)
            .map_err(|e| LaunchError(format!("{}: kill -{signal}: {e}", self.name)))?;
        if self.tree {
            // The parent first: stopped or dead, it starts no new child
            // while the others are signalled. A child that ended meanwhile
            // is no error.
            for child in descendants(pid) {
                let _ = kill(Pid::from_raw(child), signal);
            }
        }
        Ok(())
    }

    /// Kills the process with `SIGKILL` (no clean shutdown) and reaps it.
    ///
    /// # Errors
    ///
    /// If it is not running or cannot be signalled.
    pub fn kill(&mut self) -> Result<(), LaunchError> {
        self.signal(Signal::SIGKILL)?;
        if let Some(mut child) = self.child.take() {
            child.wait()?;
        }
        self.paused = false;
        Ok(())
    }

    /// Starts the process again with the same ports, arguments and data
    /// directory, and waits until it is ready.
    ///
    /// # Errors
    ///
    /// As [`wait_ready`](Self::wait_ready).
    pub async fn restart(&mut self) -> Result<(), LaunchError> {
        if self.child.is_some() {
            self.kill()?;
        }
        let deadline = Instant::now() + self.ready_within;
        loop {
            self.spawn()?;
            match self.wait_ready().await {
                // A server whose killed processes let go of what it needs
                // a moment later (PostgreSQL's children and its shared
                // memory): the start that met them exited; try again.
                Err(_) if self.retry_start && self.child.is_none() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                done => return done,
            }
        }
    }

    /// Freezes the process with `SIGSTOP`: its sockets stay open, nothing
    /// answers (a GC pause, a stopped VM).
    ///
    /// # Errors
    ///
    /// If it is not running or cannot be signalled.
    pub fn pause(&mut self) -> Result<(), LaunchError> {
        self.signal(Signal::SIGSTOP)?;
        self.paused = true;
        Ok(())
    }

    /// Thaws a paused process with `SIGCONT`.
    ///
    /// # Errors
    ///
    /// If it is not running or cannot be signalled.
    pub fn resume(&mut self) -> Result<(), LaunchError> {
        self.signal(Signal::SIGCONT)?;
        self.paused = false;
        Ok(())
    }

    /// The log file of the process (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

/// ", with N MiB free on its file system" (a full disk is the usual reason
/// a server dies without a word), or nothing when that cannot be read.
fn free_space(file: &Path) -> String {
    let dir = file.parent().unwrap_or(file);
    match nix::sys::statvfs::statvfs(dir) {
        Ok(fs) => {
            let free = u128::from(fs.blocks_available()) * u128::from(fs.fragment_size());
            format!(", with {} MiB free on its file system", free / (1024 * 1024))
        }
        Err(_) => String::new(),
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL also ends a stopped process.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts every member, then waits for all of them (members of a cluster
/// need each other to become ready).
pub(crate) async fn start_all(members: &mut [Member]) -> Result<(), LaunchError> {
    for m in members.iter_mut() {
        m.spawn()?;
    }
    for m in members.iter_mut() {
        m.wait_ready().await?;
    }
    Ok(())
}

/// Every process descended from `root`, read from `/proc` (children before
/// grandchildren).
fn descendants(root: i32) -> Vec<i32> {
    let mut parents = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(ppid) = std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|stat| parent_of(&stat))
            {
                parents.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|&&(_, pp)| pp == parent).map(|&(p, _)| p));
        i += 1;
    }
    found.remove(0);
    found
}

/// The parent pid in a `/proc/PID/stat` line: the second field after the
/// command name, which is in parentheses and may itself hold any character.
fn parent_of(stat: &str) -> Option<i32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that dies without writing a line (what Redis does on a full
    /// disk) is reported with its empty log and the space left, not with a
    /// blank "log tail".
    #[tokio::test]
    async fn a_silent_exit_names_the_empty_log_and_the_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let mut member = Member::new(
            "silent-0".to_owned(),
            loopback_unused(),
            "false",
            Vec::new(),
            dir.path().join("silent.log"),
            |_| Box::pin(async { false }),
            Duration::from_secs(20),
        );
        member.spawn().unwrap();
        let err = member.wait_ready().await.unwrap_err().to_string();
        assert!(
            err.contains("exited with exit status: 1 before it was ready"),
            "{err}"
        );
        assert!(err.contains("silent.log is empty, with "), "{err}");
        assert!(err.ends_with(" MiB free on its file system"), "{err}");
    }

    fn loopback_unused() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9))
    }
}
