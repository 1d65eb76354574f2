//! The exclusive lock: Curator's `InterProcessMutex` recipe, with a pipelined first round trip
//! and a drain that costs O(1) requests per waiter.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Client, EventType};

use super::{
    delete_by_prefix_in_background, delete_in_background, ensure_parents, sort_key,
    EPHEMERAL_SEQUENTIAL, MUTEX_LOCK_NAME, NODE_DATA,
};
use crate::error::{Error, Result};
use crate::guard::{FencingToken, Hold, LockGuard, OwnedLockGuard};
use crate::manager::{Inner, LockManager};
use crate::private::OnLost;

/// How many of the nearest lower contenders a waiter remembers from its listing. When the
/// predecessor goes, the next one is taken from this window instead of listing again.
const WINDOW: usize = 8;

/// An exclusive lock on one key, shared across processes: a cheap handle (`Clone`) made by
/// [`LockManager::mutex`] or [`LockManager::mutex_at_path`].
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
    manager: LockManager,
    path: Arc<str>,
    key: Arc<str>,
}

enum Wait {
    Forever,
    Until(Instant, Duration),
    Never,
}

impl Mutex {
    pub(crate) fn new(manager: LockManager, path: Arc<str>, key: Arc<str>) -> Mutex {
        Mutex { manager, path, key }
    }

