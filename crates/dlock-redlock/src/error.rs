//! The backend's name and fred's errors as dlock's one [`Error`] (the
//! mapping itself is shared with `dlock-redis`: `dlock_redis_protocol::map_err`).

use dlock_core::Error;

/// The backend's name in errors.
pub(crate) const BACKEND: &str = "redlock";

/// fred's errors as dlock's, for this backend.
pub(crate) fn map_err(e: fred::error::Error) -> Error {
    dlock_redis_protocol::map_err(BACKEND, e)
}
