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
    /// No server of the connect string could be reached to start a session (on ZooKeeper,
    /// within the connection timeout).
    #[error(
        "cannot reach the lock servers at {connect} ({source}); check the connect string and that the servers are up"
    )]
    Unreachable {
        /// The connect string that was tried (without its password).
        connect: String,
        /// What the client reported.
        #[source]
        source: ServerError,
    },

    /// A TLS connection to a server could not be set up: its certificate did not verify (not
    /// signed by a trusted CA, not valid for the name, expired), it refused the client
    /// certificate or asked for one that was not given, it does not speak TLS on that port, or
    /// the TLS settings themselves are not usable (a CA or key file missing or not PEM). Never
    /// retried: the settings or the server's certificate must change.
    ///
    /// ```
    /// let err = zklock_core::Error::Tls {
    ///     host: "10.0.0.5:6380".into(),
    ///     reason: "the server's certificate has expired: renew it on the server".into(),
    /// };
    /// assert!(err.to_string().contains("10.0.0.5:6380"));
    /// ```
    #[error("TLS to {host} failed: {reason}")]
    Tls {
        /// The server (`host:port`).
        host: String,
        /// What went wrong, and what to do.
        reason: String,
    },

    /// Every server of the connect string refused the connection (nothing listens on those
    /// ports), again and again for about a second: reported then, rather than after the whole
    /// connection timeout.
    ///
    /// ```no_run
    /// # async fn run() {
    /// match zklock_core::LockManager::connect("127.0.0.1:1").await {
    ///     Err(zklock_core::Error::Refused { connect }) => eprintln!("is ZooKeeper up at {connect}?"),
    ///     other => drop(other),
    /// }
    /// # }
    /// ```
    #[error(
        "every server in {connect} refused the connection; check the ports in the connect string and that the servers are up"
    )]
    Refused {
        /// The connect string that was tried.
        connect: String,
    },

    /// The server session behind the manager (a ZooKeeper session) expired; every lock it held
    /// is gone.
    #[error("the server session expired and every lock it held is lost; retry the operation (the manager opens a new session)")]
    SessionExpired,

    /// The manager was closed (or its last handle dropped) while the operation ran.
    #[error("the lock manager is closed; create a new LockManager to take locks again")]
    Closed,

    /// The connection to the lock servers was lost and did not come back in time.
    #[error(
        "lost the connection to the lock servers during {operation}; retry once the servers are reachable"
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
        reason: crate::types::loss::LossReason,
    },

    /// The acquire's place in the lock's queue (a waiting node on ZooKeeper) was deleted by
    /// someone else (an operator or a tool, or the session closed by another handle) before the
    /// lock was granted: nothing is held and nothing is left. Acquire again if the work should
    /// still happen.
    ///
    /// ```
    /// let err = zklock_core::Error::Dequeued { key: "order_42".into() };
    /// assert!(err.is_retryable());
    /// assert!(err.to_string().contains("nothing is held"));
    /// ```
    #[error("the place in the queue for the lock on {key} was deleted by someone else before the lock was granted; nothing is held: acquire again if the work should still happen")]
    Dequeued {
        /// The key (or raw path) of the lock.
        key: String,
    },

    /// Waiting for the lock took longer than the given timeout; nothing is held and nothing is
    /// left on the server.
    #[error(
        "timed out after {waited:?} waiting for the lock on {key}: another process holds it, or the server did not answer in time; nothing is held and nothing is left"
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

    /// An argument cannot be used: a raw lock path that is not a lock path, a semaphore with
    /// no leases, more leases asked for than a semaphore has, a multi-lock that names a key
    /// twice.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A manager option (namespace, connect string, disconnect grace, identity, ...) is
    /// invalid, or the global manager was set twice.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The server refused the operation because the session lacks permission.
    #[error("not authorized to {operation} under {path}; check the ACLs on the path or the manager's credentials")]
    NoAuth {
        /// What was being done.
        operation: &'static str,
        /// The lock path.
        path: String,
    },

    /// A manager with credentials refused a lock path whose ACL lets other clients delete its
    /// contender nodes or change its ACL: anyone so allowed could take the lock away from a
    /// holder. Nothing is held and nothing is left.
    #[error("the lock path {path} lets other clients delete its lock nodes or change its ACL ({acl}); a manager with credentials locks only where DELETE and ADMIN are its own: delete the path while it is empty (or set its ACL to the manager's credentials) and retry")]
    UnprotectedPath {
        /// The lock path.
        path: String,
        /// Its ACL, as `scheme:id:perms` entries.
        acl: String,
    },

    /// Asking for this would deadlock the caller; refused at once instead of waiting for ever.
    #[error("would deadlock on the lock {key}: {cause}")]
    WouldDeadlock {
        /// The key (or raw path) of the lock.
        key: String,
        /// What was asked for, and what to do instead.
        cause: Deadlock,
    },

    /// The manager's backend does not have this feature (for example inspection on the
    /// in-memory backend).
    #[error(
        "the {backend} backend does not support {feature}; use a manager on a backend that has it"
    )]
    Unsupported {
        /// The backend's name (`zookeeper`, `memory`, ...).
        backend: &'static str,
        /// What was asked for.
        feature: &'static str,
    },

    /// A job was skipped because another instance runs it, or ran it within its `at_least`
    /// window (see [`Job::required`](crate::Job::required)).
    #[error("the job {key} was skipped: another instance runs it or ran it recently; this is expected when several instances schedule it")]
    JobSkipped {
        /// The job's name (or raw path).
        key: String,
    },

    /// The global manager was used before it was configured and `ZKLOCK_CONNECT` is not set.
    #[error("no global LockManager: call zklock::set_global(manager) first or set ZKLOCK_CONNECT=host:port (or redis://host:port, postgres://user@host/db)")]
    NoGlobalManager,

    /// A request to the lock server failed: the server could not be reached, the connection
    /// broke or stayed silent, or the server refused the request. `backend` names the backend
    /// (as in [`Unsupported`](Error::Unsupported)); `source` carries the client's own error.
    ///
    /// ```no_run
    /// # async fn run() {
    /// match zklock_core::LockManager::connect("redis://127.0.0.1:1/").await {
    ///     Err(zklock_core::Error::Server { backend, operation, source }) => {
    ///         eprintln!("{backend} failed during {operation}: {source}");
    ///         if source.is_transient() { /* try again later */ }
    ///     }
    ///     other => drop(other),
    /// }
    /// # }
    /// ```
    #[error("{backend} error during {operation} ({source}); {}", source.advice)]
    Server {
        /// The backend's name (`zookeeper`, `redis`, `postgres`).
        backend: &'static str,
        /// What was being done.
        operation: &'static str,
        /// What the client reported.
        #[source]
        source: ServerError,
    },
}

