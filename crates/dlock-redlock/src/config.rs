//! [`RedlockConfig`]: the nodes and the knobs of the algorithm.

use std::fmt;
use std::time::Duration;

use dlock_core::Error;
use serde::{Deserialize, Serialize};

/// How to reach the Redlock nodes. Deserializable (`#[serde(default)]`);
/// `Debug` never shows passwords.
///
/// ```
/// use dlock_redlock::RedlockConfig;
///
/// let config: RedlockConfig = serde_json::from_str(r#"{
///     "nodes": ["redis://:pw@10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"],
///     "request_timeout": "50ms"
/// }"#).unwrap();
/// assert_eq!(config.quorum(), 2);
/// assert!(!format!("{config:?}").contains(":pw@"));
/// ```
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedlockConfig {
    /// The URLs of the independent nodes (`redis://` or `rediss://`), an odd
    /// number, at least 3. They must not replicate each other.
    pub nodes: Vec<String>,
    /// The bound on each request to each node (default 50 ms): a hung node
    /// costs at most this, never the whole attempt (a node that must first
    /// load a script, after a restart, is asked up to three times).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Retries after a failed attempt wait a random time between half of this
    /// and all of it (default 100 ms), or until a release notice.
    #[serde(with = "humantime_serde")]
    pub retry_jitter: Duration,
    /// The clock-drift factor of the validity computation (default 0.01):
    /// validity = ttl - elapsed - (ttl x factor + 2 ms).
    pub drift_factor: f64,
    /// Prepended to every lock key (default `dlock:`).
    pub key_prefix: String,
    /// How long `connect` waits for a quorum of nodes (default 5 s).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
}

impl Default for RedlockConfig {
    fn default() -> Self {
        RedlockConfig {
            nodes: Vec::new(),
            request_timeout: Duration::from_millis(50),
            retry_jitter: Duration::from_millis(100),
            drift_factor: 0.01,
            key_prefix: "dlock:".to_owned(),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl RedlockConfig {
    /// The defaults with these node URLs.
    pub fn new<S: Into<String>>(nodes: impl IntoIterator<Item = S>) -> Self {
        RedlockConfig {
            nodes: nodes.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Reads `redlock://[user:pass@]h1:6379,h2:6379,h3:6379[/db]`: one
    /// `redis://` node per host (a host without a port gets 6379), each
    /// with the URL's credentials and database.
    ///
    /// ```
    /// let c = dlock_redlock::RedlockConfig::from_url("redlock://:pw@a,b:7000,c/2").unwrap();
    /// assert_eq!(c.nodes, ["redis://:pw@a:6379/2", "redis://:pw@b:7000/2", "redis://:pw@c:6379/2"]);
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the URL (credentials hidden): another
    /// scheme, a missing host, a bad port, or what
    /// [`validate`](Self::validate) refuses.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        use dlock_core::driver::{authority, redact_url, with_port};
        if !url.starts_with("redlock://") {
            return Err(Error::InvalidConfig(format!(
                "Redlock URL {}: the scheme must be redlock://",
                redact_url(url)
            )));
        }
        let a = authority(url)?;
        let userinfo = match (a.user, a.password) {
            (user, Some(pw)) => format!("{}:{pw}@", user.unwrap_or("")),
            (Some(user), None) => format!("{user}@"),
            (None, None) => String::new(),
        };
        let nodes = a
            .hosts
            .iter()
            .map(|h| format!("redis://{userinfo}{}{}", with_port(h, 6379), a.path));
        let config = RedlockConfig::new(nodes);
        config.validate()?;
        Ok(config)
    }

    /// How many nodes make a quorum: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The drift allowance for a TTL: `ttl x drift_factor + 2 ms`.
    pub fn drift(&self, ttl: Duration) -> Duration {
        self.drift_of().of(ttl)
    }

    /// The same drift as the driver layer's [`Drift`](dlock_core::driver::Drift),
    /// which the guards' local deadlines use: acquire, extend and the
    /// guard agree on one validity. (A factor outside `[0, 0.5)` is refused
    /// by [`validate`](Self::validate); unvalidated, it falls back to the default.)
    pub fn drift_of(&self) -> dlock_core::driver::Drift {
        dlock_core::driver::Drift::new(self.drift_factor, Duration::from_millis(2)).unwrap_or_default()
    }

    /// Checks the configuration.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the problem: fewer than 3 or an even
    /// number of nodes, a node URL that is not `redis://` / `rediss://` or does
    /// not parse, a zero timeout, a drift factor outside `[0, 0.5)`.
    pub fn validate(&self) -> Result<(), Error> {
        let n = self.nodes.len();
        if n < 3 || n.is_multiple_of(2) {
            return Err(Error::InvalidConfig(format!(
                "redlock needs an odd number of at least 3 independent nodes, got {n}"
            )));
        }
        for url in &self.nodes {
            let scheme = url.split("://").next().unwrap_or_default();
            if !url.contains("://") || !matches!(scheme, "redis" | "rediss") {
                return Err(Error::InvalidConfig(format!(
                    "redlock node {}: the scheme must be redis:// or rediss://",
                    dlock_core::driver::redact_url(url)
                )));
            }
            fred::types::config::Config::from_url(url).map_err(|e| {
                Error::InvalidConfig(format!(
                    "redlock node {}: {}",
                    dlock_core::driver::redact_url(url),
                    e.details()
                ))
            })?;
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::InvalidConfig(
                "redlock timeouts must be greater than zero".to_owned(),
            ));
        }
        if !(0.0..0.5).contains(&self.drift_factor) {
            return Err(Error::InvalidConfig(format!(
                "redlock drift factor {} is outside [0, 0.5)",
                self.drift_factor
            )));
        }
        Ok(())
    }
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|u| dlock_core::driver::redact_url(u))
            .collect();
        f.debug_struct("RedlockConfig")
            .field("nodes", &nodes)
            .field("request_timeout", &self.request_timeout)
            .field("retry_jitter", &self.retry_jitter)
            .field("drift_factor", &self.drift_factor)
            .field("key_prefix", &self.key_prefix)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("redis://127.0.0.1:{}", 7000 + i))
            .collect()
    }

    #[test]
    fn needs_an_odd_number_of_at_least_three_nodes() {
        for n in [0, 1, 2, 4, 6] {
            let e = RedlockConfig::new(nodes(n)).validate().unwrap_err();
            assert!(
                matches!(e, Error::InvalidConfig(ref m) if m.contains(&n.to_string())),
                "{n}: {e}"
            );
        }
        for n in [3, 5, 7] {
            RedlockConfig::new(nodes(n)).validate().unwrap();
            assert_eq!(RedlockConfig::new(nodes(n)).quorum(), n / 2 + 1);
        }
    }

    #[test]
    fn refuses_bad_urls_timeouts_and_drift() {
        let mut c = RedlockConfig::new(nodes(3));
        c.nodes[1] = "http://x:1".into();
        assert!(matches!(c.validate(), Err(Error::InvalidConfig(m)) if m.contains("http://x:1")));
        let mut c = RedlockConfig::new(nodes(3));
        c.request_timeout = Duration::ZERO;
        assert!(c.validate().is_err());
        let mut c = RedlockConfig::new(nodes(3));
        c.drift_factor = 0.7;
        assert!(c.validate().is_err());
    }

    #[test]
    fn drift_is_factor_times_ttl_plus_two_ms() {
        let c = RedlockConfig::new(nodes(3));
        assert_eq!(c.drift(Duration::from_secs(10)), Duration::from_millis(102));
    }
}
