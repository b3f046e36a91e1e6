//! redis-py's own `redis.lock.Lock` as a reference client: Debian's
//! `python3-redis` on Debian's `/usr/bin/python3`, running
//! `reference/python/contender.py` (nothing to build: the interpreter runs
//! the source as the kit holds it).
//!
//! One process hosts many contenders, each a thread with its own
//! `redis.Redis` client and connection pool: separate clients as far as the
//! lock is concerned. A contender names the lock by its full Redis key
//! (redis-py's `Lock` takes the key itself): for `dlock-redis` that is
//! `RedisLock::redis_key(&key)`, the configured prefix and the name.
//!
//! redis-py's `Lock` is a plain `SET NAME TOKEN NX PX TTL` and a
//! compare-token `DEL`: it waits by sleeping `sleep` seconds between tries
//! (its default is 0.1 s; [`RedisPy::start`] takes it) and announces no
//! release, so our waiters behind it are woken by their own poll.
//!
//! ```no_run
//! # async fn demo() -> Result<(), dlock_testkit::reference::ReferenceError> {
//! use std::time::Duration;
//! use dlock_testkit::reference::python::RedisPy;
//!
//! let py = RedisPy::start("redis://127.0.0.1:6379", Duration::from_millis(5)).await?;
//! let p1 = py.contender("p1");
//! if let Some(value) = p1.try_acquire("dlock:job", Duration::from_secs(10)).await? {
//!     println!("redis-py holds dlock:job with {value}");
//!     p1.release().await?;
//! }
//! py.close().await;
//! # Ok(()) }
//! ```

use std::path::Path;
use std::time::Duration;

use tokio::process::Command;

use super::{Contender, REPLY_LIMIT, ReferenceClient, ReferenceError, Result};

const SOURCE: &str = include_str!("../../reference/python/contender.py");

/// Debian's interpreter (not the first `python3` on the `PATH`, which may
/// be another one without Debian's packages).
pub const PYTHON: &str = "/usr/bin/python3";
/// A file Debian's `python3-redis` installs.
pub const REDIS_PY: &str = "/usr/lib/python3/dist-packages/redis/__init__.py";

/// The Debian packages the program needs, each with a file it installs.
const NEEDS: [(&str, &str); 2] = [("python3", PYTHON), ("python3-redis", REDIS_PY)];

/// The Debian packages redis-py's contender needs that look missing (by a
/// file each installs), with that file.
pub fn missing() -> Vec<(&'static str, &'static str)> {
    NEEDS
        .iter()
        .copied()
        .filter(|(_, file)| !Path::new(file).exists())
        .collect()
}

/// A running redis-py program (one process, many contenders). Dropping it
/// kills the process (its locks then expire by their TTL); [`close`]
/// releases them first.
///
/// [`close`]: RedisPy::close
#[derive(Debug, Clone)]
pub struct RedisPy {
    client: ReferenceClient,
}

impl RedisPy {
    /// redis-py against the Redis at `url` (`redis://host:port[/db]`, as
    /// redis-py's `Redis.from_url` reads it); its blocking acquires try
    /// again every `poll` (the `Lock`'s `sleep`).
    ///
    /// # Errors
    ///
    /// A [`ReferenceError`] naming the Debian package when the interpreter
    /// or redis-py is missing, or saying why the program did not start.
    pub async fn start(url: &str, poll: Duration) -> Result<Self> {
        let absent = missing();
        if !absent.is_empty() {
            let list: Vec<String> = absent
                .iter()
                .map(|(package, file)| format!("{package} (no {file})"))
                .collect();
            let packages: Vec<&str> = absent.iter().map(|(p, _)| *p).collect();
            return Err(ReferenceError(format!(
                "the redis-py reference client cannot run: missing Debian package(s) {}; install them \
                 (`apt-get install -y {}`) or run `cargo xtask test`, which does",
                list.join(", "),
                packages.join(" ")
            )));
        }
        let mut cmd = Command::new(PYTHON);
        // Isolated (no PYTHON* variables, no user site) and unbuffered.
        let poll = poll.as_secs_f64().to_string();
        cmd.args(["-I", "-u", "-c", SOURCE, url, poll.as_str()]);
        Ok(RedisPy {
            client: ReferenceClient::start("redis-py", cmd).await?,
        })
    }

