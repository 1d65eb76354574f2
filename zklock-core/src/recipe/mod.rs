//! Recipes: the lock handles users take locks with (mutex, read/write lock, semaphore,
//! multi-lock), on any backend, through the local table and frames.

pub(crate) mod job;
pub(crate) mod leader;
pub(crate) mod mutex;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, LockTarget};
use crate::guard::LockGuard;
use crate::local::frame::{self, Reentry};
use crate::local::{self, LocalConfig, LocalTable};
use crate::metrics::{KeyLabel, Labels, Outcome, Recipe};
use crate::types::error::{Error, Result};
use crate::types::loss::LossReason;
use crate::types::mode::{LockMode, Wait};

/// Runs `acquire`, then counts it against tokio's cooperative budget, as tokio's own locks
/// count theirs. Many acquires answer without a request (a try of a key busy in this process,
/// a lingering hold taken again, a re-entry, a try in memory): counted, a loop of them gives
/// its thread back now and then instead of starving the holder and the manager's own
/// background work. Counted once the answer is there: an acquire polled once has reached its
/// place in the local queue, as before. What is dropped here is released as any other.
///
/// The acquire is boxed: an `async fn` keeps a future it is given by value both as its
/// argument and as the future it awaits, so a `lock()` future carried the acquire's state
/// twice (3,032 bytes; 216 and a boxed 1,416 now, in a release build). Boxed, it costs one
/// allocation per acquire, and each waiting task carries the state once.
pub(crate) fn budgeted<T>(acquire: impl Future<Output = T>) -> impl Future<Output = T> {
    let acquire = Box::pin(acquire);
    async move {
        let answer = acquire.await;
        tokio::task::coop::consume_budget().await;
        answer
    }
}

/// What happens when the hold is lost while a body runs under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnLost {
    /// Drop the body at its next await point and return [`Error::LockLost`] (default).
    Abort,
    /// Let the body finish; its result is returned as is.
    Continue,
}

/// What the recipes run on: a backend, the local table in front of it, and their options.
pub(crate) struct Core {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) table: LocalTable,
    pub(crate) local: LocalConfig,
    /// How long a `try_*` may take in all.
    pub(crate) try_timeout: Duration,
    /// Whether the metrics carry a `key` label.
    pub(crate) key_label: KeyLabel,
}

impl fmt::Debug for Core {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Core")
            .field("backend", &self.backend.kind().label())
            .finish()
    }
}

impl Core {
    /// The deadline a wait gets: its own, a try's `try_timeout`, or none.
    pub(crate) fn bound(&self, wait: Wait) -> Option<(tokio::time::Instant, Duration)> {
        match wait {
            Wait::Until(deadline, waited) => Some((deadline, waited)),
            Wait::Never => Some((
                tokio::time::Instant::now() + self.try_timeout,
                self.try_timeout,
            )),
            Wait::Forever => None,
        }
    }
}

/// One lock of one recipe in one mode: what the handles (`Mutex`, each side of `RwLock`)
/// share.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) core: Arc<Core>,
    pub(crate) lock: LockTarget,
    pub(crate) mode: LockMode,
    /// The labels of this lock's metrics, made once per handle.
    pub(crate) labels: Labels,
}

impl Target {
    /// The lock `lock` of `recipe`, taken in `mode`.
    pub(crate) fn new(core: Arc<Core>, lock: LockTarget, mode: LockMode, recipe: Recipe) -> Target {
        let labels = Labels::new(recipe, core.backend.kind(), core.key_label, &lock.key);
        Target {
            core,
            lock,
            mode,
            labels,
        }
    }

    /// Waits for a guard (at most `timeout`): a re-entry when an enclosing frame holds the
    /// lock, else a real acquire.
    pub(crate) async fn acquire(&self, timeout: Option<Duration>) -> Result<LockGuard> {
        let guard = self.guard(Wait::timeout(timeout)).await?;
        Ok(guard.expect("a blocking wait ends with the lock or an error"))
    }

