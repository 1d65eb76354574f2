//! Multi-locks: several locks of any recipe, all or nothing, under one deadline, always taken
//! in one global order so that two callers with overlapping sets cannot deadlock.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::guard::LockGuard;
use crate::manager::LockManager;
use crate::recipe::semaphore::Lease;
use crate::types::error::{Error, Result};
use crate::types::loss::LossReason;
use crate::types::token::FencingToken;

/// One lock of a multi-lock.
///
/// ```
/// use zklock_core::LockSpec;
/// let specs = [LockSpec::mutex("account_1"), LockSpec::write("ledger"), LockSpec::semaphore("slots", 4)];
/// # let _ = specs;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockSpec {
    /// The exclusive lock of a key.
    Mutex(String),
    /// The read side of a key's read/write lock.
    Read(String),
    /// The write side of a key's read/write lock.
    Write(String),
    /// One lease of a key's semaphore with this many leases.
    Semaphore(String, u32),
}

impl LockSpec {
    /// The exclusive lock of `key`.
    ///
    /// ```
    /// let s = zklock_core::LockSpec::mutex("k");
    /// # let _ = s;
    /// ```
    pub fn mutex(key: impl Into<String>) -> LockSpec {
        LockSpec::Mutex(key.into())
    }

    /// The read side of `key`'s read/write lock.
    ///
    /// ```
    /// let s = zklock_core::LockSpec::read("k");
    /// # let _ = s;
    /// ```
    pub fn read(key: impl Into<String>) -> LockSpec {
        LockSpec::Read(key.into())
    }

    /// The write side of `key`'s read/write lock.
    ///
    /// ```
    /// let s = zklock_core::LockSpec::write("k");
    /// # let _ = s;
    /// ```
    pub fn write(key: impl Into<String>) -> LockSpec {
        LockSpec::Write(key.into())
    }

    /// One lease of `key`'s semaphore with `max_leases` leases.
    ///
    /// ```
    /// let s = zklock_core::LockSpec::semaphore("k", 3);
    /// # let _ = s;
    /// ```
    pub fn semaphore(key: impl Into<String>, max_leases: u32) -> LockSpec {
        LockSpec::Semaphore(key.into(), max_leases)
    }

    fn key(&self) -> &str {
        match self {
            LockSpec::Mutex(k)
            | LockSpec::Read(k)
            | LockSpec::Write(k)
            | LockSpec::Semaphore(k, _) => k,
        }
    }
}

enum Held {
    Lock(LockGuard),
    Lease(Lease),
}

/// Every lock of a multi-lock, held together. Dropping it releases them all.
///
/// # Examples
///
/// ```no_run
/// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
/// use zklock_core::LockSpec;
/// // A transfer locks both accounts; another transfer the other way cannot deadlock with it.
/// let both = m.lock_all([LockSpec::mutex("account_9"), LockSpec::mutex("account_3")], None).await?;
/// assert!(both.is_held());
/// both.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the locks will immediately release"]
#[clippy::has_significant_drop]
pub struct MultiGuard {
    held: Vec<(LockSpec, Held)>,
}

impl MultiGuard {
    /// The locks held, in the global order they were taken, with their fencing tokens.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// # let both = m.lock_all([zklock_core::LockSpec::mutex("a")], None).await?;
    /// for (spec, token) in both.tokens() { println!("{spec:?}: {token}") }
    /// # Ok(()) }
    /// ```
    pub fn tokens(&self) -> Vec<(LockSpec, FencingToken)> {
        self.held
            .iter()
            .map(|(spec, h)| {
                let token = match h {
                    Held::Lock(g) => g.fencing_token(),
                    Held::Lease(l) => l.fencing_token(),
                };
                (spec.clone(), token)
            })
            .collect()
    }

    /// Whether every lock is still held.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// # let both = m.lock_all([zklock_core::LockSpec::mutex("a")], None).await?;
    /// assert!(both.is_held());
    /// # Ok(()) }
    /// ```
    pub fn is_held(&self) -> bool {
        self.held.iter().all(|(_, h)| match h {
            Held::Lock(g) => g.is_held(),
            Held::Lease(l) => l.is_held(),
        })
    }

    /// Completes when any of the locks is lost.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// # let both = m.lock_all([zklock_core::LockSpec::mutex("a")], None).await?;
    /// tokio::select! { r = both.lost() => eprintln!("{r}"), _ = async {} => {} }
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) -> LossReason {
        let losses =
            self.held.iter().map(
                |(_, h)| -> std::pin::Pin<
                    Box<dyn std::future::Future<Output = LossReason> + Send + '_>,
                > {
                    match h {
                        Held::Lock(g) => Box::pin(g.lost()),
                        Held::Lease(l) => Box::pin(l.lost()),
                    }
                },
            );
        if self.held.is_empty() {
            return std::future::pending().await;
        }
        futures::future::select_all(losses).await.0
    }

    /// Releases every lock, in reverse order, and waits for the server to confirm; the first
    /// error is returned after all were tried.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// # let both = m.lock_all([zklock_core::LockSpec::mutex("a")], None).await?;
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<()> {
        let mut result = Ok(());
        while let Some((_, h)) = self.held.pop() {
            let r = match h {
                Held::Lock(g) => g.release().await,
                Held::Lease(l) => l.release().await,
            };
            if result.is_ok() {
                result = r;
            }
        }
        result
    }
}

