//! ZooKeeper's client errors as zklock's [`Error`]: their mapping, which of them are a lost
//! connection or the session's end, and the errors of an acquire that the server's answers tell.

use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, ServerError};

/// What to check when ZooKeeper refuses a request.
const ADVICE: &str =
    "check the connect string, the servers and the manager's credentials, then retry";

/// Wraps a client error that happened during `operation` on `path`.
pub(super) fn zk_error(operation: &'static str, path: &str, err: zookeeper_client::Error) -> Error {
    use zookeeper_client::Error as Zk;
    match err {
        Zk::SessionExpired => Error::SessionExpired,
        Zk::ClientClosed => Error::Closed,
        // A connection broken otherwise than by a clean close fails requests with the
        // transport's error (see [`connection_lost`]).
        Zk::ConnectionLoss | Zk::Custom(_) => Error::ConnectionLoss { operation },
        Zk::NoAuth => Error::NoAuth {
            operation,
            path: path.to_string(),
        },
        other => Error::Server {
            backend: BackendKind::ZooKeeper.label(),
            operation,
            source: server_error(other),
        },
    }
}

/// The client's error as a [`ServerError`].
fn server_error(err: zookeeper_client::Error) -> ServerError {
    use zookeeper_client::Error as Zk;
    let transient = matches!(
        err,
        Zk::ConnectionLoss | Zk::Timeout | Zk::SessionExpired | Zk::SessionMoved
    );
    ServerError::new(
        std::sync::Arc::new(err.clone()),
        err.to_string(),
        transient,
        ADVICE,
    )
}

/// Whether `err` is the client's `NoNode`, wrapped by [`zk_error`].
pub(super) fn is_no_node(err: &Error) -> bool {
    match err {
        Error::Server { source, .. } => {
            source.downcast_ref::<zookeeper_client::Error>()
                == Some(&zookeeper_client::Error::NoNode)
        }
        _ => false,
    }
}

/// The error of a session that could not be opened on `connect`: the client's `err` (its
/// `Timeout` when the connect took too long).
pub(super) fn unreachable(connect: &str, err: zookeeper_client::Error) -> Error {
    Error::Unreachable {
        connect: connect.to_string(),
        source: server_error(err),
    }
}

/// Whether a request failed because its connection broke (its outcome unknown, the session
/// possibly alive): zookeeper-client reports a clean close as `ConnectionLoss`, but fails the
/// requests in flight with the transport's own error (`Custom`: a reset connection, no answer
/// within the read timeout) when the connection breaks otherwise. Both are a connection loss.
pub(super) fn connection_lost(err: &zookeeper_client::Error) -> bool {
    matches!(
        err,
        zookeeper_client::Error::ConnectionLoss | zookeeper_client::Error::Custom(_)
    )
}

/// Whether a request failed because the session is over for good.
pub(super) fn is_terminal(err: &zookeeper_client::Error) -> bool {
    matches!(
        err,
        zookeeper_client::Error::SessionExpired
            | zookeeper_client::Error::ClientClosed
            | zookeeper_client::Error::AuthFailed
    )
}

/// The error of an acquire that found `node` under the lock path `path`, a child that is
/// neither a lock node of zklock or Curator nor one of kazoo's.
pub(super) fn unknown_node(path: &str, node: &str) -> Error {
    tracing::warn!(%path, %node, "a child of the lock path is no lock contender");
    Error::InvalidArgument(format!(
        "the lock path {path} holds the node {node}, which is neither a lock node of zklock or \
         Curator (_c_<uuid>-lock-<seq>, -__READ__<seq>, -__WRIT__<seq>) nor one of kazoo's \
         (<uuid hex>__lock__<seq>, __rlock__<seq>), so zklock cannot tell whether it holds the \
         lock and refuses to take it; nothing is held and no node is left. Lock a path that \
         only lock clients use (another recipe, such as a Curator semaphore or leader latch, \
         keeps its own path), or delete {path}/{node} if nothing uses it"
    ))
}

/// The error of an acquire whose session ended while it waited.
pub(super) fn session_ended(event: &zookeeper_client::WatchedEvent) -> Error {
    match event.session_state {
        zookeeper_client::SessionState::Expired => Error::SessionExpired,
        _ => Error::Closed,
    }
}
