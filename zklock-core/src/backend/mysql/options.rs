//! [`MySqlOptions`]: the settings that only the MySQL / MariaDB backend has.

use std::time::Duration;

use crate::backend::DEFAULT_LEASE;
use crate::types::tls::Tls;

/// The shortest lease accepted: the server counts `wait_timeout` in whole seconds, and
/// liveness checks go out every lease/3.
pub(crate) const MIN_LEASE: Duration = Duration::from_secs(1);

/// The MySQL / MariaDB backend's own settings, given to
/// [`Builder::mysql`](crate::Builder::mysql). A manager whose connect string names another
/// backend refuses them at [`connect`](crate::Builder::connect) with
/// [`Error::Config`](crate::Error::Config).
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// use std::time::Duration;
/// use zklock_core::LockManager;
///
/// // The server ends a holding session silent for 5 s, which frees its locks.
/// let manager = LockManager::builder("mysql://app:secret@db.internal/app")
///     .mysql(|my| my.lease(Duration::from_secs(5)))
///     .connect()
///     .await?;
/// # let _ = manager; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MySqlOptions {
    pub(crate) lease: Duration,
    pub(crate) tls: Option<Tls>,
}

impl Default for MySqlOptions {
    fn default() -> MySqlOptions {
        MySqlOptions {
            lease: DEFAULT_LEASE,
            tls: None,
        }
    }
}

impl MySqlOptions {
    /// The `wait_timeout` of the sessions that hold locks, in whole seconds (default
    /// [`DEFAULT_LEASE`](crate::DEFAULT_LEASE), 10 s; at least 1 s): a holder that goes silent
    /// (paused, partitioned) has its session ended, and its locks freed, by the server after
    /// this long. The sessions are checked every lease/3; a hold is reported lost at once when
    /// its connection breaks or a check fails, and at 94% of the lease after the last confirmed
    /// check otherwise, before the server ends a silent session.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("mysql://app:secret@db.internal/app")
    ///     .mysql(|my| my.lease(Duration::from_secs(3)));
    /// # let _ = b;
    /// ```
    pub fn lease(mut self, lease: Duration) -> MySqlOptions {
        self.lease = lease;
        self
    }

    /// Connects over TLS with these settings (a private CA, a client certificate for an account
    /// created `REQUIRE X509`, the name to check), the server's certificate always verified:
    /// its chain against the CA given (else the system's roots), and its name against the
    /// URL's host (or [`Tls::server_name`]). The files are read again for every new session.
    /// Without these settings, a URL with `require_ssl=true` uses TLS verified against the
    /// system's roots; a URL that turns verification off (`verify_ca=false`,
    /// `verify_identity=false`) is refused.
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("mysql://app:secret@db.internal/app")
    ///     .mysql(|my| {
    ///         my.tls(
    ///             zklock_core::Tls::new()
    ///                 .ca_file("/etc/zklock/ca.pem")
    ///                 .client_cert_files("/etc/zklock/app.pem", "/etc/zklock/app.key"),
    ///         )
    ///     });
    /// # let _ = b;
    /// ```
    pub fn tls(mut self, tls: Tls) -> MySqlOptions {
        self.tls = Some(tls);
        self
    }
}
