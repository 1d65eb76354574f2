//! The read/write lock: Curator's `InterProcessReadWriteLock` recipe. Readers share, a writer
//! excludes everyone, FIFO between them; a reader waits only on writers ahead of it, a writer
//! on every node ahead of it (on ZooKeeper it watches the nearest 2, and lists the queue again
//! while its predecessor holds, so the predecessor's deletion is its grant, with no request
//! after it).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Core, OnLost, Target};
use crate::backend::LockTarget;
use crate::guard::LockGuard;
use crate::metrics::Recipe;
use crate::types::error::Result;
use crate::types::mode::LockMode;

/// A read/write lock on one key, shared across processes: a cheap handle (`Clone`) made by
/// [`LockManager::rwlock`](crate::LockManager::rwlock) or [`LockManager::rwlock_at_path`](crate::LockManager::rwlock_at_path).
///
/// Contenders are `_c_<uuid>-__READ__<seq>` and `_c_<uuid>-__WRIT__<seq>` under one path, as
/// Apache Curator's `InterProcessReadWriteLock` writes them: Curator readers and zklock
/// readers share, and a writer of either excludes everyone.
///
/// Inside a holder frame (`with_write`, `with_read`, [`LockGuard::scope`]) a writer may
/// take the read lock of its own key; a reader asking for the write lock of its own key gets
/// [`Error::WouldDeadlock`](crate::Error::WouldDeadlock) at once.
///
/// # Examples
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager) -> zklock_core::Result<()> {
/// let prices = manager.rwlock("price-table")?;
/// let total = prices.with_read(async { /* many readers at once */ 42 }).await?;
/// prices.with_write(async { /* one writer, no readers */ }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RwLock {
    read: Target,
    write: Target,
}

impl RwLock {
    pub(crate) fn new(core: Arc<Core>, path: Arc<str>, key: Arc<str>) -> RwLock {
        let lock = LockTarget::lock(key, path);
        let read = Target::new(core.clone(), lock.clone(), LockMode::Read, Recipe::Read);
        let write = Target::new(core, lock, LockMode::Write, Recipe::Write);
        RwLock { read, write }
    }

    /// The path of this lock (its znode path on ZooKeeper).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.rwlock("cfg")?.path(), "/zklock/locks/%RW/cfg");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.read.lock.path
    }

    /// Waits for a read hold (shared with other readers).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped acquire leaves no node behind.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("cfg")?;
    /// let guard = rw.read().await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub async fn read(&self) -> Result<LockGuard> {
        self.read.acquire(None).await
    }

    /// Waits for the write hold (exclusive).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped acquire leaves no node behind.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("cfg")?;
    /// let guard = rw.write().await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub async fn write(&self) -> Result<LockGuard> {
        self.write.acquire(None).await
    }

    /// A read hold if no writer holds or waits ahead: `Ok(None)` otherwise.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("cfg")?;
    /// if let Some(g) = rw.try_read().await? { drop(g) }
    /// # Ok(()) }
    /// ```
    pub async fn try_read(&self) -> Result<Option<LockGuard>> {
        self.read.try_acquire().await
    }

    /// The write hold if nobody holds or waits: `Ok(None)` otherwise.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("cfg")?;
    /// if let Some(g) = rw.try_write().await? { drop(g) }
    /// # Ok(()) }
    /// ```
    pub async fn try_write(&self) -> Result<Option<LockGuard>> {
        self.write.try_acquire().await
    }

    /// Waits at most `timeout` for a read hold.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when the time runs out; nothing is left on the server.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("cfg")?;
    /// let g = rw.read_timeout(std::time::Duration::from_secs(1)).await?;
    /// # drop(g); Ok(()) }
    /// ```
    pub async fn read_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        self.read.acquire(Some(timeout)).await
    }

    /// Waits at most `timeout` for the write hold.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when the time runs out; nothing is left on the server.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("cfg")?;
    /// let g = rw.write_timeout(std::time::Duration::from_secs(1)).await?;
    /// # drop(g); Ok(()) }
    /// ```
    pub async fn write_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        self.write.acquire(Some(timeout)).await
    }

    /// Runs `body` under a read hold, in a holder frame.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let n = m.rwlock("cfg")?.with_read(async { 1 }).await?;
    /// # Ok(()) }
    /// ```
    pub fn with_read<'a, T, F>(&'a self, body: F) -> impl Future<Output = Result<T>> + 'a
    where
        F: Future<Output = T> + 'a,
        T: 'a,
    {
        self.read.run(None, OnLost::Abort, Box::pin(body))
    }

    /// Runs `body` under the write hold, in a holder frame.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// m.rwlock("cfg")?.with_write(async { /* update */ }).await?;
    /// # Ok(()) }
    /// ```
    pub fn with_write<'a, T, F>(&'a self, body: F) -> impl Future<Output = Result<T>> + 'a
    where
        F: Future<Output = T> + 'a,
        T: 'a,
    {
        self.write.run(None, OnLost::Abort, Box::pin(body))
    }

    pub(crate) async fn run<T, F: Future<Output = T>>(
        &self,
        write: bool,
        timeout: Option<Duration>,
        on_lost: OnLost,
        body: F,
    ) -> Result<T> {
        let target = if write { &self.write } else { &self.read };
        target.run(timeout, on_lost, body).await
    }
}
