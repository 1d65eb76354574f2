//! Scheduled jobs that must run once across the fleet: every instance's cron fires, one runs
//! the job, the others skip it (ShedLock's purpose), with `at_least` (no other run within that
//! long of this run's start, even if this process exits; measured by the server's clock) and
//! `at_most` (a run that takes longer is stopped and its lock given up).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{Core, OnLost, Target};
use crate::backend::LockTarget;
use crate::metrics::Recipe;
use crate::types::error::{Error, Result};
use crate::types::mode::LockMode;

/// A job that every instance schedules and one runs at a time: a cheap handle (`Clone`) made
/// by [`LockManager::job`](crate::LockManager::job), configured with builder methods.
///
/// By default a run skips when another instance holds the job's lock. Options:
/// - [`at_least`](Self::at_least): once a run starts, no other run starts within this long of
///   its start, even after it ended or its process exited. The window is kept on the server
///   (ZooKeeper: a persistent run record beside the lock path, stamped by the server's clock,
///   so skewed instance clocks do not matter; Redis: a key holding the window's end, by
///   the server's clock; PostgreSQL: a column of the key table, by the server's clock); in
///   memory, by this process's clock. The window is as durable as the server's data: a Redis
///   restarted without persistence forgets it (run it with `appendonly yes`, `appendfsync
///   always` where the window matters).
/// - [`at_most`](Self::at_most): a run still going after this long is stopped (its body is
///   dropped at its next await point), reported as
///   [`LossReason::HoldLimit`](crate::LossReason::HoldLimit), and the lock is given up. A run whose process freezes or
///   dies loses its lock with its session (ZooKeeper) or lease (Redis, PostgreSQL) as any hold
///   does.
/// - [`wait`](Self::wait): wait up to this long for the lock instead of skipping.
/// - [`required`](Self::required): a skip is an error ([`Error::JobSkipped`]) rather than
///   [`Ran::Skipped`].
///
/// All options work on every backend: ZooKeeper, Redis, PostgreSQL and in memory.
///
/// # Examples
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager) -> zklock_core::Result<()> {
/// use std::time::Duration;
/// use zklock_core::Ran;
///
/// // Every instance runs this at 02:00; one of them sends the report.
/// let job = manager
///     .job("nightly-report")?
///     .at_least(Duration::from_secs(30))   // a fast run on a skewed clock does not repeat
///     .at_most(Duration::from_secs(600));  // a stuck run does not keep it for ever
/// match job.run(async { /* build and send the report */ 42 }).await? {
///     Ran::Ran(sent) => println!("sent {sent}"),
///     Ran::Skipped => println!("another instance has it"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Job {
    target: Target,
    at_least: Option<Duration>,
    at_most: Option<Duration>,
    wait: Option<Duration>,
    required: bool,
}

/// What a [`Job`] run did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Ran<T> {
    /// This instance ran the job; its body's value.
    Ran(T),
    /// Another instance runs it, or ran it within its `at_least` window.
    Skipped,
}

impl<T> Ran<T> {
    /// The body's value, if the job ran here.
    ///
    /// ```
    /// assert_eq!(zklock_core::Ran::Ran(3).ran(), Some(3));
    /// assert_eq!(zklock_core::Ran::<u8>::Skipped.ran(), None);
    /// ```
    pub fn ran(self) -> Option<T> {
        match self {
            Ran::Ran(value) => Some(value),
            Ran::Skipped => None,
        }
    }
}

impl Job {
    pub(crate) fn new(core: Arc<Core>, path: Arc<str>, key: Arc<str>) -> Job {
        Job {
            target: Target::new(
                core,
                LockTarget::lock(key, path),
                LockMode::Exclusive,
                Recipe::Job,
            ),
            at_least: None,
            at_most: None,
            wait: None,
            required: false,
        }
    }

    /// No other run starts within `window` of this run's start (by the server's clock).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let job = m.job("cleanup")?.at_least(std::time::Duration::from_secs(60));
    /// # Ok(()) }
    /// ```
    pub fn at_least(mut self, window: Duration) -> Job {
        self.at_least = Some(window);
        self
    }

    /// A run still going after `limit` is stopped and its lock given up.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let job = m.job("cleanup")?.at_most(std::time::Duration::from_secs(300));
    /// # Ok(()) }
    /// ```
    pub fn at_most(mut self, limit: Duration) -> Job {
        self.at_most = Some(limit);
        self
    }

    /// Waits up to `timeout` for the job's lock instead of skipping at once.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let job = m.job("cleanup")?.wait(std::time::Duration::from_secs(5));
    /// # Ok(()) }
    /// ```
    pub fn wait(mut self, timeout: Duration) -> Job {
        self.wait = Some(timeout);
        self
    }

    /// Whether a skip is an error ([`Error::JobSkipped`]) instead of [`Ran::Skipped`].
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let sent = m.job("invoice-run")?.required(true).run(async { 1 }).await?;
    /// # Ok(()) }
    /// ```
    pub fn required(mut self, required: bool) -> Job {
        self.required = required;
        self
    }

    /// Runs `body` if this instance gets the job: its lock is free (or freed within
    /// [`wait`](Self::wait)) and no earlier run's `at_least` window covers now. The body runs
    /// in a holder frame (`current_fencing_token()` gives its token) and is stopped when the
    /// hold is lost or passes `at_most`.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the hold was lost while the body ran (reason
    /// [`HoldLimit`](crate::LossReason::HoldLimit) past `at_most`); [`Error::JobSkipped`]
    /// for a skip when [`required`](Self::required); connection errors.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the body and gives the lock up. An `at_least`
    /// window already recorded stays.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// if let Some(n) = m.job("reindex")?.run(async { 7 }).await?.ran() {
    ///     println!("reindexed {n}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn run<T, F: Future<Output = T>>(&self, body: F) -> Result<Ran<T>> {
        let body = Box::pin(body);
        let guard = match self.wait {
            None => self.target.try_acquire().await?,
            Some(timeout) => match self.target.acquire(Some(timeout)).await {
                Ok(guard) => Some(guard),
                Err(Error::Timeout { .. }) => None,
                Err(err) => return Err(err),
            },
        };
        let Some(guard) = guard else {
            return self.skipped("another instance holds it");
        };
        if let Some(window) = self.at_least {
            let claimed = self
                .target
                .core
                .backend
                .claim_run(&self.target.lock, window)
                .await?;
            if !claimed {
                drop(guard);
                return self.skipped("it ran within its at_least window");
            }
        }
        tracing::info!(job = %self.target.lock.key, token = %guard.fencing_token(), "zklock: running the job");
        let value = self
            .target
            .run_held(guard, OnLost::Abort, self.at_most, body)
            .await?;
        Ok(Ran::Ran(value))
    }

    fn skipped<T>(&self, why: &'static str) -> Result<Ran<T>> {
        tracing::info!(job = %self.target.lock.key, why, "zklock: job skipped");
        if self.required {
            Err(Error::JobSkipped {
                key: self.target.lock.key.to_string(),
            })
        } else {
            Ok(Ran::Skipped)
        }
    }
}
