//! Guards: a held lock, its fencing token, and the signal that the hold was lost.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use zookeeper_client::{Client, EventType};

use crate::error::{Error, Result};
use crate::local::LocalLock;
use crate::manager::{DirTicket, Health, Inner};
use crate::recipe::{connection_lost, delete_in_background, wait_reconnect};

/// A number that strictly increases across successive holders of one key.
///
/// It is the czxid of the holder's contender node (the zxid of the transaction that created
/// it), extended by a local counter when a process hands the lock from task to task without a
/// new node. Pass it to the store you protect and have the store refuse writes that carry an
/// older token than the last it accepted: a holder that was paused past its session timeout
/// then cannot overwrite what the next holder wrote.
///
/// Tokens order by `(zxid, local)`; [`as_u128`](Self::as_u128) packs them into one number.
///
/// # Examples
///
/// ```
/// use zklock_core::FencingToken;
///
/// let first = FencingToken::new(0x1_0000_0005, 0);
/// let handed_on = FencingToken::new(0x1_0000_0005, 1);
/// let next_node = FencingToken::new(0x1_0000_0009, 0);
/// assert!(first < handed_on && handed_on < next_node);
/// assert_eq!(first.to_string(), "4294967301");
/// assert_eq!(handed_on.to_string(), "4294967301.1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken {
    zxid: i64,
    local: u32,
}

impl FencingToken {
    /// Makes a token from a node's czxid and a local handoff counter.
    ///
    /// ```
    /// let t = zklock_core::FencingToken::new(42, 0);
    /// assert_eq!(t.zxid(), 42);
    /// ```
    pub fn new(zxid: i64, local: u32) -> FencingToken {
        FencingToken { zxid, local }
    }

    /// The czxid of the contender node behind the hold.
    ///
    /// ```
    /// assert_eq!(zklock_core::FencingToken::new(7, 2).zxid(), 7);
    /// ```
    pub fn zxid(&self) -> i64 {
        self.zxid
    }

    /// How many local handoffs happened on the same node before this hold.
    ///
    /// ```
    /// assert_eq!(zklock_core::FencingToken::new(7, 2).local(), 2);
    /// ```
    pub fn local(&self) -> u32 {
        self.local
    }

    /// The token as one unsigned number, ordered as the token (`zxid << 32 | local`).
    ///
    /// ```
    /// use zklock_core::FencingToken;
    /// assert!(FencingToken::new(7, 9).as_u128() < FencingToken::new(8, 0).as_u128());
    /// ```
    pub fn as_u128(&self) -> u128 {
        ((self.zxid as u64 as u128) << 32) | self.local as u128
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.local == 0 {
            write!(f, "{}", self.zxid)
        } else {
            write!(f, "{}.{}", self.zxid, self.local)
        }
    }
}

/// Why a hold is no longer certain.
///
/// # Examples
///
/// ```
/// use zklock_core::LossReason;
/// assert_eq!(LossReason::SessionExpired.to_string(), "the ZooKeeper session expired");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The session expired: the server deleted the node, and another process may hold the lock.
    SessionExpired,
    /// The connection was lost for longer than the manager's [`DisconnectPolicy`](crate::DisconnectPolicy) allows.
    Disconnected,
    /// The contender node was deleted by someone else (an operator, or a revocation).
    NodeDeleted,
    /// The holder was asked to give up the lock (Curator's `__REVOKE__`).
    Revoked,
    /// The manager was closed.
    Closed,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::SessionExpired => "the ZooKeeper session expired",
            LossReason::Disconnected => "disconnected from ZooKeeper past the disconnect policy",
            LossReason::NodeDeleted => "the lock node was deleted by someone else",
            LossReason::Revoked => "the lock was revoked",
            LossReason::Closed => "the lock manager was closed",
        })
    }
}

