//! [`PostgresConfig`]: where the server is, which table holds the locks, and
//! how long to wait.

use std::fmt;
use std::str::FromStr;
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
    /// `postgres://[user[:password]@]host[:port][,host2[:port2]...][/database][?sslmode=disable|prefer]`
    /// (`postgresql://` too). Default `postgres://postgres@127.0.0.1:5432/postgres`.
    pub url: String,
    /// The schema of the lock table (default `public`).
    pub schema: String,
    /// The lock table (default `dlock_locks`): created at connect if absent
    /// (see [`PostgresConfig::create_table`] for the statement).
    pub table: String,
    /// Whether `connect` creates the table when it is absent (default
    /// true). Off, a missing table is an error naming the statement.
    pub create_table: bool,
    /// How long to try to connect before reporting the server unavailable
    /// (default 5 s).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one statement may take (default 2 s).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: "postgres://postgres@127.0.0.1:5432/postgres".to_owned(),
            schema: "public".to_owned(),
            table: "dlock_locks".to_owned(),
            create_table: true,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
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
    /// configuration.
    pub(crate) fn to_tokio(&self) -> Result<tokio_postgres::Config, Error> {
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
        let mut config = tokio_postgres::Config::from_str(&self.url).map_err(|e| bad(e.to_string()))?;
        if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
            return Err(bad(
                "sslmode=require: this build of dlock-postgres has no TLS (use sslmode=disable or prefer, or a TLS-terminating proxy)"
                    .to_owned(),
            ));
        }
        if config.get_user().is_none() {
            config.user("postgres");
        }
        config.connect_timeout(self.connect_timeout);
        config.application_name("dlock");
        Ok(config)
    }
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
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
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
            "postgres://127.0.0.1/db?sslmode=require",
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
}
