//! The watch on a held node: what it has seen, the watches an acquire handed over turned into
//! what the monitor waits on, what the synchronous checks see of an event before the monitor task
//! has acted on it, and the task that watches the node's data (deletion, revoke requests).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;
use zookeeper_client::{Client, EventType};

use super::super::error::connection_lost;
use super::super::session::wait_reconnect;
use super::super::wire::REVOKE_MESSAGE;
use crate::backend::BoxFuture;
use crate::types::loss::LossReason;

/// What the watch on a held node has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NodeState {
    /// No answer yet (the watch is not started, or its first request is in flight).
    Unconfirmed,
    /// The node existed when the watch was set; a deletion or revoke request will be seen.
    Watched,
    /// The node is gone, or was revoked.
    Lost(LossReason),
}

/// A children watch's event, shared between its pollers; a watcher whose session task went
/// away without a word (it panics when polled) counts as fired.
pub(super) type ChildrenChange = futures::future::Shared<BoxFuture<'static, ()>>;

/// A children watch's event as a [`ChildrenChange`].
pub(super) fn children_change(watcher: zookeeper_client::OneshotWatcher) -> ChildrenChange {
    use futures::FutureExt;
    // A watcher whose session task went away without a word panics when polled: that too is
    // doubt.
    let fired: BoxFuture<'static, ()> = Box::pin(
        std::panic::AssertUnwindSafe(watcher.changed())
            .catch_unwind()
            .map(|_| ()),
    );
    fired.shared()
}

/// A data watch's event type, shared between the monitor that waits for it and the
/// synchronous checks that look whether it came.
pub(super) type DataEvent = futures::future::Shared<BoxFuture<'static, EventType>>;

/// A data watch's event as a [`DataEvent`].
pub(super) fn data_event(fired: BoxFuture<'static, zookeeper_client::WatchedEvent>) -> DataEvent {
    use futures::FutureExt;
    let event: BoxFuture<'static, EventType> = Box::pin(fired.map(|e| e.event_type));
    event.shared()
}

/// The watch on the held node that the monitor waits on, as the synchronous checks see it:
/// an event the client has received counts at once, even before the monitor (a task, which
/// may run after the caller) has acted on it. So `is_held()` never lags what this process has
/// heard of a deletion, and a local handoff never goes ahead on a change still unread.
#[derive(Default)]
pub(super) struct ReceivedWatch(std::sync::Mutex<Option<MonitoredWatch>>);

pub(super) enum MonitoredWatch {
    /// The children watch of the listing that granted the node alone.
    Children(ChildrenChange),
    /// A data watch on the node.
    Data(DataEvent),
}

impl ReceivedWatch {
    pub(super) fn set(&self, watch: Option<MonitoredWatch>) {
        *self.0.lock().unwrap() = watch;
    }

    /// The data watch reported the node's deletion.
    pub(super) fn deleted(&self) -> bool {
        use futures::FutureExt;
        match &*self.0.lock().unwrap() {
            Some(MonitoredWatch::Data(event)) => {
                event.clone().now_or_never() == Some(EventType::NodeDeleted)
            }
            _ => false,
        }
    }

    /// The children watch fired and the monitor has not acted on it yet: whether the node is
    /// still there is not known until its data is read.
    pub(super) fn children_changed(&self) -> bool {
        use futures::FutureExt;
        match &*self.0.lock().unwrap() {
            Some(MonitoredWatch::Children(fired)) => fired.clone().now_or_never().is_some(),
            _ => false,
        }
    }
}

/// What the node monitor shares with its hold.
#[derive(Default)]
pub(super) struct Revocation {
    /// The holder opted in: a revoke request is a loss.
    pub(super) revocable: AtomicBool,
    /// Someone asked (the node's data is `__REVOKE__`).
    pub(super) requested: AtomicBool,
}

/// A held node was deleted by someone else: the hold is lost.
pub(super) fn node_gone(node: &str, state: &watch::Sender<NodeState>) {
    tracing::warn!(%node, "lock node deleted by someone else");
    state.send_replace(NodeState::Lost(LossReason::NodeDeleted));
}