/// One granted contender node on ZooKeeper. Deleted when dropped (in the background) or by
/// [`Hold::release`]; shared by the local holders it is handed to.
pub(crate) struct Hold {
    pub(crate) inner: Arc<Inner>,
    pub(crate) client: Client,
    pub(crate) key: Arc<str>,
    pub(crate) node: String,
    pub(crate) czxid: i64,
    /// The health epoch at grant; `u64::MAX` when the session was already unhealthy.
    epoch: u64,
    health: watch::Receiver<Health>,
    node_lost: watch::Receiver<Option<LossReason>>,
    node_lost_tx: Arc<watch::Sender<Option<LossReason>>>,
    revocation: Arc<Revocation>,
    /// The watch on the node, started on first interest (see [`Hold::watch`]).
    monitor: std::sync::OnceLock<AbortHandle>,
    released: AtomicBool,
    _ticket: DirTicket,
}

impl Hold {
    /// Builds the hold and starts watching its node for deletion.
    pub(crate) fn new(
        inner: Arc<Inner>,
        client: Client,
        key: Arc<str>,
        node: String,
        token: FencingToken,
        ticket: DirTicket,
    ) -> Hold {
        let health = inner.health.subscribe();
        let epoch = {
            let h = health.borrow();
            if h.ok {
                h.epoch
            } else {
                u64::MAX
            }
        };
        let (tx, node_lost) = watch::channel(None);
        let tx = Arc::new(tx);
        let revocation = Arc::new(Revocation::default());
        revocation
            .revocable
            .store(inner.config.revocable, Ordering::SeqCst);
        let eager = inner.config.watch_held_nodes;
        let hold = Hold {
            inner,
            client,
            key,
            node,
            czxid: token.zxid,
            epoch,
            health,
            node_lost,
            node_lost_tx: tx,
            revocation,
            monitor: std::sync::OnceLock::new(),
            released: AtomicBool::new(false),
            _ticket: ticket,
        };
        if eager {
            hold.watch();
        }
        hold
    }

    /// Starts watching the node (once): its deletion by someone else, or a revoke request,
    /// becomes a loss. Started on first interest (`lost()`, `is_held()`, `make_revocable()`,
    /// `with_lock`'s abort-on-loss) rather than at every grant: an unconditional watch puts a
    /// request in front of every release, which costs an uncontended cycle about a third.
    pub(crate) fn watch(&self) {
        if self.released.load(Ordering::SeqCst) {
            return;
        }
        self.monitor.get_or_init(|| {
            self.inner.count(1);
            let watching = watch_node(
                self.client.clone(),
                self.node.clone(),
                self.node_lost_tx.clone(),
                self.revocation.clone(),
            );
            self.inner.runtime.spawn(watching).abort_handle()
        });
    }

    fn stop_watching(&self) {
        if let Some(monitor) = self.monitor.get() {
            monitor.abort();
        }
    }

