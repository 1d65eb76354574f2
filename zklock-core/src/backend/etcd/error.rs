//! What the etcd backend reports when a request fails: [`Error::Server`] built from the
//! client's error, and the bound every request runs under; and when connecting fails:
//! [`Error::Unreachable`], [`Error::Tls`], or [`Error::Config`] for refused credentials.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::types::backend_kind::BackendKind;
use crate::types::error::{redacted, Error, Result, ServerError};

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
pub(super) fn transient(err: &etcd_client::Error) -> bool {
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
fn is_auth(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(s)
        if matches!(s.code() as i32, grpc::UNAUTHENTICATED | grpc::PERMISSION_DENIED)
            || s.message().contains("authentication failed")
            || s.message().contains("permission denied"))
}

/// Whether etcd answered that the lease a request names does not exist (any more).
pub(super) fn is_lease_gone(err: &Error) -> bool {
    matches!(err, Error::Server { source, .. }
        if source.downcast_ref::<etcd_client::Error>().is_some_and(|e| matches!(e,
            etcd_client::Error::GRpcStatus(s) if s.message().contains("requested lease not found"))))
}

/// The client's `err` during `operation`.
pub(super) fn server_error(operation: &'static str, err: etcd_client::Error) -> Error {
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
pub(super) fn timed_out(operation: &'static str) -> Error {
    Error::Server {
        backend: BackendKind::Etcd.label(),
        operation,
        source: ServerError::timed_out(BackendKind::Etcd.label()),
    }
}

/// Runs the request `fut` of `operation` within `bound`.
pub(super) async fn bounded<T>(
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

/// The connect string `url` is not usable, for `why`.
pub(super) fn bad_connect_string(url: &str, why: &str) -> Error {
    Error::Config(format!(
        "the etcd connect string {} is not usable: {why}; give etcd://[user:password@]host:port[,host:port...]",
        redacted(url)
    ))
}

/// The cluster runs etcd `version`, older than `oldest` (major, minor).
pub(super) fn too_old(version: &str, oldest: (u32, u32)) -> Error {
    Error::Config(format!(
        "etcd {} is too old: zklock needs etcd {}.{} or later",
        version, oldest.0, oldest.1
    ))
}

/// Connecting to `url` found no member that answered.
fn unreachable(url: &str, source: ServerError) -> Error {
    Error::Unreachable {
        connect: redacted(url),
        source,
    }
}

/// etcd refused the user `name`'s credentials (`e`).
fn refused(name: &str, e: &etcd_client::Error) -> Error {
    Error::Config(format!(
        "etcd refused the user {name:?} ({}); check the user name and password (etcdctl user get {name})",
        match e {
            etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
            e => e.to_string(),
        }
    ))
}

/// A failed step of connecting to `url` as `user`: credentials refused, a TLS failure (when
/// `tls` names the first member's host and the TLS settings), or no member answered.
pub(super) fn connect_failed(
    e: etcd_client::Error,
    url: &str,
    user: &str,
    tls: Option<(&str, &crate::types::tls::Tls)>,
) -> Error {
    if is_auth(&e) {
        return refused(user, &e);
    }
    if let Some(failure) = tls.and_then(|(host, tls)| tls_failure(&e, host, tls)) {
        return failure;
    }
    let message = format!("no etcd member answered: {e}");
    unreachable(
        url,
        ServerError::new(
            Arc::new(e),
            message,
            true,
            "check the endpoints and that the etcd members are up",
        ),
    )
}

/// A step of connecting to `url` that got no answer in time.
pub(super) fn connect_timed_out(url: &str) -> Error {
    unreachable(url, ServerError::timed_out(BackendKind::Etcd.label()))
}

/// What the session's first lease grant failing as `err` means: the user `user` may not grant
/// leases ([`Error::Config`]), or `err` itself.
pub(super) fn lease_refused(err: Error, user: &str) -> Error {
    match err {
        Error::Server { source, .. } if source.downcast_ref::<etcd_client::Error>().is_some_and(is_auth) => {
            Error::Config(format!(
                "etcd refused to grant a lease to the user {:?}: {source}; give the user the permission to grant leases and to write the lock keys",
                user
            ))
        }
        e => e,
    }
}

/// The TLS failure inside an etcd client error, as [`Error::Tls`] naming `host`, if it is
/// one: a certificate that did not verify, a refused client certificate, a plaintext member.
/// (The gRPC stack keeps rustls's error as text in its status.)
fn tls_failure(
    err: &etcd_client::Error,
    host: &str,
    tls: &crate::types::tls::Tls,
) -> Option<Error> {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        text.push_str(" / ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    // (As a broken pipe, a reset or a closed connection, whichever the client meets first; the
    // system's words are capitalised: "Connection reset by peer".)
    let lower = text.to_ascii_lowercase();
    let closed = [
        "broken pipe",
        "connection reset",
        "connection closed",
        "stream closed",
    ]
    .iter()
    .any(|c| lower.contains(c));
    let reason = match crate::types::tls::failure_in_text(&text, tls) {
        Some(reason) => reason,
        None if closed => crate::types::tls::closed_in_handshake(tls),
        None => return None,
    };
    Some(Error::Tls {
        host: host.to_string(),
        reason,
    })
}
