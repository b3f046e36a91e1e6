//! [`EtcdConfig`]: where etcd is and how to talk to it.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use dlock_core::Error;
use serde::{Deserialize, Serialize};

/// How to reach etcd. Deserializable (`#[serde(default)]`); `Debug` never
/// shows the password.
///
/// ```
/// use dlock_etcd::EtcdConfig;
///
/// let config: EtcdConfig = serde_json::from_str(r#"{
///     "endpoints": ["http://10.0.0.1:2379", "10.0.0.2:2379"],
///     "user": "app", "password": "s3cret", "connect_timeout": "2s"
/// }"#).unwrap();
/// assert!(!format!("{config:?}").contains("s3cret"));
/// config.validate().unwrap();
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdConfig {
    /// Members to talk to: `http://host:port`, `https://host:port`, or
    /// `host:port`. Default `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// User for etcd authentication, if enabled.
    pub user: Option<String>,
    /// Password of `user`.
    pub password: Option<String>,
    /// Use TLS (also implied by `https://` endpoints).
    pub tls: bool,
    /// A PEM file with the CA that signed the servers' certificates (TLS).
    pub ca_file: Option<PathBuf>,
    /// Prepended to every lock name (default `dlock/`). May be empty: then
    /// `etcdctl lock NAME` and Go's `concurrency.Mutex` on `NAME` exclude dlock
    /// on the same name, and the other way round.
    pub key_prefix: String,
    /// How long to try to reach a member (default 5 s).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one request may take (default 5 s).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".to_owned()],
            user: None,
            password: None,
            tls: false,
            ca_file: None,
            key_prefix: "dlock/".to_owned(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
        }
    }
}

impl EtcdConfig {
    /// The defaults with these endpoints.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Reads `etcd://[user:pass@]h1:2379,h2:2379` (`etcds://`: TLS); a
    /// host without a port gets 2379.
    ///
    /// ```
    /// let c = dlock_etcd::EtcdConfig::from_url("etcds://u:p@h1,h2:2380").unwrap();
    /// assert_eq!(c.endpoints, ["https://h1:2379", "https://h2:2380"]);
    /// assert!(c.tls && c.user.as_deref() == Some("u"));
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the URL (credentials hidden): another
    /// scheme, a path, a missing host, a bad port, or what
    /// [`validate`](Self::validate) refuses.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        use dlock_core::driver::{authority, redact_url, with_port};
        let tls = match url.split_once("://").map(|(s, _)| s) {
            Some("etcd") => false,
            Some("etcds") => true,
            _ => {
                return Err(Error::InvalidConfig(format!(
                    "etcd URL {}: the scheme must be etcd:// or etcds://",
                    redact_url(url)
                )));
            }
        };
        let a = authority(url)?;
        if !a.path.is_empty() && a.path != "/" {
            return Err(Error::InvalidConfig(format!(
                "URL {}: etcd URLs take no path",
                redact_url(url)
            )));
        }
        let http = if tls { "https" } else { "http" };
        let config = EtcdConfig {
            user: a.user.map(str::to_owned),
            password: a.password.map(str::to_owned),
            tls,
            ..EtcdConfig::new(a.hosts.iter().map(|h| format!("{http}://{}", with_port(h, 2379))))
        };
        config.validate()?;
        Ok(config)
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

    /// Checks the endpoints and timeouts.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the problem: no endpoint, an endpoint
    /// that is not `[http[s]://]host:port`, a password without a user, a zero
    /// timeout.
    pub fn validate(&self) -> Result<(), Error> {
        if self.endpoints.is_empty() {
            return Err(Error::InvalidConfig("etcd: no endpoints".to_owned()));
        }
        for e in &self.endpoints {
            let rest = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"))
                .unwrap_or(e);
            let valid = match rest.rsplit_once(':') {
                Some((host, port)) => {
                    !host.is_empty()
                        && !rest.contains("://")
                        && !host.contains(|c: char| c.is_whitespace() || c == '/' || c == '@')
                        && port.parse::<u16>().is_ok_and(|p| p > 0)
                }
                None => false,
            };
            if !valid {
                return Err(Error::InvalidConfig(format!(
                    "etcd endpoint {:?} is not of the form [http[s]://]host:port",
                    dlock_core::driver::redact_url(e)
                )));
            }
        }
        if self.password.is_some() && self.user.is_none() {
            return Err(Error::InvalidConfig("etcd: a password without a user".to_owned()));
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(Error::InvalidConfig(
                "etcd timeouts must be greater than zero".to_owned(),
            ));
        }
        Ok(())
    }

    /// Whether TLS is on (the flag, or any `https://` endpoint).
    pub fn uses_tls(&self) -> bool {
        self.tls || self.endpoints.iter().any(|e| e.starts_with("https://"))
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
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
    fn endpoints_are_checked() {
        for bad in [
            "",
            "localhost",
            "http://",
            "http://h:",
            "h:99999",
            "h:0",
            "ftp://h:1",
            "a b:1",
            "http://h:1/x",
        ] {
            let e = EtcdConfig::new([bad]).validate().unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e}");
        }
        EtcdConfig::new(["127.0.0.1:2379", "http://h:1", "https://[::1]:2379"])
            .validate()
            .unwrap();
        assert!(EtcdConfig::new(Vec::<String>::new()).validate().is_err());
        assert!(EtcdConfig::new(["https://h:1"]).uses_tls());
    }

    #[test]
    fn password_is_redacted() {
        let c = EtcdConfig {
            user: Some("u".into()),
            password: Some("hunter2".into()),
            ..EtcdConfig::default()
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
