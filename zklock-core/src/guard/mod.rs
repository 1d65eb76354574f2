//! Guards: what users hold. They release downward only, through the local table.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::backend::LockTarget;
use crate::fence::{Fence, Fenced};
use crate::local::frame;
use crate::local::Grant;
use crate::types::error::{Deadlock, Error, Result};
use crate::types::loss::LossReason;
use crate::types::mode::HoldMode;
use crate::types::token::FencingToken;

/// A held lock. Dropping it releases the lock.
///
/// It owns what it needs (`Send + 'static`), so it can move into spawned tasks. Drop cannot
/// wait, so it sends the release at once (any later request of this process is ordered after
/// it) and retries in a spawned task if the connection is lost; call
/// [`release`](Self::release) to wait for the result instead. When tasks of this process wait
/// for the same key, the release hands the lock to the next of them without a round trip.
///
/// # Examples
///
/// ```no_run
/// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
/// let guard = m.lock("user_42").await?;
/// let token = guard.fencing_token(); // send it with every write
/// tokio::spawn(async move {
///     // work under the lock in another task, then let go
///     guard.release().await
/// });
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock will immediately release"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    grant: Option<Arc<Grant>>,
    /// Serializes re-entries of one frame's hold.
    gate: Option<tokio::sync::OwnedMutexGuard<()>>,
    key: Arc<str>,
}

impl LockGuard {
    pub(crate) fn new(grant: Grant, key: Arc<str>) -> LockGuard {
        Self::reentered(Arc::new(grant), None, key)
    }

    /// A re-entry of a hold an enclosing frame has.
    pub(crate) fn reentered(
        grant: Arc<Grant>,
        gate: Option<tokio::sync::OwnedMutexGuard<()>>,
        key: Arc<str>,
    ) -> LockGuard {
        grant.guards.fetch_add(1, Ordering::SeqCst);
        LockGuard {
            grant: Some(grant),
            gate,
            key,
        }
    }

    pub(crate) fn grant(&self) -> &Arc<Grant> {
        self.grant
            .as_ref()
            .expect("a guard holds until it is consumed")
    }

    /// The fencing token of this hold; see [`FencingToken`].
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let guard = m.lock("k").await?;
    /// let token = guard.fencing_token();
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> FencingToken {
        self.grant().token
    }

