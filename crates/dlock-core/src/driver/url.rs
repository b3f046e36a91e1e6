//! Where the servers are, as messages show it: endpoints without
//! credentials, and this machine's name.

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

#[cfg(test)]
mod tests {
    use super::*;

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
