//! [`PostgresConfig`]: where the server is, which table holds the locks, and
//! how long to wait.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::Error;
/// The URL for messages and `Debug`, its credentials hidden; a connection
/// string that is not a URL (libpq's `host=... password=...` form) is not
/// shown at all, as any of it may be a secret.
fn shown(url: &str) -> String {
    if url.contains("://") {
        dlock_core::driver::redact_url(url)
    } else {
        "<not a URL>".to_owned()
    }
}
use serde::{Deserialize, Serialize};

/// How to reach PostgreSQL, and the lock table. Deserializable
/// (`#[serde(default)]`: every field may be left out); `Debug` never shows
/// the password.
///
/// ```
/// use dlock_postgres::PostgresConfig;
///
/// let config: PostgresConfig = serde_json::from_str(
///     r#"{ "url": "postgres://app:s3cret@127.0.0.1:5432/app", "table": "locks", "request_timeout": "2s" }"#,
/// ).unwrap();
/// assert!(!format!("{config:?}").contains("s3cret"));
/// assert_eq!(config.table, "locks");
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// `postgres://[user[:password]@]host[:port][,host2[:port2]...][/database][?param=value&...]`
    /// (`postgresql://` too). Default `postgres://postgres@127.0.0.1:5432/postgres`.
    ///
    /// TLS: `sslmode=require` (or `verify-ca`, `verify-full`: all three
    /// verify the server's certificate chain and host name, stricter than
    /// libpq's `require`), and `sslrootcert=PATH` for the CA to trust
    /// instead of the system's. `sslmode=prefer` (the default) and
    /// `disable` connect without TLS: dlock never makes a TLS connection it
    /// does not verify. The name verified is the URL's host, so with TLS a
    /// `hostaddr` needs a host name beside it. Client certificates and
    /// `sslnegotiation=direct` are not supported (an
    /// [`Error::InvalidConfig`] at connect).
    pub url: String,
    /// The schema of the lock table (default `public`).
    pub schema: String,
    /// The lock table (default `dlock_locks`): created at connect if absent
    /// (see [`PostgresConfig::create_table`] for the statement).
    pub table: String,
    /// Whether `connect` creates the table when it is absent (default
    /// true). Off, a missing table is an error naming the statement.
    pub create_table: bool,
    /// A PEM file of the certificate authorities to trust, instead of the
    /// system's (what `sslrootcert=PATH` in the URL sets; not both). It
    /// turns TLS on unless the URL says `sslmode=disable`, which is an
    /// error.
    pub ca_file: Option<PathBuf>,
    /// How long to try to connect before reporting the server unavailable
    /// (default 5 s).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one statement may take (default 2 s).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Delete the rows of names nobody has held for this long (`lock_until`
    /// older than now minus this), at connect and then hourly, in the
    /// background (default `None`: rows stay, as ShedLock leaves them). See
    /// [`PostgresLock::prune`](crate::PostgresLock::prune), which does it
    /// once, and why a pruned name's next token is still higher.
    ///
    /// Off by default because deleting needs the `DELETE` right on the
    /// table, which a role given only `SELECT, INSERT, UPDATE` (all that
    /// locking needs) lacks, and because a table shared with ShedLock or
    /// other tools is the operator's to clean. Turn it on where names are
    /// many and short-lived (`job:<id>`): a day (`"1d"`) is a good bound.
    /// A failed prune is logged (`tracing`, target `dlock`) and tried again
    /// at the next one.
    #[serde(with = "humantime_serde")]
    pub prune_after: Option<Duration>,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: "postgres://postgres@127.0.0.1:5432/postgres".to_owned(),
            schema: "public".to_owned(),
            table: "dlock_locks".to_owned(),
            create_table: true,
            ca_file: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            prune_after: None,
        }
    }
}

impl PostgresConfig {
    /// The defaults with this URL.
    pub fn from_url(url: impl Into<String>) -> Self {
        PostgresConfig {
            url: url.into(),
            ..Self::default()
        }
    }

    /// Checks the URL (scheme, host, port, TLS parameters), the table name
    /// and the timeouts, as connecting would: that includes the TLS set-up,
    /// which reads the CA file (`sslrootcert`, `ca_file`) or the system's
    /// roots.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the URL (credentials hidden) and
    /// what is wrong with it.
    pub fn validate(&self) -> Result<(), Error> {
        dlock_core::driver::authority(&self.url)?;
        self.to_tokio().map(drop)
    }

    /// Sets the schema and table of the locks.
    #[must_use]
    pub fn table(mut self, schema: impl Into<String>, table: impl Into<String>) -> Self {
        self.schema = schema.into();
        self.table = table.into();
        self
    }

