//! `dlock`: run a command under a distributed lock.
//!
//! ```text
//! dlock run job:4471 --url etcd://10.0.0.1:2379 --ttl 30s --wait 10s -- ./nightly-cleanup.sh
//! dlock holder job:4471 --url etcd://10.0.0.1:2379
//! ```
//!
//! See `dlock --help` for the exit codes.

mod child;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use distlock::{AcquireOptions, Claim, Config, Error, Guard, Lock, LockKey, Wait};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Command as Child;
use tokio::signal::unix::{SignalKind, signal};

/// Exit codes, in the spirit of flock(1) and `consul lock`.
mod exit {
    /// Bad arguments or configuration (clap's own usage errors also use 2).
    pub const USAGE: u8 = 2;
    /// The backend could not be reached (sysexits EX_UNAVAILABLE).
    pub const UNAVAILABLE: u8 = 69;
    /// The lock was not acquired within the wait, or held with --no-wait
    /// (sysexits EX_TEMPFAIL: try again later).
    pub const NOT_ACQUIRED: u8 = 75;
    /// The lock was lost while the command ran; the command was terminated.
    pub const LOST: u8 = 76;
    /// The command could not be started.
    pub const CANNOT_RUN: u8 = 127;
}

const EXIT_CODES: &str = "\
Exit codes of `dlock run`:
  the command's own code   the command ran under the lock and exited (128+N if killed by signal N)
  2                        bad arguments or configuration
  69                       the lock backend could not be reached
  75                       not acquired: held by someone else past --wait (or at once with --no-wait),
                           or our place in line vanished while waiting
  76                       the lock was lost while the command ran; it got SIGTERM (SIGKILL after --grace)
  127                      the command could not be started

The backend comes from --url, --url-file FILE, --config FILE, or DLOCK_URL /
DLOCK_CONFIG in the environment. A command line is visible to other users
(ps): pass a URL with a password with --url-file or DLOCK_URL, not --url.
URL schemes: mem://, redis://, rediss://, redlock://h1,h2,h3, etcd://,
etcds://, zk://.
The command sees DLOCK_KEY, DLOCK_BACKEND and, where the backend fences,
DLOCK_FENCING_TOKEN in its environment (DLOCK_URL and DLOCK_CONFIG are
removed from it). SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to the
command; if dlock dies, even by SIGKILL, the command is killed with it.";

#[derive(Parser, Debug)]
#[command(name = "dlock", version, about = "Run a command under a distributed lock", after_help = EXIT_CODES)]
struct Cli {
    /// The lock backend as a URL, e.g. etcd://127.0.0.1:2379. Other users
    /// can read a command line (ps): give a URL with a password with
    /// --url-file or DLOCK_URL instead.
    #[arg(long, global = true)]
    url: Option<String>,
    /// A file holding the backend's URL (its first line), e.g. one only its
    /// owner can read: how to pass a password.
    #[arg(long, global = true, conflicts_with_all = ["url", "config"])]
    url_file: Option<PathBuf>,
    /// A TOML or JSON file naming the backend (`backend = "etcd"` ...)
    #[arg(long, global = true, conflicts_with = "url")]
    config: Option<PathBuf>,
    /// Tell on stderr what the lock does: -v grants, releases, losses and
    /// trouble; -vv also the waiting. RUST_LOG (e.g. `dlock=debug`)
    /// chooses instead, when set.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Acquire KEY, run the command while holding it, release when it exits.
    #[command(after_help = EXIT_CODES)]
    Run {
        /// The lock's name.
        key: String,
        /// The lock's TTL (renewed while the command runs).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        ttl: Duration,
        /// How long to wait for the lock (default: forever).
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
        wait: Option<Duration>,
        /// Do not wait: fail at once if the lock is held.
        #[arg(long)]
        no_wait: bool,
        /// After SIGTERM on a lost lock, how long before SIGKILL.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        grace: Duration,
        /// Take KEY as a read-write lock, shared (a reader): runs beside
        /// other readers, never beside a writer (`dlock run` without it on a
        /// read-write lock's name is a mutex of that name, not its writer).
        #[arg(long, conflicts_with_all = ["permits", "exclusive"])]
        shared: bool,
        /// Take KEY as a read-write lock, exclusive (the writer).
        #[arg(long, conflicts_with = "permits")]
        exclusive: bool,
        /// Take one of N permits of the semaphore KEY: at most N commands
        /// hold it at once (every user of KEY must give the same N).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        permits: Option<u32>,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true, num_args = 1..)]
        command: Vec<String>,
    },
    /// Show who holds KEY, since when, its token and time left: the
    /// mutex's holder, or every reader, writer and permit holder of KEY's
    /// read-write lock and semaphore.
    Holder {
        /// The lock's name.
        key: String,
    },
}

