//! What kind of hold is asked for, and how long an acquire may wait.

use std::time::Duration;

use tokio::time::Instant;

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
/// (`Backend::acquire_leases`). A backend never has to refuse a mode at run time.
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

    /// When the wait must end, if it has a deadline.
    pub(crate) fn deadline(self) -> Option<Instant> {
        match self {
            Wait::Until(deadline, _) => Some(deadline),
            _ => None,
        }
    }
}
