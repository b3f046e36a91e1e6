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

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

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