/// What a backend's client reported, in [`Error::Server`] and [`Error::Unreachable`]: the
/// client's own error (reach it with [`downcast_ref`](Self::downcast_ref)), or a request that
/// got no reply in time, with whether the same request may succeed later. Comparable by
/// message, so that [`Error`] stays `PartialEq`.
///
/// ```
/// use zklock_core::{Error, ServerError};
///
/// let err = Error::Server {
///     backend: "postgres",
///     operation: "connect",
///     source: ServerError::timed_out("PostgreSQL"),
/// };
/// assert!(err.is_retryable());
/// assert!(err.to_string().contains("no reply from PostgreSQL in time"));
/// ```
#[derive(Debug, Clone)]
pub struct ServerError {
    message: String,
    client: Option<std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>>,
    transient: bool,
    advice: &'static str,
}

impl ServerError {
    /// The client's `error`, with its `message` as users should read it, whether the same
    /// request may succeed later, and what to check.
    #[cfg_attr(
        not(any(
            feature = "zookeeper",
            feature = "redis",
            feature = "postgres",
            feature = "etcd",
            feature = "mysql"
        )),
        allow(dead_code)
    )]
    pub(crate) fn new(
        error: std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>,
        message: String,
        transient: bool,
        advice: &'static str,
    ) -> Self {
        ServerError {
            message,
            client: Some(error),
            transient,
            advice,
        }
    }

    /// The error of a request to `server` (as users call it: `PostgreSQL`) that got no reply in
    /// time. The connection is then closed, and what it held is released by the server.
    ///
    /// ```
    /// let e = zklock_core::ServerError::timed_out("Redis");
    /// assert!(e.is_transient() && e.get_ref().is_none());
    /// ```
    pub fn timed_out(server: &str) -> ServerError {
        ServerError {
            message: format!("no reply from {server} in time"),
            client: None,
            transient: true,
            advice: "check that the server is up and not overloaded, then retry",
        }
    }

    /// The client's own error, if it reported one (`None` for a request that timed out).
    ///
    /// ```
    /// assert!(zklock_core::ServerError::timed_out("Redis").get_ref().is_none());
    /// ```
    pub fn get_ref(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.client.as_deref()
    }

    /// The client's own error as the type `E` the backend's client uses
    /// (`zookeeper_client::Error`, `redis::RedisError`, `tokio_postgres::Error`), e.g. to look
    /// at its code.
    ///
    /// ```
    /// let e = zklock_core::ServerError::timed_out("ZooKeeper");
    /// assert!(e.downcast_ref::<zklock_core::zookeeper_client::Error>().is_none());
    /// ```
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.get_ref()?.downcast_ref::<E>()
    }

    /// Whether the same request may succeed later: the connection broke, was refused or timed
    /// out, or the server is starting or shutting down.
    ///
    /// ```
    /// assert!(zklock_core::ServerError::timed_out("Redis").is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

