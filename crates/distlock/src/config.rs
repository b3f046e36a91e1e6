//! [`Config`]: the backend chosen at run time, from a URL, a TOML or JSON
//! file, or the environment.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use dlock_core::driver::redact_url;
use dlock_core::{AcquireOptions, Error, Result, Wait};
use serde::{Deserialize, Serialize};

/// A backend section whose cargo feature is off: accepted when read (so a
/// shared config file still loads), refused when connecting with a message
/// naming the feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Disabled;

impl Serialize for Disabled {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        s.serialize_map(Some(0))?.end()
    }
}

impl<'de> Deserialize<'de> for Disabled {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Disabled)
    }
}

#[cfg(feature = "redis")]
type RedisSection = dlock_redis::RedisConfig;
#[cfg(not(feature = "redis"))]
type RedisSection = Disabled;
#[cfg(feature = "redlock")]
type RedlockSection = dlock_redlock::RedlockConfig;
#[cfg(not(feature = "redlock"))]
type RedlockSection = Disabled;
#[cfg(feature = "etcd")]
type EtcdSection = dlock_etcd::EtcdConfig;
#[cfg(not(feature = "etcd"))]
type EtcdSection = Disabled;
#[cfg(feature = "zk")]
type ZkSection = dlock_zk::ZkConfig;
#[cfg(not(feature = "zk"))]
type ZkSection = Disabled;
#[cfg(feature = "postgres")]
type PostgresSection = dlock_postgres::PostgresConfig;
#[cfg(not(feature = "postgres"))]
type PostgresSection = Disabled;

/// Which backend, with its settings: a serde enum tagged by `backend`.
///
/// ```toml
/// backend = "etcd"
/// endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
/// key_prefix = "locks/"
/// ```
///
/// Each section is the driver's own config type (`RedisConfig`,
/// `RedlockConfig`, `EtcdConfig`, `ZkConfig`); `Debug` never shows a
/// password.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "backend", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Config {
    /// The in-process `MemLock` (always available; a new backend per connect).
    Mem,
    /// One Redis server or a Redis Cluster (feature `redis`).
    Redis(RedisSection),
    /// Redlock over independent Redis nodes (feature `redlock`).
    Redlock(RedlockSection),
    /// etcd (feature `etcd`).
    Etcd(EtcdSection),
    /// ZooKeeper (feature `zk`).
    Zk(ZkSection),
    /// PostgreSQL (feature `postgres`).
    Postgres(PostgresSection),
}

/// The three ways to say which backend to use, for error messages.
pub(crate) const HOW_TO_CONFIGURE: &str = "no lock backend configured; give one of:\n  \
     --url URL              e.g. --url etcd://127.0.0.1:2379\n  \
     --config FILE          a TOML or JSON file with `backend = \"...\"`\n  \
     DLOCK_URL=URL          in the environment\n\
     URL schemes: mem://, redis://, rediss://, redlock://h1,h2,h3, etcd://, etcds://, zk://, postgres://";

fn invalid(msg: String) -> Error {
    Error::InvalidConfig(msg)
}

#[allow(dead_code)]
fn feature_off(feature: &str) -> Error {
    invalid(format!(
        "the {feature} backend is not built in: enable the cargo feature `{feature}` of distlock \
         (distlock = {{ features = [\"{feature}\"] }})"
    ))
}

/// Every URL scheme [`Config::from_url`] reads.
const URL_SCHEMES: [&str; 11] = [
    "mem",
    "redis",
    "rediss",
    "redis-cluster",
    "rediss-cluster",
    "redlock",
    "etcd",
    "etcds",
    "zk",
    "postgres",
    "postgresql",
];