    /// Sets both timeouts.
    #[must_use]
    pub fn timeouts(mut self, connect: Duration, request: Duration) -> Self {
        self.connect_timeout = connect;
        self.request_timeout = request;
        self
    }

    /// The lock table's statement, for teams that create schema by
    /// migration (what `connect` runs when the table is absent):
    ///
    /// ```
    /// let sql = dlock_postgres::PostgresConfig::default().create_table_sql().unwrap();
    /// assert!(sql.starts_with(r#"CREATE TABLE IF NOT EXISTS "public"."dlock_locks""#));
    /// ```
    ///
    /// The first four columns are ShedLock's (`name`, `lock_until`,
    /// `locked_at`, `locked_by`, times in UTC), so ShedLock's JDBC provider
    /// and dlock can share one table and exclude each other; `fence` is the
    /// latest grant's fencing token.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a schema or table that is not a plain
    /// identifier.
    pub fn create_table_sql(&self) -> Result<String, Error> {
        Ok(format!(
            "CREATE TABLE IF NOT EXISTS {} (\n    \
             name TEXT NOT NULL PRIMARY KEY,\n    \
             lock_until TIMESTAMP NOT NULL,\n    \
             locked_at TIMESTAMP NOT NULL,\n    \
             locked_by TEXT NOT NULL,\n    \
             fence BIGINT NOT NULL DEFAULT 0\n)",
            self.qualified_table()?
        ))
    }

    /// `"schema"."table"`, checked.
    pub(crate) fn qualified_table(&self) -> Result<String, Error> {
        Ok(format!(
            "\"{}\".\"{}\"",
            identifier(&self.schema)?,
            identifier(&self.table)?
        ))
    }

    /// The notification channel of this table's releases.
    pub(crate) fn channel(&self) -> String {
        // At most 63 bytes, as every identifier.
        let mut channel = format!("dlock_released_{}_{}", self.schema, self.table);
        channel.truncate(63);
        channel
    }

    /// Checks the URL, names and timeouts, and builds tokio-postgres's
    /// configuration and the TLS connector (which reads the CA file, or
    /// the system's certificates).
    pub(crate) fn to_tokio(&self) -> Result<(tokio_postgres::Config, Tls), Error> {
        let bad = |why: String| Error::InvalidConfig(format!("postgres URL {}: {why}", shown(&self.url)));
        if !(self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")) {
            return Err(bad("the scheme must be postgres:// or postgresql://".to_owned()));
        }
        if self.connect_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(Error::InvalidConfig(
                "postgres timeouts must be greater than zero".to_owned(),
            ));
        }
        self.qualified_table()?;
        let params = TlsParams::take_from(&self.url).map_err(bad)?;
        let mut config = tokio_postgres::Config::from_str(&params.url).map_err(|e| bad(e.to_string()))?;
        let ca_file = match (self.ca_file.clone(), params.root_cert) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "sslrootcert in the URL and ca_file in the configuration: give one".to_owned(),
                ));
            }
            (Some(file), None) | (None, Some(file)) => Some(file),
            (None, None) => None,
        };
        use tokio_postgres::config::SslMode;
        let verified = params.verify || config.get_ssl_mode() == SslMode::Require;
        let tls = if verified || ca_file.is_some() {
            if params.disable {
                return Err(bad(
                    "sslmode=disable, and TLS asked for by a CA file or sslmode=verify-*: drop one"
                        .to_owned(),
                ));
            }
            if config.get_hosts().is_empty() {
                return Err(bad(
                    "TLS verifies the server by name: give the host its certificate names, \
                     with hostaddr for the address"
                        .to_owned(),
                ));
            }
            if config.get_ssl_negotiation() == tokio_postgres::config::SslNegotiation::Direct {
                return Err(bad(
                    "sslnegotiation=direct is not supported (it needs ALPN): leave it out".to_owned(),
                ));
            }
            config.ssl_mode(SslMode::Require);
            Tls::Verified(tls_connector(ca_file.as_ref())?)
        } else {
            // prefer (the default) or disable: no TLS, as no TLS
            // connection is made without verifying it.
            config.ssl_mode(SslMode::Disable);
            Tls::Off
        };
        if config.get_user().is_none() {
            config.user("postgres");
        }
        config.connect_timeout(self.connect_timeout);
        config.application_name("dlock");
        Ok((config, tls))
    }
}

/// Where a configuration connects, for messages: `host:port/database` (each
/// host of a list, comma-separated), never a credential.
pub(crate) fn endpoint(config: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let ports = config.get_ports();
    let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
    let hosts: Vec<String> = if config.get_hosts().is_empty() {
        config
            .get_hostaddrs()
            .iter()
            .enumerate()
            .map(|(i, addr)| std::net::SocketAddr::new(*addr, port(i)).to_string())
            .collect()
    } else {
        config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| match host {
                Host::Tcp(name) => format!("{name}:{}", port(i)),
                #[cfg(unix)]
                Host::Unix(dir) => format!("{}:{}", dir.display(), port(i)),
            })
            .collect()
    };
    // PostgreSQL's default database is the user's name.
    let database = config.get_dbname().or(config.get_user()).unwrap_or("postgres");
    format!("{}/{database}", hosts.join(","))
}

