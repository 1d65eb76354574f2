//! The one error type of zklock.

use std::time::Duration;

/// Everything that can go wrong when taking or holding a zklock lock.
///
/// Every message says what happened and what to do about it. The enum is
/// `#[non_exhaustive]`: match the variants you handle and keep a catch-all arm.
///
/// # Examples
///
/// ```
/// use zklock_core::{Error, Key};
///
/// let err = Key::new("").unwrap_err();
/// assert!(matches!(err, Error::InvalidKey { .. }));
/// assert!(err.to_string().contains("empty"));
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No ZooKeeper server could be reached to start a session.
    #[error(
        "cannot reach ZooKeeper at {connect} ({source}); check the connect string and that the servers are up"
    )]
    Unreachable {
        /// The connect string that was tried.
        connect: String,
        /// What the client reported.
        #[source]
        source: zookeeper_client::Error,
    },

    /// The ZooKeeper session behind the manager expired; every lock it held is gone.
    #[error("the ZooKeeper session expired and every lock it held is lost; retry the operation (the manager opens a new session)")]
    SessionExpired,

    /// The manager was closed (or its last handle dropped) while the operation ran.
    #[error("the lock manager is closed; create a new LockManager to take locks again")]
    Closed,

    /// The connection to ZooKeeper was lost and did not come back in time.
    #[error(
        "lost the connection to ZooKeeper during {operation}; retry once the servers are reachable"
    )]
    ConnectionLoss {
        /// What was being done.
        operation: &'static str,
    },

    /// The hold on a lock was lost while it was held (session expired, disconnected past the
    /// configured policy, node deleted or revoked). Whatever the critical section did after the
    /// loss was not protected.
    #[error("lost the lock on {key} while holding it ({reason}); the critical section may have overlapped another holder: check the fencing token before writing")]
    LockLost {
        /// The key (or raw path) of the lock.
        key: String,
        /// Why the hold is no longer certain.
        reason: crate::LossReason,
    },

    /// Waiting for the lock took longer than the given timeout; nothing is held and no node is left.
    #[error(
        "timed out after {waited:?} waiting for the lock on {key}; another holder still has it"
    )]
    Timeout {
        /// The key (or raw path) of the lock.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The key cannot be used as a lock name.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given (truncated when very long).
        key: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// A manager option (namespace, connect string, raw lock path, ...) is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The server refused the operation because the session lacks permission.
    #[error("not authorized to {operation} under {path}; check the ACLs on the path or the manager's credentials")]
    NoAuth {
        /// What was being done.
        operation: &'static str,
        /// The znode path.
        path: String,
    },

    /// Asking for this lock would deadlock the caller (for example a read holder asking for the
    /// write lock of the same key).
    #[error("would deadlock: {0}")]
    WouldDeadlock(String),

    /// The global manager was used before it was configured and `ZKLOCK_CONNECT` is not set.
    #[error("no global LockManager: call zklock::set_global(manager) first or set ZKLOCK_CONNECT=host:port")]
    NoGlobalManager,

    /// Any other error reported by ZooKeeper.
    #[error("ZooKeeper error during {operation}: {source}")]
    ZooKeeper {
        /// What was being done.
        operation: &'static str,
        /// What the client reported.
        #[source]
        source: zookeeper_client::Error,
    },
}

impl Error {
    /// Wraps a client error that happened during `operation` on `path`.
    pub(crate) fn zk(operation: &'static str, path: &str, err: zookeeper_client::Error) -> Error {
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
            other => Error::ZooKeeper {
                operation,
                source: other,
            },
        }
    }

    /// Whether retrying the same operation later may succeed.
    ///
    /// ```
    /// use zklock_core::Error;
    /// assert!(Error::ConnectionLoss { operation: "lock" }.is_retryable());
    /// assert!(!Error::Closed.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::ConnectionLoss { .. }
                | Error::SessionExpired
                | Error::Timeout { .. }
                | Error::Unreachable { .. }
        )
    }
}

/// `Result` with zklock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn assert<T: Send + Sync + 'static + std::error::Error>() {}
        assert::<Error>();
    }
}
