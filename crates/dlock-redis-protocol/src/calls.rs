//! The scripts as calls: each one's `KEYS`/`ARGV` and the parsing of its
//! reply, in one place for both drivers. Errors are fred's, so a driver can
//! map them (`dlock-redis`) or tally them per node (`dlock-redlock`).

use std::time::Duration;

use fred::clients::Client;
use fred::error::Error as FredError;
use fred::types::Value;
use fred::types::scripts::Script;

use crate::millis;
use crate::scripts::{self, QUEUE_SUFFIX, SEEN_SUFFIX};

/// The scripts, loaded by hash on first use (and again after a server lost
/// them: `evalsha_with_reload`).
pub struct Scripts {
    acquire: Script,
    acquire_unfenced: Script,
    release: Script,
    extend: Script,
    leave: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts {
            acquire: Script::from_lua(scripts::ACQUIRE),
            acquire_unfenced: Script::from_lua(scripts::ACQUIRE_UNFENCED),
            release: Script::from_lua(scripts::RELEASE),
            extend: Script::from_lua(scripts::EXTEND),
            leave: Script::from_lua(scripts::LEAVE),
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
        let reply: Vec<i64> = self
            .acquire
            .evalsha_with_reload(
                client,
                vec![lock_key.to_owned(), fence_key.to_owned(), queue, seen],
                attempt_args(value, ttl, waiter),
            )
            .await?;
        match reply.as_slice() {
            [1, token] => u64::try_from(*token)
                .map(Fenced::Granted)
                .map_err(|_| parse_error(format!("negative fencing token {token}"))),
            [0, ms] => Ok(Fenced::Held(pttl(*ms))),
            other => Err(parse_error(format!("unexpected acquire reply {other:?}"))),
        }
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
        let reply: Vec<Value> = self
            .acquire_unfenced
            .evalsha_with_reload(
                client,
                vec![lock_key.to_owned(), queue, seen],
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
    /// someone else (see [`Outcome::from_reply`](crate::Outcome::from_reply)).
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

fn parse_error(what: String) -> FredError {
    FredError::new(fred::error::ErrorKind::Parse, what)
}