    /// A guard if the lock is free now (or re-entered), else `None`.
    pub(crate) async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.guard(Wait::Never).await
    }

    /// `Ok(None)` only for [`Wait::Never`] when the lock is taken.
    async fn guard(&self, wait: Wait) -> Result<Option<LockGuard>> {
        budgeted(self.take(wait)).await
    }

    /// [`guard`](Self::guard), without counting against the budget.
    async fn take(&self, wait: Wait) -> Result<Option<LockGuard>> {
        let try_only = matches!(wait, Wait::Never);
        let key = &self.lock.key;
        let table = self.core.table.id();
        // A deadline is a deadline wherever the acquire waits: at an enclosing frame's gate
        // (behind a concurrent branch that re-entered first), at the local queue, at the
        // backend, connection trouble included; the whole acquire is cut off then (cancel
        // safe: nothing is left). A try waits for nobody, but still needs the backend to
        // answer: it gets the manager's `try_timeout`.
        let bound = self.core.bound(wait);
        let timed_out = |waited| Error::Timeout {
            key: key.to_string(),
            waited,
        };
        let reentry = frame::reenter(table, &self.lock.path, self.mode.into(), key, try_only);
        let reentry = match bound {
            Some((deadline, waited)) => tokio::time::timeout_at(deadline, reentry)
                .await
                .unwrap_or_else(|_| Err(timed_out(waited))),
            None => reentry.await,
        };
        match reentry? {
            Reentry::Entered(grant, gate) => {
                return Ok(Some(LockGuard::reentered(grant, Some(gate), key.clone())))
            }
            Reentry::Busy => return Ok(None),
            Reentry::NotHeld => {}
        }
        let started = std::time::Instant::now();
        let backend = self.core.backend.kind().label();
        let span = tracing::debug_span!("zklock.acquire", key = %key, mode = ?self.mode, backend);
        let core = &self.core;
        let acquire = local::acquire(
            &*core.backend,
            &core.table,
            core.local,
            &self.lock,
            self.mode,
            wait,
            &self.labels,
        );
        let acquire = tracing::Instrument::instrument(acquire, span);
        let grant = match bound {
            Some((deadline, waited)) => tokio::time::timeout_at(deadline, acquire)
                .await
                .unwrap_or_else(|_| Err(timed_out(waited))),
            None => acquire.await,
        };
        let waited = started.elapsed();
        self.labels.acquired(Outcome::of(&grant), waited);
        let grant = grant?;
        if let Some(g) = &grant {
            let waited_ms = waited.as_millis() as u64;
            tracing::debug!(key = %key, token = %g.token, waited_ms, "zklock: acquired");
        }
        Ok(grant.map(|g| LockGuard::new(g, key.clone())))
    }

    /// Runs `body` in a holder frame of this lock.
    pub(crate) async fn run<T, F: Future<Output = T>>(
        &self,
        timeout: Option<Duration>,
        on_lost: OnLost,
        body: F,
    ) -> Result<T> {
        let guard = Box::pin(self.acquire(timeout)).await?;
        self.run_held(guard, on_lost, None, body).await
    }

    /// Runs `body` in a holder frame of `guard`, then releases it. With `at_most`, a body
    /// still running then is dropped and the hold reported lost ([`LossReason::HoldLimit`]).
    pub(crate) async fn run_held<T, F: Future<Output = T>>(
        &self,
        guard: LockGuard,
        on_lost: OnLost,
        at_most: Option<Duration>,
        body: F,
    ) -> Result<T> {
        let grant = guard.grant().clone();
        let key = &self.lock.key;
        let span = tracing::debug_span!("zklock.hold", key = %key, token = %grant.token);
        let body = tracing::Instrument::instrument(body, span);
        let lost = |reason| Error::LockLost {
            key: key.to_string(),
            reason,
        };
        let limit = async {
            match at_most {
                Some(limit) => tokio::time::sleep(limit).await,
                None => std::future::pending().await,
            }
        };
        let result = frame::run_in(grant.clone(), async move {
            tokio::pin!(body);
            match on_lost {
                OnLost::Continue => tokio::select! {
                    biased;
                    _ = limit => Err(lost(LossReason::HoldLimit)),
                    value = &mut body => Ok(value),
                },
                OnLost::Abort => tokio::select! {
                    biased;
                    reason = grant.lost() => Err(lost(reason)),
                    _ = limit => Err(lost(LossReason::HoldLimit)),
                    value = &mut body => Ok(value),
                },
            }
        })
        .await;
        if let Err(Error::LockLost {
            reason: LossReason::HoldLimit,
            ..
        }) = &result
        {
            tracing::warn!(%key, ?at_most, "zklock: the body ran past its hold limit and was stopped");
            guard.grant().end_for(LossReason::HoldLimit);
        }
        drop(guard);
        result
    }
}
