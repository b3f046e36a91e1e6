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
//! 2. with `FG` = `fg` (dlock runs in the foreground of a terminal), makes
//!    its own process group the terminal's foreground group, as shells and
//!    `timeout --foreground` do, so that a command reading the terminal is
//!    not stopped by `SIGTTIN` while the lock stays held;
//! 3. `exec`s the command (same process: the pid `dlock` waits on).
//!
//! So the command never outlives `dlock`, however `dlock` ends (`SIGKILL`
//! and the OOM killer included). The death signal reaches the command's own
//! process only: what the command starts in the background and detaches
//! from it is its own business, as with `timeout(1)`.

use std::ffi::{CString, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
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
    let Ok(argv) = command
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
    else {
        return fail("the command has a NUL byte".to_owned());
    };
    let e = nix::unistd::execvp(&argv[0], &argv).unwrap_err();
    fail(format!("cannot run {:?}: {e}", command[0]))
}