    /// What the program runs, as it printed it (e.g. `redis-py 4.3.4
    /// (python 3.11.2)`).
    pub fn version(&self) -> &str {
        self.client.version()
    }

    /// The contender named `id` (its thread and client are made on its
    /// first command).
    pub fn contender(&self, id: &str) -> PyContender {
        PyContender {
            contender: self.client.contender(id),
        }
    }

    /// Ends the program: closes its input, so every contender releases
    /// what it holds, and waits for it to exit (killing it after
    /// [`REPLY_LIMIT`]).
    pub async fn close(self) {
        self.client.close().await;
    }
}

/// One redis-py contender: its commands run in order, each on a new
/// `redis.lock.Lock` of its client.
#[derive(Debug, Clone)]
pub struct PyContender {
    contender: Contender,
}

impl PyContender {
    /// Its name.
    pub fn id(&self) -> &str {
        self.contender.id()
    }

    /// How a hold record names it: `redis-py ID`.
    pub fn who(&self) -> String {
        format!("{} {}", self.contender.client(), self.contender.id())
    }

    /// Sends `command` and returns its reply, which must come within `limit`.
    async fn ask(&self, command: &str, limit: Duration) -> Result<String> {
        let c = &self.contender;
        c.process.send(&format!("{} {command}", c.id)).await?;
        c.process.next(&c.id, limit).await
    }

    fn check_name(&self, name: &str) -> Result<()> {
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(self.contender.err(format_args!(
                "a lock name the line protocol cannot carry: {name:?}"
            )));
        }
        Ok(())
    }

    /// A grant's value (`granted VALUE`), `None` for the `refused` reply.
    fn granted(&self, reply: &str, refused: &str) -> Result<Option<String>> {
        match reply.split_once(' ') {
            Some(("granted", value)) if !value.trim().is_empty() => Ok(Some(value.trim().to_owned())),
            _ if reply == refused => Ok(None),
            _ => Err(self
                .contender
                .err(format_args!("expected granted or {refused}, said {reply:?}"))),
        }
    }

    /// `Lock(client, name, timeout=ttl).acquire(blocking=False)`: the value
    /// it stored when it got the lock, `None` when someone else holds it.
    ///
    /// # Errors
    ///
    /// When it failed (it already holds, Redis failed) or did not answer in
    /// time.
    pub async fn try_acquire(&self, name: &str, ttl: Duration) -> Result<Option<String>> {
        self.check_name(name)?;
        let reply = self
            .ask(&format!("try {name} {}", ttl.as_millis().max(1)), REPLY_LIMIT)
            .await?;
        self.granted(&reply, "busy")
    }

    /// `Lock(client, name, timeout=ttl, sleep=poll).acquire(blocking_timeout=wait)`:
    /// the value it stored once it got the lock, `None` when `wait` ran out.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire); the answer may take `wait`
    /// and [`REPLY_LIMIT`].
    pub async fn acquire(&self, name: &str, ttl: Duration, wait: Duration) -> Result<Option<String>> {
        self.check_name(name)?;
        let command = format!("acquire {name} {} {}", ttl.as_millis().max(1), wait.as_millis());
        let reply = self.ask(&command, wait.saturating_add(REPLY_LIMIT)).await?;
        self.granted(&reply, "timeout")
    }

    /// `release()` of the lock it holds: redis-py's compare-token delete,
    /// which fails (`LockNotOwnedError`) when its value is no longer there.
    ///
    /// # Errors
    ///
    /// When it holds nothing, the release failed, or no answer came in time.
    pub async fn release(&self) -> Result<()> {
        self.contender.release().await
    }

    /// redis-py's view: `Lock(client, name).locked()`, whether anyone
    /// holds `name`.
    ///
    /// # Errors
    ///
    /// When it failed or did not answer in time.
    pub async fn locked(&self, name: &str) -> Result<bool> {
        self.check_name(name)?;
        match self.ask(&format!("locked {name}"), REPLY_LIMIT).await?.as_str() {
            "locked 1" => Ok(true),
            "locked 0" => Ok(false),
            other => Err(self
                .contender
                .err(format_args!("expected locked 1 or 0, said {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_need_names_a_package_and_an_absolute_file() {
        for (package, file) in NEEDS {
            assert!(!package.is_empty() && file.starts_with('/'));
        }
        assert!(
            SOURCE.contains("\"version\""),
            "the program announces its version"
        );
    }
}
