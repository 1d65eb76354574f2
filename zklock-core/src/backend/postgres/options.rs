//! [`PostgresOptions`]: the settings that only the PostgreSQL backend has.

use std::time::Duration;

use crate::backend::DEFAULT_LEASE;

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
}

impl Default for PostgresOptions {
    fn default() -> PostgresOptions {
        PostgresOptions {
            lease: DEFAULT_LEASE,
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
}
