//! The backend's name and the mapping of zookeeper-client's errors into
//! dlock's.

use dlock_core::Error;

/// The backend's name in errors and reports.
pub(crate) const BACKEND: &str = "zk";

/// Maps a ZooKeeper client error into dlock's [`Error`].
pub(crate) fn map_err(e: zookeeper_client::Error) -> Error {
    use zookeeper_client::Error as E;
    match e {
        E::ConnectionLoss
        | E::Timeout
        | E::ClientClosed
        | E::NoHosts
        | E::SessionExpired
        | E::SessionMoved
        | E::Throttled => Error::unavailable(BACKEND, e),
        E::AuthFailed | E::NoAuth | E::InvalidAcl => Error::InvalidConfig(format!("zookeeper: {e}")),
        E::BadArguments(_) => Error::InvalidKey {
            reason: format!("zookeeper refused the path: {e}"),
        },
        other => Error::backend(BACKEND, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zookeeper_client::Error as E;

    #[test]
    fn connection_and_session_trouble_is_unavailable() {
        for e in [
            E::ConnectionLoss,
            E::Timeout,
            E::ClientClosed,
            E::NoHosts,
            E::SessionExpired,
            E::SessionMoved,
            E::Throttled,
        ] {
            let shown = format!("{e:?}");
            assert!(
                matches!(map_err(e), Error::Unavailable { backend: "zk", .. }),
                "{shown}"
            );
        }
    }

    #[test]
    fn credentials_and_paths_are_the_callers_to_fix() {
        for e in [E::AuthFailed, E::NoAuth, E::InvalidAcl] {
            let shown = format!("{e:?}");
            assert!(matches!(map_err(e), Error::InvalidConfig(_)), "{shown}");
        }
        assert!(matches!(
            map_err(E::BadArguments(&"bad path")),
            Error::InvalidKey { .. }
        ));
    }

    #[test]
    fn anything_else_the_server_says_is_a_backend_error() {
        for e in [E::NoNode, E::NodeExists, E::NotEmpty, E::BadVersion] {
            let shown = format!("{e:?}");
            assert!(
                matches!(map_err(e), Error::Backend { backend: "zk", .. }),
                "{shown}"
            );
        }
    }
}
