//! The command's process: it dies with `dlock`, and under a terminal it
//! runs in dlock's foreground job.
//!
//! `dlock` does not fork the command directly: it starts itself again as a
//! small launcher (`dlock __exec PARENT-PID -- COMMAND...`), which, in the
//! new process and before `exec`:
//!
//! 1. asks the kernel for `SIGKILL` when its parent dies
//!    (`PR_SET_PDEATHSIG`, kept across `exec`), then checks that its parent
//!    is still the `dlock` that started it (the parent may have died before
//!    the request; then the launcher exits at once);
//! 2. `exec`s the command (same process: the pid `dlock` waits on), with
//!    SIGPIPE and the signal mask back to their defaults.
//!
//! Where the command runs: without a terminal (cron, systemd), in a process
//! group of its own, so a signal reaches it and everything it started.
//! In the foreground of a terminal, in dlock's own group, as
//! `timeout --foreground` does: it can read the terminal (a background
//! group would be stopped by `SIGTTIN` while the lock stays held), Ctrl-Z
//! stops dlock with it (renewals stop with the command: the shell gets its
//! job back, and if the lock expired meanwhile, dlock stops the command when
//! both resume), and a pipeline around dlock (`dlock run k make | less`)
//! keeps the terminal for `less`. Signals dlock passes on then go to the
//! command and every process below it, found through `/proc`.
//!
//! So the command never outlives `dlock`, however `dlock` ends (`SIGKILL`
//! and the OOM killer included). Limits: the death signal reaches the
//! command's own process only (what it starts and detaches is its own
//! business, as with `timeout(1)`), and the kernel clears it when the
//! command is a set-user-ID or file-capability binary (`sudo`, `ping`).

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::process::ExitCode;

use nix::sys::signal::Signal;
use nix::unistd::{Pid, getpgrp, getppid, tcgetpgrp};

/// The hidden first argument that makes `dlock` the launcher.
pub const EXEC: &str = "__exec";

/// Whether this process is in the foreground of the terminal on stdin.
pub fn in_foreground() -> bool {
    let stdin = std::io::stdin();
    tcgetpgrp(stdin.as_fd()).is_ok_and(|fg| fg == getpgrp())
}

/// `root` and every process below it (children, grandchildren...), read
/// from `/proc`: where the command runs in dlock's group, this is how a
/// signal reaches what it started.
pub fn with_descendants(root: i32) -> Vec<i32> {
    let mut parents = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`; comm may hold spaces and parens.
            let ppid = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if let Some(ppid) = ppid {
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
    found
}

/// Whether `signal` was ignored when dlock started (`nohup` ignores
/// SIGHUP): such a signal is not passed on either. Read from
/// `/proc/self/status`; when unsure, `false`.
pub fn ignored_at_start(signal: Signal) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal as i32 - 1)) != 0)
}

/// The launcher's arguments, after the program name: `[EXEC, parent pid,
/// "--", program, args...]`.
pub fn launcher_args(parent: u32, command: &[String]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![EXEC.into(), parent.to_string().into(), "--".into()];
    args.extend(command.iter().map(OsString::from));
    args
}

/// The launcher: see the module docs. Returns only when it cannot `exec`.
pub fn exec(args: &[OsString]) -> ExitCode {
    let fail = |msg: String| {
        eprintln!("dlock: {msg}");
        ExitCode::from(crate::exit::CANNOT_RUN)
    };
    let [parent, dashes, command @ ..] = args else {
        return fail("bad launcher arguments".to_owned());
    };
    let Some(parent) = parent.to_str().and_then(|p| p.parse::<i32>().ok()) else {
        return fail("bad launcher parent".to_owned());
    };
    if dashes != "--" || command.is_empty() {
        return fail("bad launcher arguments".to_owned());
    }
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        return fail(format!("cannot tie the command to dlock: {e}"));
    }
    // Our parent died before the request above: nothing would hold the lock.
    if getppid() != Pid::from_raw(parent) {
        return ExitCode::from(crate::exit::LOST);
    }
    // std's exec resets what a Rust program changes at start-up (SIGPIPE is
    // ignored by Rust's runtime; an ignored signal would stay ignored in the
    // command) and the signal mask, then searches PATH like execvp.
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(&command[0]).args(&command[1..]).exec();
    fail(format!("cannot run {:?}: {e}", command[0]))
}