    /// The znode path of this lock (its contenders are its children).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.mutex("a b")?.path(), "/zklock/locks/a%20b");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Waits for the lock and returns a guard borrowed from this handle.
    ///
    /// # Cancel safety
    /// This method is cancel safe. If the future is dropped before it completes, the contender
    /// node (if one was created) is deleted, and the lock is not acquired.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let mutex = m.mutex("k")?;
    /// let guard = mutex.lock().await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub async fn lock(&self) -> Result<LockGuard<'_>> {
        self.lock_owned_ref().await.map(LockGuard::from_owned)
    }

    /// Waits for the lock and returns an owned guard (`'static`).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let guard = m.mutex("k")?.lock_owned().await?;
    /// tokio::spawn(async move { drop(guard) });
    /// # Ok(()) }
    /// ```
    pub async fn lock_owned(self) -> Result<OwnedLockGuard> {
        self.lock_owned_ref().await
    }

    async fn lock_owned_ref(&self) -> Result<OwnedLockGuard> {
        let hold = self
            .acquire(Wait::Forever)
            .await?
            .expect("an unbounded wait ends with the lock");
        Ok(OwnedLockGuard::new(hold))
    }

    /// Takes the lock only if nobody holds or waits for it: `Ok(None)` otherwise. Costs one
    /// round trip when free, two when taken.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// if let Some(guard) = m.mutex("k")?.try_lock().await? {
    ///     drop(guard);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_lock(&self) -> Result<Option<LockGuard<'_>>> {
        Ok(self
            .acquire(Wait::Never)
            .await?
            .map(|h| LockGuard::from_owned(OwnedLockGuard::new(h))))
    }

    /// [`try_lock`](Self::try_lock) returning an owned guard.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let maybe = m.mutex("k")?.try_lock_owned().await?;
    /// # drop(maybe); Ok(()) }
    /// ```
    pub async fn try_lock_owned(self) -> Result<Option<OwnedLockGuard>> {
        Ok(self.acquire(Wait::Never).await?.map(OwnedLockGuard::new))
    }

    /// Waits at most `timeout` for the lock.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the time runs out; the contender node is removed then.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// use std::time::Duration;
    /// let mutex = m.mutex("k")?;
    /// let guard = mutex.lock_timeout(Duration::from_millis(500)).await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<LockGuard<'_>> {
        self.lock_timeout_owned_ref(timeout)
            .await
            .map(LockGuard::from_owned)
    }

    /// [`lock_timeout`](Self::lock_timeout) returning an owned guard.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let guard = m.mutex("k")?.lock_timeout_owned(std::time::Duration::from_secs(1)).await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub async fn lock_timeout_owned(self, timeout: Duration) -> Result<OwnedLockGuard> {
        self.lock_timeout_owned_ref(timeout).await
    }

    async fn lock_timeout_owned_ref(&self, timeout: Duration) -> Result<OwnedLockGuard> {
        let wait = Wait::Until(Instant::now() + timeout, timeout);
        let hold = self
            .acquire(wait)
            .await?
            .expect("a bounded wait ends with the lock or an error");
        Ok(OwnedLockGuard::new(hold))
    }

    /// Runs `body` under the lock and releases it afterwards; see [`LockManager::with_lock`].
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
    pub async fn with_lock<T, F: Future<Output = T>>(&self, body: F) -> Result<T> {
        self.run(None, OnLost::Abort, body).await
    }

    /// Runs `body` under the lock, waiting at most `timeout` for it, and stopping the body
    /// when the hold is lost if `on_lost` says so.
    pub(crate) async fn run<T, F: Future<Output = T>>(
        &self,
        timeout: Option<Duration>,
        on_lost: OnLost,
        body: F,
    ) -> Result<T> {
        let guard = match timeout {
            Some(timeout) => self.lock_timeout(timeout).await?,
            None => self.lock().await?,
        };
        let result = match on_lost {
            OnLost::Continue => Ok(body.await),
            OnLost::Abort => {
                tokio::pin!(body);
                tokio::select! {
                    biased;
                    reason = guard.lost() => Err(Error::LockLost { key: self.key.to_string(), reason }),
                    value = &mut body => Ok(value),
                }
            }
        };
        drop(guard);
        result
    }

    /// The acquire: create the contender and list the children in one round trip, then wait on
    /// the predecessor only.
    async fn acquire(&self, wait: Wait) -> Result<Option<Hold>> {
        let inner = &self.manager.inner;
        let ticket = inner.enter_dir(&self.path);
        let client = inner.live_client().await?;
        let uuid = uuid::Uuid::new_v4();
        let protect = format!("_c_{uuid}-");
        let prefix = format!("{}/{protect}{MUTEX_LOCK_NAME}", self.path);
        let mut pending = Pending {
            inner: inner.clone(),
            client: client.clone(),
            dir: self.path.clone(),
            protect,
            node: None,
            sent: false,
        };

        let (name, czxid, children) = self
            .create_contender(&client, &prefix, &mut pending)
            .await?;
        let me = sort_key(&name, MUTEX_LOCK_NAME).to_string();
        let mut queue = Queue::new(children, &name)?;
        loop {
            if let Some(floor) = ticket.granted_floor() {
                queue.prune_below(&floor);
            }
            let Some(pred) = queue.predecessor() else {
                if queue.hidden {
                    inner.count(1);
                    let children = match client.list_children(&self.path).await {
                        Ok(children) => children,
                        Err(err) => {
                            self.retry_or_fail("list the contenders", err).await?;
                            continue;
                        }
                    };
                    queue = Queue::new(children, &name)?;
                    continue;
                }
                break;
            };
            if matches!(wait, Wait::Never) {
                pending.cancel_now();
                return Ok(None);
            }
            let pred_path = format!("{}/{pred}", self.path);
            inner.count(1);
            let watcher = match client.check_and_watch_stat(&pred_path).await {
                Ok((None, _)) => {
                    queue.pop();
                    continue;
                }
                Ok((Some(_), watcher)) => watcher,
                Err(err) => {
                    self.retry_or_fail("watch the predecessor", err).await?;
                    continue;
                }
            };
            let event = match &wait {
                Wait::Until(deadline, waited) => {
                    match tokio::time::timeout_at(*deadline, watcher.changed()).await {
                        Ok(event) => event,
                        Err(_) => {
                            pending.cancel_now();
                            return Err(Error::Timeout {
                                key: self.key.to_string(),
                                waited: *waited,
                            });
                        }
                    }
                }
                _ => watcher.changed().await,
            };
            inner
                .stats
                .predecessor_events
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match event.event_type {
                EventType::NodeDeleted => queue.pop(),
                EventType::Session => {
                    // The session ended while waiting: our node went with it.
                    return Err(match event.session_state {
                        zookeeper_client::SessionState::Expired => Error::SessionExpired,
                        _ => Error::Closed,
                    });
                }
                // Data changed (e.g. a Curator revocation request): look again.
                _ => {}
            }
        }
        ticket.record_grant(&me);
        let node = pending.disarm().expect("a granted contender has a node");
        tracing::debug!(key = %self.key, node = %node, token = czxid, "lock acquired");
        Ok(Some(Hold::new(
            inner.clone(),
            client,
            self.key.clone(),
            node,
            FencingToken::new(czxid, 0),
            ticket,
        )))
    }

    /// Creates the contender node (making the lock path on first use) and lists its siblings,
    /// pipelined. Returns the node's name, its czxid and the listing taken after it.
    async fn create_contender(
        &self,
        client: &Client,
        prefix: &str,
        pending: &mut Pending,
    ) -> Result<(String, i64, Vec<String>)> {
        let inner = &self.manager.inner;
        for _ in 0..20 {
            // Both requests are sent here, in this order: the listing sees the new node.
            let create = client.create(prefix, &NODE_DATA, &EPHEMERAL_SEQUENTIAL);
            let list = client.list_children(&self.path);
            pending.sent = true;
            inner.count(2);
            let (created, listed) = futures::join!(create, list);
            match created {
                Ok((stat, seq)) => {
                    let name = format!("{}{MUTEX_LOCK_NAME}{seq}", pending.protect);
                    pending.node = Some(format!("{}/{name}", self.path));
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => self.list_retrying(client).await?,
                    };
                    return Ok((name, stat.czxid, children));
                }
                Err(zookeeper_client::Error::NoNode) => ensure_parents(client, &self.path).await?,
                Err(zookeeper_client::Error::ConnectionLoss) => {
                    // The create may have happened: find it by its protected prefix.
                    inner.wait_connected("create the contender node").await?;
                    let children = self.list_retrying(client).await?;
                    if let Some(name) = children
                        .iter()
                        .find(|c| c.starts_with(&pending.protect))
                        .cloned()
                    {
                        let path = format!("{}/{name}", self.path);
                        pending.node = Some(path.clone());
                        inner.count(1);
                        match client.check_stat(&path).await {
                            Ok(Some(stat)) => return Ok((name, stat.czxid, children)),
                            Ok(None) => pending.node = None,
                            Err(err) => {
                                return Err(Error::zk("read the contender node", &path, err))
                            }
                        }
                    }
                }
                Err(err) => return Err(Error::zk("create the contender node", &self.path, err)),
            }
        }
        Err(Error::Config(format!(
            "could not create a contender under {} after 20 tries: the lock path keeps disappearing",
            self.path
        )))
    }

    async fn list_retrying(&self, client: &Client) -> Result<Vec<String>> {
        loop {
            self.manager.inner.count(1);
            match client.list_children(&self.path).await {
                Ok(children) => return Ok(children),
                Err(err) => self.retry_or_fail("list the contenders", err).await?,
            }
        }
    }

    /// Waits out a connection loss; any other error ends the acquire.
    async fn retry_or_fail(
        &self,
        operation: &'static str,
        err: zookeeper_client::Error,
    ) -> Result<()> {
        match err {
            zookeeper_client::Error::ConnectionLoss => {
                self.manager.inner.wait_connected(operation).await
            }
            err => Err(Error::zk(operation, &self.path, err)),
        }
    }
}

