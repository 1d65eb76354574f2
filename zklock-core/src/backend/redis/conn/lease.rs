//! A Redis hold's lease as this process knows it: which key it lives in, until when it is
//! certain, and why it was lost. What the hold and the watchdog both read and change.

use tokio::sync::watch;
use tokio::time::Instant;

use super::breaks::Breaks;
use crate::types::loss::LossReason;

/// Which key a hold lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The exclusive key of a mutex (or a leader latch), whose waiters queue.
    Mutex,
    /// The exclusive key of a writer.
    Exclusive,
    /// A member of the shared set (a reader or a semaphore lease).
    Shared,
}

/// What a hold's loss is computed from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HoldState {
    /// When the lease could run out: the send time of the last confirmed grant or renewal,
    /// plus the lease the server was told, minus a margin (see `Inner::margin`).
    pub(crate) deadline: Instant,
    /// The connection epoch (see [`Breaks`]) in which the hold was granted. Once a break that
    /// reaches the hold comes after it (a connection broke since: the server may have
    /// restarted and lost the key, and let someone else in), the hold is lost
    /// (`Disconnected`), at once and for good: a hold seen not held never turns held again.
    pub(crate) epoch: u64,
    /// On Cluster, the hold's slot: only breaks that reach it count (see [`Breaks`]).
    pub(crate) slot: Option<u16>,
    /// Set once the hold is lost; never cleared.
    pub(crate) lost: Option<LossReason>,
    /// The hold ended (released or downgraded): its deadline no longer matters.
    pub(crate) released: bool,
}

impl HoldState {
    /// Why the hold is not held at `now` with `breaks` as they are, if it is not: lost, its
    /// lease could have run out, or a connection broke (or the store failed over) since it was
    /// granted. Each is final.
    pub(crate) fn reason_at(&self, now: Instant, breaks: &Breaks) -> Option<LossReason> {
        if self.lost.is_some() {
            self.lost
        } else if self.released {
            None
        } else if now >= self.deadline {
            Some(LossReason::LeaseExpired)
        } else if breaks.ended_since(self.epoch, self.slot) {
            Some(breaks.why(self.epoch, self.slot))
        } else {
            None
        }
    }

    /// Whether the hold is lost for good at `now` (its deadline passed, or a loss was set).
    fn final_reason(&self, now: Instant) -> Option<LossReason> {
        if self.lost.is_some() {
            self.lost
        } else if !self.released && now >= self.deadline {
            Some(LossReason::LeaseExpired)
        } else {
            None
        }
    }
}

/// Why `state`'s hold is not held, if it is not. The clock is read while the state is
/// borrowed, so a renewal confirmed later cannot make a hold seen as lost held again (see
/// [`extend`]).
pub(crate) fn reason(state: &watch::Receiver<HoldState>, breaks: &Breaks) -> Option<LossReason> {
    let s = state.borrow();
    s.reason_at(Instant::now(), breaks)
}

/// Moves the deadline on to `deadline` after a renewal (or check) sent in connection epoch
/// `sent` was confirmed with `breaks` current, unless the hold was already lost: its deadline
/// passed, or a break that reaches it came since its grant or during the request, before the
/// confirmation came (someone may have seen it lost, and a loss is final).
pub(crate) fn extend(
    state: &watch::Sender<HoldState>,
    deadline: Instant,
    sent: u64,
    breaks: &Breaks,
) {
    state.send_if_modified(|s| {
        if s.lost.is_some() || s.released {
            return false;
        }
        if let Some(reason) = s.reason_at(Instant::now(), breaks) {
            s.lost = Some(reason);
        } else if breaks.ended_since(sent, s.slot) {
            s.lost = Some(breaks.why(sent, s.slot));
        } else {
            s.deadline = s.deadline.max(deadline);
            return false;
        }
        tracing::warn!(reason = %s.lost.expect("just set"), "zklock: Redis lease lost");
        true
    });
}

/// Makes the hold lost with `reason`, unless it is already lost or ended.
pub(crate) fn lose(state: &watch::Sender<HoldState>, reason: LossReason, location: &str) {
    state.send_if_modified(|s| {
        if s.released || s.lost.is_some() {
            return false;
        }
        // A deadline that has passed is the first reason.
        s.lost = Some(s.final_reason(Instant::now()).unwrap_or(reason));
        tracing::warn!(key = %location, reason = %s.lost.expect("just set"), "zklock: Redis lease lost");
        true
    });
}
