//! ZooKeeper's client errors as zklock's [`Error`].

use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, ServerError};

/// What to check when ZooKeeper refuses a request.
const ADVICE: &str =
    "check the connect string, the servers and the manager's credentials, then retry";

/// Wraps a client error that happened during `operation` on `path`.
pub(crate) fn zk_error(operation: &'static str, path: &str, err: zookeeper_client::Error) -> Error {
    use zookeeper_client::Error as Zk;
    match err {
        Zk::SessionExpired => Error::SessionExpired,
        Zk::ClientClosed => Error::Closed,
        // A connection broken otherwise than by a clean close fails requests with the
        // transport's error (see `recipe::connection_lost`).
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
pub(crate) fn server_error(err: zookeeper_client::Error) -> ServerError {
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

/// Whether `err` is the client's `NoNode`, wrapped by [`Error::zk`].
pub(crate) fn is_no_node(err: &Error) -> bool {
    match err {
        Error::Server { source, .. } => {
            source.downcast_ref::<zookeeper_client::Error>()
                == Some(&zookeeper_client::Error::NoNode)
        }
        _ => false,
    }
}
