//! What the etcd backend reports when a request fails: [`Error::Server`] built from the
//! client's error, and the bound every request runs under.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, Result, ServerError};

/// gRPC's status codes (the numbers every gRPC implementation shares).
mod grpc {
    pub(super) const CANCELLED: i32 = 1;
    pub(super) const UNKNOWN: i32 = 2;
    pub(super) const DEADLINE_EXCEEDED: i32 = 4;
    pub(super) const PERMISSION_DENIED: i32 = 7;
    pub(super) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(super) const ABORTED: i32 = 10;
    pub(super) const UNAVAILABLE: i32 = 14;
    pub(super) const UNAUTHENTICATED: i32 = 16;
}

/// Whether the same request may succeed later: the cluster unreachable or without a leader,
/// a request that ran out of time, a stream that broke.
pub(crate) fn transient(err: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match err {
        E::GRpcStatus(status) => matches!(
            status.code() as i32,
            grpc::UNAVAILABLE
                | grpc::DEADLINE_EXCEEDED
                | grpc::ABORTED
                | grpc::CANCELLED
                | grpc::UNKNOWN
                | grpc::RESOURCE_EXHAUSTED
        ),
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

/// Whether etcd refused the request for the credentials (wrong password, no permission).
pub(crate) fn is_auth(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(s)
        if matches!(s.code() as i32, grpc::UNAUTHENTICATED | grpc::PERMISSION_DENIED)
            || s.message().contains("authentication failed")
            || s.message().contains("permission denied"))
}

/// Whether etcd answered that the lease a request names does not exist (any more).
pub(crate) fn is_lease_gone(err: &Error) -> bool {
    matches!(err, Error::Server { source, .. }
        if source.downcast_ref::<etcd_client::Error>().is_some_and(|e| matches!(e,
            etcd_client::Error::GRpcStatus(s) if s.message().contains("requested lease not found"))))
}

/// The client's `err` during `operation`.
pub(crate) fn server_error(operation: &'static str, err: etcd_client::Error) -> Error {
    let message = match &err {
        etcd_client::Error::GRpcStatus(s) => {
            format!("etcd answered {:?}: {}", s.code(), s.message())
        }
        e => e.to_string(),
    };
    let transient = transient(&err);
    Error::Server {
        backend: BackendKind::Etcd.label(),
        operation,
        source: ServerError::new(
            Arc::new(err),
            message,
            transient,
            "check the endpoints, that a majority of the etcd members is up and that the user may read and write the lock keys, then retry",
        ),
    }
}

/// A request of `operation` that got no reply within its bound.
pub(crate) fn timed_out(operation: &'static str) -> Error {
    Error::Server {
        backend: BackendKind::Etcd.label(),
        operation,
        source: ServerError::timed_out(BackendKind::Etcd.label()),
    }
}

/// Runs the request `fut` of `operation` within `bound`.
pub(crate) async fn bounded<T>(
    operation: &'static str,
    bound: Duration,
    fut: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(bound, fut).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(server_error(operation, e)),
        Err(_) => Err(timed_out(operation)),
    }
}
