//! Introspection and revocation: who holds a lock, who waits, since when, with which token;
//! and asking a holder to let go. Each backend reads its own server (its `Inspect` ability);
//! here keys become lock paths, and what this process keeps lingering is marked.

use crate::backend::Backend;
use crate::manager::LockManager;
use crate::types::error::{Error, Result};
use crate::types::inspect::{LockInfo, LockKind};
use crate::types::key::{validate_path, Key};
use crate::types::layout;

impl LockManager {
    fn backend(&self) -> &dyn Backend {
        &*self.inner.core.backend
    }

    fn inspector(&self) -> Result<&dyn crate::backend::Inspect> {
        self.backend()
            .inspector()
            .map_err(|feature| Error::Unsupported {
                backend: self.backend().kind().label(),
                feature,
            })
    }

    /// Marks the holders this manager keeps lingering, and names the lock by `key`.
    fn shown(&self, mut info: LockInfo, key: String) -> LockInfo {
        let table = &self.inner.core.table;
        for h in &mut info.holders {
            h.lingering = table.is_lingering(&h.location);
        }
        info.key = key;
        info
    }

    /// Who holds the lock on `key` and who waits, of whichever recipe uses the key (mutex,
    /// read/write lock, semaphore or leader latch), read from the server: on ZooKeeper, Redis
    /// and PostgreSQL alike (in memory, from the manager's own lock table).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let info = m.inspect("order_42").await?;
    /// for h in &info.holders {
    ///     println!("held by {} since {:?} (token {})", h.owner, h.since, h.token);
    /// }
    /// println!("{} waiting", info.waiters.len());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The backend's error when its server does not answer.
    pub async fn inspect(&self, key: &str) -> Result<LockInfo> {
        let k = Key::new(key)?;
        let inspector = self.inspector()?;
        let mut first = None;
        for kind in layout::KINDS {
            let path = layout::path(self.namespace(), kind, &k);
            let info = inspector.inspect(&path, Some(kind)).await?;
            let info = self.shown(info, key.to_string());
            if !info.holders.is_empty() || !info.waiters.is_empty() {
                return Ok(info);
            }
            first.get_or_insert(info);
        }
        Ok(first.expect("every recipe was inspected"))
    }

    /// [`inspect`](Self::inspect) for a raw lock path; the recipe is told by what the server
    /// holds there.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let info = m.inspect_path("/billing/locks/nightly").await?;
    /// # Ok(()) }
    /// ```
    pub async fn inspect_path(&self, path: &str) -> Result<LockInfo> {
        validate_path(path, "lock path")?;
        let info = self.inspector()?.inspect(path, None).await?;
        let key = match layout::parse(self.namespace(), path) {
            Some((_, key)) => key,
            None => path.to_string(),
        };
        Ok(self.shown(info, key))
    }

    /// Every lock under the namespace whose key starts with `prefix`, with its state: what
    /// `zklock ls` shows. Locks with neither holder nor waiter are left out.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// for lock in m.list("sku_").await? {
    ///     println!("{} {} holders, {} waiting", lock.key, lock.holders.len(), lock.waiters.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let inspector = self.inspector()?;
        let mut locks: Vec<(LockKind, String, String)> = inspector
            .lock_paths(self.namespace())
            .await?
            .into_iter()
            .filter_map(|path| {
                let (kind, key) = layout::parse(self.namespace(), &path)?;
                key.starts_with(prefix).then_some((kind, key, path))
            })
            .collect();
        locks.sort_by(|a, b| (kind_rank(a.0), &a.1).cmp(&(kind_rank(b.0), &b.1)));
        locks.dedup_by(|a, b| a.2 == b.2);
        let mut out = vec![];
        for (kind, key, path) in locks {
            let info = self.shown(inspector.inspect(&path, Some(kind)).await?, key);
            if !info.holders.is_empty() || !info.waiters.is_empty() {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Asks the holder(s) of the lock on `key` to let go (on ZooKeeper, Curator's revocation:
    /// their node's data becomes `__REVOKE__`). Holders that opted in with
    /// [`LockGuard::make_revocable`](crate::LockGuard::make_revocable) see the hold
    /// lost with [`LossReason::Revoked`](crate::LossReason::Revoked); others are not forced.
    /// Returns the holders asked.
    ///
    /// # Errors
    /// [`Error::Unsupported`], with the reason, on a backend that cannot carry the request.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let asked = m.revoke("stuck-job").await?;
    /// println!("asked {} holder(s)", asked.len());
    /// # Ok(()) }
    /// ```
    pub async fn revoke(&self, key: &str) -> Result<Vec<String>> {
        let revoker = self.revoker()?;
        let info = self.inspect(key).await?;
        revoker.revoke(&info).await
    }

    /// [`revoke`](Self::revoke) for a raw lock path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// m.revoke_path("/billing/locks/nightly").await?;
    /// # Ok(()) }
    /// ```
    pub async fn revoke_path(&self, path: &str) -> Result<Vec<String>> {
        let revoker = self.revoker()?;
        let info = self.inspect_path(path).await?;
        revoker.revoke(&info).await
    }

    fn revoker(&self) -> Result<&dyn crate::backend::Revoke> {
        self.backend()
            .revoker()
            .map_err(|feature| Error::Unsupported {
                backend: self.backend().kind().label(),
                feature,
            })
    }
}

/// The order `list` shows recipes in: as [`layout::KINDS`].
fn kind_rank(kind: LockKind) -> usize {
    layout::KINDS
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(usize::MAX)
}
