//! The counting semaphore: at most N leases at once across processes. On ZooKeeper it is
//! Curator's `InterProcessSemaphoreV2` layout (`<path>/locks/` and `<path>/leases/`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::Core;
use crate::backend::{drive, BackendHold, LockTarget};
use crate::metrics::{HoldMeter, Labels, Outcome, Recipe};
use crate::types::error::{Error, Result};
use crate::types::loss::LossReason;
use crate::types::mode::Wait;
use crate::types::token::FencingToken;

/// A semaphore with N leases shared across processes: a cheap handle (`Clone`) made by
/// [`LockManager::semaphore`](crate::LockManager::semaphore) or [`LockManager::semaphore_at_path`](crate::LockManager::semaphore_at_path).
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
    core: Arc<Core>,
    target: LockTarget,
    max_leases: u32,
    labels: Labels,
}

impl Semaphore {
    pub(crate) fn new(
        core: Arc<Core>,
        path: &str,
        key: Arc<str>,
        max_leases: u32,
    ) -> Result<Semaphore> {
        if max_leases == 0 {
            return Err(Error::InvalidArgument(format!(
                "the semaphore {key} needs at least one lease"
            )));
        }
        let labels = Labels::new(Recipe::Semaphore, core.backend.kind(), core.key_label, &key);
        Ok(Semaphore {
            core,
            target: LockTarget::lock(key, path.into()),
            max_leases,
            labels,
        })
    }

    /// The path of this semaphore (on ZooKeeper, its znode path: leases are under `leases`,
    /// the gate under `locks`).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.semaphore("exports", 3)?.path(), "/zklock/locks/%SEM/exports");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.target.path
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
        self.take(1, None).await.map(one)
    }

    /// Waits for `n` leases at once: all or none.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `n` is 0 or exceeds the semaphore's leases (it could never succeed).
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
        self.take(n, None).await
    }

    /// A lease if one is free now: `Ok(None)` otherwise.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// if let Some(lease) = m.semaphore("s", 1)?.try_acquire().await? { drop(lease) }
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self) -> Result<Option<Lease>> {
        Ok(self.acquire_inner(1, Wait::Never).await?.map(one))
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
        self.take(1, Some(timeout)).await.map(one)
    }

    /// Waits at most `timeout` for `n` leases: all or none.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let two = m.semaphore("s", 4)?.acquire_many_timeout(2, std::time::Duration::from_secs(2)).await?;
    /// # drop(two); Ok(()) }
    /// ```
    pub async fn acquire_many_timeout(&self, n: u32, timeout: Duration) -> Result<Vec<Lease>> {
        self.take(n, Some(timeout)).await
    }

    /// Waits (at most `timeout`) for `n` leases.
    async fn take(&self, n: u32, timeout: Option<Duration>) -> Result<Vec<Lease>> {
        let leases = self.acquire_inner(n, Wait::timeout(timeout)).await?;
        Ok(leases.expect("a blocking wait ends with leases or an error"))
    }

    /// `Ok(None)` only for [`Wait::Never`] when the leases are not free.
    async fn acquire_inner(&self, n: u32, wait: Wait) -> Result<Option<Vec<Lease>>> {
        super::budgeted(self.lease(n, wait)).await
    }

    /// [`acquire_inner`](Self::acquire_inner), without counting against the budget.
    async fn lease(&self, n: u32, wait: Wait) -> Result<Option<Vec<Lease>>> {
        let key = &self.target.key;
        if n == 0 || n > self.max_leases {
            return Err(Error::InvalidArgument(format!(
                "asked for {n} leases of the semaphore {key}, which has {}: ask for 1 to {0}",
                self.max_leases
            )));
        }
        // A deadline is a deadline, connection trouble included; a try gets the manager's
        // try_timeout. Cancel safe: whatever was taken so far is dropped.
        let started = std::time::Instant::now();
        let _waiting = (!matches!(wait, Wait::Never)).then(|| self.labels.waiting());
        let acquiring = drive::acquire_leases(
            self.core.backend.as_ref(),
            &self.target,
            self.max_leases,
            n,
            wait,
        );
        let holds = match self.core.bound(wait) {
            Some((deadline, waited)) => tokio::time::timeout_at(deadline, acquiring)
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Timeout {
                        key: key.to_string(),
                        waited,
                    })
                }),
            None => acquiring.await,
        };
        self.labels.acquired(Outcome::of(&holds), started.elapsed());
        let granted = std::time::Instant::now();
        Ok(holds?.map(|holds| {
            self.labels.backend_grants(holds.len() as u64);
            holds
                .into_iter()
                .map(|hold| Lease {
                    hold: Some(hold),
                    tokens: self.core.local.tokens,
                    key: key.clone(),
                    meter: self.labels.hold(granted),
                })
                .collect()
        }))
    }
}

/// The one lease of a single-lease acquire.
fn one(leases: Vec<Lease>) -> Lease {
    leases
        .into_iter()
        .next()
        .expect("a granted acquire of one lease has one")
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
    hold: Option<Arc<dyn BackendHold>>,
    /// Whether the manager issues fencing tokens (see [`FencingToken::NONE`]).
    tokens: bool,
    key: Arc<str>,
    /// Counts this lease in the metrics until it ends.
    meter: HoldMeter,
}

impl Lease {
    fn hold(&self) -> &Arc<dyn BackendHold> {
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
        if !self.tokens {
            return FencingToken::NONE;
        }
        self.hold().token()
    }

    /// The lease node's path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// println!("{}", m.semaphore("s", 2)?.acquire().await?.node_path());
    /// # Ok(()) }
    /// ```
    pub fn node_path(&self) -> &str {
        self.hold().location()
    }

    /// Whether the lease is still certain (see [`LockGuard::is_held`](crate::LockGuard::is_held)).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert!(m.semaphore("s", 2)?.acquire().await?.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.hold().loss_reason().is_none()
    }

    /// Why the lease was lost, or `None` while it is held.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.semaphore("s", 2)?.acquire().await?.loss_reason(), None);
    /// # Ok(()) }
    /// ```
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.hold().loss_reason()
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
        self.hold().loss().lost().await
    }

    /// Returns the lease and waits until the server confirms it.
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
        self.meter.end(hold.loss_known());
        hold.release().await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(hold) = &self.hold {
            self.meter.end(hold.loss_known());
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.hold {
            Some(h) => f
                .debug_struct("Lease")
                .field("key", &self.key)
                .field("node", &h.location())
                .finish(),
            None => f.write_str("Lease(released)"),
        }
    }
}
