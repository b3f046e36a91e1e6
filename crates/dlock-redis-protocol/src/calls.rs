//! The scripts as calls: each one's `KEYS`/`ARGV` and the parsing of its
//! reply, in one place for both drivers. Errors are fred's, so a driver can
//! map them (`dlock-redis`) or tally them per node (`dlock-redlock`).

use std::time::Duration;

use fred::clients::Client;
use fred::error::Error as FredError;
use fred::interfaces::LuaInterface;
use fred::types::scripts::Script;
use fred::types::{FromValue, Value};

use crate::millis;
use crate::scripts::{self, QUEUE_SUFFIX, SEEN_SUFFIX};

/// The scripts, loaded by hash on first use and again after a server lost
/// them (fred's `evalsha_with_reload`; an acquire's steps one by one, each
/// kept to the end from the caller: `kept`).
pub struct Scripts {
    acquire: Script,
    acquire_unfenced: Script,
    release: Script,
    extend: Script,
    leave: Script,
    read_acquire: Script,
    write_acquire: Script,
    permits_acquire: Script,
    member_release: Script,
    member_extend: Script,
    family_holders: Script,
    leave_mark: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts {
            acquire: Script::from_lua(scripts::ACQUIRE),
            acquire_unfenced: Script::from_lua(scripts::ACQUIRE_UNFENCED),
            release: Script::from_lua(scripts::RELEASE),
            extend: Script::from_lua(scripts::EXTEND),
            leave: Script::from_lua(scripts::LEAVE),
            read_acquire: Script::from_lua(scripts::READ_ACQUIRE),
            write_acquire: Script::from_lua(scripts::WRITE_ACQUIRE),
            permits_acquire: Script::from_lua(scripts::PERMITS_ACQUIRE),
            member_release: Script::from_lua(scripts::MEMBER_RELEASE),
            member_extend: Script::from_lua(scripts::MEMBER_EXTEND),
            family_holders: Script::from_lua(scripts::FAMILY_HOLDERS),
            leave_mark: Script::from_lua(scripts::LEAVE_MARK),
        }
    }
}

/// What a fenced acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Granted, with this fencing token.
    Granted(u64),
    /// Held by someone else, for this much longer (`None`: no expiry).
    Held(Option<Duration>),
}

/// The lock family beyond the mutex: which primitive a grant is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// A read of a read-write lock.
    Read,
    /// A write of a read-write lock.
    Write,
    /// `count` permits of a semaphore of `limit`.
    Permits {
        /// Permits taken.
        count: u32,
        /// The semaphore's limit.
        limit: u32,
    },
}

impl Family {
    /// The channel its releases are announced on.
    pub fn channel(self, lock_key: &str) -> String {
        match self {
            Family::Read | Family::Write => scripts::rw_channel(lock_key),
            Family::Permits { .. } => scripts::permits_channel(lock_key),
        }
    }

    /// Whether a waiter of this primitive marks itself waiting (so that
    /// others hold back for it, and it must leave when it gives up).
    pub fn queues(self) -> bool {
        self == Family::Write
    }

    /// The value a grant with `token` is held under, for its release and
    /// extend: a reader's and a permit holder's carry their own token (the
    /// granting script stored it so: [`scripts::with_token`]); a writer's
    /// is the value itself. A grant whose reply was lost is released by
    /// its plain value (the release finds the member).
    pub fn held_value(self, value: &str, token: u64) -> String {
        match self {
            Family::Read | Family::Permits { .. } => scripts::with_token(value, token),
            Family::Write => value.to_owned(),
        }
    }
}

/// A holder of a read-write lock or a semaphore, as
/// [`Scripts::family_holders`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyHolder {
    /// What it holds (a semaphore's `limit` is unknown here: 0).
    pub family: Family,
    /// Its value (without the token a member carries).
    pub value: String,
    /// Its own fencing token, where the layout stores it: a reader's and a
    /// permit holder's (`None` for a member written before tokens were
    /// stored); the writer's is not stored (`None`).
    pub token: Option<u64>,
    /// How much longer it holds (`None`: no expiry).
    pub remaining: Option<Duration>,
}

/// A read-write lock's readers, writer and waiting writers beside `lock_key`.
fn rw_keys(lock_key: &str) -> [String; 3] {
    [
        scripts::companion_key(lock_key, scripts::READERS_SUFFIX),
        scripts::companion_key(lock_key, scripts::WRITER_SUFFIX),
        scripts::companion_key(lock_key, scripts::WRITERS_WAITING_SUFFIX),
    ]
}