impl Config {
    /// Reads a backend URL:
    ///
    /// | URL | backend |
    /// |---|---|
    /// | `mem://` | in-process |
    /// | `redis://[user:pass@]host:port[/db]`, `rediss://...` | one Redis (TLS) |
    /// | `redlock://[:pass@]h1:6379,h2:6379,h3:6379` | Redlock |
    /// | `etcd://[user:pass@]h1:2379,h2:2379`, `etcds://...` | etcd (TLS) |
    /// | `zk://[user:pass@]h1:2181,h2:2181[/chroot]` | ZooKeeper (digest auth) |
    /// | `postgres://[user[:pass]@]host[:5432][/db][?sslmode=require&sslrootcert=PATH]`, `postgresql://...` | PostgreSQL |
    ///
    /// ```
    /// let config = distlock::Config::from_url("mem://").unwrap();
    /// assert_eq!(config.backend(), "mem");
    /// assert!(distlock::Config::from_url("ftp://h").is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the problem: no or unknown scheme, a
    /// missing host, a bad port, a backend whose cargo feature is off.
    pub fn from_url(url: &str) -> Result<Config> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid(format!("{:?} is not a URL (scheme://...)", redact_url(url))))?;
        // The URL's shape first, whatever the backend: a malformed URL is
        // named as such even where the backend's feature is off.
        if scheme != "mem" && URL_SCHEMES.contains(&scheme) {
            dlock_core::driver::authority(url)?;
        }
        match scheme {
            "mem" => {
                if !rest.is_empty() {
                    return Err(invalid(format!(
                        "mem:// takes nothing after the scheme, got {:?}",
                        redact_url(url)
                    )));
                }
                Ok(Config::Mem)
            }
            "redis" | "rediss" | "redis-cluster" | "rediss-cluster" => Self::redis(url),
            "redlock" => Self::redlock(url),
            "etcd" | "etcds" => Self::etcd(url),
            "zk" => Self::zk(url),
            "postgres" | "postgresql" => Self::postgres(url),
            other => Err(invalid(format!(
                "unknown URL scheme {other:?}; known: {}",
                URL_SCHEMES.join(", ")
            ))),
        }
    }

    // Each backend's config reads its own URL; a backend whose feature is
    // off says so.

    #[cfg(feature = "redis")]
    fn redis(url: &str) -> Result<Config> {
        let config = dlock_redis::RedisConfig::from_url(url);
        config.validate()?;
        Ok(Config::Redis(config))
    }
    #[cfg(not(feature = "redis"))]
    fn redis(_: &str) -> Result<Config> {
        Err(feature_off("redis"))
    }

    #[cfg(feature = "redlock")]
    fn redlock(url: &str) -> Result<Config> {
        dlock_redlock::RedlockConfig::from_url(url).map(Config::Redlock)
    }
    #[cfg(not(feature = "redlock"))]
    fn redlock(_: &str) -> Result<Config> {
        Err(feature_off("redlock"))
    }

    #[cfg(feature = "etcd")]
    fn etcd(url: &str) -> Result<Config> {
        dlock_etcd::EtcdConfig::from_url(url).map(Config::Etcd)
    }
    #[cfg(not(feature = "etcd"))]
    fn etcd(_: &str) -> Result<Config> {
        Err(feature_off("etcd"))
    }

    #[cfg(feature = "postgres")]
    fn postgres(url: &str) -> Result<Config> {
        let config = dlock_postgres::PostgresConfig::from_url(url);
        config.validate()?;
        Ok(Config::Postgres(config))
    }
    #[cfg(not(feature = "postgres"))]
    fn postgres(_: &str) -> Result<Config> {
        Err(feature_off("postgres"))
    }

    #[cfg(feature = "zk")]
    fn zk(url: &str) -> Result<Config> {
        dlock_zk::ZkConfig::from_url(url).map(Config::Zk)
    }
    #[cfg(not(feature = "zk"))]
    fn zk(_: &str) -> Result<Config> {
        Err(feature_off("zk"))
    }

    /// Reads a TOML document.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] with the parser's message (it names the field).
    pub fn from_toml(text: &str) -> Result<Config> {
        toml::from_str(text).map_err(|e| invalid(format!("config: {e}")))
    }

    /// Reads a JSON document.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] with the parser's message.
    pub fn from_json(text: &str) -> Result<Config> {
        serde_json::from_str(text).map_err(|e| invalid(format!("config: {e}")))
    }

    /// Reads a file: JSON if it ends in `.json`, TOML otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if it cannot be read or parsed.
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid(format!("config file {}: {e}", path.display())))?;
        if path.extension().is_some_and(|e| e == "json") {
            Self::from_json(&text)
        } else {
            Self::from_toml(&text)
        }
    }

    /// Writes the config as TOML (passwords included: it is a config file).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if a value cannot be written as TOML.
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| invalid(format!("config: {e}")))
    }

    /// The backend's short name: `mem`, `redis`, `redlock`, `etcd`, `zk`.
    pub fn backend(&self) -> &'static str {
        match self {
            Config::Mem => "mem",
            Config::Redis(_) => "redis",
            Config::Redlock(_) => "redlock",
            Config::Etcd(_) => "etcd",
            Config::Zk(_) => "zk",
            Config::Postgres(_) => "postgres",
        }
    }
}

