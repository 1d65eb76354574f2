//! The vocabulary of lock kinds, every conversion between them, and how long an acquire may
//! wait.
//!
//! Three types, because three different questions are asked:
//! - [`LockKind`] (public): which recipe a lock *path* belongs to (mutex, read/write lock,
//!   semaphore, leader latch). The layout derives the path from it, and inspection shows it.
//! - [`LockMode`]: what one acquire asks a backend for, through the seam. Every mode but a
//!   semaphore lease, which is asked for with the semaphore's size and a count
//!   (`Wanted::Leases` of the acquire driver), so a backend never has to refuse a mode at run time.
//! - [`HoldMode`]: what a hold *is*, once granted: guards, frames, the in-memory table and
//!   inspection's `Contender::mode` ([`HoldMode::name`]) speak of it. A lock of one kind has
//!   holds of several modes (a read/write lock: read and write holds).
//!
//! Beside them, with reasons of their own: the metrics' `recipe` label (`metrics::Recipe`:
//! which API an acquire came through, so a job's acquire counts as `job`, not as a mutex),
//! the attribute's `private::Mode` (what `mode = ...` of `#[distributed_lock]` may say), and
//! each backend's names for a mode on its server (Curator's node names on ZooKeeper, in
//! `backend/zk/queue.rs`'s `CuratorMode`), converted there from [`HoldMode`]. What inspection
//! shows of a mode is [`HoldMode::name`] on every backend, and it agrees with [`LockKind`]'s
//! names (a leader latch's participants are `leader`).

use std::time::Duration;

use tokio::time::Instant;

use crate::types::inspect::LockKind;

/// What kind of hold a guard is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum HoldMode {
    /// A mutex: one holder.
    Exclusive,
    /// The shared side of a read/write lock.
    Read,
    /// The exclusive side of a read/write lock.
    Write,
    /// One lease of a semaphore.
    Lease,
    /// The leadership of a leader latch: exclusive, each participant with a hold of its own.
    Leader,
}

/// What one acquire of one lock asks a backend for: every [`HoldMode`] but a semaphore
/// lease, which is asked for with the semaphore's size, several at once
/// (`Wanted::Leases` of the acquire driver). A backend never has to refuse a mode at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LockMode {
    /// A mutex: one holder.
    Exclusive,
    /// The shared side of a read/write lock.
    Read,
    /// The exclusive side of a read/write lock.
    Write,
    /// The leadership of a leader latch: exclusive, each participant with a hold of its own.
    Leader,
}

impl HoldMode {
    /// The recipe a lock with holds of this mode belongs to.
    pub(crate) fn lock_kind(self) -> LockKind {
        match self {
            HoldMode::Exclusive => LockKind::Mutex,
            HoldMode::Read | HoldMode::Write => LockKind::ReadWrite,
            HoldMode::Lease => LockKind::Semaphore,
            HoldMode::Leader => LockKind::Leader,
        }
    }

    /// The exclusive hold of a lock of `kind`: the mode of a mutex's holder, a read/write
    /// lock's writer, a semaphore's lease, a latch's leader.
    #[cfg_attr(
        not(any(feature = "redis", feature = "postgres", feature = "etcd")),
        allow(dead_code)
    )]
    pub(crate) fn exclusive_of(kind: LockKind) -> HoldMode {
        match kind {
            LockKind::ReadWrite => HoldMode::Write,
            LockKind::Semaphore => HoldMode::Lease,
            LockKind::Leader => HoldMode::Leader,
            _ => HoldMode::Exclusive,
        }
    }

    /// The mode's name in inspection ([`Contender::mode`](crate::Contender::mode)), in the
    /// command line's listings and in tracing: `mutex`, `read`, `write`, `lease`, `leader`
    /// (a leader latch's participants, as [`LockKind::Leader`] prints). Every backend's
    /// inspection takes its modes' names from here.
    pub(crate) fn name(self) -> &'static str {
        match self {
            HoldMode::Exclusive => "mutex",
            HoldMode::Read => "read",
            HoldMode::Write => "write",
            HoldMode::Lease => "lease",
            HoldMode::Leader => "leader",
        }
    }
}

impl From<LockMode> for HoldMode {
    fn from(mode: LockMode) -> HoldMode {
        match mode {
            LockMode::Exclusive => HoldMode::Exclusive,
            LockMode::Read => HoldMode::Read,
            LockMode::Write => HoldMode::Write,
            LockMode::Leader => HoldMode::Leader,
        }
    }
}

/// How long an acquire may wait.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    Forever,
    Until(Instant, Duration),
    Never,
}

impl Wait {
    pub(crate) fn timeout(timeout: Option<Duration>) -> Wait {
        match timeout {
            Some(t) => Wait::Until(Instant::now() + t, t),
            None => Wait::Forever,
        }
    }
}