fn fail(code: u8, msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("dlock: {msg}");
    ExitCode::from(code)
}

fn code_for(e: &Error) -> u8 {
    match e {
        Error::Unavailable { .. } => exit::UNAVAILABLE,
        Error::Timeout { .. } => exit::NOT_ACQUIRED,
        Error::Lost { .. } => exit::LOST,
        _ => exit::USAGE,
    }
}

fn resolve(cli: &Cli) -> Result<Config, Error> {
    if let Some(url) = &cli.url {
        return Config::from_url(url).map_err(|e| match e {
            // Said once: "invalid configuration: --url: ...".
            Error::InvalidConfig(why) => Error::InvalidConfig(format!("--url: {why}")),
            other => other,
        });
    }
    if let Some(file) = &cli.url_file {
        let text = std::fs::read_to_string(file)
            .map_err(|e| Error::InvalidConfig(format!("--url-file {}: {e}", file.display())))?;
        let url = text.lines().next().unwrap_or_default().trim();
        return Config::from_url(url).map_err(|e| match e {
            // Said once: "invalid configuration: --url-file F: ...".
            Error::InvalidConfig(why) => {
                Error::InvalidConfig(format!("--url-file {}: {why}", file.display()))
            }
            other => other,
        });
    }
    if let Some(file) = &cli.config {
        return Config::from_file(file);
    }
    distlock::Settings::from_env().map(|s| s.config)
}

/// Server data as text safe for a terminal: control characters (escape
/// sequences) are shown escaped, never sent raw.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn holders_of(n: usize) -> String {
    if n == 1 {
        "1 holder".to_owned()
    } else {
        format!("{n} holders")
    }
}

fn describe(h: &distlock::Holder) -> String {
    let mut s = format!("{} ({})", printable(&h.id), printable(&h.detail));
    if let Some(t) = h.token {
        s.push_str(&format!(", token {t}"));
    }
    // humantime formats years 0000-9999 only; foreign data can say anything.
    let until_year_9999 = std::time::UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    if let Some(since) = h.since.filter(|&t| t <= until_year_9999) {
        s.push_str(&format!(", since {}", humantime::format_rfc3339_seconds(since)));
    }
    if let Some(left) = h.remaining {
        s.push_str(&format!(
            ", {} left",
            humantime::format_duration(Duration::from_millis(
                u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
            ))
        ));
    }
    s
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == child::EXEC) {
        return child::exec(&args[2..]);
    }
    let cli = Cli::parse();
    report_to_stderr(cli.verbose, std::env::var("RUST_LOG").ok());
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(exit::USAGE, format!("cannot start: {e}")),
    };
    runtime.block_on(async {
        let config = match resolve(&cli) {
            Ok(c) => c,
            Err(e) => return fail(code_for(&e), e),
        };
        match &cli.command {
            Command::Holder { key } => holder(&config, key).await,
            Command::Run {
                key,
                ttl,
                wait,
                no_wait,
                grace,
                shared,
                exclusive,
                permits,
                command,
            } => {
                let wait = match (wait, no_wait) {
                    (_, true) => Wait::No,
                    (Some(d), false) => Wait::For(*d),
                    (None, false) => Wait::Forever,
                };
                let how = match (shared, exclusive, permits) {
                    (true, _, _) => Claim::Read,
                    (_, true, _) => Claim::Write,
                    (_, _, Some(n)) => Claim::Permits { count: 1, limit: *n },
                    _ => Claim::Mutex,
                };
                run(&config, key, how, *ttl, wait, *grace, command).await
            }
        }
    })
}

