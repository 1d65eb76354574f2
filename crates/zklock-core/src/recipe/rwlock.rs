//! The read/write lock: Curator's `InterProcessReadWriteLock` recipe. Readers share, a writer
//! excludes everyone, FIFO between them; a reader waits only on writers ahead of it, a writer
//! only on its predecessor.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::contender::{create_node, NodeKind, Wait, WRITE_NAME};
use super::Target;
use crate::error::Result;
use crate::guard::{FencingToken, Grant, HoldMode, LockGuard, OwnedLockGuard};
use crate::manager::LockManager;
use crate::private::OnLost;

/// A read/write lock on one key, shared across processes: a cheap handle (`Clone`) made by
/// [`LockManager::rwlock`] or [`LockManager::rwlock_at_path`].
///
/// Contenders are `_c_<uuid>-__READ__<seq>` and `_c_<uuid>-__WRIT__<seq>` under one path, as
/// Apache Curator's `InterProcessReadWriteLock` writes them: Curator readers and zklock
/// readers share, and a writer of either excludes everyone.
///
/// Inside a holder frame (`with_write`, `with_read`, [`OwnedLockGuard::scope`]) a writer may
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
    pub(crate) fn new(manager: LockManager, path: Arc<str>, key: Arc<str>) -> RwLock {
        let read = Target {
            manager,
            path,
            key,
            kind: NodeKind::Read,
        };
        let write = Target {
            kind: NodeKind::Write,
            ..read.clone()
        };
        RwLock { read, write }
    }

    /// The znode path of this lock.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.rwlock("cfg")?.path(), "/zklock/locks/%RW/cfg");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.read.path
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
    pub async fn read(&self) -> Result<LockGuard<'_>> {
        Ok(LockGuard::from_owned(
            self.read
                .guard(Wait::Forever)
                .await?
                .expect("unbounded wait"),
        ))
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
    pub async fn write(&self) -> Result<LockGuard<'_>> {
        Ok(LockGuard::from_owned(
            self.write
                .guard(Wait::Forever)
                .await?
                .expect("unbounded wait"),
        ))
    }

    /// A read hold if no writer holds or waits ahead: `Ok(None)` otherwise.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("cfg")?;
    /// if let Some(g) = rw.try_read().await? { drop(g) }
    /// # Ok(()) }
    /// ```
    pub async fn try_read(&self) -> Result<Option<LockGuard<'_>>> {
        Ok(self
            .read
            .guard(Wait::Never)
            .await?
            .map(LockGuard::from_owned))
    }

    /// The write hold if nobody holds or waits: `Ok(None)` otherwise.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("cfg")?;
    /// if let Some(g) = rw.try_write().await? { drop(g) }
    /// # Ok(()) }
    /// ```
    pub async fn try_write(&self) -> Result<Option<LockGuard<'_>>> {
        Ok(self
            .write
            .guard(Wait::Never)
            .await?
            .map(LockGuard::from_owned))
    }

    /// Waits at most `timeout` for a read hold.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when the time runs out; no node is left.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("cfg")?;
    /// let g = rw.read_timeout(std::time::Duration::from_secs(1)).await?;
    /// # drop(g); Ok(()) }
    /// ```
    pub async fn read_timeout(&self, timeout: Duration) -> Result<LockGuard<'_>> {
        let guard = self.read.guard(Wait::timeout(Some(timeout))).await?;
        Ok(LockGuard::from_owned(
            guard.expect("a bounded wait ends with the lock or an error"),
        ))
    }

    /// Waits at most `timeout` for the write hold.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when the time runs out; no node is left.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("cfg")?;
    /// let g = rw.write_timeout(std::time::Duration::from_secs(1)).await?;
    /// # drop(g); Ok(()) }
    /// ```
    pub async fn write_timeout(&self, timeout: Duration) -> Result<LockGuard<'_>> {
        let guard = self.write.guard(Wait::timeout(Some(timeout))).await?;
        Ok(LockGuard::from_owned(
            guard.expect("a bounded wait ends with the lock or an error"),
        ))
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

/// Turns a write grant into a read grant: a read node is created (no wait: we hold the write
/// lock), then the write node is let go if no writer queued between the two; otherwise the
/// write node is kept until the read grant ends, so that no queued writer can get in while we
/// read.
pub(crate) async fn downgrade(write: Grant, key: Arc<str>) -> Result<OwnedLockGuard> {
    let hold = write.hold().clone();
    let path = write.path.clone();
    let inner = hold.inner.clone();
    let (read, children) = create_node(&inner, &path, &key, NodeKind::Read).await?;
    let read_key = NodeKind::Read
        .sort_key(read.node.rsplit('/').next().unwrap_or_default())
        .to_string();
    let write_key = NodeKind::Write
        .sort_key(hold.node.rsplit('/').next().unwrap_or_default())
        .to_string();
    let writer_between = children.iter().any(|c| {
        let k = NodeKind::Write.sort_key(c);
        c.contains(WRITE_NAME) && k > write_key.as_str() && k < read_key.as_str()
    });
    let local = write.local_lock();
    let write_node = write.defuse();
    let write_node = match local {
        Some(local) => local.give_up(write_node),
        None => write_node,
    };
    let token = FencingToken::new(read.czxid, 0);
    let mut grant = Grant::new(Arc::new(read), token, HoldMode::Read, path, None);
    if writer_between {
        grant.keep(write_node);
    } else {
        write_node.release().await?;
    }
    Ok(OwnedLockGuard::new(grant, key))
}