/// What an unfenced (Redlock) acquire found on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfenced {
    /// Granted on this node.
    Granted,
    /// Held there, for this much longer, by this value (when readable).
    Held(Option<Duration>, Option<String>),
}

/// The waiter queue and the gone-at times beside `lock_key`.
fn queue_keys(lock_key: &str) -> [String; 2] {
    [
        scripts::companion_key(lock_key, QUEUE_SUFFIX),
        scripts::companion_key(lock_key, SEEN_SUFFIX),
    ]
}

/// An acquire script by hash, loaded again on `NOSCRIPT` (fred's
/// `evalsha_with_reload`, step by step), each command kept
/// [`to_the_end`](crate::to_the_end) from here: a call dropped between two
/// steps sends nothing more, so a clean-up's release sent after the drop
/// is never overtaken by a retry from the background (both `NOSCRIPT`
/// after a restart, the release's retry first, the acquire's after it,
/// would leave the key taken for a whole TTL).
async fn kept<R: FromValue + Send + 'static>(
    script: &Script,
    client: &Client,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<R, FredError> {
    let evalsha = || {
        let (c, hash, keys, args) = (client.clone(), script.sha1().clone(), keys.clone(), args.clone());
        crate::to_the_end(async move { c.evalsha::<R, _, _, _>(hash, keys, args).await })
    };
    match evalsha().await {
        Err(e) if e.details().starts_with("NOSCRIPT") => {
            let (c, script) = (client.clone(), script.clone());
            crate::to_the_end(async move { script.load(&c).await }).await?;
            evalsha().await
        }
        done => done,
    }
}

/// An acquire's `ARGV`: value, TTL in ms, waiter id and window (the window
/// is read only with a waiter).
fn attempt_args(value: &str, ttl: Duration, waiter: Option<(&str, u64)>) -> Vec<String> {
    let (id, window) = waiter.unwrap_or_default();
    vec![
        value.to_owned(),
        millis(ttl).to_string(),
        id.to_owned(),
        window.max(1).to_string(),
    ]
}

