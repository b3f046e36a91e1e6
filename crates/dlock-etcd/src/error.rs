//! The backend's name and the mapping of etcd-client's errors into dlock's.

use dlock_core::Error;

/// The backend's name in errors and reports.
pub(crate) const BACKEND: &str = "etcd";

/// Maps an etcd client error into dlock's [`Error`].
pub(crate) fn map_err(e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    match e {
        E::GRpcStatus(ref status) => {
            use tonic::Code as C;
            match status.code() {
                // The cluster could not serve it now. Internal is tonic's
                // code for a connection the server closed (GOAWAY, RST).
                C::Cancelled
                | C::Unknown
                | C::DeadlineExceeded
                | C::ResourceExhausted
                | C::Aborted
                | C::Internal
                | C::Unavailable => Error::unavailable(BACKEND, e),
                C::Unauthenticated | C::PermissionDenied => {
                    Error::InvalidConfig(format!("etcd refused the credentials: {e}"))
                }
                _ => Error::backend(BACKEND, e),
            }
        }
        E::TransportError(_)
        | E::IoError(_)
        | E::WatchError(_)
        | E::LeaseKeepAliveError(_)
        | E::Internal(_) => Error::unavailable(BACKEND, e),
        E::InvalidUri(_) | E::InvalidArgs(_) | E::EndpointError(_) | E::InvalidMetadataValue(_) => {
            Error::InvalidConfig(format!("etcd: {e}"))
        }
        other => Error::backend(BACKEND, other),
    }
}

/// Whether `e` is etcd saying a request's lease does not exist (revoked,
/// or expired before our keep-alive noticed): gRPC `NotFound`, "etcdserver:
/// requested lease not found".
pub(crate) fn is_lease_gone(e: &Error) -> bool {
    let Error::Backend { source, .. } = e else {
        return false;
    };
    matches!(
        source.downcast_ref::<etcd_client::Error>(),
        Some(etcd_client::Error::GRpcStatus(status))
            if status.code() == tonic::Code::NotFound && status.message().contains("lease not found")
    )
}

/// How a request failed when it got no answer because its connection
/// failed under it (rather than etcd answering it, or the time running
/// out): what sending it again, on a fresh connection, could do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unanswered {
    /// It never left this process: hyper dropped it from the queue of a
    /// connection that ended before taking it ("connection closed"), or
    /// that could take nothing ("connection was not ready"). Any request
    /// may be sent again.
    NotSent,
    /// The connection broke (reset, closed, its pings unanswered) while the
    /// request may have been on its way or applied: only a request whose
    /// second application changes nothing and answers the same may be sent
    /// again.
    Cut,
}

/// tonic's message for hyper's `Canceled` error (the request was never
/// sent: hyper's `Error::is_canceled`), under the code `Cancelled`. A
/// request timeout is `Cancelled` too, with another message and
/// [`tonic::TimeoutExpired`] as its source.
const HYPER_CANCELED: &str = "operation was canceled";

