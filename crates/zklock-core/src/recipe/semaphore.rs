//! The counting semaphore: Curator's `InterProcessSemaphoreV2` recipe. A mutex on
//! `<path>/locks` admits one acquirer at a time; it creates its lease
//! `<path>/leases/_c_<uuid>-lease-<seq>` and waits, still holding the mutex, until at most N
//! leases exist. Only that one acquirer watches the leases: no herd.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::EventType;

use super::contender::{create_node, NodeKind, Wait};
use super::mutex::Mutex;
use crate::error::{Error, Result};
use crate::guard::{FencingToken, Hold, LossReason};
use crate::manager::LockManager;

/// A semaphore with N leases shared across processes: a cheap handle (`Clone`) made by
/// [`LockManager::semaphore`] or [`LockManager::semaphore_at_path`].
///
/// Laid out as Curator's `InterProcessSemaphoreV2` (`<path>/locks/` and `<path>/leases/`), so
/// Curator clients using the same path and the same number of leases share the count.
///
/// # Examples
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager) -> zklock_core::Result<()> {
/// // At most 3 exports run at once across every instance.
/// let exports = manager.semaphore("exports", 3)?;
/// let lease = exports.acquire().await?;
/// // ... export ...
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    manager: LockManager,
    key: Arc<str>,
    leases: Arc<str>,
    lock: Mutex,
    max_leases: u32,
}

impl Semaphore {
    pub(crate) fn new(
        manager: LockManager,
        path: &str,
        key: Arc<str>,
        max_leases: u32,
    ) -> Result<Semaphore> {
        if max_leases == 0 {
            return Err(Error::Config(format!(
                "the semaphore {key} needs at least one lease"
            )));
        }
        let lock = Mutex::new(manager.clone(), format!("{path}/locks").into(), key.clone());
        Ok(Semaphore {
            manager,
            key,
            leases: format!("{path}/leases").into(),
            lock,
            max_leases,
        })
    }

    /// How many leases may be held at once.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.semaphore("s", 3)?.max_leases(), 3);
    /// # Ok(()) }
    /// ```
    pub fn max_leases(&self) -> u32 {
        self.max_leases
    }

    /// Waits for one lease.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped acquire leaves no lease node and no lock node behind.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let lease = m.semaphore("s", 2)?.acquire().await?;
    /// # drop(lease); Ok(()) }
    /// ```
    pub async fn acquire(&self) -> Result<Lease> {
        let mut leases = self
            .acquire_inner(1, Wait::Forever)
            .await?
            .expect("an unbounded wait ends with leases");
        Ok(leases.pop().expect("one lease"))
    }

    /// Waits for `n` leases at once: all or none.
    ///
    /// # Errors
    /// [`Error::Config`] when `n` exceeds the semaphore's leases (it could never succeed).
    ///
    /// # Cancel safety
    /// Cancel safe: leases taken so far are returned.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let two = m.semaphore("s", 4)?.acquire_many(2).await?;
    /// # drop(two); Ok(()) }
    /// ```
    pub async fn acquire_many(&self, n: u32) -> Result<Vec<Lease>> {
        Ok(self
            .acquire_inner(n, Wait::Forever)
            .await?
            .expect("an unbounded wait ends with leases"))
    }

