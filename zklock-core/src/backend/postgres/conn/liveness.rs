//! Keeping a holding connection alive, and knowing when it is not: its [`ConnState`], the
//! liveness check every lease/3 ([`liveness`]), and the confirmations that move its deadline.

use std::sync::{Arc, Weak};

use tokio::sync::watch;
use tokio::time::Instant;

use super::{ConnConfig, HoldConn};
use crate::backend::postgres::wire;
use crate::types::loss::LossReason;

/// What the holds of one connection share.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnState {
    /// When the server could end the session for being idle, less a margin: the send time of
    /// the last confirmed liveness check, plus the lease, less the margin.
    pub(crate) deadline: Instant,
    /// Set once the connection is lost; never cleared.
    pub(crate) lost: Option<LossReason>,
    /// A statement that waits in the server's lock queue runs on the connection (see
    /// [`HoldConn::try_block`]): the session is busy, so the server does not end it for being
    /// idle, and nothing is held on it, so the deadline does not apply until the wait ends.
    pub(crate) blocked: bool,
}

impl ConnState {
    pub(crate) fn reason_at(&self, now: Instant) -> Option<LossReason> {
        if self.lost.is_some() {
            self.lost
        } else if self.blocked {
            None
        } else if now >= self.deadline {
            Some(LossReason::LeaseExpired)
        } else {
            None
        }
    }
}

/// Makes the connection lost with `reason` unless it already is (a passed deadline is the
/// first reason).
pub(super) fn lose(state: &watch::Sender<ConnState>, reason: LossReason) {
    state.send_if_modified(|s| {
        if s.lost.is_some() {
            return false;
        }
        s.lost = Some(s.reason_at(Instant::now()).unwrap_or(reason));
        true
    });
}

/// A confirmed check moves the deadline to `deadline` (if later), unless the connection is
/// lost, or the old deadline passed before the answer came (then it is lost now). Only a loss
/// wakes the state's watchers (see [`HoldConn::answered`]).
fn confirm_until(state: &watch::Sender<ConnState>, deadline: Instant) {
    state.send_if_modified(|s| {
        if s.lost.is_some() {
            return false;
        }
        match s.reason_at(Instant::now()) {
            Some(reason) => {
                s.lost = Some(reason);
                true
            }
            None => {
                s.deadline = s.deadline.max(deadline);
                false
            }
        }
    });
}

impl HoldConn {
    /// Why the connection's holds are lost, if they are. The clock is read while the state is
    /// borrowed, so a later confirmation cannot make a lost connection held again.
    pub(crate) fn reason(&self) -> Option<LossReason> {
        self.state.borrow().reason_at(Instant::now())
    }

    /// The connection's state, to watch.
    pub(crate) fn subscribe(&self) -> watch::Receiver<ConnState> {
        self.state.subscribe()
    }

    /// A check sent at `sent` was answered: the session was alive then, so its locks are held
    /// until the lease from then (unless the connection was lost meanwhile, or the old
    /// deadline passed before the answer came: a loss is final).
    ///
    /// A later deadline is written without waking the state's watchers: only a loss does.
    /// Every hold's loss signal, and every local waiter watching its holder's, sleeps until
    /// the deadline it last read and reads the state again then, so an earlier wake-up was
    /// for nothing; with a wake-up per check, a local queue of n tasks cost n polls per
    /// handoff (each handoff confirms the hold), and its drain grew as n².
    fn answered(&self, sent: Instant) {
        confirm_until(&self.state, self.cc.deadline(sent));
    }

    /// Asks the session whether it is still there (one round trip on this connection): a
    /// session-level advisory lock lasts as long as its session, so an answer confirms every
    /// lock the connection holds, as of the request's sending. A failure or a silence past the
    /// reply timeout closes the connection, and its holds are lost.
    pub(crate) async fn confirm(&self) {
        if self.reason().is_some() {
            return;
        }
        let sent = Instant::now();
        if self.run(self.client.simple_query(wire::PING)).await.is_ok() {
            self.answered(sent);
        }
    }
}

/// Checks every lease/3 that the session answers; makes the connection lost the moment a
/// check fails, or when no check was confirmed before the deadline.
pub(super) async fn liveness(conn: Weak<HoldConn>, cc: Arc<ConnConfig>, mut last_sent: Instant) {
    loop {
        tokio::time::sleep_until(last_sent + cc.lease / 3).await;
        let Some(c) = conn.upgrade() else { return };
        if c.state.borrow().blocked {
            // Any request would wait behind the wait in the lock queue: wait for its end, then
            // count from the request that ended it.
            let mut state = c.subscribe();
            drop(c);
            if state
                .wait_for(|s| !s.blocked || s.lost.is_some())
                .await
                .is_err()
            {
                return;
            }
            let Some(c) = conn.upgrade() else { return };
            let deadline = c.state.borrow().deadline;
            last_sent = (deadline + cc.margin)
                .checked_sub(cc.lease)
                .unwrap_or(deadline);
            continue;
        }
        if c.reason().is_some() {
            return c.kill(LossReason::LeaseExpired);
        }
        let deadline = c.state.borrow().deadline;
        let sent = Instant::now();
        match tokio::time::timeout_at(deadline, c.client.simple_query(wire::PING)).await {
            Ok(Ok(_)) => {
                c.answered(sent);
                last_sent = sent;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "zklock: a PostgreSQL liveness check failed; the connection's locks are lost");
                return c.kill(LossReason::Disconnected);
            }
            Err(_) => {
                tracing::warn!("zklock: PostgreSQL did not answer a liveness check in time; the connection's locks are lost");
                return c.kill(LossReason::LeaseExpired);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A confirmed check moves the deadline without waking anyone (a local queue of n tasks
    /// watches its holder's connection: a wake-up per handoff's check cost n polls, and its
    /// drain n²); a loss wakes them.
    #[tokio::test]
    async fn a_later_deadline_wakes_nobody_and_a_loss_wakes_everyone() {
        let now = Instant::now();
        let state = watch::Sender::new(ConnState {
            deadline: now + Duration::from_secs(1),
            lost: None,
            blocked: false,
        });
        let mut watcher = state.subscribe();
        confirm_until(&state, now + Duration::from_secs(5));
        assert!(
            !watcher.has_changed().unwrap(),
            "a later deadline woke a watcher"
        );
        assert_eq!(watcher.borrow().deadline, now + Duration::from_secs(5));
        // An earlier one leaves it.
        confirm_until(&state, now + Duration::from_secs(2));
        assert_eq!(watcher.borrow().deadline, now + Duration::from_secs(5));
        // A check answered after the deadline passed: lost, and every watcher told.
        state.send_modify(|s| s.deadline = Instant::now() - Duration::from_millis(1));
        watcher.borrow_and_update();
        confirm_until(&state, Instant::now() + Duration::from_secs(5));
        assert!(watcher.has_changed().unwrap());
        assert_eq!(watcher.borrow().lost, Some(LossReason::LeaseExpired));
    }
}