    /// Opts in to revocation: a revoke request (already made or to come) becomes a loss.
    pub(crate) fn make_revocable(&self) {
        self.revocation.revocable.store(true, Ordering::SeqCst);
        self.watch();
        if self.revocation.requested.load(Ordering::SeqCst) {
            let _ = self.node_lost_tx.send(Some(LossReason::Revoked));
        }
    }

    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        if let Some(reason) = *self.node_lost.borrow() {
            return Some(reason);
        }
        let h = self.health.borrow();
        if h.epoch != self.epoch {
            return Some(h.reason.unwrap_or(LossReason::Disconnected));
        }
        None
    }

    pub(crate) async fn lost(&self) -> LossReason {
        self.watch();
        let mut health = self.health.clone();
        let mut node = self.node_lost.clone();
        let mut node_open = true;
        loop {
            if let Some(reason) = self.loss_reason() {
                return reason;
            }
            tokio::select! {
                changed = health.changed() => if changed.is_err() { return LossReason::Closed },
                changed = node.changed(), if node_open => if changed.is_err() { node_open = false },
            }
        }
    }

    /// Deletes the node and waits for the answer.
    pub(crate) async fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.stop_watching();
        let mut attempts = 0;
        loop {
            self.inner.count(1);
            match self.client.delete(&self.node, None).await {
                Ok(()) => return Ok(()),
                Err(zookeeper_client::Error::NoNode) => {
                    return match self.loss_reason() {
                        Some(reason) => Err(Error::LockLost {
                            key: self.key.to_string(),
                            reason,
                        }),
                        None => Ok(()),
                    }
                }
                Err(err) if connection_lost(&err) && attempts < 100 => {
                    attempts += 1;
                    if !wait_reconnect(&self.client).await {
                        return Err(Error::LockLost {
                            key: self.key.to_string(),
                            reason: LossReason::SessionExpired,
                        });
                    }
                }
                Err(err) => {
                    return Err(match self.loss_reason() {
                        Some(reason) => Error::LockLost {
                            key: self.key.to_string(),
                            reason,
                        },
                        None => Error::zk("release the lock", &self.node, err),
                    })
                }
            }
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.released.swap(true, Ordering::SeqCst) {
            self.stop_watching();
            delete_in_background(&self.inner, self.client.clone(), self.node.clone());
        }
    }
}

/// The data Curator's `Revoker` writes into a holder's node to ask it to let go.
pub(crate) const REVOKE_MESSAGE: &[u8] = b"__REVOKE__";

/// What the node monitor shares with its hold.
#[derive(Default)]
pub(crate) struct Revocation {
    /// The holder opted in: a revoke request is a loss.
    pub(crate) revocable: AtomicBool,
    /// Someone asked (the node's data is `__REVOKE__`).
    pub(crate) requested: AtomicBool,
}

