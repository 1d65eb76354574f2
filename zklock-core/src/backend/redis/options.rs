//! [`RedisOptions`]: the settings that only the Redis backend has.

use std::time::Duration;

use crate::backend::DEFAULT_LEASE;

/// The Redis backend's own settings, given to [`Builder::redis`](crate::Builder::redis). A
/// manager whose connect string names another backend refuses them at
/// [`connect`](crate::Builder::connect) with [`Error::Config`](crate::Error::Config).
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// use std::time::Duration;
/// use zklock_core::LockManager;
///
/// // A holder that cannot renew its 5 s lease reports the lock lost before Redis frees it.
/// let manager = LockManager::builder("redis://127.0.0.1:6379")
///     .redis(|r| r.lease(Duration::from_secs(5)))
///     .connect()
///     .await?;
/// # let _ = manager; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisOptions {
    pub(crate) lease: Duration,
}

impl Default for RedisOptions {
    fn default() -> RedisOptions {
        RedisOptions {
            lease: DEFAULT_LEASE,
        }
    }
}

impl RedisOptions {
    /// How long a hold lives without a renewal (default [`DEFAULT_LEASE`], 10 s; at least
    /// 100 ms): the `PX` of its key.
    ///
    /// A watchdog renews every hold every lease/3 while it lives. The hold is reported lost
    /// ([`LockGuard::lost`](crate::LockGuard::lost)) the moment a renewal fails, or when the
    /// lease could have run out without a confirmed renewal: at 94% of the lease (less 2 ms)
    /// after the last confirmed renewal was sent, leaving 1% + 2 ms for clock drift and 5% for
    /// the process to notice and stop before the server lets another holder in. A shorter
    /// lease hands a crashed holder's lock on sooner; a longer one survives longer server or
    /// network stalls.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("redis://127.0.0.1:6379")
    ///     .redis(|r| r.lease(Duration::from_secs(3)));
    /// # let _ = b;
    /// ```
    pub fn lease(mut self, lease: Duration) -> RedisOptions {
        self.lease = lease;
        self
    }
}