/// How connections are made: in the clear, or over TLS with the server's
/// certificate verified.
#[derive(Clone)]
pub(crate) enum Tls {
    Off,
    Verified(tokio_postgres_rustls::MakeRustlsConnect),
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tls::Off => "Off",
            Tls::Verified(_) => "Verified",
        })
    }
}

/// The URL with the TLS parameters tokio-postgres does not know taken out
/// (`sslrootcert`, and `sslmode=verify-ca|verify-full`, read as `require`
/// with verification, which `require` always has here).
struct TlsParams {
    url: String,
    root_cert: Option<PathBuf>,
    verify: bool,
    disable: bool,
}

impl TlsParams {
    fn take_from(url: &str) -> Result<Self, String> {
        // The query starts at the first `?` after the credentials (a raw
        // `?` may be in a password, as tokio-postgres reads it).
        let after = url.find("://").map_or(0, |i| i + 3);
        let host_from = url[after..].find('@').map_or(after, |i| after + i + 1);
        let split = url[host_from..].find('?').map(|i| host_from + i);
        let Some((base, query)) = split.map(|i| (&url[..i], &url[i + 1..])) else {
            return Ok(TlsParams {
                url: url.to_owned(),
                root_cert: None,
                verify: false,
                disable: false,
            });
        };
        let mut kept = Vec::new();
        let (mut root_cert, mut verify, mut disable) = (None, false, false);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match (key, value) {
                ("sslrootcert", "") => return Err("sslrootcert needs a path".to_owned()),
                // libpq 16's word for the system's certificates, which
                // implies verify-full there, and TLS here.
                ("sslrootcert", "system") => verify = true,
                ("sslrootcert", path) => root_cert = Some(PathBuf::from(percent_decoded(path)?)),
                ("sslmode", "verify-ca" | "verify-full") => verify = true,
                ("sslmode", mode) => {
                    disable = mode == "disable";
                    kept.push(pair);
                }
                _ => kept.push(pair),
            }
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok(TlsParams {
            url,
            root_cert,
            verify,
            disable,
        })
    }
}

/// `%XX` decoded (a path may hold characters a URL cannot).
fn percent_decoded(s: &str) -> Result<String, String> {
    let bad = || format!("{s:?} is not percent-encoded properly");
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .ok_or_else(bad)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad())
}

