//! What went wrong talking to MySQL or MariaDB: the client's error or no reply in time, inside
//! the backend; zklock's [`Error::Server`] once it leaves it.

use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, ServerError};
use crate::types::tls::{closed_in_handshake, failure_in_text, handshake_failure, Tls};

/// What to check when the server fails a request.
const ADVICE: &str = "check the URL, that the server is up and that the account may read and \
     write the table zklock_locks, then retry";

/// The server's error code of a query killed (`KILL QUERY`) or interrupted.
const ER_QUERY_INTERRUPTED: u16 = 1317;
/// The server's error codes of a command denied to the account.
const ER_DENIED: [u16; 3] = [1142, 1044, 1227];
/// The server's error code of too many connections.
const ER_CON_COUNT: u16 = 1040;

/// The client's error, or no reply in time.
#[derive(Debug, Clone)]
pub(super) enum MySqlError {
    Client(std::sync::Arc<mysql_async::Error>),
    TimedOut,
    /// TLS could not be set up (a certificate that does not verify, a file that cannot be
    /// read, a server without TLS, or one that requires it of a plaintext client): what went
    /// wrong and what to do.
    Tls(String),
}

impl MySqlError {
    /// Whether the same request may succeed later, on another connection: the connection
    /// broke or timed out, the server has too many connections, or is shutting down.
    pub(super) fn is_transient(&self) -> bool {
        match self {
            MySqlError::TimedOut => true,
            MySqlError::Tls(_) => false,
            MySqlError::Client(e) => match &**e {
                mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => true,
                mysql_async::Error::Server(s) => {
                    s.code == ER_CON_COUNT || s.code == ER_QUERY_INTERRUPTED || s.code == 1053
                }
                _ => false,
            },
        }
    }

    /// The server's error code, if the server answered with an error.
    fn code(&self) -> Option<u16> {
        match self {
            MySqlError::Client(e) => match &**e {
                mysql_async::Error::Server(s) => Some(s.code),
                _ => None,
            },
            MySqlError::TimedOut | MySqlError::Tls(_) => None,
        }
    }

    /// The error of opening a session; `tls`: the TLS settings it was opened with, if any. A
    /// failure of TLS, or the server's refusal of a plaintext client, is [`MySqlError::Tls`].
    pub(super) fn of_connect(e: mysql_async::Error, tls: Option<&Tls>) -> MySqlError {
        let reason = match (&e, tls) {
            (mysql_async::Error::Io(mysql_async::IoError::Tls(t)), Some(tls)) => {
                let text = format!("{t:?} {t}");
                Some(failure_in_text(&text, tls).unwrap_or_else(|| {
                    format!(
                        "the TLS handshake failed: {t}; check the CA (Tls::ca_file), the \
                         server's certificate and name, and the client certificate"
                    )
                }))
            }
            // rustls's error inside the I/O error (a certificate that does not verify, an
            // alert), or a connection closed or reset while TLS was being set up.
            (mysql_async::Error::Io(mysql_async::IoError::Io(io)), Some(tls)) => {
                if io
                    .get_ref()
                    .is_some_and(|e| e.downcast_ref::<rustls::Error>().is_some())
                {
                    Some(handshake_failure(io, tls))
                } else if matches!(
                    io.kind(),
                    std::io::ErrorKind::UnexpectedEof
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::BrokenPipe
                ) {
                    Some(closed_in_handshake(tls))
                } else {
                    None
                }
            }
            (
                mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer),
                _,
            ) => Some(
                "the server does not speak TLS; turn TLS on in the server (ssl_cert, \
                     ssl_key), or leave TLS out of the settings"
                    .to_string(),
            ),
            // ER_SECURE_TRANSPORT_REQUIRED (MySQL 3159, MariaDB 4036)
            (mysql_async::Error::Server(s), None) if s.code == 3159 || s.code == 4036 => {
                Some(format!(
                    "the server requires TLS ({}); add require_ssl=true to the URL, or give \
                     .mysql(|my| my.tls(..))",
                    s.message
                ))
            }
            _ => None,
        };
        match reason {
            Some(reason) => MySqlError::Tls(reason),
            None => e.into(),
        }
    }

    /// Whether the account may not do what was asked.
    pub(super) fn is_denied(&self) -> bool {
        self.code().is_some_and(|c| ER_DENIED.contains(&c))
    }

    /// This error during `operation` on `host`, as zklock's [`Error`].
    pub(super) fn on(self, host: String, operation: &'static str) -> Error {
        match self {
            MySqlError::Tls(reason) => Error::Tls { host, reason },
            e => e.during(operation),
        }
    }

    /// This error during `operation`, as zklock's [`Error`].
    pub(super) fn during(self, operation: &'static str) -> Error {
        let source = match &self {
            MySqlError::Tls(reason) => {
                return Error::Tls {
                    host: "the MySQL server".into(),
                    reason: reason.clone(),
                }
            }
            MySqlError::TimedOut => ServerError::timed_out("MySQL"),
            MySqlError::Client(e) => {
                ServerError::new(e.clone(), self.to_string(), self.is_transient(), ADVICE)
            }
        };
        Error::Server {
            backend: BackendKind::MySql.label(),
            operation,
            source,
        }
    }
}

/// A MySQL error during `operation`.
pub(super) fn mysql_error(operation: &'static str) -> impl FnOnce(MySqlError) -> Error {
    move |source| source.during(operation)
}

/// A URL the client refuses. The URL may carry a password: the error names the problem, not
/// the URL.
pub(super) fn unusable_url(e: mysql_async::UrlError) -> Error {
    Error::Config(format!("the MySQL URL is not usable: {e}"))
}

/// The server is a replica (`read_only`): its user locks exclude only its own sessions.
pub(super) fn replica() -> Error {
    Error::Config(
        "the MySQL URL reaches a server with read_only set (a replica): its GET_LOCK locks \
         would exclude only its own sessions, never the primary's, and it refuses zklock's \
         table writes; give the primary's address"
            .into(),
    )
}

/// The table could not be made when the backend connected.
pub(super) fn schema_refused(e: MySqlError) -> Error {
    if e.is_denied() {
        return Error::Config(
            "zklock's table zklock_locks is not in this database, and this account may not \
             create it: have an administrator run, once, the SQL that `zklock --connect <URL> \
             setup --grant-to <account>` prints (see the security guide)"
                .to_string(),
        );
    }
    e.during("create the table zklock_locks")
}

impl From<mysql_async::Error> for MySqlError {
    fn from(e: mysql_async::Error) -> MySqlError {
        MySqlError::Client(std::sync::Arc::new(e))
    }
}

impl std::fmt::Display for MySqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MySqlError::Client(e) => match &**e {
                mysql_async::Error::Server(s) => {
                    write!(f, "{} (error {}, SQLSTATE {})", s.message, s.code, s.state)
                }
                e => e.fmt(f),
            },
            MySqlError::TimedOut => f.write_str("no reply from MySQL in time"),
            MySqlError::Tls(reason) => f.write_str(reason),
        }
    }
}