    /// A lease if one is free now: `Ok(None)` otherwise.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// if let Some(lease) = m.semaphore("s", 1)?.try_acquire().await? { drop(lease) }
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self) -> Result<Option<Lease>> {
        Ok(self
            .acquire_inner(1, Wait::Never)
            .await?
            .and_then(|mut l| l.pop()))
    }

    /// Waits at most `timeout` for one lease.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the time runs out; nothing is left behind.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let lease = m.semaphore("s", 1)?.acquire_timeout(std::time::Duration::from_secs(2)).await?;
    /// # drop(lease); Ok(()) }
    /// ```
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Lease> {
        let mut leases = self.acquire_many_timeout(1, timeout).await?;
        Ok(leases.pop().expect("one lease"))
    }

    /// Waits at most `timeout` for `n` leases: all or none.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let two = m.semaphore("s", 4)?.acquire_many_timeout(2, std::time::Duration::from_secs(2)).await?;
    /// # drop(two); Ok(()) }
    /// ```
    pub async fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<Vec<Lease>> {
        let leases = self.acquire_inner(n, Wait::timeout(Some(timeout))).await?;
        Ok(leases.expect("a bounded wait ends with leases or an error"))
    }

    async fn acquire_inner(&self, n: u32, wait: Wait) -> Result<Option<Vec<Lease>>> {
        if n > self.max_leases {
            return Err(Error::Config(format!(
                "asked for {n} leases of the semaphore {} which has {}",
                self.key, self.max_leases
            )));
        }
        let mut leases = Vec::with_capacity(n as usize);
        for _ in 0..n {
            match Box::pin(self.acquire_one(wait)).await? {
                Some(lease) => leases.push(lease),
                // Dropping the leases taken so far returns them.
                None => return Ok(None),
            }
        }
        Ok(Some(leases))
    }

    async fn acquire_one(&self, wait: Wait) -> Result<Option<Lease>> {
        let gate = match wait {
            Wait::Never => match self.lock.try_lock().await? {
                Some(g) => g,
                None => return Ok(None),
            },
            Wait::Until(deadline, _) => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                self.lock
                    .lock_timeout(left)
                    .await
                    .map_err(|e| self.timeout_error(e, wait))?
            }
            Wait::Forever => self.lock.lock().await?,
        };
        let inner = &self.manager.inner;
        let (hold, mut children) =
            create_node(inner, &self.leases, &self.key, NodeKind::Lease).await?;
        let name = hold.node.rsplit('/').next().unwrap_or_default().to_string();
        let client = hold.client.clone();
        loop {
            if !children.contains(&name) {
                return Err(Error::LockLost {
                    key: self.key.to_string(),
                    reason: LossReason::NodeDeleted,
                });
            }
            if children.len() <= self.max_leases as usize {
                break;
            }
            if matches!(wait, Wait::Never) {
                return Ok(None);
            }
            inner.count(1);
            let (kids, watcher) = match client.list_and_watch_children(&self.leases).await {
                Ok(listed) => listed,
                Err(err) if super::connection_lost(&err) => {
                    inner.wait_connected("list the leases").await?;
                    continue;
                }
                Err(err) => return Err(Error::zk("list the leases", &self.leases, err)),
            };
            if kids.contains(&name) && kids.len() <= self.max_leases as usize {
                break;
            }
            let event = match wait {
                Wait::Until(deadline, waited) => {
                    match tokio::time::timeout_at(deadline, watcher.changed()).await {
                        Ok(event) => event,
                        Err(_) => {
                            return Err(Error::Timeout {
                                key: self.key.to_string(),
                                waited,
                            })
                        }
                    }
                }
                _ => watcher.changed().await,
            };
            if event.event_type == EventType::Session {
                return Err(Error::SessionExpired);
            }
            inner.count(1);
            children = match client.list_children(&self.leases).await {
                Ok(kids) => kids,
                Err(err) => return Err(Error::zk("list the leases", &self.leases, err)),
            };
        }
        drop(gate);
        tracing::debug!(key = %self.key, node = %hold.node, "semaphore lease acquired");
        Ok(Some(Lease {
            hold: Some(Box::new(hold)),
            key: self.key.clone(),
        }))
    }

    fn timeout_error(&self, err: Error, wait: Wait) -> Error {
        match (err, wait) {
            (Error::Timeout { .. }, Wait::Until(_, waited)) => Error::Timeout {
                key: self.key.to_string(),
                waited,
            },
            (err, _) => err,
        }
    }
}

/// One lease of a [`Semaphore`]: returned when dropped (in the background) or by
/// [`release`](Self::release).
///
/// # Examples
///
/// ```no_run
/// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
/// let lease = m.semaphore("workers", 8)?.acquire().await?;
/// assert!(lease.is_held());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the lease will immediately be returned"]
#[clippy::has_significant_drop]
pub struct Lease {
    hold: Option<Box<Hold>>,
    key: Arc<str>,
}

impl Lease {
    fn hold(&self) -> &Hold {
        self.hold
            .as_ref()
            .expect("a lease holds until it is consumed")
    }

    /// The fencing token of this lease (its node's czxid).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let t = m.semaphore("s", 2)?.acquire().await?.fencing_token();
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> FencingToken {
        FencingToken::new(self.hold().czxid, 0)
    }

    /// The lease node's path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// println!("{}", m.semaphore("s", 2)?.acquire().await?.node_path());
    /// # Ok(()) }
    /// ```
    pub fn node_path(&self) -> &str {
        &self.hold().node
    }

    /// Whether the lease is still certain (see [`OwnedLockGuard::is_held`](crate::OwnedLockGuard::is_held)).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert!(m.semaphore("s", 2)?.acquire().await?.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.hold().watch();
        self.hold().loss_reason().is_none()
    }

    /// Completes when the lease is lost, with the reason.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let lease = m.semaphore("s", 2)?.acquire().await?;
    /// tokio::select! { r = lease.lost() => eprintln!("{r}"), _ = async {} => {} }
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) -> LossReason {
        self.hold().lost().await
    }

    /// Returns the lease and waits until ZooKeeper confirms it.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// m.semaphore("s", 2)?.acquire().await?.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<()> {
        let hold = self
            .hold
            .take()
            .expect("a lease holds until it is consumed");
        hold.release().await
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.hold {
            Some(h) => f
                .debug_struct("Lease")
                .field("key", &self.key)
                .field("node", &h.node)
                .finish(),
            None => f.write_str("Lease(released)"),
        }
    }
}