/// A watched node's state is in doubt until its data is read again (a watch that may have
/// missed its deletion was replaced, or the lock path's children changed).
pub(super) fn unconfirm(state: &watch::Sender<NodeState>) {
    state.send_if_modified(|s| {
        let was = *s == NodeState::Watched;
        if was {
            *s = NodeState::Unconfirmed;
        }
        was
    });
}

/// Acts on an event of the held node's data watch; whether to read and watch the data again.
pub(super) fn watch_on(event: EventType, node: &str, state: &watch::Sender<NodeState>) -> bool {
    match event {
        EventType::NodeDeleted => {
            node_gone(node, state);
            false
        }
        // Session trouble is reported through the manager's health.
        EventType::Session => false,
        // The data changed (a revoke request?): read it, and watch on.
        _ => true,
    }
}

/// Watches a held node: deletion by someone else is a loss, and so is a revoke request once
/// the holder opted in.
pub(super) async fn watch_node(
    client: Client,
    node: String,
    state: Arc<watch::Sender<NodeState>>,
    revocation: Arc<Revocation>,
    received: Arc<ReceivedWatch>,
) {
    loop {
        match client.get_and_watch_data(&node).await {
            Err(zookeeper_client::Error::NoNode) => return node_gone(&node, &state),
            Ok((data, _, watcher)) => {
                let event = data_event(Box::pin(watcher.changed()));
                received.set(Some(MonitoredWatch::Data(event.clone())));
                if data == REVOKE_MESSAGE {
                    revocation.requested.store(true, Ordering::SeqCst);
                    if revocation.revocable.load(Ordering::SeqCst) {
                        tracing::warn!(%node, "lock revoked");
                        state.send_replace(NodeState::Lost(LossReason::Revoked));
                        return;
                    }
                }
                state.send_if_modified(|s| {
                    let first = *s == NodeState::Unconfirmed;
                    if first {
                        *s = NodeState::Watched;
                    }
                    first
                });
                if !watch_on(event.await, &node, &state) {
                    return;
                }
            }
            Err(err) if connection_lost(&err) => {
                if !wait_reconnect(&client).await {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    fn event(ready: Option<EventType>) -> DataEvent {
        let fut: BoxFuture<'static, EventType> = match ready {
            Some(t) => Box::pin(async move { t }),
            None => Box::pin(std::future::pending()),
        };
        fut.shared()
    }

    fn children_change(ready: bool) -> ChildrenChange {
        let fut: BoxFuture<'static, ()> = if ready {
            Box::pin(async {})
        } else {
            Box::pin(std::future::pending())
        };
        fut.shared()
    }

    /// A deletion the client has delivered counts before any task has polled the watch.
    #[test]
    fn a_delivered_deletion_counts_before_the_monitor_runs() {
        let received = ReceivedWatch::default();
        assert!(!received.deleted(), "nothing watched");
        received.set(Some(MonitoredWatch::Data(event(None))));
        assert!(!received.deleted(), "nothing delivered");
        received.set(Some(MonitoredWatch::Data(event(Some(
            EventType::NodeDataChanged,
        )))));
        assert!(
            !received.deleted(),
            "a data change (a revoke request?) is read first"
        );
        received.set(Some(MonitoredWatch::Data(event(Some(
            EventType::NodeDeleted,
        )))));
        assert!(received.deleted());
        assert!(received.deleted(), "and stays so");
        // The holder's own release clears it: its own deletion is no loss.
        received.set(None);
        assert!(!received.deleted());
    }

    /// A delivered change of the lock path's children is unread until the monitor reads the
    /// node: not a loss, but no local handoff may go ahead on it.
    #[test]
    fn a_delivered_change_of_the_children_is_pending_until_read() {
        let received = ReceivedWatch::default();
        received.set(Some(MonitoredWatch::Children(children_change(false))));
        assert!(!received.children_changed());
        received.set(Some(MonitoredWatch::Children(children_change(true))));
        assert!(received.children_changed());
        assert!(
            !received.deleted(),
            "the children watch cannot say which node went"
        );
        received.set(None);
        assert!(!received.children_changed());
    }
}
