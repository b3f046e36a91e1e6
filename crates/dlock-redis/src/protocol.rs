//! The protocol, this driver's side: the only file that talks to Redis.
//! The scripts, their keys, arguments and replies are
//! `dlock_redis_protocol`'s (shared with Redlock); here are the connection
//! they run on, the operator reads, and the error mapping of each call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::driver::Outcome;
use dlock_core::{Error, Result};
use dlock_redis_protocol::calls::{Family, FamilyHolder, Fenced, Scripts};
use dlock_redis_protocol::outcome_of;
use dlock_redis_protocol::scripts;
use fred::clients::{Client, SubscriberClient};
use fred::interfaces::{ClientLike, KeysInterface};
use fred::types::Builder;
use fred::types::config::ReconnectPolicy;
use futures::StreamExt;

use crate::config::RedisConfig;
use crate::error::{BACKEND, map_err};

/// The shortest TTL the driver honours (Redis expiries are in milliseconds;
/// a watchdog at a third of less than this could not keep up).
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// What a handle and its guards share to talk to Redis: the command and
/// subscriber connections, the scripts, and whether the handle was
/// abandoned (then nothing more is sent: as if the process had died).
pub(crate) struct Conn {
    pub(crate) client: Client,
    pub(crate) subscriber: SubscriberClient,
    scripts: Scripts,
    abandoned: AtomicBool,
    /// Keeps every guard of this handle, in one task.
    pub(crate) keeper: dlock_core::driver::Keeper,
}

/// The last user gone (the handle and every guard): both connections are
/// closed in the background.
impl Drop for Conn {
    fn drop(&mut self) {
        let (client, subscriber) = (self.client.clone(), self.subscriber.clone());
        dlock_core::driver::spawn_detached("redis: close the connections", async move {
            let _ = client.quit().await;
            let _ = subscriber.quit().await;
        });
    }
}

/// Who holds a key, as Redis tells it: the value, the remaining TTL
/// (`None`: no expiry), the fence counter.
pub(crate) struct HeldBy {
    pub(crate) value: String,
    pub(crate) remaining: Option<Duration>,
    pub(crate) fence_counter: Option<u64>,
}

