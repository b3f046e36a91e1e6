//! [`ZkConfig`]: where ZooKeeper is and how to talk to it.

use std::fmt;
use std::time::Duration;

use dlock_core::Error;
use serde::{Deserialize, Serialize};

/// The ACL of lock nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ZkAcl {
    /// Anyone may do anything (ZooKeeper's `OPEN_ACL_UNSAFE`, Curator's default).
    #[default]
    AnyoneAll,
    /// Only the creator's identity (needs `digest` authentication).
    CreatorAll,
}

/// How to reach ZooKeeper. Deserializable (`#[serde(default)]`); `Debug`
/// never shows the password.
///
/// ```
/// use dlock_zk::ZkConfig;
///
/// let config: ZkConfig = serde_json::from_str(r#"{
///     "connect": "10.0.0.1:2181,10.0.0.2:2181/app",
///     "user": "locks", "password": "s3cret", "session_timeout": "10s"
/// }"#).unwrap();
/// assert!(!format!("{config:?}").contains("s3cret"));
/// config.validate().unwrap();
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ZkConfig {
    /// `host:port[,host:port...][/chroot]`. Default `127.0.0.1:2181`.
    pub connect: String,
    /// The session timeout asked of the server (default 10 s; the server
    /// clamps it between 2 and 20 ticks). A crashed holder's lock is freed
    /// when its session expires, so this is the lock's TTL in that case.
    #[serde(with = "humantime_serde")]
    pub session_timeout: Duration,
    /// How long to try to connect (default 5 s).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one request may take (default 5 s).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// The parent of all lock paths (default `/dlock`): lock `NAME` lives at
    /// `{root}/NAME`.
    pub root: String,
    /// User for `digest` authentication.
    pub user: Option<String>,
    /// Password of `user`.
    pub password: Option<String>,
    /// The ACL of lock nodes (default anyone-all, as Curator).
    pub acl: ZkAcl,
}

impl Default for ZkConfig {
    fn default() -> Self {
        ZkConfig {
            connect: "127.0.0.1:2181".to_owned(),
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            root: "/dlock".to_owned(),
            user: None,
            password: None,
            acl: ZkAcl::AnyoneAll,
        }
    }
}

impl ZkConfig {
    /// The defaults with this connect string.
    pub fn new(connect: impl Into<String>) -> Self {
        ZkConfig {
            connect: connect.into(),
            ..Self::default()
        }
    }

    /// Reads `zk://[user:pass@]h1:2181,h2:2181[/chroot]` (digest auth); a
    /// host without a port gets 2181.
    ///
    /// ```
    /// let c = dlock_zk::ZkConfig::from_url("zk://h1,h2:2182/app").unwrap();
    /// assert_eq!(c.connect, "h1:2181,h2:2182/app");
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the URL (credentials hidden): another
    /// scheme, a missing host, a bad port, or what
    /// [`validate`](Self::validate) refuses.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        use dlock_core::driver::{authority, redact_url, with_port};
        if !url.starts_with("zk://") {
            return Err(Error::InvalidConfig(format!(
                "ZooKeeper URL {}: the scheme must be zk://",
                redact_url(url)
            )));
        }
        let a = authority(url)?;
        let hosts: Vec<String> = a.hosts.iter().map(|h| with_port(h, 2181)).collect();
        let chroot = a.path.split('?').next().unwrap_or_default();
        let config = ZkConfig {
            user: a.user.map(str::to_owned),
            password: a.password.map(str::to_owned),
            ..ZkConfig::new(format!("{}{chroot}", hosts.join(",")))
        };
        config.validate()?;
        Ok(config)
    }

    /// Sets the session timeout.
    #[must_use]
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets the root path.
    #[must_use]
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// Checks the connect string, root, auth and timeouts.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the problem.
    pub fn validate(&self) -> Result<(), Error> {
        let invalid = |what: String| Err(Error::InvalidConfig(format!("zookeeper: {what}")));
        let (hosts, chroot) = match self.connect.find('/') {
            Some(i) => (&self.connect[..i], Some(&self.connect[i..])),
            None => (self.connect.as_str(), None),
        };
        if hosts.is_empty() {
            return invalid(format!("connect string {:?} names no host", self.connect));
        }
        for host in hosts.split(',') {
            let ok = host.rsplit_once(':').is_some_and(|(h, p)| {
                !h.is_empty() && !h.contains(char::is_whitespace) && p.parse::<u16>().is_ok_and(|p| p > 0)
            });
            if !ok {
                return invalid(format!("{host:?} in {:?} is not host:port", self.connect));
            }
        }
        if let Some(chroot) = chroot
            && !valid_path(chroot)
        {
            return invalid(format!("chroot {chroot:?} is not a valid path"));
        }
        if !valid_path(&self.root) {
            return invalid(format!(
                "root {:?} is not an absolute path like /dlock",
                self.root
            ));
        }
        if self.password.is_some() != self.user.is_some() {
            return invalid("user and password go together".to_owned());
        }
        if self.acl == ZkAcl::CreatorAll && self.user.is_none() {
            return invalid("the creator-all ACL needs digest authentication (user, password)".to_owned());
        }
        if self.session_timeout.is_zero() || self.connect_timeout.is_zero() || self.request_timeout.is_zero()
        {
            return invalid("timeouts must be greater than zero".to_owned());
        }
        Ok(())
    }
}

/// An absolute path without empty, `.` or `..` segments and without a
/// trailing slash.
fn valid_path(path: &str) -> bool {
    path.strip_prefix('/').is_some_and(|rest| {
        !rest.is_empty() && rest.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
    })
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("connect", &self.connect)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("root", &self.root)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("acl", &self.acl)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_strings_and_roots_are_checked() {
        for bad in ["", "h", "h:x", ":1", "h:1,", "h:1/", "h:1//a", "h:1/a/../b"] {
            assert!(ZkConfig::new(bad).validate().is_err(), "{bad}");
        }
        for good in ["h:1", "h:1,g:2", "h:1,g:2/app", "10.0.0.1:2181/a/b"] {
            ZkConfig::new(good).validate().unwrap();
        }
        for bad_root in ["", "dlock", "/", "/a/", "/a//b", "/./a"] {
            assert!(
                ZkConfig::new("h:1").root(bad_root).validate().is_err(),
                "{bad_root}"
            );
        }
        let creator_only = ZkConfig {
            acl: ZkAcl::CreatorAll,
            ..ZkConfig::new("h:1")
        };
        assert!(creator_only.validate().is_err());
    }
}
