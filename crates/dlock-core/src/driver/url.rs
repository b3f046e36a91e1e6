//! Where the servers are, as messages show it: endpoints without
//! credentials, and this machine's name; the authority of a backend URL.

use crate::{Error, Result};

/// The `host:port` part of `url` (or of each of its comma-separated
/// hosts), for messages: no scheme, no credentials, no path or query.
///
/// ```
/// use dlock_core::driver::endpoint_of;
/// assert_eq!(endpoint_of("redis://:secret@10.0.0.1:6379/2"), "10.0.0.1:6379");
/// assert_eq!(endpoint_of("http://127.0.0.1:2379"), "127.0.0.1:2379");
/// assert_eq!(endpoint_of("h1:2181,h2:2181/chroot"), "h1:2181,h2:2181");
/// assert_eq!(endpoint_of("redis://u:p/a@ss@h:1/0"), "h:1");
/// ```
pub fn endpoint_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    // Everything up to the last `@` is userinfo, whatever it holds (as in
    // `redact_url`): a password may hold `/` or `@`.
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    hosts.split(['/', '?', '#']).next().unwrap_or_default().to_owned()
}

/// This machine's name, for the owner values drivers write (whitespace
/// replaced, so it stays one word): what an operator sees as the holder's
/// host.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .map(|h| h.trim().replace(char::is_whitespace, "_"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned())
}

/// `url` with its credentials hidden, for messages and `Debug`: everything
/// between `scheme://` and the *last* `@` is userinfo (a password may hold
/// `/`, `?`, `#` or `@` unescaped; hiding too much is better than printing
/// a secret), shown as `user:***` (or `***` without a user); query
/// parameters named like secrets (`password`, `pass`, `pwd`, `token`,
/// `secret`, `auth`) have their values hidden too.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        // Not a URL (a typo such as `redis:/u:pw@h`): anything up to the
        // last `@` may be a credential.
        return match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_owned(),
        };
    };
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((userinfo, rest)) => (Some(userinfo), rest),
        None => (None, rest),
    };
    let mut out = format!("{scheme}://");
    if let Some(userinfo) = userinfo {
        match userinfo.split_once(':') {
            Some((user, _)) if !user.contains(['/', '?', '#']) => {
                out.push_str(user);
                out.push_str(":***@");
            }
            _ => out.push_str("***@"),
        }
    }
    let (before, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    out.push_str(before);
    if let Some(query) = query {
        out.push('?');
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((name, _))
                    if ["password", "pass", "pwd", "token", "secret", "auth"]
                        .contains(&name.to_ascii_lowercase().as_str()) =>
                {
                    format!("{name}=***")
                }
                _ => p.to_owned(),
            })
            .collect();
        out.push_str(&params.join("&"));
    }
    out
}

/// Splits `[user[:password]@]hosts[/path][?query]` (what follows `scheme://`).
/// Its `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Authority<'a> {
    /// The user, if any.
    pub user: Option<&'a str>,
    /// The password, if any.
    pub password: Option<&'a str>,
    /// The comma-separated hosts (`host[:port]` each).
    pub hosts: Vec<&'a str>,
    /// Everything after the hosts (`/path?query`), maybe empty.
    pub path: &'a str,
}

impl std::fmt::Debug for Authority<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("user", &self.user)
            .field("password", &self.password.map(|_| "***"))
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .finish()
    }
}

/// Reads what follows the `scheme://` of `url`.
///
/// # Errors
///
/// [`Error::InvalidConfig`] naming the URL (its credentials hidden): a URL
/// without `://`, a missing host, a port that is not a number, an `@`
/// after the host (a password holding `/`, `?` or `#` not percent-encoded).
pub fn authority(url: &str) -> Result<Authority<'_>> {
    let Some((_, rest)) = url.split_once("://") else {
        return Err(Error::InvalidConfig(format!(
            "{:?} is not a URL (scheme://...)",
            redact_url(url)
        )));
    };
    // The authority ends at the first `/`, `?` or `#` (so a chroot or a
    // query may hold `@`); its userinfo runs to its last `@`. An `@` past the
    // authority is refused when the authority holds none: it is most likely
    // a password holding `/`, `?` or `#`, which must be percent-encoded, and
    // guessing would either show a piece of it as a host or connect
    // somewhere else. (`redact_url` hides everything up to the last `@`.)
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(end);
    if !auth.contains('@') && path.contains('@') {
        return Err(Error::InvalidConfig(format!(
            "URL {}: an `@` after the host: a password holding `/`, `?` or `#` must be percent-encoded",
            redact_url(url)
        )));
    }
    let (userinfo, hosts) = match auth.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, auth),
    };
    let (user, password) = match userinfo {
        Some(u) => match u.split_once(':') {
            Some((user, pw)) => ((!user.is_empty()).then_some(user), Some(pw)),
            None => (Some(u), None),
        },
        None => (None, None),
    };
    let hosts: Vec<&str> = hosts.split(',').collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err(Error::InvalidConfig(format!(
            "URL {}: missing host",
            redact_url(url)
        )));
    }
    for h in &hosts {
        if let Some((_, port)) = h.rsplit_once(':')
            && !port.contains(']')
            && port.parse::<u16>().is_err()
        {
            return Err(Error::InvalidConfig(format!(
                "URL {}: port {port:?} of host {h:?} is not a number",
                redact_url(url)
            )));
        }
    }
    Ok(Authority {
        user,
        password,
        hosts,
        path,
    })
}

/// `host` with `:port` added unless it has a port.
pub fn with_port(host: &str, port: u16) -> String {
    if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        host.to_owned()
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_authority_never_shows_its_password() {
        let a = authority("zk://u:s3cret@h:2181/app").unwrap();
        assert_eq!(
            (a.user, a.password, a.hosts.clone(), a.path),
            (Some("u"), Some("s3cret"), vec!["h:2181"], "/app")
        );
        assert!(!format!("{a:?}").contains("s3cret"), "{a:?}");
    }

    #[test]
    fn urls_are_redacted_whatever_the_password_holds() {
        for (url, shown) in [
            ("redis://u:p@h:1/2", "redis://u:***@h:1/2"),
            ("rediss://:p@h:1", "rediss://:***@h:1"),
            ("redis://token@h", "redis://***@h"),
            ("redis://h:1/0", "redis://h:1/0"),
            ("no-scheme", "no-scheme"),
            // A typo for a URL: what may be a credential is hidden all the same.
            ("redis:/u:pw@h:1", "***@h:1"),
            ("redis://u:se/cret@h", "redis://u:***@h"),
            ("redis://u:se?cret@h/0", "redis://u:***@h/0"),
            ("redis://u:a@b@h", "redis://u:***@h"),
            (
                "etcd://h:2379?user=u&password=s3cret",
                "etcd://h:2379?user=u&password=***",
            ),
            ("redlock://u:p@h1,h2", "redlock://u:***@h1,h2"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
            assert!(!redact_url(url).contains("cret"), "{url}");
        }
    }
}