/// Reads a remaining TTL in ms (negative: no expiry, or no key).
fn pttl(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

impl Scripts {
    /// [`ACQUIRE`](scripts::ACQUIRE): `SET NX PX` and the fencing token;
    /// `waiter` queues a failed attempt (with its window in ms).
    ///
    /// # Errors
    ///
    /// fred's, and a [`fred::error::ErrorKind::Parse`] error for a reply
    /// that is neither a grant nor a refusal (a negative token, say).
    pub async fn acquire(
        &self,
        client: &Client,
        lock_key: &str,
        fence_key: &str,
        value: &str,
        ttl: Duration,
        waiter: Option<(&str, u64)>,
    ) -> Result<Fenced, FredError> {
        let [queue, seen] = queue_keys(lock_key);
        let keys = vec![lock_key.to_owned(), fence_key.to_owned(), queue, seen];
        let reply: Vec<i64> = kept(&self.acquire, client, keys, attempt_args(value, ttl, waiter)).await?;
        fenced(&reply)
    }

    /// [`ACQUIRE_UNFENCED`](scripts::ACQUIRE_UNFENCED) on one node.
    ///
    /// # Errors
    ///
    /// fred's, and a parse error for a reply of another shape.
    pub async fn acquire_unfenced(
        &self,
        client: &Client,
        lock_key: &str,
        value: &str,
        ttl: Duration,
        waiter: Option<(&str, u64)>,
    ) -> Result<Unfenced, FredError> {
        let [queue, seen] = queue_keys(lock_key);
        let keys = vec![lock_key.to_owned(), queue, seen];
        let reply: Vec<Value> = kept(
            &self.acquire_unfenced,
            client,
            keys,
            attempt_args(value, ttl, waiter),
        )
        .await?;
        let numbers: Vec<Option<i64>> = reply.iter().take(2).map(Value::as_i64).collect();
        match numbers.as_slice() {
            [Some(1), Some(_)] => Ok(Unfenced::Granted),
            [Some(0), Some(ms)] => Ok(Unfenced::Held(pttl(*ms), reply.get(2).and_then(Value::as_string))),
            _ => Err(parse_error(format!("unexpected acquire reply {reply:?}"))),
        }
    }

    /// [`RELEASE`](scripts::RELEASE): 1 released, 0 already gone, -1 held by
    /// someone else (see [`outcome_of`](crate::outcome_of)).
    ///
    /// # Errors
    ///
    /// fred's.
    pub async fn release(&self, client: &Client, lock_key: &str, value: &str) -> Result<i64, FredError> {
        self.release
            .evalsha_with_reload(
                client,
                {
                    let [queue, seen] = queue_keys(lock_key);
                    vec![lock_key.to_owned(), queue, seen]
                },
                vec![value.to_owned(), scripts::channel(lock_key)],
            )
            .await
    }

    /// [`EXTEND`](scripts::EXTEND): as [`release`](Self::release)'s reply.
    ///
    /// # Errors
    ///
    /// fred's.
    pub async fn extend(
        &self,
        client: &Client,
        lock_key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<i64, FredError> {
        self.extend
            .evalsha_with_reload(
                client,
                vec![lock_key.to_owned()],
                vec![value.to_owned(), millis(ttl).to_string()],
            )
            .await
    }

    /// [`LEAVE`](scripts::LEAVE): a waiter gives up its place.
    ///
    /// # Errors
    ///
    /// fred's.
    pub async fn leave(&self, client: &Client, lock_key: &str, waiter: &str) -> Result<(), FredError> {
        let _: i64 = self
            .leave
            .evalsha_with_reload(client, queue_keys(lock_key).to_vec(), vec![waiter.to_owned()])
            .await?;
        Ok(())
    }
}

impl Scripts {
    /// A grant of `family` on `lock_key`'s read-write lock or semaphore
    /// ([`READ_ACQUIRE`](scripts::READ_ACQUIRE),
    /// [`WRITE_ACQUIRE`](scripts::WRITE_ACQUIRE),
    /// [`PERMITS_ACQUIRE`](scripts::PERMITS_ACQUIRE)); `waiter` marks a
    /// refused writer waiting (with its window in ms).
    ///
    /// # Errors
    ///
    /// fred's, and a parse error for a reply of another shape.
    #[allow(clippy::too_many_arguments)]
    pub async fn acquire_family(
        &self,
        client: &Client,
        family: Family,
        lock_key: &str,
        fence_key: &str,
        value: &str,
        ttl: Duration,
        waiter: Option<(&str, u64)>,
    ) -> Result<Fenced, FredError> {
        let ms = millis(ttl).to_string();
        let (script, keys, args) = match family {
            Family::Read | Family::Write => {
                let [readers, writer, waiting] = rw_keys(lock_key);
                let keys = vec![readers, writer, waiting, fence_key.to_owned()];
                if family == Family::Read {
                    (&self.read_acquire, keys, vec![value.to_owned(), ms])
                } else {
                    let (id, window) = waiter.unwrap_or_default();
                    let args = vec![value.to_owned(), ms, id.to_owned(), window.max(1).to_string()];
                    (&self.write_acquire, keys, args)
                }
            }
            Family::Permits { count, limit } => (
                &self.permits_acquire,
                vec![
                    scripts::companion_key(lock_key, scripts::PERMITS_SUFFIX),
                    fence_key.to_owned(),
                ],
                vec![
                    scripts::permits_member(count, value),
                    ms,
                    count.to_string(),
                    limit.to_string(),
                ],
            ),
        };
        let reply: Vec<i64> = kept(script, client, keys, args).await?;
        fenced(&reply)
    }

    /// Releases a grant of `family`: 1 released, 0 already gone, -1 held
    /// by someone else (a writer only), as [`release`](Self::release).
    ///
    /// # Errors
    ///
    /// fred's.
    pub async fn release_family(
        &self,
        client: &Client,
        family: Family,
        lock_key: &str,
        value: &str,
    ) -> Result<i64, FredError> {
        let channel = family.channel(lock_key);
        match family {
            Family::Write => {
                let [_, writer, _] = rw_keys(lock_key);
                self.release
                    .evalsha_with_reload(client, vec![writer], vec![value.to_owned(), channel])
                    .await
            }
            Family::Read => {
                let [readers, _, _] = rw_keys(lock_key);
                let args = vec![value.to_owned(), channel, "1".to_owned()];
                self.member_release
                    .evalsha_with_reload(client, vec![readers], args)
                    .await
            }
            Family::Permits { count, .. } => {
                let holders = scripts::companion_key(lock_key, scripts::PERMITS_SUFFIX);
                let args = vec![scripts::permits_member(count, value), channel, "0".to_owned()];
                self.member_release
                    .evalsha_with_reload(client, vec![holders], args)
                    .await
            }
        }
    }

    /// Extends a grant of `family`, as [`extend`](Self::extend).
    ///
    /// # Errors
    ///
    /// fred's.
    pub async fn extend_family(
        &self,
        client: &Client,
        family: Family,
        lock_key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<i64, FredError> {
        let ms = millis(ttl).to_string();
        let (script, key, member) = match family {
            Family::Write => (&self.extend, rw_keys(lock_key)[1].clone(), value.to_owned()),
            Family::Read => (
                &self.member_extend,
                rw_keys(lock_key)[0].clone(),
                value.to_owned(),
            ),
            Family::Permits { count, .. } => (
                &self.member_extend,
                scripts::companion_key(lock_key, scripts::PERMITS_SUFFIX),
                scripts::permits_member(count, value),
            ),
        };
        script
            .evalsha_with_reload(client, vec![key], vec![member, ms])
            .await
    }

    /// A waiting writer gives up: its mark out of the waiting writers.
    ///
    /// # Errors
    ///
    /// fred's.
    pub async fn leave_family(&self, client: &Client, lock_key: &str, waiter: &str) -> Result<(), FredError> {
        let [_, _, waiting] = rw_keys(lock_key);
        let args = vec![waiter.to_owned(), scripts::rw_channel(lock_key)];
        let _: i64 = self
            .leave_mark
            .evalsha_with_reload(client, vec![waiting], args)
            .await?;
        Ok(())
    }

    /// Every holder of `lock_key`'s read-write lock (the writer, when one
    /// holds, then the readers) or semaphore (the permit holders), each
    /// with its value, its own token (readers, permit holders) and
    /// remaining time; expired ones left out.
    ///
    /// # Errors
    ///
    /// fred's.
    pub async fn family_holders(
        &self,
        client: &Client,
        semaphore: bool,
        lock_key: &str,
    ) -> Result<Vec<FamilyHolder>, FredError> {
        let keys = if semaphore {
            vec![scripts::companion_key(lock_key, scripts::PERMITS_SUFFIX)]
        } else {
            let [readers, writer, _] = rw_keys(lock_key);
            vec![readers, writer]
        };
        let reply: Vec<Value> = self.family_holders.evalsha_with_reload(client, keys, ()).await?;
        let mut found = Vec::new();
        for entry in reply.chunks(3) {
            let [kind, value, ms] = entry else {
                return Err(parse_error(format!("unexpected holders reply {reply:?}")));
            };
            let (Some(kind), Some(value), Some(ms)) = (kind.as_string(), value.as_string(), ms.as_i64())
            else {
                return Err(parse_error(format!("unexpected holders entry {entry:?}")));
            };
            let (family, value, token) = match (kind.as_str(), semaphore) {
                ("w", false) => (Family::Write, value, None),
                ("m", false) => {
                    let (value, token) = scripts::split_token(&value);
                    (Family::Read, value.to_owned(), token)
                }
                ("m", true) => {
                    // A member is "<count> <value> t<token>" (or, written
                    // before tokens were stored, "<count> <value>");
                    // another's is skipped.
                    let Some((count, value)) = value.split_once(' ') else {
                        continue;
                    };
                    let Ok(count) = count.parse() else { continue };
                    let (value, token) = scripts::split_token(value);
                    (Family::Permits { count, limit: 0 }, value.to_owned(), token)
                }
                _ => return Err(parse_error(format!("unexpected holders entry {entry:?}"))),
            };
            found.push(FamilyHolder {
                family,
                value,
                token,
                remaining: pttl(ms),
            });
        }
        Ok(found)
    }
}

/// A fenced acquire's reply: `{1, token}` granted, `{0, pttl}` held.
fn fenced(reply: &[i64]) -> Result<Fenced, FredError> {
    match reply {
        [1, token] => u64::try_from(*token)
            .map(Fenced::Granted)
            .map_err(|_| parse_error(format!("negative fencing token {token}"))),
        [0, ms] => Ok(Fenced::Held(pttl(*ms))),
        other => Err(parse_error(format!("unexpected acquire reply {other:?}"))),
    }
}

fn parse_error(what: String) -> FredError {
    FredError::new(fred::error::ErrorKind::Parse, what)
}
