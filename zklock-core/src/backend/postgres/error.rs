//! What went wrong talking to PostgreSQL: the client's error or no reply in time, inside the
//! backend; zklock's [`Error::Server`] once it leaves it.

use tokio_postgres::error::SqlState;

use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, ServerError};

/// What to check when PostgreSQL fails a request.
const ADVICE: &str =
    "check the URL, that the server is up and that the role may create and update the table zklock_keys, then retry";

/// The client's error, no reply in time, or a server that must not be used.
#[derive(Debug, Clone)]
pub(super) enum PostgresError {
    Client(std::sync::Arc<tokio_postgres::Error>),
    TimedOut,
    /// The server is a standby (in recovery): its advisory locks exclude only its own
    /// sessions, never the primary's, and it refuses the key table's writes.
    Standby,
    /// The server is a primary on an older timeline than one this process has used: a primary
    /// that was failed over (a standby promoted) and still runs.
    OldPrimary {
        timeline: u32,
        newest: u32,
    },
}

impl PostgresError {
    /// The error of a request that got no reply in time (the connection is then closed: what
    /// it held is released by the server).
    pub(super) fn timed_out() -> PostgresError {
        PostgresError::TimedOut
    }

    /// The client's error, if the client reported one (`None` for a request that timed out).
    pub(super) fn get_ref(&self) -> Option<&tokio_postgres::Error> {
        match self {
            PostgresError::Client(e) => Some(e),
            PostgresError::TimedOut | PostgresError::Standby | PostgresError::OldPrimary { .. } => {
                None
            }
        }
    }

    /// Whether the same request may succeed later, on another connection: the connection
    /// broke, was refused, or timed out, or the server is shutting down or starting.
    pub(super) fn is_transient(&self) -> bool {
        match self {
            PostgresError::TimedOut => true,
            PostgresError::Standby | PostgresError::OldPrimary { .. } => false,
            // A certificate that does not verify does not verify the next time either.
            PostgresError::Client(e) if super::tls::tls_failure(e).is_some() => false,
            PostgresError::Client(e) => {
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

    /// This error during `operation`, as zklock's [`Error`].
    pub(super) fn during(self, operation: &'static str) -> Error {
        if let PostgresError::Client(e) = &self {
            if let Some(failure) = super::tls::tls_failure(e) {
                return failure;
            }
        }
        let source = match &self {
            PostgresError::Standby => {
                return Error::Config(format!(
                    "the PostgreSQL URL reaches a standby (in recovery) during {operation}: its \
                     advisory locks would exclude only its own sessions, never the primary's; \
                     give the primary's address (with several hosts in the URL, add \
                     target_session_attrs=read-write)"
                ))
            }
            PostgresError::OldPrimary { timeline, newest } => {
                return Error::Config(format!(
                    "the PostgreSQL URL reaches a primary on timeline {timeline} during \
                     {operation}, but this process has used one on timeline {newest}: a standby \
                     was promoted and this old primary still runs, so its advisory locks would \
                     not exclude the new primary's; stop (fence) the old primary or take it out \
                     of the URL"
                ))
            }
            PostgresError::TimedOut => ServerError::timed_out("PostgreSQL"),
            PostgresError::Client(e) => {
                ServerError::new(e.clone(), self.to_string(), self.is_transient(), ADVICE)
            }
        };
        Error::Server {
            backend: BackendKind::Postgres.label(),
            operation,
            source,
        }
    }
}

/// A postgres error during `operation`.
pub(super) fn pg_error(operation: &'static str) -> impl FnOnce(PostgresError) -> Error {
    move |source| source.during(operation)
}

pub(super) fn is_undefined_table(e: &PostgresError) -> bool {
    e.get_ref().and_then(|e| e.code()) == Some(&SqlState::UNDEFINED_TABLE)
}

/// A statement cancelled by someone else: this backend's own cancels end only waits whose
/// acquire was dropped, so an acquire that meets one (an operator's `pg_cancel_backend`) sends
/// its statement again.
pub(super) fn is_cancelled(e: &PostgresError) -> bool {
    e.get_ref().and_then(|e| e.code()) == Some(&SqlState::QUERY_CANCELED)
}

/// A URL the client refuses. The URL may carry a password: the error names the problem, not
/// the URL.
pub(super) fn unusable_url(e: tokio_postgres::Error) -> Error {
    Error::Config(format!("the PostgreSQL URL is not usable: {e}"))
}

/// The key table could not be made when the backend connected.
pub(super) fn schema_refused(e: PostgresError) -> Error {
    if e.get_ref().and_then(|e| e.code()) == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
        return Error::Config(
            "zklock's table zklock_keys is not in this database, and this role may not \
             create it: have an administrator run, once, the SQL that `zklock --connect \
             <URL> setup --grant-to <role>` prints (see the security guide)"
                .to_string(),
        );
    }
    e.during("create the table zklock_keys")
}

/// The key table's row of `key` kept changing while an acquire or a job's record looked its
/// id up again.
pub(super) fn row_keeps_changing(key: &str) -> Error {
    Error::Config(format!(
        "the row of {key} in the table zklock_keys keeps changing; do not delete rows of zklock_keys while zklock runs"
    ))
}

impl From<tokio_postgres::Error> for PostgresError {
    fn from(e: tokio_postgres::Error) -> PostgresError {
        PostgresError::Client(std::sync::Arc::new(e))
    }
}

impl std::fmt::Display for PostgresError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // The client's `Display` of a server error is only its severity and message;
            // the code tells which.
            PostgresError::Client(e) => match e.as_db_error() {
                Some(db) => write!(f, "{} (SQLSTATE {})", db, db.code().code()),
                None => e.fmt(f),
            },
            PostgresError::TimedOut => f.write_str("no reply from PostgreSQL in time"),
            PostgresError::Standby => f.write_str("the server is a standby (in recovery)"),
            PostgresError::OldPrimary { timeline, newest } => write!(
                f,
                "the server is a primary on timeline {timeline}, older than timeline {newest} \
                 this process has used (a failed-over primary)"
            ),
        }
    }
}