/// Prints dlock's `tracing` events ([`distlock::trace`]) to stderr: as
/// `RUST_LOG` says when it is set (and valid: an invalid one is said so and
/// ignored), otherwise at INFO for `-v` and DEBUG for `-vv`; nothing
/// without either.
fn report_to_stderr(verbose: u8, rust_log: Option<String>) {
    use tracing_subscriber::EnvFilter;
    let by_flag = match verbose {
        0 => None,
        1 => Some("dlock=info"),
        _ => Some("dlock=debug"),
    };
    let filter = match rust_log.filter(|s| !s.trim().is_empty()) {
        Some(spec) => match EnvFilter::try_new(&spec) {
            Ok(filter) => filter,
            Err(e) => {
                eprintln!("dlock: RUST_LOG ignored ({e})");
                match by_flag {
                    Some(f) => EnvFilter::new(f),
                    None => return,
                }
            }
        },
        None => match by_flag {
            Some(f) => EnvFilter::new(f),
            None => return,
        },
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // Fails only if a subscriber is installed already: then that one reports.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .try_init();
}

async fn holder(config: &Config, key: &str) -> ExitCode {
    let key = match LockKey::new(key) {
        Ok(k) => k,
        Err(e) => return fail(exit::USAGE, e),
    };
    let lock = match distlock::connect(config).await {
        Ok(l) => l,
        Err(e) => return fail(code_for(&e), e),
    };
    let listed = match lock.holders(&key).await {
        // The backend cannot list holders (Redlock): said as before.
        Err(Error::Unsupported { .. }) => Ok(Vec::new()),
        other => other,
    };
    match listed {
        Ok(all) if all.is_empty() => {
            println!(
                "{key} is not held (or the {} backend cannot tell)",
                config.backend()
            );
            ExitCode::SUCCESS
        }
        // One line for a mutex's holder, as always; a line per holder of
        // a read-write lock or semaphore.
        Ok(all) => {
            if let [h] = &all[..]
                && h.role == distlock::Role::Mutex
            {
                println!("{key} is held by {}", describe(h));
            } else {
                println!("{key} is held by {}:", holders_of(all.len()));
                for h in &all {
                    println!("  {}: {}", h.role, describe(h));
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(code_for(&e), e),
    }
}

/// `--ttl`: more than zero, at most [`distlock::MAX_TTL`] (longer is almost
/// certainly a unit mistake, and would keep a crashed holder's lock that
/// long).
fn check_ttl(ttl: Duration) -> Result<Duration, String> {
    if ttl.is_zero() {
        return Err("--ttl: a TTL must be greater than zero".to_owned());
    }
    if ttl > distlock::MAX_TTL {
        return Err(format!(
            "--ttl: a TTL of {} is more than the {}h allowed",
            humantime::format_duration(ttl),
            distlock::MAX_TTL.as_secs() / 3600
        ));
    }
    Ok(ttl)
}

async fn run(
    config: &Config,
    key: &str,
    how: Claim,
    ttl: Duration,
    wait: Wait,
    grace: Duration,
    command: &[String],
) -> ExitCode {
    let key = match LockKey::new(key) {
        Ok(k) => k,
        Err(e) => return fail(exit::USAGE, e),
    };
    let ttl = match check_ttl(ttl) {
        Ok(t) => t,
        Err(e) => return fail(exit::USAGE, e),
    };
    let lock = match distlock::connect(config).await {
        Ok(l) => l,
        Err(e) => return fail(code_for(&e), e),
    };
    let opts = AcquireOptions::default().ttl(ttl).wait(wait);
    let taken = lock.acquire_claim(&key, how, opts).await;
    let guard = match taken {
        Ok(g) => g,
        Err(Error::Timeout { .. }) => {
            // Named through the handle that tried: no second connection.
            let who = match lock.holders(&key).await {
                Ok(all) => {
                    let theirs: Vec<String> = all
                        .iter()
                        // Only the holders that keep this one out.
                        .filter(|h| how.is_kept_out_by(h.role))
                        .map(|h| match how {
                            Claim::Mutex => describe(h),
                            _ => format!("{} ({})", describe(h), h.role),
                        })
                        .collect();
                    match &theirs[..] {
                        [] => String::new(),
                        [one] => format!(": held by {one}"),
                        many => format!(": held by {}: {}", holders_of(many.len()), many.join("; ")),
                    }
                }
                Err(_) => String::new(),
            };
            return fail(exit::NOT_ACQUIRED, format!("{key} not acquired{who}"));
        }
        // Our place in line vanished while we waited: not acquired, and
        // nothing ran (76 means "lost while the command ran").
        Err(e @ Error::Lost { .. }) => return fail(exit::NOT_ACQUIRED, format!("{key} not acquired: {e}")),
        Err(e) => return fail(code_for(&e), e),
    };
    let Some(program) = command.first() else {
        return fail(exit::USAGE, "no command given");
    };
    // Listening before the command starts: a signal in between is not lost.
    // A signal ignored when dlock started (`nohup`) stays ignored.
    let listen = |kind: SignalKind, sig: Signal| {
        if child::ignored_at_start(sig) {
            Ok(None)
        } else {
            signal(kind).map(Some)
        }
    };
    let (Ok(mut sigint), Ok(mut sigterm), Ok(mut sighup), Ok(mut sigquit)) = (
        listen(SignalKind::interrupt(), Signal::SIGINT),
        listen(SignalKind::terminate(), Signal::SIGTERM),
        listen(SignalKind::hangup(), Signal::SIGHUP),
        listen(SignalKind::quit(), Signal::SIGQUIT),
    ) else {
        let _ = guard.release().await;
        return fail(exit::USAGE, "cannot listen for signals");
    };
    // In the foreground of a terminal, the command shares dlock's process
    // group (see `child`); otherwise it gets one of its own.
    let shared_group = child::in_foreground();
    // The command is started through dlock's own launcher (see `child`): it
    // dies with dlock. Spawned from this thread (the runtime's `block_on`
    // thread, which lives as long as dlock): the kernel's parent-death
    // signal follows the thread that forks.
    let mut child = Child::new("/proc/self/exe");
    child
        .arg0("dlock")
        .args(child::launcher_args(std::process::id(), command))
        .env("DLOCK_KEY", key.as_str())
        .env("DLOCK_BACKEND", config.backend())
        // The backend's URL and config may carry passwords: not the command's business.
        .env_remove("DLOCK_URL")
        .env_remove("DLOCK_CONFIG");
    if !shared_group {
        // Its own process group: signals reach the command and everything it
        // started (a shell's children too), as with timeout(1).
        child.process_group(0);
    }
    if let Some(token) = guard.token() {
        child.env("DLOCK_FENCING_TOKEN", token.to_string());
    }
    let mut child = match child.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = guard.release().await;
            return fail(exit::CANNOT_RUN, format!("cannot run {program:?}: {e}"));
        }
    };
    let child_pid = child.id().and_then(|p| i32::try_from(p).ok());
    let send = |sig: Signal| {
        let Some(pid) = child_pid else {
            return;
        };
        if shared_group {
            // The command and everything below it (not dlock's own group:
            // that is dlock, and whatever shares its pipeline).
            for p in child::with_descendants(pid) {
                let _ = kill(Pid::from_raw(p), sig);
            }
        } else {
            // A negative pid names the command's process group.
            let _ = kill(Pid::from_raw(-pid), sig);
        }
    };
    // In a shared group, the terminal's own SIGINT and SIGQUIT reach the
    // command already: passing them on would deliver them twice.
    let forward_terminal_signals = !shared_group;
    async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
        match s {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending().await,
        }
    }
    let lost = guard.lost();
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            () = next(&mut sigint) => if forward_terminal_signals { send(Signal::SIGINT) },
            () = next(&mut sigterm) => send(Signal::SIGTERM),
            () = next(&mut sighup) => send(Signal::SIGHUP),
            () = next(&mut sigquit) => if forward_terminal_signals { send(Signal::SIGQUIT) },
            () = lost.wait() => {
                // The signal first: printing may block (a stopped terminal).
                send(Signal::SIGTERM);
                eprintln!("dlock: lost the lock on {key}; stopping the command");
                if tokio::time::timeout(grace, child.wait()).await.is_err() {
                    send(Signal::SIGKILL);
                    let _ = child.wait().await;
                }
                drop(guard);
                return ExitCode::from(exit::LOST);
            }
        }
    };
    if let Err(e) = guard.release().await {
        eprintln!("dlock: releasing {key}: {e}");
    }
    match status {
        Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)),
            (None, None) => ExitCode::FAILURE,
        },
        Err(e) => fail(exit::CANNOT_RUN, format!("waiting for the command: {e}")),
    }
}
