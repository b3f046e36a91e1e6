//! A run that stops by itself: every step of the run names itself here,
//! and a plain thread (not a task: it must work when the runtime is stuck)
//! ends the process when one step takes longer than the run allows,
//! naming the step and printing every thread's stack (through `gdb`, when
//! it is there), so a hang in CI says where it was instead of eating the
//! CI's time.

use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The step under way and since when.
static STEP: Mutex<Option<(String, Instant)>> = Mutex::new(None);

/// The child process the step waits for (0: none).
static CHILD: AtomicU32 = AtomicU32::new(0);

/// The exit status of a run that overran a step.
pub(crate) const OVERRAN: i32 = 3;

/// Names the step now under way.
pub(crate) fn step(what: impl Into<String>) {
    *STEP.lock().unwrap_or_else(PoisonError::into_inner) = Some((what.into(), Instant::now()));
}

/// The step now waits for child process `pid` (`None`: no more): an
/// overrun prints its stacks and kills it too (an exit would leave it
/// running).
pub(crate) fn child(pid: Option<u32>) {
    CHILD.store(pid.unwrap_or(0), Ordering::SeqCst);
}

/// Says `line` on stderr; a closed stderr is no reason to stop.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Starts the thread that ends the process when a step takes longer than
/// `limit`. Call it once.
pub(crate) fn start(limit: Duration) {
    let spawned = std::thread::Builder::new()
        .name("dlock-bench watchdog".to_owned())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(1));
                let overran = STEP
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .filter(|(_, since)| since.elapsed() > limit)
                    .map(|(what, _)| what.clone());
                if let Some(what) = overran {
                    say(&format!(
                        "dlock-bench: {what} did not finish within {limit:?}; every thread's stack follows, then the run ends"
                    ));
                    print_stacks(std::process::id());
                    let child = CHILD.load(Ordering::SeqCst);
                    if child != 0 {
                        say(&format!("dlock-bench: the step's child process {child}:"));
                        print_stacks(child);
                        let _ = std::process::Command::new("kill")
                            .args(["-9", &child.to_string()])
                            .status();
                    }
                    say(&format!("dlock-bench: ended: {what} did not finish within {limit:?}"));
                    std::process::exit(OVERRAN);
                }
            }
        });
    if let Err(e) = spawned {
        say(&format!(
            "dlock-bench: no watchdog ({e}); a stuck step will not end the run"
        ));
    }
}

/// Every thread's stack of process `pid`, through `gdb` (bounded in time;
/// nothing when it is missing or may not attach).
fn print_stacks(pid: u32) {
    let pid = pid.to_string();
    let out = std::process::Command::new("timeout")
        .args([
            "60",
            "gdb",
            "-p",
            &pid,
            "-batch",
            "-nx",
            "-ex",
            "thread apply all bt 30",
        ])
        .stdin(std::process::Stdio::null())
        .output();
    match out {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            // Only the frames: gdb's own chatter (symbol loading) is noise.
            for line in text
                .lines()
                .filter(|l| l.starts_with('#') || l.starts_with("Thread "))
            {
                say(line);
            }
            if !out.status.success() {
                say(&format!(
                    "dlock-bench: gdb ended with {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
                ));
            }
        }
        Err(e) => say(&format!("dlock-bench: no stacks (cannot run gdb: {e})")),
    }
}