/// A backend plus the acquire defaults, as read from the environment:
/// `DLOCK_URL` (or `DLOCK_CONFIG`, a file), `DLOCK_TTL` (`30s`),
/// `DLOCK_WAIT` (`10s`, `forever`, `no`), `DLOCK_NO_AUTO_EXTEND`.
#[derive(Clone, PartialEq)]
pub struct Settings {
    /// The backend.
    pub config: Config,
    /// The acquire options.
    pub options: AcquireOptions,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("config", &self.config)
            .field("options", &self.options)
            .finish()
    }
}

/// The longest TTL accepted from configuration and by every lock: a day
/// ([`AcquireOptions::MAX_TTL`](dlock_core::AcquireOptions::MAX_TTL)).
/// Longer ones are almost certainly a unit mistake, and would keep a crashed
/// holder's lock that long.
pub const MAX_TTL: Duration = dlock_core::AcquireOptions::MAX_TTL;

/// Checks a TTL from configuration.
///
/// # Errors
///
/// [`Error::InvalidConfig`] naming `field` for zero or more than [`MAX_TTL`].
pub(crate) fn check_ttl(field: &str, ttl: Duration) -> Result<Duration> {
    if ttl.is_zero() {
        return Err(invalid(format!("{field}: a TTL must be greater than zero")));
    }
    if ttl > MAX_TTL {
        return Err(invalid(format!(
            "{field}: a TTL of {} is more than the 24h allowed",
            humantime::format_duration(ttl)
        )));
    }
    Ok(ttl)
}

/// Reads a wait: `forever`, `no` (one try), or a duration.
///
/// # Errors
///
/// [`Error::InvalidConfig`] naming `field`.
pub(crate) fn parse_wait(field: &str, text: &str) -> Result<Wait> {
    match text.trim() {
        "forever" => Ok(Wait::Forever),
        "no" | "0" | "0s" => Ok(Wait::No),
        t => humantime::parse_duration(t).map(Wait::For).map_err(|e| {
            invalid(format!(
                "{field}: {t:?} is not a duration ({e}), `forever` or `no`"
            ))
        }),
    }
}

impl Settings {
    /// Reads `DLOCK_URL` / `DLOCK_CONFIG`, `DLOCK_TTL`, `DLOCK_WAIT`,
    /// `DLOCK_NO_AUTO_EXTEND` through `var` (e.g. `|k| std::env::var(k).ok()`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the variable; with neither
    /// `DLOCK_URL` nor `DLOCK_CONFIG`, one showing how to configure a backend.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Settings> {
        let config = match (var("DLOCK_URL"), var("DLOCK_CONFIG")) {
            (Some(url), _) => Config::from_url(&url).map_err(|e| match e {
                // Said once: "invalid configuration: DLOCK_URL: ...".
                Error::InvalidConfig(why) => invalid(format!("DLOCK_URL: {why}")),
                other => other,
            })?,
            (None, Some(file)) => Config::from_file(Path::new(&file))?,
            (None, None) => return Err(invalid(HOW_TO_CONFIGURE.to_owned())),
        };
        let mut options = AcquireOptions::default();
        if let Some(ttl) = var("DLOCK_TTL") {
            let parsed = humantime::parse_duration(&ttl)
                .map_err(|e| invalid(format!("DLOCK_TTL: {ttl:?} is not a duration ({e})")))?;
            options = options.ttl(check_ttl("DLOCK_TTL", parsed)?);
        }
        if let Some(wait) = var("DLOCK_WAIT") {
            options = options.wait(parse_wait("DLOCK_WAIT", &wait)?);
        }
        if var("DLOCK_NO_AUTO_EXTEND").is_some_and(|v| !v.is_empty() && v != "0") {
            options = options.auto_extend(false);
        }
        Ok(Settings { config, options })
    }

    /// [`from_vars`](Self::from_vars) over the process environment.
    ///
    /// # Errors
    ///
    /// As [`from_vars`](Self::from_vars).
    pub fn from_env() -> Result<Settings> {
        Self::from_vars(|k| std::env::var(k).ok())
    }
}