/// The contender node of an acquire in progress: if the acquire ends without a hold (error,
/// timeout, cancellation), the node is deleted.
struct Pending {
    inner: Arc<Inner>,
    client: Client,
    dir: Arc<str>,
    protect: String,
    node: Option<String>,
    /// The create was sent: if no node is known, one may still exist under `protect`.
    sent: bool,
}

impl Pending {
    /// The acquire succeeded: the node now belongs to the hold.
    fn disarm(&mut self) -> Option<String> {
        self.sent = false;
        self.node.take()
    }

    fn cancel_now(&mut self) {
        if let Some(node) = self.node.take() {
            delete_in_background(&self.inner, self.client.clone(), node);
        }
        self.sent = false;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            delete_in_background(&self.inner, self.client.clone(), node);
        } else if self.sent {
            delete_by_prefix_in_background(
                &self.inner,
                self.client.clone(),
                self.dir.clone(),
                self.protect.clone(),
            );
        }
    }
}

/// The nearest lower contenders of a waiter, nearest last.
struct Queue {
    below: Vec<String>,
    /// More contenders sort below the window.
    hidden: bool,
    /// Sort key of the lowest node in the window when it was built; hidden nodes sort below it.
    floor: String,
}

impl Queue {
    fn new(mut children: Vec<String>, me: &str) -> Result<Queue> {
        children.sort_unstable_by(|a, b| {
            sort_key(a, MUTEX_LOCK_NAME).cmp(sort_key(b, MUTEX_LOCK_NAME))
        });
        let Some(at) = children.iter().position(|c| c == me) else {
            return Err(Error::LockLost {
                key: me.to_string(),
                reason: crate::LossReason::NodeDeleted,
            });
        };
        let start = at.saturating_sub(WINDOW);
        children.truncate(at);
        let below = children.split_off(start);
        let floor = below
            .first()
            .map(|n| sort_key(n, MUTEX_LOCK_NAME).to_string())
            .unwrap_or_default();
        Ok(Queue {
            below,
            hidden: start > 0,
            floor,
        })
    }

    fn predecessor(&self) -> Option<&str> {
        self.below.last().map(String::as_str)
    }

    fn pop(&mut self) {
        self.below.pop();
    }

    /// Forgets every node sorting below `granted`, the highest node this process was granted an
    /// exclusive hold on: all of those were gone when it was granted.
    fn prune_below(&mut self, granted: &str) {
        self.below
            .retain(|n| sort_key(n, MUTEX_LOCK_NAME) >= granted);
        if self.hidden && granted >= self.floor.as_str() {
            self.hidden = false;
        }
    }
}
