//! The in-memory manager, for users' unit tests, and its test hook.

use super::builder::Builder;
use super::LockManager;
use crate::types::error::{Error, Result};
use crate::types::key::Key;
use crate::types::layout;
use crate::types::loss::LossReason;

impl LockManager {
    /// A manager whose locks live in this process only: the same API, guards, frames, local
    /// queue, fencing tokens and loss signal as on ZooKeeper, with real exclusion between the
    /// tasks of this process. For your unit tests: no server to start. Every manager made by
    /// one call shares one lock table; clones of it share it too, separate calls do not.
    ///
    /// [`inspect`](Self::inspect) and [`list`](Self::list) show its lock table; what only
    /// ZooKeeper has (revocation, the ZooKeeper client) fails with [`Error::Unsupported`].
    /// [`lose`](Self::lose) makes a hold lost, as a session expiry would.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> zklock_core::Result<()> {
    /// use zklock_core::LockManager;
    ///
    /// let manager = LockManager::in_memory();
    /// let first = manager.lock("sku_7").await?;
    /// assert!(manager.try_lock("sku_7").await?.is_none()); // held: no second holder
    /// let token = first.fencing_token();
    /// drop(first);
    /// let second = manager.lock("sku_7").await?;
    /// assert!(second.fencing_token() > token);              // tokens increase
    /// # Ok(()) }
    /// ```
    pub fn in_memory() -> LockManager {
        LockManager::in_memory_with(Builder::new("memory"))
    }

    /// [`in_memory`](Self::in_memory) with the local options of `builder` (local queue,
    /// handoffs, `try_timeout`, namespace); its ZooKeeper options are ignored.
    ///
    /// ```
    /// let strict = zklock_core::LockManager::in_memory_with(
    ///     zklock_core::LockManager::builder("memory").local_queue(false),
    /// );
    /// # drop(strict);
    /// ```
    pub fn in_memory_with(builder: Builder) -> LockManager {
        LockManager::assemble(super::connect::memory(), &builder)
    }

    /// Makes every hold of `key` (any recipe) that this manager's backend granted lost with
    /// `reason`, as a session expiry or a deleted node would, so that tests can see what their
    /// code does then. In memory only.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on ZooKeeper (expire the session or delete the node there).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> zklock_core::Result<()> {
    /// use zklock_core::{LockManager, LossReason};
    ///
    /// let manager = LockManager::in_memory();
    /// let guard = manager.lock("job").await?;
    /// manager.lose("job", LossReason::SessionExpired)?;
    /// assert_eq!(guard.lost().await, LossReason::SessionExpired);
    /// # Ok(()) }
    /// ```
    pub fn lose(&self, key: &str, reason: LossReason) -> Result<()> {
        let backend = &self.inner.core.backend;
        let loser = backend.loser().map_err(|feature| Error::Unsupported {
            backend: backend.kind().label(),
            feature,
        })?;
        let key = Key::new(key)?;
        for kind in layout::KINDS {
            loser.lose(&layout::path(self.namespace(), kind, &key), reason);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::manager::LockManager;

    /// What a waiting task keeps in its own future: 10,000 tasks queued on one key each hold
    /// one. Before the recipes' `budgeted` boxed the acquire, the acquire's state was in it
    /// twice (3 KB).
    #[tokio::test]
    async fn a_lock_future_carries_the_acquire_boxed_once() {
        let manager = LockManager::in_memory();
        let mutex = manager.mutex("k").unwrap();
        let lock = mutex.lock();
        let timed = mutex.lock_timeout(std::time::Duration::from_secs(1));
        let semaphore = manager.semaphore("s", 2).unwrap();
        let lease = semaphore.acquire();
        for size in [
            std::mem::size_of_val(&lock),
            std::mem::size_of_val(&timed),
            std::mem::size_of_val(&lease),
        ] {
            assert!(size <= 512, "a lock or lease future of {size} bytes");
        }
    }
}