    /// A writer to `fence` that carries this hold's fencing token, on the lock's own resource
    /// name (its path, `LockManager::path_of(key)`): every write through it is applied only if
    /// the store accepted no newer token of this lock. See [`fence`](crate::fence).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use zklock_core::fence::{MemoryFence, Outcome};
    ///
    /// let manager = zklock_core::LockManager::in_memory();
    /// let stock = MemoryFence::new();
    /// let first = manager.lock("sku_7").await?;
    /// let late = first.fenced(&stock); // kept by a holder that will be paused
    /// first.release().await?;
    /// let next = manager.lock("sku_7").await?;
    /// assert!(next.fenced(&stock).write(9).await?.is_accepted());
    /// assert!(matches!(late.write(10).await?, Outcome::Stale { .. }));
    /// assert_eq!(stock.value(&manager.path_of("sku_7")?), Some(9));
    /// # Ok(()) }
    /// ```
    pub fn fenced<'f, F: Fence>(&self, fence: &'f F) -> Fenced<'f, F> {
        let grant = self.grant();
        Fenced::new(fence, grant.path.clone(), grant.token)
    }

    /// The key (or raw path, for [`mutex_at_path`](crate::LockManager::mutex_at_path)) of the lock.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.lock("k").await?.key(), "k");
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Where this hold lives on the server: its contender node's path on ZooKeeper, its key
    /// on Redis, its lock path and advisory lock on PostgreSQL.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// println!("{}", m.lock("k").await?.node_path());
    /// # Ok(()) }
    /// ```
    pub fn node_path(&self) -> &str {
        self.grant().hold().location()
    }

    /// Whether the hold is still certain: false once the session expired, the connection was
    /// lost past the manager's [`DisconnectPolicy`](crate::DisconnectPolicy), the lease could
    /// have run out, or the hold was deleted on the server. Once false it stays false.
    ///
    /// It answers from what this process has heard. On ZooKeeper the node is watched from the
    /// grant (see
    /// [`ZooKeeperOptions::watch_held_nodes`](crate::ZooKeeperOptions::watch_held_nodes)), so once any later answer
    /// from ZooKeeper has reached this process, a deletion before it has been seen too, even if
    /// the task that watches has not run yet. One exception: a node granted while alone in its
    /// lock path is watched through the path's children, which tells that the path changed but
    /// not which node; its deletion shows one read later. (A local handoff of such a node waits
    /// for that read.) A hold whose session ended is lost for good, whatever session the
    /// manager has now.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let guard = m.lock("k").await?;
    /// if !guard.is_held() { return Ok(()); /* do not write */ }
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.loss_reason().is_none()
    }

    /// Why the hold was lost, or `None` while it is held.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.lock("k").await?.loss_reason(), None);
    /// # Ok(()) }
    /// ```
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.grant().hold().loss_reason()
    }

    /// Completes when the hold is lost, with the reason. Race it against the critical section
    /// to stop work that is no longer protected.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let guard = m.lock("k").await?;
    /// tokio::select! {
    ///     reason = guard.lost() => eprintln!("stopped: {reason}"),
    ///     _ = async { /* work */ } => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) -> LossReason {
        self.grant().lost().await
    }

    /// Opts in to revocation (Curator's protocol): when someone asks this holder to let go
    /// ([`LockManager::revoke`](crate::LockManager::revoke), `zklock revoke`, or Curator's
    /// `Revoker`), the hold is reported lost with [`LossReason::Revoked`] through
    /// [`lost`](Self::lost) and [`is_held`](Self::is_held); the holder then finishes and
    /// releases. A request made before opting in counts too.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let guard = m.lock("long-report").await?;
    /// guard.make_revocable();
    /// tokio::select! {
    ///     reason = guard.lost() => eprintln!("giving up the lock: {reason}"),
    ///     _ = async { /* long work */ } => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub fn make_revocable(&self) {
        if let Some(hold) = self.grant().hold().revocable() {
            hold.make_revocable();
        }
    }

    /// How many holds share this one (1 unless re-entered with [`reenter`](Self::reenter),
    /// [`scope`](Self::scope) or a nested acquire in a frame).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let guard = m.lock("k").await?;
    /// let again = guard.reenter();
    /// assert_eq!(guard.hold_count(), 2);
    /// # drop(again); Ok(()) }
    /// ```
    pub fn hold_count(&self) -> usize {
        self.grant().guards.load(Ordering::SeqCst)
    }

    /// Counted re-entry: another guard on the same hold, with no request to the server. The node is
    /// released when the last of them ends.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let outer = m.lock("k").await?;
    /// let inner = outer.reenter();
    /// drop(outer);          // still held through `inner`
    /// assert!(inner.is_held());
    /// # Ok(()) }
    /// ```
    pub fn reenter(&self) -> LockGuard {
        Self::reentered(self.grant().clone(), None, self.key.clone())
    }

    /// Runs `body` in a holder frame of this hold: inside it, acquiring the same key (with
    /// [`LockManager::with_lock`](crate::LockManager::with_lock), `lock`, or
    /// `#[distributed_lock]`) re-enters with a count instead of waiting for itself.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let guard = m.lock("account_7").await?;
    /// guard.scope(async {
    ///     // re-enters: no deadlock, no request to the server
    ///     m.with_lock("account_7", async { /* ... */ }).await
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub fn scope<'a, F>(&'a self, body: F) -> impl std::future::Future<Output = F::Output> + 'a
    where
        F: std::future::Future + 'a,
    {
        frame::run_in(self.grant().clone(), Box::pin(body))
    }

    /// Releases the lock and waits until the server confirms it (or until it is handed to a
    /// waiting task of this process, or kept lingering: see
    /// [`Builder::linger`](crate::Builder::linger)). Ends only this hold when it was re-entered.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the node was already gone because the hold was lost;
    /// connection errors when the server could not be reached (the node then goes with the
    /// session at the latest).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped before the delete is confirmed (say, while the
    /// connection is down), the delete is sent again in the background and retried for as long
    /// as the session lives; [`LockManager::flush`](crate::LockManager::flush) waits for it.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// m.lock("k").await?.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<()> {
        self.gate.take();
        let grant = self
            .grant
            .take()
            .expect("a guard holds until it is consumed");
        grant.guards.fetch_sub(1, Ordering::SeqCst);
        match Arc::try_unwrap(grant) {
            Ok(grant) => grant.release().await,
            Err(_) => Ok(()),
        }
    }

    /// Turns a write guard of a [`RwLock`](crate::RwLock) into a read guard without letting
    /// another writer in between. The write node is let go at once when no writer queued behind
    /// it; otherwise it is kept until the read guard ends (readers of other processes then wait
    /// for that). Any other guard is returned as is.
    ///
    /// The read node is made on the write hold's own session, and the read guard's
    /// [`fencing_token`](Self::fencing_token) continues the write token (see [`FencingToken`]).
    ///
    /// # Errors
    /// [`Error::LockLost`] when the write hold is no longer certain (its session expired, its
    /// node was deleted): nothing is made then. [`Error::WouldDeadlock`] when re-entries of
    /// the write hold are still alive.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("catalog")?;
    /// let write = rw.write().await?;
    /// // ... update ...
    /// let read = write.downgrade().await?;   // keep reading what was written
    /// # drop(read); Ok(()) }
    /// ```
    pub async fn downgrade(mut self) -> Result<LockGuard> {
        if self.grant().mode != HoldMode::Write {
            return Ok(self);
        }
        self.gate.take();
        let grant = self
            .grant
            .take()
            .expect("a guard holds until it is consumed");
        grant.guards.fetch_sub(1, Ordering::SeqCst);
        let key = self.key.clone();
        let grant = match Arc::try_unwrap(grant) {
            Ok(grant) => grant,
            Err(shared) => {
                return Err(Error::WouldDeadlock {
                    key: key.to_string(),
                    cause: Deadlock::DowngradeWhileReentered {
                        others: Arc::strong_count(&shared) - 1,
                    },
                })
            }
        };
        let target = LockTarget::lock(key.clone(), grant.path.clone());
        let read = grant.downgrade(target).await?;
        Ok(LockGuard::new(read, key))
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.gate.take();
        if let Some(grant) = self.grant.take() {
            grant.guards.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.grant {
            Some(g) => f
                .debug_struct("LockGuard")
                .field("key", &self.key)
                .field("node", &g.hold().location())
                .field("token", &g.token)
                .field("mode", &g.mode)
                .field("held", &g.loss_reason().is_none())
                .finish(),
            None => f.write_str("LockGuard(released)"),
        }
    }
}