impl Drop for MultiGuard {
    fn drop(&mut self) {
        while let Some(h) = self.held.pop() {
            drop(h);
        }
    }
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.held.iter().map(|(s, _)| s))
            .finish()
    }
}

impl LockManager {
    /// Takes every lock in `specs`, all or nothing, within `timeout` (`None`: wait as long as
    /// it takes). Locks are always taken in one global order (by lock path), whatever the
    /// order of `specs`, so callers with overlapping sets cannot deadlock; a key given twice is
    /// taken once.
    ///
    /// # Errors
    /// [`Error::Timeout`] when the deadline passes; [`Error::InvalidArgument`] when one key is
    /// asked as both read and write, or by two recipes with conflicting modes; any acquire
    /// error. Before any error returns, the locks already taken have been released (awaited,
    /// as [`MultiGuard::release`]): nobody else is kept waiting for them. The acquire that
    /// failed held nothing; its waiting node (on ZooKeeper) is deleted in the background and
    /// may be seen by other clients for about a round trip more:
    /// [`flush`](LockManager::flush) waits until it is gone.
    ///
    /// # Cancel safety
    /// Cancel safe: what was taken is released and nothing is left on the server, both in the background
    /// (a dropped future cannot wait): [`flush`](LockManager::flush) waits until they are
    /// gone.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// use std::time::Duration;
    /// use zklock_core::LockSpec;
    /// let all = m
    ///     .lock_all([LockSpec::write("catalog"), LockSpec::mutex("sku_1")], Some(Duration::from_secs(5)))
    ///     .await?;
    /// # drop(all); Ok(()) }
    /// ```
    pub async fn lock_all(
        &self,
        specs: impl IntoIterator<Item = LockSpec>,
        timeout: Option<Duration>,
    ) -> Result<MultiGuard> {
        let deadline = timeout.map(|t| (Instant::now() + t, t));
        let mut ordered: Vec<(String, LockSpec)> = vec![];
        for spec in specs {
            let path = match &spec {
                LockSpec::Mutex(k) => self.mutex(k)?.path().to_string(),
                LockSpec::Read(k) | LockSpec::Write(k) => self.rwlock(k)?.path().to_string(),
                LockSpec::Semaphore(k, n) => self.semaphore(k, (*n).max(1))?.path().to_string(),
            };
            if let Some((_, other)) = ordered.iter().find(|(p, _)| *p == path) {
                if *other == spec {
                    continue;
                }
                return Err(Error::InvalidArgument(format!(
                    "the multi-lock asks for {} twice in different modes ({other:?} and {spec:?}); ask once",
                    spec.key()
                )));
            }
            ordered.push((path, spec));
        }
        ordered.sort_by(|a, b| a.0.cmp(&b.0));
        let mut guard = MultiGuard {
            held: Vec::with_capacity(ordered.len()),
        };
        if let Err(err) = self.take_in_order(&mut guard, ordered, deadline).await {
            // What was taken is given up before the error returns: nobody else waits for it.
            let _ = guard.release().await;
            return Err(err);
        }
        Ok(guard)
    }

    /// Takes the locks of `ordered` into `guard`, one by one, by `deadline`.
    async fn take_in_order(
        &self,
        guard: &mut MultiGuard,
        ordered: Vec<(String, LockSpec)>,
        deadline: Option<(Instant, Duration)>,
    ) -> Result<()> {
        for (_, spec) in ordered {
            let left = deadline.map(|(at, _)| at.saturating_duration_since(Instant::now()));
            let timed_out = |e: Error| match (e, deadline) {
                (Error::Timeout { key, .. }, Some((_, waited))) => Error::Timeout { key, waited },
                (e, _) => e,
            };
            let held = match &spec {
                LockSpec::Mutex(k) => {
                    let m = self.mutex(k)?;
                    let g = match left {
                        Some(t) => m.lock_timeout(t).await,
                        None => m.lock().await,
                    };
                    Held::Lock(g.map_err(timed_out)?)
                }
                LockSpec::Read(k) | LockSpec::Write(k) => {
                    let rw = self.rwlock(k)?;
                    let write = matches!(spec, LockSpec::Write(_));
                    let g = match (left, write) {
                        (Some(t), false) => rw.read_timeout(t).await,
                        (Some(t), true) => rw.write_timeout(t).await,
                        (None, false) => rw.read().await,
                        (None, true) => rw.write().await,
                    };
                    Held::Lock(g.map_err(timed_out)?)
                }
                LockSpec::Semaphore(k, n) => {
                    let s = self.semaphore(k, *n)?;
                    let l = match left {
                        Some(t) => s.acquire_timeout(t).await,
                        None => s.acquire().await,
                    };
                    Held::Lease(l.map_err(timed_out)?)
                }
            };
            guard.held.push((spec, held));
        }
        Ok(())
    }
}
