//! The Redis backend's errors: which failed requests may succeed on a new connection, why a
//! hold is lost on a failed confirmation, a TLS failure carried through the redis client's
//! error, and the mapping of all of them to zklock's [`Error`].

use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;

use super::options::Acks;
use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, ServerError};
use crate::types::loss::LossReason;

/// Whether a failed request may succeed on a new connection. A `-READONLY` reply is one: the
/// server turned replica (a failover), and a new connection finds the primary (through the
/// Sentinels) or fails again.
///
/// So are a Cluster's passing states: `-TRYAGAIN` (a migration splits the keys), `-CLUSTERDOWN`
/// and `-MASTERDOWN` (a failover under way).
pub(super) fn transient(err: &RedisError) -> bool {
    // A certificate that does not verify does not verify the next time either.
    if tls_failure(err).is_some() {
        return false;
    }
    connection_failed(err) || read_only(err) || passing(err)
}

/// Whether a Cluster answered that it cannot serve the request for a moment: `-TRYAGAIN` (a
/// migration splits the keys), `-CLUSTERDOWN` (a node failed and its replica is not promoted
/// yet: every node refuses every request meanwhile) or `-MASTERDOWN`. The connection is fine
/// and the keys are where they were: nothing is lost, and nobody else gets in meanwhile.
pub(super) fn passing(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        redis::ErrorKind::Server(
            redis::ServerErrorKind::TryAgain
                | redis::ServerErrorKind::ClusterDown
                | redis::ServerErrorKind::MasterDown
        )
    )
}

/// Whether a failed request says its connection failed (or stayed silent): a break.
pub(super) fn connection_failed(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_unrecoverable_error()
}

/// Why a hold is lost when a request confirming it failed with `err`: the server turned
/// replica (a failover), or the request failed on the connection.
pub(super) fn loss_of(err: &RedisError) -> LossReason {
    if read_only(err) {
        LossReason::Failover
    } else {
        LossReason::Disconnected
    }
}

/// Whether `err` is a replica's refusal to write (`-READONLY`, also from inside a script).
pub(super) fn read_only(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
    ) || err.to_string().contains("READONLY")
}

/// A client error during `operation`, as zklock's [`Error`].
pub(super) fn server_error(operation: &'static str, err: RedisError) -> Error {
    if let Some(failure) = tls_failure(&err) {
        return failure;
    }
    Error::Server {
        backend: BackendKind::Redis.label(),
        operation,
        source: ServerError::new(
            Arc::new(err.clone()),
            err.to_string(),
            transient(&err),
            "check the URL, that the server is up and that it allows EVAL and PUBLISH, then retry",
        ),
    }
}

/// The error of a request that got no reply in time.
pub(super) fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no reply from Redis in time",
    ))
}

/// The error of a grant that too few replicas acknowledged in time: `acked` of them did.
pub(super) fn unacked(acks: Option<Acks>, acked: i64, what: &'static str) -> Error {
    let (replicas, timeout) = acks.map_or((0, Duration::ZERO), |a| (a.replicas, a.timeout));
    let message = format!(
        "the primary {what}, but only {acked} of the {replicas} replicas that replica_acks \
         asks for acknowledged it within {timeout:?}"
    );
    let e = redis::RedisError::from(std::io::Error::other(message.clone()));
    Error::Server {
        backend: BackendKind::Redis.label(),
        operation: "acquire the lock",
        source: crate::types::error::ServerError::new(
            Arc::new(e),
            message,
            true,
            "check that the replicas run and keep up (INFO replication on the primary), or \
             lower replica_acks or raise its timeout; then retry",
        ),
    }
}

/// Why TLS failed, carried through the redis client's error (see [`tls_failure`]).
#[derive(Debug)]
struct Failure(Error);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Failure {}

/// `err` as a redis client error that [`tls_failure`] finds again.
pub(super) fn into_redis(err: Error) -> RedisError {
    RedisError::from(std::io::Error::other(Failure(err)))
}

/// zklock's error inside a redis client error from [`Dial`](super::conn::dial::Dial) (a TLS
/// failure, an address it cannot open), if it carries one.
pub(super) fn tls_failure(err: &RedisError) -> Option<Error> {
    let Failure(failure) = kept_io(err)?.get_ref()?.downcast_ref::<Failure>()?;
    Some(failure.clone())
}

/// The I/O error a redis client error keeps, if it is one (as `Arc<dyn Error>`, its source).
pub(super) fn kept_io(err: &RedisError) -> Option<&std::io::Error> {
    type Kept = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let kept = std::error::Error::source(err)?.downcast_ref::<Kept>()?;
    (**kept).downcast_ref::<std::io::Error>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_found_again_in_the_client_error() {
        let failure = Error::Tls {
            host: "h:1".into(),
            reason: "expired".into(),
        };
        let err = into_redis(failure.clone());
        assert_eq!(tls_failure(&err), Some(failure));
        let plain = RedisError::from(std::io::Error::other("reset"));
        assert_eq!(tls_failure(&plain), None);
    }
}
