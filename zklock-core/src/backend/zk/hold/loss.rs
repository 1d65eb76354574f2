//! What ends a hold, as a signal apart from the hold: its session's health, the watch on its
//! node, and whether it was void at grant; and the wait that settles once the watches have
//! answered.

use std::sync::Arc;

use tokio::sync::watch;

use super::super::session::Health;
use super::monitor::{NodeState, ReceivedWatch};
use crate::types::loss::{Loss, LossReason};

/// The signals that end a hold: its session's health (an epoch that moves on with every loss),
/// the watch on its node, and whether it was void from the start.
#[derive(Clone)]
pub(crate) struct LossWatch {
    /// The health epoch at grant.
    pub(super) epoch: u64,
    /// Set when the hold was already void at grant: its session had ended or was unhealthy.
    pub(super) born_lost: Option<LossReason>,
    pub(super) node: watch::Receiver<NodeState>,
    pub(super) health: watch::Receiver<Health>,
    /// The event the monitor waits on, seen as soon as the client has it.
    pub(super) received: Arc<ReceivedWatch>,
}

impl Loss for LossWatch {
    fn reason(&self) -> Option<LossReason> {
        LossWatch::reason(self)
    }

    fn lost(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = LossReason> + Send>> {
        Box::pin(self.clone().lost())
    }
}

impl LossWatch {
    pub(super) fn reason(&self) -> Option<LossReason> {
        if self.born_lost.is_some() {
            return self.born_lost;
        }
        if let NodeState::Lost(reason) = *self.node.borrow() {
            return Some(reason);
        }
        if self.received.deleted() {
            return Some(LossReason::NodeDeleted);
        }
        let h = self.health.borrow();
        if h.epoch != self.epoch {
            return Some(h.reason.unwrap_or(LossReason::Disconnected));
        }
        None
    }

    /// Completes when the hold is lost, with the reason.
    pub(super) async fn lost(mut self) -> LossReason {
        let mut node_open = true;
        loop {
            if let Some(reason) = self.reason() {
                return reason;
            }
            tokio::select! {
                changed = self.health.changed() => if changed.is_err() { return LossReason::Closed },
                changed = self.node.changed(), if node_open => if changed.is_err() { node_open = false },
            }
        }
    }
}

/// Waits until `settled()` answers true, asking again after every change of the three
/// channels (or returns when one of them closes).
///
/// `settled` may read what no channel versions (a watch event the client delivered, the
/// listing's state): each round marks the channels' versions seen *before* it asks, so a change
/// made while it asks (the monitor unconfirms, reads, confirms again) is a change still unseen
/// and wakes the wait. Asking first and marking after would consume that change while the
/// answer was taken from the stale read: a wait for ever (a lost wake-up).
pub(super) async fn settle<A, B, C>(
    a: &mut watch::Receiver<A>,
    b: &mut watch::Receiver<B>,
    c: &mut watch::Receiver<C>,
    mut settled: impl FnMut() -> bool,
) {
    loop {
        a.borrow_and_update();
        b.borrow_and_update();
        c.borrow_and_update();
        if settled() {
            return;
        }
        tokio::select! {
            changed = a.changed() => if changed.is_err() { return },
            changed = b.changed() => if changed.is_err() { return },
            changed = c.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::super::monitor::unconfirm;
    use super::*;

    /// The monitor runs its whole sequence (unconfirm, clear the unread flag, read, confirm)
    /// while `confirmed()` asks whether the node is settled, after the flag was read as set:
    /// the versions it marked seen must be older than that sequence, so the wait wakes and
    /// asks again. (Marking them seen after asking waits for ever.)
    #[tokio::test]
    async fn a_change_made_while_settled_is_asked_wakes_the_wait() {
        use std::sync::atomic::AtomicUsize;
        let (state, mut rx) = watch::channel(NodeState::Watched);
        let (_listed, mut listed) = watch::channel(());
        let (_health, mut health) = watch::channel(());
        let unread = AtomicBool::new(true);
        let asked = AtomicUsize::new(0);
        let settled = || {
            asked.fetch_add(1, Ordering::SeqCst);
            let was_unread = unread.load(Ordering::SeqCst);
            // The window held open: the monitor's whole sequence runs here.
            if was_unread {
                unconfirm(&state);
                unread.store(false, Ordering::SeqCst);
                state.send_replace(NodeState::Watched);
            }
            *state.borrow() != NodeState::Unconfirmed && !was_unread
        };
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            settle(&mut rx, &mut listed, &mut health, settled),
        )
        .await
        .expect("the wait woke for the change made while it asked");
        assert_eq!(asked.load(Ordering::SeqCst), 2);
    }
}
