//! Guards: a held lock, its fencing token, and the signal that the hold was lost.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use zookeeper_client::{Client, EventType};

use crate::error::{Error, Result};
use crate::manager::{DirTicket, Health, Inner};
use crate::recipe::{delete_in_background, wait_reconnect};

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

/// One granted contender node: what every guard form shares.
pub(crate) struct Hold {
    pub(crate) inner: Arc<Inner>,
    pub(crate) client: Client,
    pub(crate) key: Arc<str>,
    pub(crate) node: String,
    pub(crate) token: FencingToken,
    /// The health epoch at grant; `u64::MAX` when the session was already unhealthy.
    pub(crate) epoch: u64,
    pub(crate) health: watch::Receiver<Health>,
    pub(crate) node_lost: watch::Receiver<Option<LossReason>>,
    pub(crate) monitor: AbortHandle,
    pub(crate) _ticket: DirTicket,
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
        inner.count(1);
        let monitor = inner
            .runtime
            .spawn(watch_node(client.clone(), node.clone(), tx))
            .abort_handle();
        Hold {
            inner,
            client,
            key,
            node,
            token,
            epoch,
            health,
            node_lost,
            monitor,
            _ticket: ticket,
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
    pub(crate) async fn release(self) -> Result<()> {
        self.monitor.abort();
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
                Err(zookeeper_client::Error::ConnectionLoss) if attempts < 100 => {
                    attempts += 1;
                    if !wait_reconnect(&self.client).await {
                        return Err(Error::LockLost {
                            key: self.key.to_string(),
                            reason: LossReason::SessionExpired,
                        });
                    }
                }
                Err(
                    zookeeper_client::Error::SessionExpired | zookeeper_client::Error::ClientClosed,
                ) => {
                    let reason = self.loss_reason().unwrap_or(LossReason::SessionExpired);
                    return Err(Error::LockLost {
                        key: self.key.to_string(),
                        reason,
                    });
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

    /// Deletes the node in the background (for `Drop`).
    fn release_in_background(&self) {
        self.monitor.abort();
        delete_in_background(&self.inner, self.client.clone(), self.node.clone());
    }
}

/// Watches a held node: deletion by someone else is a loss.
async fn watch_node(client: Client, node: String, lost: watch::Sender<Option<LossReason>>) {
    loop {
        match client.check_and_watch_stat(&node).await {
            Ok((None, _)) => {
                let _ = lost.send(Some(LossReason::NodeDeleted));
                return;
            }
            Ok((Some(_), watcher)) => {
                let event = watcher.changed().await;
                match event.event_type {
                    EventType::NodeDeleted => {
                        let _ = lost.send(Some(LossReason::NodeDeleted));
                        return;
                    }
                    // Session trouble is reported through the manager's health.
                    EventType::Session => return,
                    _ => continue,
                }
            }
            Err(zookeeper_client::Error::ConnectionLoss) => {
                if !wait_reconnect(&client).await {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

/// A held exclusive lock that owns its handle: `Send + 'static`, so it can move into spawned
/// tasks. Dropping it releases the lock.
///
/// Drop cannot wait, so it sends the delete at once (any later request of this process is
/// ordered after it) and retries in a spawned task if the connection is lost; call
/// [`release`](Self::release) to wait for the result instead.
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
    hold: Option<Hold>,
}

impl OwnedLockGuard {
    pub(crate) fn new(hold: Hold) -> OwnedLockGuard {
        OwnedLockGuard { hold: Some(hold) }
    }

    fn hold(&self) -> &Hold {
        self.hold
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
        self.hold().token
    }

    /// The key (or raw path, for [`mutex_at_path`](crate::LockManager::mutex_at_path)) of the lock.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.lock("k").await?.key(), "k");
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &str {
        &self.hold().key
    }

    /// The full path of the contender node behind this hold.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// println!("{}", m.lock("k").await?.node_path());
    /// # Ok(()) }
    /// ```
    pub fn node_path(&self) -> &str {
        &self.hold().node
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
        self.hold().loss_reason().is_none()
    }

    /// Why the hold was lost, or `None` while it is held.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.lock("k").await?.loss_reason(), None);
    /// # Ok(()) }
    /// ```
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.hold().loss_reason()
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
        self.hold().lost().await
    }

    /// Releases the lock and waits until ZooKeeper confirms it.
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
        let hold = self
            .hold
            .take()
            .expect("a guard holds until it is consumed");
        hold.release().await
    }
}

impl Drop for OwnedLockGuard {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            hold.release_in_background();
        }
    }
}

impl fmt::Debug for OwnedLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.hold {
            Some(h) => f
                .debug_struct("LockGuard")
                .field("key", &h.key)
                .field("node", &h.node)
                .field("token", &h.token)
                .field("held", &h.loss_reason().is_none())
                .finish(),
            None => f.write_str("LockGuard(released)"),
        }
    }
}

/// A held exclusive lock, borrowed from the [`Mutex`](crate::Mutex) or
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
