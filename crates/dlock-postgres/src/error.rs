//! The backend's name and the mapping of tokio-postgres's errors into dlock's.

use dlock_core::Error;
use tokio_postgres::error::SqlState;

/// The backend's name in errors and reports.
pub(crate) const BACKEND: &str = "postgres";

/// Maps a tokio-postgres error into dlock's [`Error`]: a connection that is
/// gone or a server that cannot serve now is [`Error::Unavailable`]; a
/// database that does not exist or credentials refused,
/// [`Error::InvalidConfig`]; anything else the server said, [`Error::Backend`].
pub(crate) fn map_err(e: tokio_postgres::Error) -> Error {
    if let Some(why) = tls_refusal(&e) {
        // Trying again will not change the server's certificate.
        return Error::InvalidConfig(format!("{BACKEND}: TLS: {why}"));
    }
    if e.is_closed() {
        return Error::unavailable(BACKEND, e);
    }
    let Some(code) = e.code() else {
        // No SQL state: the connection or the protocol failed.
        return Error::unavailable(BACKEND, e);
    };
    // A code is five characters; anything else is read as no class.
    let class = code.code().get(..2).unwrap_or_default();
    if class == "08"
        || class == "53"
        || class == "57"
        || class == "40"
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
    {
        // Connection exceptions, out of resources, shutting down or not
        // ready, serialization failures and a standby: try again later.
        return Error::unavailable(BACKEND, e);
    }
    if *code == SqlState::INVALID_CATALOG_NAME
        || *code == SqlState::INVALID_PASSWORD
        || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
    {
        return Error::InvalidConfig(format!("{BACKEND}: {}", describe(&e)));
    }
    Error::backend(BACKEND, describe(&e))
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

/// The server's message, when it sent one (tokio-postgres's `Display` of a
/// database error says only "db error").
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {} ({})", db.severity(), db.message(), db.code().code()),
        None => e.to_string(),
    }
}