impl PartialEq for ServerError {
    /// Same message, same verdict.
    fn eq(&self, other: &ServerError) -> bool {
        self.message == other.message && self.transient == other.transient
    }
}

impl Eq for ServerError {}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.client {
            Some(e) => Some(&**e),
            None => None,
        }
    }
}

/// Why a request was refused as a deadlock; see [`Error::WouldDeadlock`].
///
/// ```
/// use zklock_core::Deadlock;
/// assert!(Deadlock::WriteInsideRead.to_string().contains("release the read lock first"));
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadlock {
    /// The write lock was asked for inside a read hold of the same key (upgrades would wait
    /// for the caller's own read hold).
    WriteInsideRead,
    /// A write hold was downgraded while other holds re-entered it.
    DowngradeWhileReentered {
        /// How many other holds share the write hold.
        others: usize,
    },
}

impl std::fmt::Display for Deadlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Deadlock::WriteInsideRead => f.write_str(
                "the write lock was asked for inside a read hold of the same key; release the \
                 read lock first (upgrades are not supported)",
            ),
            Deadlock::DowngradeWhileReentered { others } => write!(
                f,
                "the write lock cannot be downgraded while {others} other holds re-enter it; \
                 end them first"
            ),
        }
    }
}

impl Error {
    /// Whether retrying the same operation later may succeed.
    ///
    /// ```
    /// use zklock_core::Error;
    /// assert!(Error::ConnectionLoss { operation: "lock" }.is_retryable());
    /// assert!(!Error::Closed.is_retryable());
    /// ```
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::ConnectionLoss { .. }
            | Error::SessionExpired
            | Error::Timeout { .. }
            | Error::Dequeued { .. }
            | Error::Unreachable { .. }
            | Error::Refused { .. } => true,
            Error::Server { source, .. } => source.is_transient(),
            _ => false,
        }
    }
}

/// `Result` with zklock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `connect` without the password a URL may carry.
pub(crate) fn redacted(connect: &str) -> String {
    // Any URL's user part (`scheme://user:password@host`); a ZooKeeper connect string has none.
    match (connect.find("://"), connect.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &connect[..scheme], &connect[at + 1..])
        }
        _ => connect.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn assert<T: Send + Sync + 'static + std::error::Error>() {}
        assert::<Error>();
    }
}