impl Conn {
    /// Connects the command and subscriber connections within the connect
    /// timeout.
    pub(crate) async fn connect(config: &RedisConfig) -> Result<Self> {
        let fred_config = config.to_fred()?;
        let mut builder = Builder::from_config(fred_config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = config.connect_timeout;
                c.internal_command_timeout = config.request_timeout;
                // A command is sent once: a silent resend after a reconnect
                // could take a lock nobody is waiting for any more.
                c.max_command_attempts = 1;
            })
            .with_performance_config(|p| {
                p.default_command_timeout = config.request_timeout;
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2));
        let client = builder.build().map_err(map_err)?;
        let subscriber = builder.build_subscriber_client().map_err(map_err)?;
        let connected = tokio::time::timeout(config.connect_timeout, async {
            client.init().await?;
            subscriber.init().await
        })
        .await;
        let failure = match connected {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(map_err(e)),
            Err(_) => Some(Error::unavailable(
                BACKEND,
                format!("no connection within {:?}", config.connect_timeout),
            )),
        };
        let conn = Conn {
            client,
            subscriber,
            scripts: Scripts::default(),
            abandoned: AtomicBool::new(false),
            keeper: dlock_core::driver::Keeper::new(),
        };
        match failure {
            None => Ok(conn),
            // Dropping `conn` closes its connections.
            Some(e) => Err(match e {
                Error::Unavailable { .. } | Error::InvalidConfig(_) => e,
                other => Error::unavailable(BACKEND, other),
            }),
        }
    }

    pub(crate) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// Marks the handle abandoned and closes both connections.
    pub(crate) async fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        let _ = self.client.quit().await;
        let _ = self.subscriber.quit().await;
    }

    /// One fenced attempt at `kind` (`None`: the mutex, see `ACQUIRE`;
    /// else a read, a write or permits); `waiter` (its id and window in ms)
    /// queues it (a mutex) or marks it waiting (a write) if refused. Its
    /// commands run [`to_the_end`](dlock_redis_protocol::to_the_end),
    /// whoever stops waiting for them.
    pub(crate) async fn acquire(
        &self,
        kind: Option<Family>,
        lock_key: &str,
        fence_key: &str,
        value: &str,
        ttl: Duration,
        waiter: Option<(&str, u64)>,
    ) -> Result<Fenced> {
        let client = &self.client;
        match kind {
            None => {
                self.scripts
                    .acquire(client, lock_key, fence_key, value, ttl, waiter)
                    .await
            }
            Some(f) => {
                self.scripts
                    .acquire_family(client, f, lock_key, fence_key, value, ttl, waiter)
                    .await
            }
        }
        .map_err(map_err)
    }

    /// The compare-value release of `kind`, announced to waiters.
    pub(crate) async fn release(&self, kind: Option<Family>, lock_key: &str, value: &str) -> Result<Outcome> {
        let client = &self.client;
        let reply = match kind {
            None => self.scripts.release(client, lock_key, value).await,
            Some(f) => self.scripts.release_family(client, f, lock_key, value).await,
        }
        .map_err(map_err)?;
        outcome_of(BACKEND, reply)
    }

    /// The compare-value extend of `kind`.
    pub(crate) async fn extend(
        &self,
        kind: Option<Family>,
        lock_key: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Outcome> {
        let client = &self.client;
        let reply = match kind {
            None => self.scripts.extend(client, lock_key, value, ttl).await,
            Some(f) => self.scripts.extend_family(client, f, lock_key, value, ttl).await,
        }
        .map_err(map_err)?;
        outcome_of(BACKEND, reply)
    }

    /// A waiter of `kind` gives up its place in the queue (a mutex) or its
    /// waiting mark (a write).
    pub(crate) async fn leave(&self, kind: Option<Family>, lock_key: &str, waiter: &str) -> Result<()> {
        match kind {
            None => self.scripts.leave(&self.client, lock_key, waiter).await,
            Some(_) => self.scripts.leave_family(&self.client, lock_key, waiter).await,
        }
        .map_err(map_err)
    }

    /// Every live holder of `lock_key`'s read-write lock or (`semaphore`)
    /// semaphore: its primitive, value, own token (where stored) and
    /// remaining time.
    pub(crate) async fn family_holders(&self, semaphore: bool, lock_key: &str) -> Result<Vec<FamilyHolder>> {
        self.scripts
            .family_holders(&self.client, semaphore, lock_key)
            .await
            .map_err(map_err)
    }

    /// The lock key's value, remaining TTL and fence counter; `None` if the
    /// key is free.
    pub(crate) async fn held_by(&self, lock_key: &str) -> Result<Option<HeldBy>> {
        let client = &self.client;
        let value: Option<String> = client.get(lock_key).await.map_err(map_err)?;
        let Some(value) = value else { return Ok(None) };
        let pttl: i64 = client.pttl(lock_key).await.map_err(map_err)?;
        let fence_counter = self.fence_counter(lock_key).await?;
        Ok(Some(HeldBy {
            value,
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            fence_counter,
        }))
    }

    /// The fence counter of `lock_key`'s name, if it has one.
    pub(crate) async fn fence_counter(&self, lock_key: &str) -> Result<Option<u64>> {
        match scripts::fence_key(lock_key) {
            Some(k) => self.client.get(k).await.map_err(map_err),
            None => Ok(None),
        }
    }

    /// Every lock key starting with `start` (companion keys left out; a
    /// read-write lock or a semaphore as its lock key), sorted; on a
    /// cluster, from every primary.
    pub(crate) async fn lock_keys(&self, start: &str, cluster: bool) -> Result<Vec<String>> {
        let mut pattern = String::with_capacity(start.len() + 1);
        for c in start.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('*');
        // The family's keys of an untagged lock key are `{<lock key>}:...`.
        let patterns = [pattern.clone(), format!("{{{pattern}")];
        let client = &self.client;
        let mut keys = Vec::new();
        for pattern in patterns {
            let mut stream = if cluster {
                client.scan_cluster_buffered(pattern, Some(500), None).boxed()
            } else {
                client.scan_buffered(pattern, Some(500), None).boxed()
            };
            while let Some(key) = stream.next().await {
                let key = key.map_err(map_err)?;
                let Some(name) = key.as_str() else { continue };
                match scripts::family_owner(name) {
                    Some(owner) if owner.starts_with(start) => keys.push(owner.to_owned()),
                    Some(_) => {}
                    None if scripts::SUFFIXES.iter().any(|s| name.ends_with(s)) => {}
                    None if name.starts_with(start) => keys.push(name.to_string()),
                    None => {}
                }
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }
}

/// The handle's connection, as its guards' leases see it.
impl dlock_core::driver::LeaseHome for Conn {
    const BACKEND: &'static str = BACKEND;

    fn keeper(&self) -> &dlock_core::driver::Keeper {
        &self.keeper
    }

    fn is_abandoned(&self) -> bool {
        Conn::is_abandoned(self)
    }
}
