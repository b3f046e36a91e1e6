//! [`RedisConfig`]: where the server is and how to talk to it.

use std::fmt;
use std::time::Duration;

use dlock_core::Error;
use dlock_core::driver::redact_url;
use serde::{Deserialize, Serialize};

/// How to reach Redis. Deserializable (`#[serde(default)]`: every field may
/// be left out); `Debug` never shows the password.
///
/// ```
/// use dlock_redis::RedisConfig;
///
/// let config: RedisConfig = serde_json::from_str(
///     r#"{ "url": "redis://app:s3cret@127.0.0.1:6379/2", "key_prefix": "locks:", "request_timeout": "2s" }"#,
/// ).unwrap();
/// assert!(!format!("{config:?}").contains("s3cret"));
/// assert_eq!(config.request_timeout, std::time::Duration::from_secs(2));
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:pass@]host:port[/db]`, `rediss://...` for TLS, or
    /// `redis-cluster://host:port?node=host2:port2&node=...` (`rediss-cluster`
    /// for TLS) for a Redis Cluster. Default `redis://127.0.0.1:6379`.
    pub url: String,
    /// Prepended to every lock key (default `dlock:`). May be empty, so that
    /// dlock and other clients' `SET NX PX` locks on the same names exclude
    /// each other.
    pub key_prefix: String,
    /// How long to try to connect before reporting the server unavailable
    /// (default 5 s). Human-readable in config files: `"500ms"`, `"5s"`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one command may take (default 2 s).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379".to_owned(),
            key_prefix: "dlock:".to_owned(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
        }
    }
}

impl RedisConfig {
    /// The defaults with this URL.
    pub fn from_url(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Sets the key prefix.
    #[must_use]
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Sets both timeouts.
    #[must_use]
    pub fn timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.connect_timeout = connect;
        self.request_timeout = request;
        self
    }

    /// Checks the URL (its scheme, host and port; one host unless it is a
    /// cluster URL) and the timeouts, as connecting would.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the URL (credentials hidden) and
    /// what is wrong with it.
    pub fn validate(&self) -> Result<(), Error> {
        let a = dlock_core::driver::authority(&self.url)?;
        if a.hosts.len() > 1 && !self.is_cluster() {
            return Err(Error::InvalidConfig(format!(
                "URL {}: one Redis server per redis:// URL (use redlock:// for several independent nodes)",
                redact_url(&self.url)
            )));
        }
        self.to_fred().map(drop)
    }

    /// Checks the URL and timeouts and builds fred's configuration.
    pub(crate) fn to_fred(&self) -> Result<fred::types::config::Config, Error> {
        let scheme = self.url.split("://").next().unwrap_or_default();
        if !matches!(scheme, "redis" | "rediss" | "redis-cluster" | "rediss-cluster")
            || !self.url.contains("://")
        {
            return Err(Error::InvalidConfig(format!(
                "redis URL {}: the scheme must be redis://, rediss://, redis-cluster:// or rediss-cluster://",
                redact_url(&self.url)
            )));
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(Error::InvalidConfig(
                "redis timeouts must be greater than zero".to_owned(),
            ));
        }
        fred::types::config::Config::from_url(&self.url).map_err(|e| {
            // fred names the URL parser's error (`InvalidDomainCharacter`):
            // said in words.
            let why = dlock_core::plain_cause(&*dlock_core::BoxError::from(e.details().to_owned()));
            Error::InvalidConfig(format!("redis URL {}: {why}", redact_url(&self.url)))
        })
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.url.starts_with("redis-cluster://") || self.url.starts_with("rediss-cluster://")
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact_url(&self.url))
            .field("key_prefix", &self.key_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        let c = RedisConfig::from_url("redis://admin:hunter2@127.0.0.1:6379");
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn bad_urls_are_invalid_config_naming_the_problem() {
        for url in [
            "",
            "127.0.0.1:6379",
            "http://h:1",
            "redis://",
            "redis://h:notaport",
        ] {
            match RedisConfig::from_url(url).to_fred() {
                Err(Error::InvalidConfig(msg)) => assert!(msg.contains("redis"), "{url}: {msg}"),
                other => panic!("{url}: expected InvalidConfig, got {other:?}"),
            }
        }
        assert!(
            RedisConfig::from_url("redis://127.0.0.1:6379/1")
                .to_fred()
                .is_ok()
        );
    }

    #[test]
    fn defaults_fill_missing_fields() {
        let c: RedisConfig = serde_json::from_str(r#"{"key_prefix": ""}"#).unwrap();
        assert_eq!(c.url, "redis://127.0.0.1:6379");
        assert_eq!(c.key_prefix, "");
        assert!(serde_json::from_str::<RedisConfig>(r#"{"nope": 1}"#).is_err());
    }
}
