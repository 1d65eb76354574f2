//! The acquire driver: the one loop every backend's acquire runs, as Curator's
//! `LockInternals` loop drives its `LockInternalsDriver`. A backend gives an [`Acquisition`] for
//! each acquire (how it enters, attempts, waits and undoes); this loop decides what comes next,
//! knowing nothing of the service:
//!
//! 1. Wait for this process's undos of the lock ([`Undos`]): a dropped acquire's, a dropped
//!    hold's release in the background. Until they have run, the lock may still be held by
//!    what this very process let go of.
//! 2. [`enter`](Acquisition::enter): a live session (ZooKeeper's session, etcd's lease, a Redis
//!    connection, a PostgreSQL connection reserved for the lock) and a new entry on it.
//! 3. [`attempt`](Acquisition::attempt): one attempt of the entry, which comes to a [`Step`].
//! 4. Busy: a try [`gives up`](Acquisition::give_up); a waiter [`wait`](Acquisition::wait)s for a
//!    change (a release, a watch, a wake-up), which comes to a [`Step`] too. Again: the same
//!    entry attempts again. Restart: the entry's session ended; a new entry on a live one.
//!
//! Deadlines are not the driver's, nor the backends': the recipe drops the acquire at its
//! deadline and reports the timeout. Whatever an acquire that ends without a hold (dropped at
//! any await, failed, a try refused) left on the server, its acquisition undoes: at once where
//! the driver can wait for it ([`give_up`](Acquisition::give_up)), else in the background when it
//! is dropped, registered in [`Undos`] under the lock's path.

use super::undos::Undos;
use super::{Backend, BoxFuture, LockTarget, SharedHold};
use crate::types::error::Result;
use crate::types::mode::{LockMode, Wait};

/// What an acquire asks of a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wanted {
    /// One hold of the lock in this mode.
    Hold(LockMode),
    /// `n` leases of a semaphore with `max` leases, all or none (`1 <= n <= max`).
    Leases { max: u32, n: u32 },
}

/// What an attempt, or a wait, came to. (A build with only some backends may use only some of
/// the variants.)
#[cfg_attr(
    not(all(
        feature = "zookeeper",
        feature = "redis",
        feature = "postgres",
        feature = "etcd"
    )),
    allow(dead_code)
)]
pub(crate) enum Step<H = SharedHold> {
    /// Granted: the holds (one, or a semaphore's `n`).
    Held(Vec<H>),
    /// The lock is taken: a try gives up, a waiter waits.
    Busy,
    /// Attempt again with the same entry (a wake-up, a retry after a failed request).
    Again,
    /// The entry's session ended (or the entry went): a new entry on a live session.
    Restart,
}

/// One acquire as a backend carries it out, between the driver's calls. Dropped before a
/// grant (the acquire dropped, failed or given up), it undoes what its entries may have left
/// on the server, in the background, registered in its [`Undos`]. What it grants is `H`: the
/// seam's shared holds, or a backend's own (a ZooKeeper semaphore's gate).
pub(crate) trait Acquisition<H = SharedHold>: Send {
    /// The undos of this backend: the driver waits for those of the lock first. `None` where
    /// an undo is ordered before the next request by the backend itself (ZooKeeper's one
    /// session) or runs before the drop returns (memory).
    fn undos(&self) -> Option<&Undos> {
        None
    }

    /// Waits for a live session and makes a new entry on it; the previous entry, if any, is
    /// dropped (undone).
    fn enter(&mut self) -> BoxFuture<'_, Result<()>>;

    /// One attempt of the entry.
    fn attempt(&mut self) -> BoxFuture<'_, Result<Step<H>>>;

    /// After [`Step::Busy`] in an acquire that waits: waits for a change worth another look,
    /// and says what came of it.
    fn wait(&mut self) -> BoxFuture<'_, Result<Step<H>>>;

    /// After [`Step::Busy`] in a try: undoes what the entry left, waiting for the answer where
    /// it can (by default the drop undoes it in the background).
    fn give_up(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// Runs `acquisition` of `target` until it holds (`Ok(Some)`), a try finds the lock taken
/// (`Ok(None)`), or it fails. Cancel safe: dropped at any await, the acquisition undoes.
pub(crate) async fn drive<H>(
    mut acquisition: Box<dyn Acquisition<H> + '_>,
    target: &LockTarget,
    wait: Wait,
) -> Result<Option<Vec<H>>> {
    if let Some(undos) = acquisition.undos() {
        undos.finished(&target.path).await;
    }
    loop {
        acquisition.enter().await?;
        let mut step = acquisition.attempt().await?;
        loop {
            step = match step {
                Step::Held(holds) => return Ok(Some(holds)),
                Step::Busy if matches!(wait, Wait::Never) => {
                    acquisition.give_up().await;
                    return Ok(None);
                }
                Step::Busy => acquisition.wait().await?,
                Step::Again => acquisition.attempt().await?,
                Step::Restart => break,
            };
        }
    }
}

/// Acquires one hold of `target` in `mode` on `backend` (see [`drive`]).
pub(crate) async fn acquire(
    backend: &dyn Backend,
    target: &LockTarget,
    mode: LockMode,
    wait: Wait,
) -> Result<Option<SharedHold>> {
    let acquisition = backend.acquisition(target, Wanted::Hold(mode), wait)?;
    let holds = drive(acquisition, target, wait).await?;
    Ok(holds.and_then(|h| h.into_iter().next()))
}

/// Acquires `n` leases of the semaphore `target` with `max` leases on `backend`, all or none
/// (see [`drive`]). The recipe has checked that `1 <= n <= max`.
pub(crate) async fn acquire_leases(
    backend: &dyn Backend,
    target: &LockTarget,
    max: u32,
    n: u32,
    wait: Wait,
) -> Result<Option<Vec<SharedHold>>> {
    let acquisition = backend.acquisition(target, Wanted::Leases { max, n }, wait)?;
    drive(acquisition, target, wait).await
}