/// Watches a held node: deletion by someone else is a loss, and so is a revoke request once
/// the holder opted in.
async fn watch_node(
    client: Client,
    node: String,
    lost: Arc<watch::Sender<Option<LossReason>>>,
    revocation: Arc<Revocation>,
) {
    loop {
        match client.get_and_watch_data(&node).await {
            Err(zookeeper_client::Error::NoNode) => {
                tracing::warn!(%node, "lock node deleted by someone else");
                let _ = lost.send(Some(LossReason::NodeDeleted));
                return;
            }
            Ok((data, _, watcher)) => {
                if data == REVOKE_MESSAGE {
                    revocation.requested.store(true, Ordering::SeqCst);
                    if revocation.revocable.load(Ordering::SeqCst) {
                        tracing::warn!(%node, "lock revoked");
                        let _ = lost.send(Some(LossReason::Revoked));
                        return;
                    }
                }
                let event = watcher.changed().await;
                match event.event_type {
                    EventType::NodeDeleted => {
                        tracing::warn!(%node, "lock node deleted by someone else");
                        let _ = lost.send(Some(LossReason::NodeDeleted));
                        return;
                    }
                    // Session trouble is reported through the manager's health.
                    EventType::Session => return,
                    _ => continue,
                }
            }
            Err(err) if connection_lost(&err) => {
                if !wait_reconnect(&client).await {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

/// What kind of hold a guard is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldMode {
    Exclusive,
    Read,
    Write,
    Lease,
}

/// One local holder's grant: a node (shared with the local holders it is handed on to), the
/// token of this grant, and the local queue to hand it to on release.
pub(crate) struct Grant {
    node: Option<Arc<Hold>>,
    /// A second node this grant keeps until it ends (a downgrade that could not let go of its
    /// write node yet).
    extra: Option<Arc<Hold>>,
    pub(crate) token: FencingToken,
    pub(crate) mode: HoldMode,
    pub(crate) path: Arc<str>,
    local: Option<Arc<LocalLock>>,
    since: std::time::Instant,
    /// Guards on this grant (re-entries included).
    guards: std::sync::atomic::AtomicUsize,
}

impl Grant {
    pub(crate) fn new(
        node: Arc<Hold>,
        token: FencingToken,
        mode: HoldMode,
        path: Arc<str>,
        local: Option<Arc<LocalLock>>,
    ) -> Grant {
        Grant {
            node: Some(node),
            extra: None,
            token,
            mode,
            path,
            local,
            since: std::time::Instant::now(),
            guards: Default::default(),
        }
    }

    pub(crate) fn hold(&self) -> &Arc<Hold> {
        self.node
            .as_ref()
            .expect("a grant has its node until it ends")
    }

    /// The local queue this grant hands on to, if any.
    pub(crate) fn local_lock(&self) -> Option<Arc<LocalLock>> {
        self.local.clone()
    }

    /// Keeps `node` until this grant ends.
    pub(crate) fn keep(&mut self, node: Arc<Hold>) {
        self.extra = Some(node);
    }

    /// Takes the node out without releasing it (used when a handoff found no taker).
    pub(crate) fn defuse(mut self) -> Arc<Hold> {
        self.extra = None;
        self.local = None;
        self.node
            .take()
            .expect("a grant has its node until it ends")
    }

    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.hold().loss_reason()
    }

    pub(crate) async fn lost(&self) -> LossReason {
        self.hold().lost().await
    }

    /// Ends the grant: hands the node to the next local waiter, or deletes it and waits.
    async fn release(mut self) -> Result<()> {
        let node = self
            .node
            .take()
            .expect("a grant has its node until it ends");
        let extra = self.extra.take();
        let to_delete = match self.local.take() {
            Some(local) => local.release(node),
            None => Some(node),
        };
        let mut result = Ok(());
        if let Some(node) = to_delete {
            result = node.release().await;
        }
        if let Some(extra) = extra {
            let _ = extra.release().await;
        }
        result
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            let held_ms = self.since.elapsed().as_millis() as u64;
            tracing::debug!(key = %node.key, token = %self.token, held_ms, "zklock: released");
            match self.local.take() {
                // The returned node (if any) is deleted by its own Drop.
                Some(local) => drop(local.release(node)),
                None => drop(node),
            }
        }
    }
}

/// A held lock that owns its handle: `Send + 'static`, so it can move into spawned tasks.
/// Dropping it releases the lock.
///
/// Drop cannot wait, so it sends the delete at once (any later request of this process is
/// ordered after it) and retries in a spawned task if the connection is lost; call
/// [`release`](Self::release) to wait for the result instead. When tasks of this process wait
/// for the same key, the release hands the lock to the next of them without a round trip.
///
/// # Examples
///
/// ```no_run
/// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
/// let guard = m.mutex("job")?.lock_owned().await?;
/// tokio::spawn(async move {
///     // work under the lock in another task
///     guard.release().await
/// });
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock will immediately release"]
#[clippy::has_significant_drop]
pub struct OwnedLockGuard {
    grant: Option<Arc<Grant>>,
    /// Serializes re-entries of one frame's hold.
    gate: Option<tokio::sync::OwnedMutexGuard<()>>,
    key: Arc<str>,
}

impl OwnedLockGuard {
    pub(crate) fn new(grant: Grant, key: Arc<str>) -> OwnedLockGuard {
        Self::reentered(Arc::new(grant), None, key)
    }

    /// A re-entry of a hold an enclosing frame has.
    pub(crate) fn reentered(
        grant: Arc<Grant>,
        gate: Option<tokio::sync::OwnedMutexGuard<()>>,
        key: Arc<str>,
    ) -> OwnedLockGuard {
        grant.guards.fetch_add(1, Ordering::SeqCst);
        OwnedLockGuard {
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

    /// The full path of the contender node behind this hold.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// println!("{}", m.lock("k").await?.node_path());
    /// # Ok(()) }
    /// ```
    pub fn node_path(&self) -> &str {
        &self.grant().hold().node
    }

    /// Whether the hold is still certain: false once the session expired, the connection was
    /// lost past the manager's [`DisconnectPolicy`](crate::DisconnectPolicy), or the node was
    /// deleted. Once false it stays false.
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
        let hold = self.grant().hold();
        hold.watch();
        hold.loss_reason()
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
        self.grant().hold().make_revocable();
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

    /// Counted re-entry: another guard on the same hold, with no ZooKeeper traffic. The node is
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
    pub fn reenter(&self) -> OwnedLockGuard {
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
    ///     // re-enters: no deadlock, no ZooKeeper traffic
    ///     m.with_lock("account_7", async { /* ... */ }).await
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub fn scope<'a, F>(&'a self, body: F) -> impl std::future::Future<Output = F::Output> + 'a
    where
        F: std::future::Future + 'a,
    {
        crate::frame::run_in(self.grant().clone(), Box::pin(body))
    }

    /// Releases the lock and waits until ZooKeeper confirms it (or until it is handed to a
    /// waiting task of this process). Ends only this hold when it was re-entered.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the node was already gone because the hold was lost;
    /// connection errors when the server could not be reached (the node then goes with the
    /// session at the latest).
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
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("catalog")?;
    /// let write = rw.write().await?;
    /// // ... update ...
    /// let read = write.into_owned().downgrade().await?;   // keep reading what was written
    /// # drop(read); Ok(()) }
    /// ```
    pub async fn downgrade(mut self) -> Result<OwnedLockGuard> {
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
                return Err(Error::WouldDeadlock(format!(
                    "cannot downgrade the write lock on {key}: {} other holds re-enter it",
                    Arc::strong_count(&shared) - 1
                )))
            }
        };
        crate::recipe::rwlock::downgrade(grant, key).await
    }
}

impl Drop for OwnedLockGuard {
    fn drop(&mut self) {
        self.gate.take();
        if let Some(grant) = self.grant.take() {
            grant.guards.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl fmt::Debug for OwnedLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.grant {
            Some(g) => f
                .debug_struct("LockGuard")
                .field("key", &self.key)
                .field("node", &g.hold().node)
                .field("token", &g.token)
                .field("mode", &g.mode)
                .field("held", &g.loss_reason().is_none())
                .finish(),
            None => f.write_str("LockGuard(released)"),
        }
    }
}

/// A held lock, borrowed from the [`Mutex`](crate::Mutex), [`RwLock`](crate::RwLock) or
/// [`LockManager`](crate::LockManager) it came from. Dropping it releases the lock.
///
/// It derefs to [`OwnedLockGuard`], which documents every method; use
/// [`into_owned`](Self::into_owned) to move it into a spawned task.
///
/// # Examples
///
/// ```no_run
/// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
/// let guard = m.lock("user_42").await?;
/// let token = guard.fencing_token();   // send it with every write
/// assert!(guard.is_held());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock will immediately release"]
#[clippy::has_significant_drop]
pub struct LockGuard<'a> {
    owned: OwnedLockGuard,
    _borrow: PhantomData<&'a ()>,
}

impl<'a> LockGuard<'a> {
    pub(crate) fn from_owned(owned: OwnedLockGuard) -> LockGuard<'a> {
        LockGuard {
            owned,
            _borrow: PhantomData,
        }
    }

    /// Turns the borrowed guard into an owned one (`'static`).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let owned = m.lock("k").await?.into_owned();
    /// tokio::spawn(async move { drop(owned) });
    /// # Ok(()) }
    /// ```
    pub fn into_owned(self) -> OwnedLockGuard {
        self.owned
    }

    /// Releases the lock and waits until ZooKeeper confirms it; see [`OwnedLockGuard::release`].
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// m.lock("k").await?.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn release(self) -> Result<()> {
        self.owned.release().await
    }
}

impl std::ops::Deref for LockGuard<'_> {
    type Target = OwnedLockGuard;

    fn deref(&self) -> &OwnedLockGuard {
        &self.owned
    }
}

impl fmt::Debug for LockGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.owned.fmt(f)
    }
}