/// Whether `e` is a request that got no answer because its connection
/// failed under it, and how ([`Unanswered`]); `None` for an answer from
/// etcd, a timeout, a connection that could not be made (a fresh one
/// would fail alike: the caller hears `Unavailable` at once), and any
/// other error.
///
/// Read from tonic's status: a status etcd sent carries no source, one
/// tonic made from a local failure keeps that failure as its source.
/// (Downcasting to hyper's error would be exact but needs hyper as a
/// dependency of this crate; tonic's public error types and the message it
/// copies from hyper's `Canceled` tell the same cases apart.)
pub(crate) fn unanswered(e: &etcd_client::Error) -> Option<Unanswered> {
    use std::error::Error as _;
    use tonic::Code as C;
    let etcd_client::Error::GRpcStatus(status) = e else {
        return None;
    };
    let local = status.source()?;
    let mut chain = std::iter::successors(Some(local), |&e| e.source());
    if chain.any(|e| e.is::<tonic::TimeoutExpired>() || e.is::<tonic::ConnectError>()) {
        return None;
    }
    match status.code() {
        C::Cancelled if status.message() == HYPER_CANCELED => Some(Unanswered::NotSent),
        C::Cancelled | C::Unknown | C::Internal | C::Unavailable => Some(Unanswered::Cut),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::sync::Arc;
    use tonic::{Code, Status};

    /// A status tonic made on this side of the connection from `source`.
    fn local(code: Code, message: &str, source: io::Error) -> etcd_client::Error {
        let mut status = Status::new(code, message);
        status.set_source(Arc::new(source));
        etcd_client::Error::GRpcStatus(status)
    }

    /// The failure of the flaky link scenario: an acquire's request queued
    /// on a connection the fault proxy had just reset (hyper's `Canceled`,
    /// "connection closed", as tonic reports it) was never sent. It may be
    /// sent again whatever it does; once the resends run out it is still
    /// `Unavailable`.
    #[test]
    fn a_request_its_connection_never_sent_may_be_sent_again() {
        let never_sent = || {
            local(
                Code::Cancelled,
                HYPER_CANCELED,
                io::Error::other("connection closed"),
            )
        };
        assert_eq!(unanswered(&never_sent()), Some(Unanswered::NotSent));
        assert!(matches!(
            map_err(never_sent()),
            Error::Unavailable { backend: "etcd", .. }
        ));
    }

    #[test]
    fn a_request_whose_connection_broke_may_have_been_applied() {
        // How tonic reports an I/O error of the connection under a request.
        let reset = etcd_client::Error::GRpcStatus(Status::from_error(Box::new(io::Error::from(
            io::ErrorKind::ConnectionReset,
        ))));
        assert_eq!(unanswered(&reset), Some(Unanswered::Cut));
        // An HTTP/2 keep-alive that gave up on the connection.
        let pings = local(
            Code::Unavailable,
            "keep-alive timed out",
            io::Error::other("ping"),
        );
        assert_eq!(unanswered(&pings), Some(Unanswered::Cut));
    }

    #[test]
    fn answers_timeouts_and_connections_not_made_are_not_sent_again() {
        // What etcd itself answers has no local source, whatever it says.
        for code in [
            Code::Cancelled,
            Code::Unknown,
            Code::Unavailable,
            Code::Internal,
            Code::NotFound,
        ] {
            let answer = etcd_client::Error::GRpcStatus(Status::new(code, HYPER_CANCELED));
            assert_eq!(unanswered(&answer), None, "{code:?}");
        }
        // The request timeout (tonic's, also `Cancelled`): no time is left.
        let timeout = Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(timeout.code(), Code::Cancelled);
        assert_eq!(unanswered(&etcd_client::Error::GRpcStatus(timeout)), None);
        // A connection refused: a fresh one would be refused too.
        let refused = Status::from_error(Box::new(tonic::ConnectError(Box::new(io::Error::from(
            io::ErrorKind::ConnectionRefused,
        )))));
        assert_eq!(unanswered(&etcd_client::Error::GRpcStatus(refused)), None);
        // A local failure of another kind (credentials) is not a broken connection.
        let denied = local(Code::PermissionDenied, "no", io::Error::other("tls"));
        assert_eq!(unanswered(&denied), None);
        assert_eq!(unanswered(&etcd_client::Error::Internal("x".into())), None);
    }

    fn grpc(code: Code) -> Error {
        map_err(etcd_client::Error::GRpcStatus(Status::new(code, "test")))
    }

    #[test]
    fn a_lease_etcd_does_not_have_is_told_from_other_not_founds() {
        let status = |m: &str| map_err(etcd_client::Error::GRpcStatus(Status::new(Code::NotFound, m)));
        assert!(is_lease_gone(&status("etcdserver: requested lease not found")));
        assert!(!is_lease_gone(&status("etcdserver: key not found")));
        assert!(!is_lease_gone(&grpc(Code::Unavailable)));
    }

    #[test]
    fn the_cluster_out_of_reach_is_unavailable() {
        for code in [
            Code::Cancelled,
            Code::Unknown,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::Internal,
            Code::Unavailable,
        ] {
            assert!(
                matches!(grpc(code), Error::Unavailable { backend: "etcd", .. }),
                "{code:?}"
            );
        }
        assert!(matches!(
            map_err(etcd_client::Error::Internal("connection closed".into())),
            Error::Unavailable { .. }
        ));
    }

    #[test]
    fn refused_credentials_and_bad_arguments_are_config_errors() {
        for code in [Code::Unauthenticated, Code::PermissionDenied] {
            assert!(matches!(grpc(code), Error::InvalidConfig(_)), "{code:?}");
        }
        assert!(matches!(
            map_err(etcd_client::Error::InvalidArgs("x".into())),
            Error::InvalidConfig(_)
        ));
    }

    #[test]
    fn anything_else_the_server_says_is_a_backend_error() {
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::FailedPrecondition,
            Code::OutOfRange,
        ] {
            assert!(
                matches!(grpc(code), Error::Backend { backend: "etcd", .. }),
                "{code:?}"
            );
        }
    }
}
