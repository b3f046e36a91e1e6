//! The backend's name and fred's errors as dlock's one [`Error`] (the
//! mapping itself is shared with `dlock-redis`: `dlock_redis_protocol::map_err`).

use dlock_core::Error;

/// The backend's name in errors.
pub(crate) const BACKEND: &str = "redlock";

/// fred's errors as dlock's, for this backend.
pub(crate) fn map_err(e: fred::error::Error) -> Error {
    dlock_redis_protocol::map_err(BACKEND, e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fred::error::{Error as FredError, ErrorKind};

    #[test]
    fn errors_name_this_backend_and_keep_their_kind() {
        match map_err(FredError::new(ErrorKind::Timeout, "Request timed out.")) {
            Error::Unavailable { backend, .. } => assert_eq!(backend, BACKEND),
            other => panic!("{other:?}"),
        }
        match map_err(FredError::new(ErrorKind::Url, "bad url")) {
            Error::InvalidConfig(why) => assert!(why.starts_with(BACKEND), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
