//! [`PostgresOptions`]: the settings that only the PostgreSQL backend has.

use std::time::Duration;

use crate::backend::DEFAULT_LEASE;
use crate::types::tls::Tls;

/// The shortest lease accepted: liveness checks go out every lease/3, and the server counts
/// `idle_session_timeout` in milliseconds.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(300);

/// The PostgreSQL backend's own settings, given to
/// [`Builder::postgres`](crate::Builder::postgres). A manager whose connect string names
/// another backend refuses them at [`connect`](crate::Builder::connect) with
/// [`Error::Config`](crate::Error::Config).
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// use std::time::Duration;
/// use zklock_core::LockManager;
///
/// // The server ends a holding session silent for 5 s, which frees its advisory locks.
/// let manager = LockManager::builder("postgres://app@db.internal/app")
///     .postgres(|pg| pg.lease(Duration::from_secs(5)))
///     .connect()
///     .await?;
/// # let _ = manager; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    pub(crate) lease: Duration,
    pub(crate) tls: Option<Tls>,
}

impl Default for PostgresOptions {
    fn default() -> PostgresOptions {
        PostgresOptions {
            lease: DEFAULT_LEASE,
            tls: None,
        }
    }
}

impl PostgresOptions {
    /// The `idle_session_timeout` of the sessions that hold advisory locks (default
    /// [`DEFAULT_LEASE`](crate::DEFAULT_LEASE), 10 s; at least 300 ms): a holder that goes
    /// silent (paused, partitioned) has its session ended, and its locks freed, by the server
    /// after this long. The sessions are checked every lease/3; a hold is reported lost at
    /// once when its connection breaks or a check fails, and at 94% of the lease after the
    /// last confirmed check otherwise, before the server ends a silent session.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("postgres://app@db.internal/app")
    ///     .postgres(|pg| pg.lease(Duration::from_secs(3)));
    /// # let _ = b;
    /// ```
    pub fn lease(mut self, lease: Duration) -> PostgresOptions {
        self.lease = lease;
        self
    }

    /// Connects over TLS with these settings (a private CA, a client certificate for
    /// PostgreSQL's `cert` authentication, the name to check). The URL's `sslmode` says how the
    /// server's certificate is checked (`verify-full`, the default here, or `verify-ca`); its
    /// `sslrootcert`, `sslcert` and `sslkey` take the place of the files given here. Without
    /// these settings, a URL with `sslmode=require`, `verify-ca` or `verify-full` uses TLS
    /// verified against `sslrootcert` or the system's roots.
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("postgres://app@db.internal/app")
    ///     .postgres(|pg| {
    ///         pg.tls(
    ///             zklock_core::Tls::new()
    ///                 .ca_file("/etc/zklock/ca.pem")
    ///                 .client_cert_files("/etc/zklock/app.pem", "/etc/zklock/app.key"),
    ///         )
    ///     });
    /// # let _ = b;
    /// ```
    pub fn tls(mut self, tls: Tls) -> PostgresOptions {
        self.tls = Some(tls);
        self
    }
}
