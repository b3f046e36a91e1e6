//! The command's process: it dies with `dlock`, and it owns the terminal
//! while it runs.
//!
//! `dlock` does not fork the command directly: it starts itself again as a
//! small launcher (`dlock __exec PARENT-PID FG -- COMMAND...`), which, in the
//! new process and before `exec`:
//!
//! 1. asks the kernel for `SIGKILL` when its parent dies
//!    (`PR_SET_PDEATHSIG`, kept across `exec`), then checks that its parent
//!    is still the `dlock` that started it (the parent may have died before
//!    the request; then the launcher exits at once);
//! 2. with `FG` = `fg` (dlock runs alone in the foreground of a terminal),
//!    makes its own process group the terminal's foreground group, as
//!    shells do for a job, so that a command reading the terminal is not
//!    stopped by `SIGTTIN` while the lock stays held (dlock takes the
//!    terminal back when it ends); when dlock shares its group with others
//!    (`dlock run k make | less`), the command stays in dlock's group
//!    instead, as `timeout --foreground` does, and `less` keeps the terminal;
//! 3. `exec`s the command (same process: the pid `dlock` waits on), with
//!    SIGPIPE and the signal mask back to their defaults.
//!
//! So the command never outlives `dlock`, however `dlock` ends (`SIGKILL`
//! and the OOM killer included). Limits: the death signal reaches the
//! command's own process only (what it starts and detaches is its own
//! business, as with `timeout(1)`), and the kernel clears it when the
//! command is a set-user-ID or file-capability binary (`sudo`, `ping`).

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::process::ExitCode;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::unistd::{Pid, getpgrp, getppid, tcgetpgrp, tcsetpgrp};

/// The hidden first argument that makes `dlock` the launcher.
pub const EXEC: &str = "__exec";

/// Whether this process is in the foreground of the terminal on stdin.
pub fn in_foreground() -> bool {
    let stdin = std::io::stdin();
    tcgetpgrp(stdin.as_fd()).is_ok_and(|fg| fg == getpgrp())
}

/// Whether another process shares our process group (a pipeline such as
/// `dlock run k make | less`: `less` must keep the terminal), read from
/// `/proc`. When unsure, `true`.
pub fn group_is_shared() -> bool {
    let (me, group) = (std::process::id(), getpgrp().as_raw());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp ...`; comm may hold spaces and parens.
        let pgrp = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').nth(2))
            .and_then(|p| p.parse::<i32>().ok());
        if pgrp == Some(group) {
            return true;
        }
    }
    false
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

/// Gives the terminal on stdin to process group `pgrp` (our own after the
/// command exits). `SIGTTOU` is blocked meanwhile: a process outside the
/// foreground group may then still set it.
pub fn give_terminal(pgrp: Pid) {
    let ttou = SigSet::from(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    if sigprocmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old)).is_err() {
        return;
    }
    let _ = tcsetpgrp(std::io::stdin().as_fd(), pgrp);
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
}

/// The launcher's arguments, after the program name: `[EXEC, parent pid,
/// fg|bg, "--", program, args...]`.
pub fn launcher_args(parent: u32, foreground: bool, command: &[String]) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        EXEC.into(),
        parent.to_string().into(),
        if foreground { "fg" } else { "bg" }.into(),
        "--".into(),
    ];
    args.extend(command.iter().map(OsString::from));
    args
}

/// The launcher: see the module docs. Returns only when it cannot `exec`.
pub fn exec(args: &[OsString]) -> ExitCode {
    let fail = |msg: String| {
        eprintln!("dlock: {msg}");
        ExitCode::from(crate::exit::CANNOT_RUN)
    };
    let [parent, fg, dashes, command @ ..] = args else {
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
    if fg == "fg" {
        give_terminal(getpgrp());
    }
    // std's exec resets what a Rust program changes at start-up (SIGPIPE is
    // ignored by Rust's runtime; an ignored signal would stay ignored in the
    // command) and the signal mask, then searches PATH like execvp.
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(&command[0]).args(&command[1..]).exec();
    fail(format!("cannot run {:?}: {e}", command[0]))
}
