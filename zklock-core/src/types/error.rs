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

    /// Every ZooKeeper server of the connect string refused the connection (nothing listens
    /// on those ports), again and again for about a second: reported then, rather than after
    /// the whole connection timeout.
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
        "every ZooKeeper server in {connect} refused the connection; check the ports in the connect string and that the servers are up"
    )]
    Refused {
        /// The connect string that was tried.
        connect: String,
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
        reason: crate::types::loss::LossReason,
    },

    /// The acquire's waiting node was deleted by someone else (an operator or a tool, or the
    /// session closed by another handle) before the lock was granted: nothing is held and no
    /// node is left. Acquire again if the work should still happen.
    ///
    /// ```
    /// let err = zklock_core::Error::Dequeued { key: "order_42".into() };
    /// assert!(err.is_retryable());
    /// assert!(err.to_string().contains("nothing is held"));
    /// ```
    #[error("the waiting node for the lock on {key} was deleted by someone else before the lock was granted; nothing is held: acquire again if the work should still happen")]
    Dequeued {
        /// The key (or raw path) of the lock.
        key: String,
    },

    /// Waiting for the lock took longer than the given timeout; nothing is held and no node is left.
    #[error(
        "timed out after {waited:?} waiting for the lock on {key}: another process holds it, or ZooKeeper did not answer in time; nothing is held and no node is left"
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

    /// An argument cannot be used: a raw lock path that is not a znode path, a semaphore with
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
        /// The znode path.
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

    /// A request to Redis failed: the server could not be reached, the connection broke, or
    /// the server refused the request (the Redis backend, feature `redis`).
    #[cfg(feature = "redis")]
    #[error("Redis error during {operation} ({source}); check the URL, that the server is up and that it allows EVAL and PUBLISH, then retry")]
    Redis {
        /// What was being done.
        operation: &'static str,
        /// What the client reported.
        #[source]
        source: RedisError,
    },

    /// A request to PostgreSQL failed: the server could not be reached, the connection broke
    /// or stayed silent, or the server refused the request (the PostgreSQL backend, feature
    /// `postgres`).
    #[cfg(feature = "postgres")]
    #[error("PostgreSQL error during {operation} ({source}); check the URL, that the server is up and that the role may create and update the table zklock_keys, then retry")]
    Postgres {
        /// What was being done.
        operation: &'static str,
        /// What the client reported.
        #[source]
        source: PostgresError,
    },

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

/// What the `redis` client reported, in [`Error::Redis`]: the client's own error, comparable
/// so that [`Error`] stays `PartialEq`.
///
/// ```
/// # #[cfg(feature = "redis")] {
/// use zklock_core::{redis, Error, RedisError};
///
/// let refused = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
/// let err = Error::Redis { operation: "connect", source: RedisError::from(refused) };
/// assert!(err.is_retryable());
/// # }
/// ```
#[cfg(feature = "redis")]
#[derive(Debug, Clone)]
pub struct RedisError(redis::RedisError);

#[cfg(feature = "redis")]
impl RedisError {
    /// The client's error, e.g. to look at its [`kind`](redis::RedisError::kind).
    ///
    /// ```
    /// # #[cfg(feature = "redis")] {
    /// let io = zklock_core::redis::RedisError::from(std::io::Error::other("boom"));
    /// assert!(zklock_core::RedisError::from(io).get_ref().is_io_error());
    /// # }
    /// ```
    pub fn get_ref(&self) -> &redis::RedisError {
        &self.0
    }

    /// Whether the same request may succeed later: the connection broke, was refused, or timed
    /// out.
    fn is_transient(&self) -> bool {
        let e = &self.0;
        e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_unrecoverable_error()
    }
}

#[cfg(feature = "redis")]
impl From<redis::RedisError> for RedisError {
    fn from(e: redis::RedisError) -> RedisError {
        RedisError(e)
    }
}

#[cfg(feature = "redis")]
impl PartialEq for RedisError {
    /// Same kind, same message.
    fn eq(&self, other: &RedisError) -> bool {
        self.0.kind() == other.0.kind() && self.0.to_string() == other.0.to_string()
    }
}

#[cfg(feature = "redis")]
impl Eq for RedisError {}

