//! Support for `#[distributed_lock]`'s generated code. Not a public API: names here may change
//! in any release. Generated code reaches everything through `::zklock::__private`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use std::format;

use crate::manager::LockManager;
pub use crate::recipe::job::Ran;
pub use crate::types::error::Error;

/// The lock mode of an annotated fn: what `mode = ...` of `#[distributed_lock]` may say. The
/// attribute takes a mutex or one side of a read/write lock, never a lease or a leadership, so
/// it has its own three values rather than every mode a backend can be asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The exclusive mutex (default).
    Exclusive,
    /// The shared side of the read/write lock.
    Read,
    /// The exclusive side of the read/write lock.
    Write,
}

pub use crate::recipe::OnLost;

/// Options of an annotated fn.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Lock mode.
    pub mode: Mode,
    /// How long to wait for the lock; `None` waits forever.
    pub timeout: Option<Duration>,
    /// What to do when the hold is lost.
    pub on_lost: OnLost,
}

impl Options {
    /// The defaults: exclusive, wait forever, abort on loss.
    pub const fn new() -> Options {
        Options {
            mode: Mode::Exclusive,
            timeout: None,
            on_lost: OnLost::Abort,
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options::new()
    }
}

/// Anything a `manager = ...` option may name: a manager, a reference to one, an `Arc`, or a
/// lazily initialised static.
pub trait AsLockManager {
    /// The manager.
    fn as_lock_manager(&self) -> &LockManager;
}

impl AsLockManager for LockManager {
    fn as_lock_manager(&self) -> &LockManager {
        self
    }
}

impl<T: AsLockManager + ?Sized> AsLockManager for &T {
    fn as_lock_manager(&self) -> &LockManager {
        (**self).as_lock_manager()
    }
}

impl AsLockManager for Arc<LockManager> {
    fn as_lock_manager(&self) -> &LockManager {
        self
    }
}

impl AsLockManager for once_cell::sync::Lazy<LockManager> {
    fn as_lock_manager(&self) -> &LockManager {
        self
    }
}

impl AsLockManager for std::sync::LazyLock<LockManager> {
    fn as_lock_manager(&self) -> &LockManager {
        self
    }
}

/// The manager an annotated fn uses when none is named.
pub async fn global() -> Result<LockManager, Error> {
    crate::manager::global().await
}

/// Runs `body` under the lock on `key`, converting zklock's errors into the fn's error type.
pub fn run<'a, T, E, F>(
    manager: &'a LockManager,
    key: &'a str,
    options: Options,
    body: F,
) -> impl Future<Output = Result<T, E>> + 'a
where
    F: Future<Output = Result<T, E>> + 'a,
    E: From<Error> + 'a,
    T: 'a,
{
    // Boxed before any state machine holds it, so nested annotated calls stay small.
    let body = Box::pin(body);
    async move {
        run_locked(manager, key, options, body)
            .await
            .map_err(E::from)?
    }
}

/// Runs `body` under the lock on `key` with the options of `#[distributed_lock]`.
async fn run_locked<T, F: Future<Output = T>>(
    manager: &LockManager,
    key: &str,
    options: Options,
    body: F,
) -> crate::types::error::Result<T> {
    match options.mode {
        Mode::Exclusive => {
            manager
                .mutex(key)?
                .run(options.timeout, options.on_lost, body)
                .await
        }
        Mode::Read | Mode::Write => {
            let write = options.mode == Mode::Write;
            manager
                .rwlock(key)?
                .run(write, options.timeout, options.on_lost, body)
                .await
        }
    }
}

/// The job options of an annotated fn (`skip_if_locked`, `timeout`, `at_least`, `at_most`):
/// the fn runs as [`LockManager::job`] with these settings.
#[derive(Clone, Copy, Debug, Default)]
pub struct JobOptions {
    /// [`Job::wait`](crate::Job::wait): `None` skips at once (`skip_if_locked`).
    pub wait: Option<Duration>,
    /// [`Job::at_least`](crate::Job::at_least).
    pub at_least: Option<Duration>,
    /// [`Job::at_most`](crate::Job::at_most).
    pub at_most: Option<Duration>,
}

impl JobOptions {
    fn job(self, manager: &LockManager, key: &str, required: bool) -> Result<crate::Job, Error> {
        let mut job = manager.job(key)?.required(required);
        if let Some(wait) = self.wait {
            job = job.wait(wait);
        }
        if let Some(at_least) = self.at_least {
            job = job.at_least(at_least);
        }
        if let Some(at_most) = self.at_most {
            job = job.at_most(at_most);
        }
        Ok(job)
    }
}

/// Runs `body` as the job `key` for a fn that returns `Result<Ran<T>, E>`: the body's `Ok`
/// value comes back as `Ran::Ran`, a skip as `Ok(Ran::Skipped)`.
pub fn run_job<'a, T, E, F>(
    manager: &'a LockManager,
    key: &'a str,
    options: JobOptions,
    body: F,
) -> impl Future<Output = Result<Ran<T>, E>> + 'a
where
    F: Future<Output = Result<T, E>> + 'a,
    E: From<Error> + 'a,
    T: 'a,
{
    let body = Box::pin(body);
    async move {
        let job = options.job(manager, key, false)?;
        match job.run(body).await? {
            Ran::Ran(result) => result.map(Ran::Ran),
            Ran::Skipped => Ok(Ran::Skipped),
        }
    }
}

/// Runs `body` as the job `key` for a fn that returns `Result<T, E>`: a skip is
/// `Err(Error::JobSkipped { .. }.into())`.
pub fn run_required_job<'a, T, E, F>(
    manager: &'a LockManager,
    key: &'a str,
    options: JobOptions,
    body: F,
) -> impl Future<Output = Result<T, E>> + 'a
where
    F: Future<Output = Result<T, E>> + 'a,
    E: From<Error> + 'a,
    T: 'a,
{
    let body = Box::pin(body);
    async move {
        let job = options.job(manager, key, true)?;
        match job.run(body).await? {
            Ran::Ran(result) => result,
            // `required` makes a skip an error; this is the same error, should it ever return.
            Ran::Skipped => Err(Error::JobSkipped { key: key.into() }.into()),
        }
    }
}
