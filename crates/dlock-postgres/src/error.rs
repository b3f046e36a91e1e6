//! The backend's name and the mapping of tokio-postgres's errors into dlock's.
//!
//! tokio-postgres's `Display` of a server error says only "db error": every
//! error made here says instead where it happened (`host:port/database`,
//! never a credential) and what the server said: its severity, message and
//! SQLSTATE (`ERROR: could not serialize access due to concurrent update
//! (SQLSTATE 40001)`). The tokio-postgres error stays reachable as the
//! source.

use std::fmt;

use dlock_core::Error;
use tokio_postgres::error::{Severity, SqlState};

/// The backend's name in errors and reports.
pub(crate) const BACKEND: &str = "postgres";

/// What a failure means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The server is out of reach or cannot serve now: try again later.
    Unavailable,
    /// A database that does not exist, or credentials refused.
    InvalidConfig,
    /// A name longer than the lock table's `name` column allows (a
    /// ShedLock table's `VARCHAR(64)`).
    InvalidKey,
    /// Anything else the server said.
    Backend,
}

/// The kind of a failure with SQLSTATE `code` (`None`: the server said
/// nothing, the connection or the protocol failed).
fn kind(code: Option<&str>) -> Kind {
    let Some(code) = code else {
        return Kind::Unavailable;
    };
    // A code is five characters; anything else is read as no class.
    let class = code.get(..2).unwrap_or_default();
    // Connection exceptions, out of resources, shutting down or not ready,
    // serialization failures and deadlocks (when sending the statement
    // again did not help), and a standby: try again later.
    if matches!(class, "08" | "53" | "57" | "40") || code == SqlState::READ_ONLY_SQL_TRANSACTION.code() {
        return Kind::Unavailable;
    }
    if code == SqlState::STRING_DATA_RIGHT_TRUNCATION.code() {
        return Kind::InvalidKey;
    }
    if [
        &SqlState::INVALID_CATALOG_NAME,
        &SqlState::INVALID_PASSWORD,
        &SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
    ]
    .iter()
    .any(|c| c.code() == code)
    {
        return Kind::InvalidConfig;
    }
    Kind::Backend
}

/// A PostgreSQL failure, told for people: what the server said (or the
/// client library's words and their cause), and where, when no wrapper
/// says it already (an [`Error::Unavailable`] says it through its
/// [`Unreachable`](dlock_core::Unreachable)). The tokio-postgres error is
/// its source.
#[derive(Debug)]
pub(crate) struct Failure {
    at: Option<String>,
    said: String,
    source: Option<tokio_postgres::Error>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.at {
            Some(at) => write!(f, "at {at}: {}", self.said),
            None => f.write_str(&self.said),
        }
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Maps a tokio-postgres error at `endpoint` (`host:port/database`) into
/// dlock's [`Error`]: a connection that is gone or a server that cannot
/// serve now is [`Error::Unavailable`]; a database that does not exist,
/// credentials or a certificate refused, [`Error::InvalidConfig`]; anything
/// else the server said, [`Error::Backend`]. Each names the endpoint and
/// carries the server's words and SQLSTATE.
pub(crate) fn map_err(e: tokio_postgres::Error, endpoint: &str) -> Error {
    if let Some(why) = tls_refusal(&e) {
        // Trying again will not change the server's certificate.
        return Error::InvalidConfig(format!("{BACKEND} at {endpoint}: TLS: {why}"));
    }
    let code = if e.is_closed() {
        None
    } else {
        e.code().map(|c| c.code().to_owned())
    };
    let said = said(&e);
    classified(kind(code.as_deref()), said, Some(e), endpoint)
}

/// The error of `kind`, saying `said` at `endpoint`, with `source` behind it.
fn classified(kind: Kind, said: String, source: Option<tokio_postgres::Error>, endpoint: &str) -> Error {
    match kind {
        Kind::Unavailable => Error::unavailable(
            BACKEND,
            Failure {
                at: None,
                said,
                source,
            },
        )
        .at(endpoint),
        Kind::InvalidConfig => Error::InvalidConfig(format!("{BACKEND} at {endpoint}: {said}")),
        Kind::InvalidKey => Error::InvalidKey {
            reason: format!(
                "{BACKEND} at {endpoint}: a value is longer than the lock table's column allows (a name \
                 longer than its name column, such as a ShedLock table's VARCHAR(64)): {said}"
            ),
        },
        Kind::Backend => Error::backend(
            BACKEND,
            Failure {
                at: Some(endpoint.to_owned()),
                said,
                source,
            },
        ),
    }
}

/// A reply the driver could not read (a column of another type than the
/// statement's): [`Error::Backend`], never a panic.
pub(crate) fn odd_reply(e: tokio_postgres::Error, endpoint: &str) -> Error {
    let said = format!("an unexpected reply: {}", said(&e));
    classified(Kind::Backend, said, Some(e), endpoint)
}

/// Whether the statement lost a serialization failure (40001) or a
/// deadlock (40P01): it was rolled back, and sending it again is the
/// answer (under `REPEATABLE READ` or `SERIALIZABLE`, ordinary contention
/// on a row raises them).
pub(crate) fn is_conflict(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| conflict_code(c.code()))
}

fn conflict_code(code: &str) -> bool {
    code == SqlState::T_R_SERIALIZATION_FAILURE.code() || code == SqlState::T_R_DEADLOCK_DETECTED.code()
}

