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
        // The client passes a broken connection's I/O error on as is (a
        // reset, a closed socket): the server is out of reach, not wrong.
        E::Custom(_) if std::error::Error::source(&e).is_some_and(is_connection_failure) => {
            Error::unavailable(BACKEND, e)
        }
        // Said (with no source) when a connection stops answering while the
        // session is being (re)established.
        E::Custom(_) if is_unresponsive(&e.to_string()) => Error::unavailable(BACKEND, e),
        // Said when the client's own task is gone (its runtime shut down)
        // while its state still reads connected: out of reach, not wrong.
        E::UnexpectedError(ref m) if is_client_gone(m) => Error::unavailable(BACKEND, e),
        other => Error::backend(BACKEND, other),
    }
}

/// Whether zookeeper-client's message says its session task is gone: a
/// request could not be sent ("expect error state, got SyncConnected") or
/// was dropped unanswered ("BUG: Create2 expect response, but got none").
fn is_client_gone(message: &str) -> bool {
    message.starts_with("expect error state") || message.ends_with("expect response, but got none")
}

/// Whether zookeeper-client's message says a connection stopped answering.
fn is_unresponsive(message: &str) -> bool {
    message.starts_with("no response from connection")
}

/// Whether `e`, or anything in its source chain, is an I/O error of a
/// connection that failed (reset, refused, closed, timed out).
fn is_connection_failure(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind as K;
    let mut next = Some(e);
    while let Some(e) = next {
        // zookeeper-client keeps its sources as `Arc<dyn Error>`, whose own
        // `source()` skips the error inside.
        if let Some(inner) = e.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>() {
            next = Some(&**inner);
            continue;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                K::ConnectionReset
                    | K::ConnectionAborted
                    | K::ConnectionRefused
                    | K::BrokenPipe
                    | K::NotConnected
                    | K::UnexpectedEof
                    | K::TimedOut
            );
        }
        next = e.source();
    }
    false
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
    fn a_broken_connection_is_told_from_other_io_errors() {
        use std::io::{Error as Io, ErrorKind as K};
        #[derive(Debug)]
        struct Wrapped(Io);
        impl std::fmt::Display for Wrapped {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "wrapped: {}", self.0)
            }
        }
        impl std::error::Error for Wrapped {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        for kind in [
            K::ConnectionReset,
            K::BrokenPipe,
            K::UnexpectedEof,
            K::ConnectionRefused,
        ] {
            assert!(is_connection_failure(&Io::from(kind)), "{kind:?}");
            assert!(
                is_connection_failure(&Wrapped(Io::from(kind))),
                "wrapped {kind:?}"
            );
            // As zookeeper-client keeps it.
            let shared: std::sync::Arc<dyn std::error::Error + Send + Sync> =
                std::sync::Arc::new(Io::from(kind));
            assert!(is_connection_failure(&shared), "shared {kind:?}");
        }
        // Reading a CA file that is not there is a configuration problem.
        for kind in [K::NotFound, K::PermissionDenied, K::InvalidData] {
            assert!(!is_connection_failure(&Wrapped(Io::from(kind))), "{kind:?}");
        }
    }

    #[test]
    fn a_connection_that_stopped_answering_is_told_by_its_message() {
        // zookeeper-client's words (session/mod.rs), with no source.
        assert!(is_unresponsive("no response from connection in 600ms"));
        assert!(!is_unresponsive("encounter writable server 127.0.0.1:2181"));
    }

    #[test]
    fn a_client_whose_task_is_gone_is_unavailable() {
        // zookeeper-client's words (session/types.rs, session/request.rs).
        for m in [
            "expect error state, got SyncConnected",
            "BUG: Create2 expect response, but got none",
        ] {
            let e = E::UnexpectedError(m.to_owned());
            assert!(
                matches!(map_err(e), Error::Unavailable { backend: "zk", .. }),
                "{m}"
            );
        }
        let other = E::UnexpectedError("keeper state value should not be 9".to_owned());
        assert!(matches!(map_err(other), Error::Backend { backend: "zk", .. }));
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