#[cfg(feature = "redis")]
impl std::fmt::Display for RedisError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(feature = "redis")]
impl std::error::Error for RedisError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// What went wrong talking to PostgreSQL, in [`Error::Postgres`]: the client's error, or no
/// reply in time. Comparable by message, so that [`Error`] stays `PartialEq`.
///
/// ```
/// # #[cfg(feature = "postgres")] {
/// use zklock_core::{Error, PostgresError};
///
/// let err = Error::Postgres { operation: "connect", source: PostgresError::timed_out() };
/// assert!(err.is_retryable());
/// assert!(err.to_string().contains("no reply"));
/// # }
/// ```
#[cfg(feature = "postgres")]
#[derive(Debug, Clone)]
pub struct PostgresError(PostgresRepr);

#[cfg(feature = "postgres")]
#[derive(Debug, Clone)]
enum PostgresRepr {
    Client(std::sync::Arc<tokio_postgres::Error>),
    TimedOut,
}

#[cfg(feature = "postgres")]
impl PostgresError {
    /// The error of a request that got no reply in time (the connection is then closed: what
    /// it held is released by the server).
    ///
    /// ```
    /// # #[cfg(feature = "postgres")]
    /// assert!(zklock_core::PostgresError::timed_out().get_ref().is_none());
    /// ```
    pub fn timed_out() -> PostgresError {
        PostgresError(PostgresRepr::TimedOut)
    }

    /// The client's error, if the client reported one (`None` for a request that timed out),
    /// e.g. to look at its [`code`](tokio_postgres::Error::code).
    ///
    /// ```
    /// # #[cfg(feature = "postgres")]
    /// assert!(zklock_core::PostgresError::timed_out().get_ref().is_none());
    /// ```
    pub fn get_ref(&self) -> Option<&tokio_postgres::Error> {
        match &self.0 {
            PostgresRepr::Client(e) => Some(e),
            PostgresRepr::TimedOut => None,
        }
    }

    /// Whether the same request may succeed later, on another connection: the connection
    /// broke, was refused, or timed out, or the server is shutting down or starting.
    pub(crate) fn is_transient(&self) -> bool {
        match &self.0 {
            PostgresRepr::TimedOut => true,
            PostgresRepr::Client(e) => {
                use tokio_postgres::error::SqlState;
                e.is_closed()
                    || e.as_db_error().is_none() && e.code().is_none()
                    || e.code().is_some_and(|c| {
                        c.code().starts_with("08")
                            || *c == SqlState::ADMIN_SHUTDOWN
                            || *c == SqlState::CRASH_SHUTDOWN
                            || *c == SqlState::CANNOT_CONNECT_NOW
                            || *c == SqlState::IDLE_SESSION_TIMEOUT
                            || *c == SqlState::TOO_MANY_CONNECTIONS
                    })
            }
        }
    }
}

#[cfg(feature = "postgres")]
impl From<tokio_postgres::Error> for PostgresError {
    fn from(e: tokio_postgres::Error) -> PostgresError {
        PostgresError(PostgresRepr::Client(std::sync::Arc::new(e)))
    }
}

#[cfg(feature = "postgres")]
impl PartialEq for PostgresError {
    /// Same message.
    fn eq(&self, other: &PostgresError) -> bool {
        self.to_string() == other.to_string()
    }
}

#[cfg(feature = "postgres")]
impl Eq for PostgresError {}

#[cfg(feature = "postgres")]
impl std::fmt::Display for PostgresError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            // The client's `Display` of a server error is only its severity and message;
            // the code tells which.
            PostgresRepr::Client(e) => match e.as_db_error() {
                Some(db) => write!(f, "{} (SQLSTATE {})", db, db.code().code()),
                None => e.fmt(f),
            },
            PostgresRepr::TimedOut => f.write_str("no reply from PostgreSQL in time"),
        }
    }
}

#[cfg(feature = "postgres")]
impl std::error::Error for PostgresError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0 {
            PostgresRepr::Client(e) => Some(&**e),
            PostgresRepr::TimedOut => None,
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
        match self {
            Error::ConnectionLoss { .. }
            | Error::SessionExpired
            | Error::Timeout { .. }
            | Error::Dequeued { .. }
            | Error::Unreachable { .. }
            | Error::Refused { .. } => true,
            #[cfg(feature = "redis")]
            Error::Redis { source, .. } => source.is_transient(),
            #[cfg(feature = "postgres")]
            Error::Postgres { source, .. } => source.is_transient(),
            _ => false,
        }
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