/// Whether the server answered the statement with an `ERROR`: its
/// transaction (one statement, implicit) ended without committing. A
/// `FATAL` does not say so (a backend ended while it waited for a
/// synchronous standby has committed locally), nor does a lost connection.
pub(crate) fn rolled_back(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| db.parsed_severity() == Some(Severity::Error))
}

/// Whether a connection was refused for a startup parameter the other end
/// does not take: PgBouncer (1.20 and later) refuses `options` that set a
/// parameter it does not track ("unsupported startup parameter in options:
/// ...").
pub(crate) fn refuses_startup_options(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| startup_parameter_refused(db.message()))
}

fn startup_parameter_refused(message: &str) -> bool {
    message.contains("unsupported startup parameter")
}

/// Why TLS could not be set up, when that is what failed for good: the
/// server's certificate was refused, or the server has no TLS.
fn tls_refusal(e: &tokio_postgres::Error) -> Option<String> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        // tokio-rustls wraps rustls' error in an io::Error, whose `source`
        // skips it: look inside.
        let inner = s
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .map_or(s, |inner| inner as &(dyn std::error::Error + 'static));
        if let Some(rustls::Error::InvalidCertificate(why)) = inner.downcast_ref::<rustls::Error>() {
            return Some(format!(
                "the server's certificate was refused ({why}): give the CA that signed it with sslrootcert=PATH"
            ));
        }
        if inner.to_string() == "server does not support TLS" {
            return Some("the server does not support TLS (sslmode=require)".to_owned());
        }
        source = s.source();
    }
    None
}

/// What an error says, in one line: the server's severity, message and
/// SQLSTATE when it sent one (tokio-postgres's `Display` of a server error
/// says only "db error"), else the client library's words and their cause.
pub(crate) fn said(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => server_words(db.severity(), db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

fn server_words(severity: &str, message: &str, code: &str) -> String {
    let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("{severity}: {message} (SQLSTATE {code})")
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: &str = "127.0.0.1:5432/app";

    fn mapped(code: &str, message: &str) -> Error {
        classified(kind(Some(code)), server_words("ERROR", message, code), None, AT)
    }

    #[test]
    fn the_server_out_of_reach_or_busy_is_unavailable() {
        for code in [
            "08006", "08P01", "53300", "57P01", "57014", "40001", "40P01", "25006",
        ] {
            assert_eq!(kind(Some(code)), Kind::Unavailable, "{code}");
            assert!(matches!(
                mapped(code, "x"),
                Error::Unavailable {
                    backend: "postgres",
                    ..
                }
            ));
        }
        // No code: the connection or the protocol failed.
        assert_eq!(kind(None), Kind::Unavailable);
        assert_eq!(kind(Some("4")), Kind::Backend);
    }

    #[test]
    fn a_missing_database_and_refused_credentials_are_config_errors() {
        for code in ["3D000", "28P01", "28000"] {
            assert!(matches!(mapped(code, "x"), Error::InvalidConfig(_)), "{code}");
        }
    }

    /// A name longer than the table's `name` column (a ShedLock table's
    /// `VARCHAR(64)`) is the caller's key, not the server failing.
    #[test]
    fn a_value_too_long_for_its_column_is_an_invalid_key() {
        let e = mapped("22001", "value too long for type character varying(64)");
        assert!(
            matches!(&e, Error::InvalidKey { reason } if reason.contains(AT) && reason.contains("VARCHAR(64)")),
            "{e:?}"
        );
    }

    #[test]
    fn anything_else_the_server_says_is_a_backend_error() {
        for code in ["42501", "42P01", "23505", "22003", "0A000"] {
            assert!(
                matches!(
                    mapped(code, "x"),
                    Error::Backend {
                        backend: "postgres",
                        ..
                    }
                ),
                "{code}"
            );
        }
    }

    #[test]
    fn every_error_names_the_endpoint_the_servers_words_and_the_sqlstate() {
        let e = mapped("40001", "could not serialize access due to concurrent update");
        assert_eq!(
            e.to_string(),
            "postgres at 127.0.0.1:5432/app unavailable: \
             ERROR: could not serialize access due to concurrent update (SQLSTATE 40001)"
        );
        let e = mapped("42501", "permission denied for table dlock_locks");
        assert_eq!(
            e.to_string(),
            "postgres error: at 127.0.0.1:5432/app: \
             ERROR: permission denied for table dlock_locks (SQLSTATE 42501)"
        );
        let e = classified(
            Kind::InvalidConfig,
            server_words("FATAL", "database \"x\" does not exist", "3D000"),
            None,
            "127.0.0.1:5432/x",
        );
        assert_eq!(
            e.to_string(),
            "invalid configuration: postgres at 127.0.0.1:5432/x: \
             FATAL: database \"x\" does not exist (SQLSTATE 3D000)"
        );
        // A message over several lines reads as one.
        assert_eq!(
            server_words("ERROR", "a\n  b", "XX000"),
            "ERROR: a b (SQLSTATE XX000)"
        );
    }

    #[test]
    fn conflicts_are_sent_again_and_pooler_refusals_are_recognised() {
        assert!(conflict_code("40001") && conflict_code("40P01"));
        assert!(!conflict_code("40002") && !conflict_code("55P03"));
        assert!(startup_parameter_refused(
            "unsupported startup parameter in options: default_transaction_isolation"
        ));
        assert!(!startup_parameter_refused("database \"x\" does not exist"));
    }
}