/// A rustls connector (ring) trusting the CA file's certificates, or the
/// system's.
fn tls_connector(ca_file: Option<&PathBuf>) -> Result<tokio_postgres_rustls::MakeRustlsConnect, Error> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let invalid = |why: String| Error::InvalidConfig(format!("postgres TLS: {why}"));
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| invalid(format!("reading the CA file {}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(invalid(format!("no certificate in {}", path.display())));
            }
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| invalid(format!("a certificate in {}: {e}", path.display())))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            // Unreadable ones are skipped, as rustls' own examples do; none
            // at all is an error.
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(invalid(
                    "no system certificate found to verify the server with: give sslrootcert=PATH".to_owned(),
                ));
            }
        }
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// `name` if it is a plain identifier (letters, digits, `_`, not starting
/// with a digit, at most 63 bytes), so it can be quoted into statements.
fn identifier(name: &str) -> Result<&str, Error> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if ok {
        Ok(name)
    } else {
        Err(Error::InvalidConfig(format!(
            "postgres: {name:?} is not a plain identifier (letters, digits and _, not starting with a digit, at most 63 bytes)"
        )))
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &shown(&self.url))
            .field("schema", &self.schema)
            .field("table", &self.table)
            .field("create_table", &self.create_table)
            .field("ca_file", &self.ca_file)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("prune_after", &self.prune_after)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_names_and_timeouts_are_checked() {
        assert!(
            PostgresConfig::from_url("postgres://u:p@127.0.0.1:5432/db")
                .to_tokio()
                .is_ok()
        );
        assert!(
            PostgresConfig::from_url("postgresql://127.0.0.1/db?sslmode=disable")
                .to_tokio()
                .is_ok()
        );
        for bad in [
            "redis://127.0.0.1:6379",
            "postgres://u:p@127.0.0.1:notaport/db",
            "postgres://127.0.0.1/db?sslmode=bogus",
            "postgres://127.0.0.1/db?sslrootcert=",
            "postgres://127.0.0.1/db?sslrootcert=%zz",
            "postgres://127.0.0.1/db?sslmode=require&sslrootcert=/nonexistent.pem",
            "postgres://127.0.0.1/db?sslmode=disable&sslrootcert=/nonexistent.pem",
            "postgres://127.0.0.1/db?sslcert=/client.pem",
        ] {
            let e = PostgresConfig::from_url(bad).to_tokio().unwrap_err();
            assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e:?}");
        }
        let e = PostgresConfig::from_url("postgres://u:s3cret@127.0.0.1:x/db")
            .to_tokio()
            .unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        for name in ["", "1locks", "a-b", "a\"b", &"x".repeat(64)] {
            let config = PostgresConfig::default().table("public", name);
            assert!(config.to_tokio().is_err(), "{name:?}");
        }
        // A libpq key/value string is refused without showing any of it.
        let kv = PostgresConfig::from_url("host=db user=app password=s3cret");
        let e = kv.to_tokio().unwrap_err();
        assert!(
            !e.to_string().contains("s3cret") && !format!("{kv:?}").contains("s3cret"),
            "{e}"
        );
        let zero = PostgresConfig::default().timeouts(Duration::ZERO, Duration::from_secs(1));
        assert!(zero.to_tokio().is_err());
    }

    #[test]
    fn endpoints_name_hosts_ports_and_the_database_but_no_credential() {
        for (url, shown) in [
            ("postgres://u:s3cret@127.0.0.1:5433/app", "127.0.0.1:5433/app"),
            ("postgres://app@db.example", "db.example:5432/app"),
            ("postgres://u@h1:1,h2:2/x?sslmode=disable", "h1:1,h2:2/x"),
            ("postgres:///x?hostaddr=::1&port=7", "[::1]:7/x"),
        ] {
            let (config, _) = PostgresConfig::from_url(url).to_tokio().unwrap();
            assert_eq!(endpoint(&config), shown, "{url}");
        }
    }

    #[test]
    fn tls_needs_a_host_name_and_the_postgres_negotiation() {
        for (url, says) in [
            ("postgres:///db?hostaddr=127.0.0.1&sslmode=require", "by name"),
            (
                "postgres://127.0.0.1/db?sslmode=require&sslnegotiation=direct",
                "sslnegotiation=direct",
            ),
        ] {
            let e = PostgresConfig::from_url(url).to_tokio().unwrap_err();
            assert!(
                matches!(&e, Error::InvalidConfig(m) if m.contains(says)),
                "{url}: {e:?}"
            );
        }
        // Without TLS neither matters.
        for url in [
            "postgres:///db?hostaddr=127.0.0.1",
            "postgres://127.0.0.1/db?sslnegotiation=direct",
        ] {
            assert!(PostgresConfig::from_url(url).to_tokio().is_ok(), "{url}");
        }
    }

    #[test]
    fn tls_parameters_are_read_and_taken_out() {
        let p = TlsParams::take_from(
            "postgres://h/db?sslmode=verify-full&sslrootcert=/a%20b/ca.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(p.url, "postgres://h/db?connect_timeout=3");
        assert_eq!(p.root_cert, Some(PathBuf::from("/a b/ca.pem")));
        assert!(p.verify && !p.disable);
        // sslrootcert=system asks for TLS (libpq 16: verify-full), so with
        // disable it is refused.
        let p = TlsParams::take_from("postgres://h/db?sslmode=disable&sslrootcert=system").unwrap();
        assert_eq!(p.url, "postgres://h/db?sslmode=disable");
        assert!(p.root_cert.is_none() && p.disable && p.verify);
        assert!(
            PostgresConfig::from_url("postgres://h/db?sslmode=disable&sslrootcert=system")
                .to_tokio()
                .is_err()
        );
        assert!(
            TlsParams::take_from("postgres://h/db?sslrootcert=system")
                .unwrap()
                .verify
        );
        // A `?` in the password is not the query's start.
        let p = TlsParams::take_from("postgres://u:x?y&sslmode=verify-full&z@h/db?sslmode=disable").unwrap();
        assert_eq!(
            p.url,
            "postgres://u:x?y&sslmode=verify-full&z@h/db?sslmode=disable"
        );
        assert!(p.disable && !p.verify);
        assert!(percent_decoded("%+5").is_err() && percent_decoded("%é").is_err());
        let p = TlsParams::take_from("postgres://h/db").unwrap();
        assert_eq!(p.url, "postgres://h/db");
        // prefer and disable make plain connections; nothing asks for TLS.
        for url in [
            "postgres://h/db",
            "postgres://h/db?sslmode=prefer",
            "postgres://h/db?sslmode=disable",
        ] {
            assert!(
                matches!(PostgresConfig::from_url(url).to_tokio().unwrap().1, Tls::Off),
                "{url}"
            );
        }
    }
}
