//! The handles of each recipe: what [`LockManager`] hands out for a key or a raw path.

use std::sync::Arc;

use super::LockManager;
use crate::recipe::job::Job;
use crate::recipe::leader::LeaderLatch;
use crate::recipe::mutex::Mutex;
use crate::recipe::rwlock::RwLock;
use crate::recipe::semaphore::Semaphore;
use crate::types::error::{Error, Result};
use crate::types::inspect::LockKind;
use crate::types::key::{validate_path, Key};
use crate::types::layout;

impl LockManager {
    /// The exclusive lock (mutex) for `key`: a cheap handle to lock and unlock it.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the key is refused (see [`Key`]).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let mutex = m.mutex("inventory:sku-7")?;
    /// let guard = mutex.lock().await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub fn mutex(&self, key: &str) -> Result<Mutex> {
        let key = Key::new(key)?;
        let path = layout::path(self.namespace(), LockKind::Mutex, &key);
        Ok(Mutex::new(
            self.inner.core.clone(),
            path.into(),
            key.as_str().into(),
        ))
    }

    /// The exclusive lock on a raw znode path, outside the namespace: for locks shared with
    /// other clients (Curator's `InterProcessMutex` on the same path excludes it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the path is not a usable znode path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let shared_with_jvm = m.mutex_at_path("/billing/locks/nightly")?;
    /// # Ok(()) }
    /// ```
    pub fn mutex_at_path(&self, path: &str) -> Result<Mutex> {
        validate_path(path, "lock path")?;
        Ok(Mutex::new(
            self.inner.core.clone(),
            path.into(),
            path.into(),
        ))
    }

    /// The read/write lock for `key`. Its znode path is `<namespace>/%RW/<encoded key>`, apart
    /// from the mutexes' (a recipe owns its path, as in Curator).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the key is refused (see [`Key`]).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("catalog")?;
    /// let reading = rw.read().await?;
    /// # drop(reading); Ok(()) }
    /// ```
    pub fn rwlock(&self, key: &str) -> Result<RwLock> {
        let key = Key::new(key)?;
        let path = layout::path(self.namespace(), LockKind::ReadWrite, &key);
        Ok(RwLock::new(
            self.inner.core.clone(),
            path.into(),
            key.as_str().into(),
        ))
    }

    /// The read/write lock on a raw znode path: Curator's `InterProcessReadWriteLock` on the
    /// same path shares and excludes with it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the path is not a usable znode path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock_at_path("/shared/config-lock")?;
    /// # Ok(()) }
    /// ```
    pub fn rwlock_at_path(&self, path: &str) -> Result<RwLock> {
        validate_path(path, "lock path")?;
        Ok(RwLock::new(
            self.inner.core.clone(),
            path.into(),
            path.into(),
        ))
    }

    /// The semaphore for `key` with `max_leases` leases. Its znode path is
    /// `<namespace>/%SEM/<encoded key>`.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a refused key; [`Error::InvalidArgument`] for zero leases.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let lease = m.semaphore("exports", 3)?.acquire().await?;
    /// # drop(lease); Ok(()) }
    /// ```
    pub fn semaphore(&self, key: &str, max_leases: u32) -> Result<Semaphore> {
        let key = Key::new(key)?;
        let path = layout::path(self.namespace(), LockKind::Semaphore, &key);
        Semaphore::new(
            self.inner.core.clone(),
            &path,
            key.as_str().into(),
            max_leases,
        )
    }

    /// The semaphore on a raw znode path: Curator's `InterProcessSemaphoreV2` on the same path
    /// (with the same number of leases) shares the count.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad path or zero leases.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let s = m.semaphore_at_path("/shared/export-slots", 3)?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore_at_path(&self, path: &str, max_leases: u32) -> Result<Semaphore> {
        validate_path(path, "semaphore path")?;
        Semaphore::new(self.inner.core.clone(), path, path.into(), max_leases)
    }

    /// The scheduled job `name`: one instance runs it at a time, the others skip it (see
    /// [`Job`]). Its lock is the key's own lock, the one [`lock`](Self::lock) and
    /// [`mutex`](Self::mutex) take (`<namespace>/<encoded name>`): one name is one lock, so a
    /// job and a plain holder of the same key exclude each other. Its run record (the
    /// `at_least` window) sits beside that lock (`<namespace>/<encoded name>%RUN`, a name no
    /// key encodes to).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a refused name.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let outcome = m.job("nightly")?.run(async { /* the job */ }).await?;
    /// # Ok(()) }
    /// ```
    pub fn job(&self, name: &str) -> Result<Job> {
        let key = Key::new(name)?;
        let path = layout::path(self.namespace(), LockKind::Mutex, &key);
        Ok(Job::new(
            self.inner.core.clone(),
            path.into(),
            key.as_str().into(),
        ))
    }

    /// The scheduled job whose lock is the raw path `path` (its run record is the sibling
    /// `<path>%RUN`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let job = m.job_at_path("/billing/jobs/invoices")?;
    /// # Ok(()) }
    /// ```
    pub fn job_at_path(&self, path: &str) -> Result<Job> {
        validate_path(path, "job path")?;
        Ok(Job::new(self.inner.core.clone(), path.into(), path.into()))
    }

    /// A participant `participant` (any text up to 1024 bytes, e.g. an instance name) of the
    /// leader election `name`. Its path is `<namespace>/%LATCH/<encoded name>`.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a refused name; [`Error::InvalidArgument`] for an empty or
    /// oversized participant id.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let leadership = m.leader_latch("scheduler", "web-3")?.lead().await?;
    /// # drop(leadership); Ok(()) }
    /// ```
    pub fn leader_latch(&self, name: &str, participant: &str) -> Result<LeaderLatch> {
        let key = Key::new(name)?;
        let path = layout::path(self.namespace(), LockKind::Leader, &key);
        self.latch(path.into(), key.as_str().into(), participant)
    }

    /// The leader election on a raw path: Curator's `LeaderLatch` on the same path takes part
    /// in the same election.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad path or participant id.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let latch = m.leader_latch_at_path("/services/billing/leader", "rust-1")?;
    /// # Ok(()) }
    /// ```
    pub fn leader_latch_at_path(&self, path: &str, participant: &str) -> Result<LeaderLatch> {
        validate_path(path, "election path")?;
        self.latch(path.into(), path.into(), participant)
    }

    fn latch(&self, path: Arc<str>, key: Arc<str>, participant: &str) -> Result<LeaderLatch> {
        // The id is the node's data: an oversized one would make the server drop the
        // connection on every create.
        const MAX_PARTICIPANT_LEN: usize = 1024;
        if participant.is_empty() || participant.len() > MAX_PARTICIPANT_LEN {
            return Err(Error::InvalidArgument(format!(
                "the participant id of the election {key} is {} bytes long; give 1 to \
                 {MAX_PARTICIPANT_LEN} bytes",
                participant.len()
            )));
        }
        Ok(LeaderLatch::new(
            self.inner.core.clone(),
            path,
            key,
            participant.into(),
        ))
    }
}
