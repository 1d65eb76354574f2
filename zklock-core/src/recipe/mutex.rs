//! The exclusive lock: Curator's `InterProcessMutex` recipe, with a pipelined first round trip
//! and a drain that costs O(1) requests per waiter.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Core, OnLost, Target};
use crate::backend::LockTarget;
use crate::guard::LockGuard;
use crate::metrics::Recipe;
use crate::types::error::Result;
use crate::types::mode::LockMode;

/// An exclusive lock on one key, shared across processes: a cheap handle (`Clone`) made by
/// [`LockManager::mutex`](crate::LockManager::mutex) or [`LockManager::mutex_at_path`](crate::LockManager::mutex_at_path).
///
/// Contenders are ephemeral sequential znodes `_c_<uuid>-lock-<seq>` under the lock path, as
/// Apache Curator's `InterProcessMutex` writes them, so a Curator client locking the same path
/// is excluded and queues in the same FIFO order.
///
/// # Examples
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager) -> zklock_core::Result<()> {
/// let mutex = manager.mutex("sku_100")?;
/// {
///     let guard = mutex.lock().await?;
///     // read stock, check, write stock with guard.fencing_token()
/// } // released here
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Mutex {
    target: Target,
}

impl Mutex {
    pub(crate) fn new(core: Arc<Core>, path: Arc<str>, key: Arc<str>) -> Mutex {
        Mutex {
            target: Target::new(
                core,
                LockTarget::lock(key, path),
                LockMode::Exclusive,
                Recipe::Mutex,
            ),
        }
    }

    /// The path of this lock (on ZooKeeper, its znode path: its contenders are its children).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.mutex("a b")?.path(), "/zklock/locks/a%20b");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.target.lock.path
    }

    /// Waits for the lock and returns its guard.
    ///
    /// # Reentrancy
    /// Inside a holder frame of this lock (a `with_lock` body, `#[distributed_lock]`, or
    /// [`LockGuard::scope`]) this re-enters instead of queueing, and the returned guard holds
    /// the frame's gate: concurrent branches of that frame wait for it. To take the key again
    /// from the same branch while holding that guard, use `with_lock` or `guard.scope(..)`, which
    /// open a new frame; a second `lock()` from the same branch would wait for itself.
    ///
    /// # Cancel safety
    /// This method is cancel safe. If the future is dropped before it completes, the contender
    /// node (if one was created) is deleted, and the lock is not acquired.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let mutex = m.mutex("k")?;
    /// let guard = mutex.lock().await?;
    /// tokio::spawn(async move { drop(guard) }); // a guard can move to another task
    /// # Ok(()) }
    /// ```
    pub async fn lock(&self) -> Result<LockGuard> {
        self.target.acquire(None).await
    }

    /// Takes the lock only if nobody holds or waits for it: `Ok(None)` otherwise. Costs one
    /// round trip when free, two when taken. Bounded by the manager's
    /// [`try_timeout`](crate::Builder::try_timeout) when the server is slow or unreachable.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// match m.mutex("nightly")?.try_lock().await? {
    ///     Some(guard) => { /* run the job */ drop(guard) }
    ///     None => println!("another instance has it"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.target.try_acquire().await
    }

    /// Waits at most `timeout` for the lock, connection trouble included.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when the time runs out; the contender node is removed then.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// use std::time::Duration;
    /// let mutex = m.mutex("k")?;
    /// match mutex.lock_timeout(Duration::from_millis(500)).await {
    ///     Ok(guard) => drop(guard),
    ///     Err(zklock_core::Error::Timeout { .. }) => println!("busy, try later"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<LockGuard> {
        self.target.acquire(Some(timeout)).await
    }

    /// Runs `body` under the lock and releases it afterwards; see [`LockManager::with_lock`](crate::LockManager::with_lock).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future releases the lock or removes the waiting node.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let n = m.mutex("k")?.with_lock(async { 41 + 1 }).await?;
    /// assert_eq!(n, 42);
    /// # Ok(()) }
    /// ```
    pub fn with_lock<'a, T, F>(&'a self, body: F) -> impl Future<Output = Result<T>> + 'a
    where
        F: Future<Output = T> + 'a,
        T: 'a,
    {
        let body = Box::pin(body);
        self.run(None, OnLost::Abort, body)
    }

    /// Runs `body` under the lock, waiting at most `timeout` for it, and stopping the body
    /// when the hold is lost if `on_lost` says so.
    pub(crate) async fn run<T, F: Future<Output = T>>(
        &self,
        timeout: Option<Duration>,
        on_lost: OnLost,
        body: F,
    ) -> Result<T> {
        self.target.run(timeout, on_lost, body).await
    }
}
