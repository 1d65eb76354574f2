//! A granted contender node: its session, its watch, its loss, its release.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use zookeeper_client::{Client, EventType};

use super::node::create_node;
use super::protocol::delete_in_background;
use super::queue::{NodeKind, WRITE_NAME};
use super::session::{connection_lost, wait_reconnect, Health, Session};
use super::{DirTicket, Inner};
use crate::backend::{BackendHold, BoxFuture, Downgraded, LockTarget};
use crate::metrics::{self, BackendKind};
use crate::types::error::{Error, Result};
use crate::types::loss::{Loss, LossReason, LossSignal};
use crate::types::token::FencingToken;

/// What the watch on a held node has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeState {
    /// No answer yet (the watch is not started, or its first request is in flight).
    Unconfirmed,
    /// The node existed when the watch was set; a deletion or revoke request will be seen.
    Watched,
    /// The node is gone, or was revoked.
    Lost(LossReason),
}

/// What a hold knows of other contenders for its lock (see [`Hold::others_waiting`]).
enum Others {
    /// Nobody asked yet.
    Unasked,
    /// The listing that sets the children watch is in flight.
    Listing,
    /// The listing showed no other contender; the children watch it set completes on any
    /// change of the lock path's children (a new contender, or any doubt: the session ended).
    /// Shared: [`Hold::others_waiting`] polls it in passing, a lingering hold's task awaits it.
    NoneYet(ChildrenChange),
    /// Another contender exists or existed, or the listing failed: the bound applies.
    Maybe,
}

/// A children watch's event, shared between its pollers; a watcher whose session task went
/// away without a word (it panics when polled) counts as fired.
type ChildrenChange = futures::future::Shared<BoxFuture<'static, ()>>;

/// The data watch a waiter set on its own node while it waited (one request in the round that
/// watched the nodes ahead of it), handed to the hold it became: the node is then watched with
/// no request at the grant.
pub(crate) struct NodeWatch {
    /// The watch's event: the node deleted, its data changed, or the session's end.
    pub(crate) fired: BoxFuture<'static, zookeeper_client::WatchedEvent>,
    /// The node's data was a revoke request when the watch was set.
    pub(crate) revoke_requested: bool,
}

/// What watches a new hold's node with no request of its own.
pub(crate) enum HandedWatch {
    /// Nothing: the hold watches its node's data (one request), unless the manager opted out.
    NoWatch,
    /// The children watch of the listing that showed the node alone and granted it.
    Children(zookeeper_client::OneshotWatcher),
    /// The data watch the waiter set on its own node while it waited.
    OwnNode(NodeWatch),
}

/// A children watch's event as a [`ChildrenChange`].
fn children_change(watcher: zookeeper_client::OneshotWatcher) -> ChildrenChange {
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
type DataEvent = futures::future::Shared<BoxFuture<'static, EventType>>;

/// A data watch's event as a [`DataEvent`].
fn data_event(fired: BoxFuture<'static, zookeeper_client::WatchedEvent>) -> DataEvent {
    use futures::FutureExt;
    let event: BoxFuture<'static, EventType> = Box::pin(fired.map(|e| e.event_type));
    event.shared()
}

/// The watch on the held node that the monitor waits on, as the synchronous checks see it:
/// an event the client has received counts at once, even before the monitor (a task, which
/// may run after the caller) has acted on it. So `is_held()` never lags what this process has
/// heard of a deletion, and a local handoff never goes ahead on a change still unread.
#[derive(Default)]
struct ReceivedWatch(std::sync::Mutex<Option<MonitoredWatch>>);

enum MonitoredWatch {
    /// The children watch of the listing that granted the node alone.
    Children(ChildrenChange),
    /// A data watch on the node.
    Data(DataEvent),
}

impl ReceivedWatch {
    fn set(&self, watch: Option<MonitoredWatch>) {
        *self.0.lock().unwrap() = watch;
    }

    /// The data watch reported the node's deletion.
    fn deleted(&self) -> bool {
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
    fn children_changed(&self) -> bool {
        use futures::FutureExt;
        match &*self.0.lock().unwrap() {
            Some(MonitoredWatch::Children(fired)) => fired.clone().now_or_never().is_some(),
            _ => false,
        }
    }
}

/// A hold's knowledge of other contenders, shared with the task that lists them.
struct Contenders {
    others: std::sync::Mutex<Others>,
    /// Bumped when the listing has answered (what [`Hold::confirmed`] waits for).
    listed: watch::Sender<()>,
}

/// The signals that end a hold: its session's health (an epoch that moves on with every loss),
/// the watch on its node, and whether it was void from the start.
#[derive(Clone)]
pub(crate) struct LossWatch {
    /// The health epoch at grant.
    epoch: u64,
    /// Set when the hold was already void at grant: its session had ended or was unhealthy.
    born_lost: Option<LossReason>,
    node: watch::Receiver<NodeState>,
    health: watch::Receiver<Health>,
    /// The event the monitor waits on, seen as soon as the client has it.
    received: Arc<ReceivedWatch>,
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
    pub(crate) fn reason(&self) -> Option<LossReason> {
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
    pub(crate) async fn lost(mut self) -> LossReason {
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

/// One granted contender node on ZooKeeper. Deleted when dropped (in the background) or by
/// [`Hold::release`]; shared by the local holders it is handed to.
///
/// A hold belongs to the session it was created on: it is lost once that session expires,
/// whatever session the manager has afterwards, and its node is deleted through that session
/// only.
pub(crate) struct Hold {
    pub(crate) inner: Arc<Inner>,
    pub(crate) session: Session,
    pub(crate) key: Arc<str>,
    pub(crate) node: String,
    pub(crate) czxid: i64,
    loss: LossWatch,
    node_state: Arc<watch::Sender<NodeState>>,
    revocation: Arc<Revocation>,
    /// The task that watches the node, started at the grant or on first interest (see
    /// [`Hold::watch`]).
    monitor: std::sync::Mutex<Option<AbortHandle>>,
    /// The monitor watches the node's data (not only the lock path's children).
    data_watched: AtomicBool,
    /// The delete was confirmed, or handed to a background task: nothing more to do on drop.
    released: AtomicBool,
    contenders: Arc<Contenders>,
    _ticket: DirTicket,
}

impl Hold {
    /// Builds the hold of `node`, created on `session` (the session captured when the acquire
    /// started, not the manager's current one), and starts watching the node if configured.
    ///
    /// `given` is a watch the acquire already set, so that the grant sends no request:
    /// - [`HandedWatch::Children`], the children watch of the listing that showed this node alone in the
    ///   lock path and granted it. The node is then watched through it: any change of the lock
    ///   path's children (this node deleted, another contender queued, the session's end) fires
    ///   it, and only then is the node's data watched (a request); meanwhile the node is as
    ///   confirmed as by a data watch set and not fired, and no other contender waits. A
    ///   contender that is alone and never contended for so pays no request for its watch.
    /// - [`HandedWatch::OwnNode`], the data watch the waiter set on its node while it waited: the hold's
    ///   data watch, set early. A data change (a revoke request?) has the hold read the data.
    pub(crate) fn new(
        inner: Arc<Inner>,
        session: Session,
        key: Arc<str>,
        node: String,
        token: FencingToken,
        ticket: DirTicket,
        given: HandedWatch,
    ) -> Hold {
        let health = inner.session.health.subscribe();
        let (epoch, born_lost) = {
            let h = health.borrow();
            if h.session.generation != session.generation {
                // Granted on a session that has since been replaced: its node went with it.
                (h.epoch, Some(LossReason::SessionExpired))
            } else if !h.ok {
                (h.epoch, Some(h.reason.unwrap_or(LossReason::Disconnected)))
            } else {
                (h.epoch, None)
            }
        };
        let revocation = Arc::new(Revocation::default());
        revocation
            .revocable
            .store(inner.config.revocable, Ordering::SeqCst);
        let eager = inner.config.watch_held_nodes;
        // A revocable hold watches the data from the start (a revoke request changes no child).
        // Likewise the data watch set while waiting: a revocable hold reads the data again.
        let usable = eager && !inner.config.revocable && born_lost.is_none();
        let (fired, node_watch) = match given {
            HandedWatch::Children(watcher) if usable => (Some(children_change(watcher)), None),
            HandedWatch::OwnNode(watch) if usable => (None, Some(watch)),
            _ => (None, None),
        };
        if node_watch.as_ref().is_some_and(|w| w.revoke_requested) {
            revocation.requested.store(true, Ordering::SeqCst);
        }
        let received = Arc::new(ReceivedWatch::default());
        let node_event = node_watch.map(|w| data_event(w.fired));
        if let Some(fired) = &fired {
            received.set(Some(MonitoredWatch::Children(fired.clone())));
        }
        if let Some(event) = &node_event {
            received.set(Some(MonitoredWatch::Data(event.clone())));
        }
        let (node_state, _) = watch::channel(if fired.is_some() || node_event.is_some() {
            NodeState::Watched
        } else {
            NodeState::Unconfirmed
        });
        let hold = Hold {
            inner,
            session,
            key,
            node,
            czxid: token.zxid(),
            loss: LossWatch {
                epoch,
                born_lost,
                node: node_state.subscribe(),
                health,
                received,
            },
            node_state: Arc::new(node_state),
            revocation,
            monitor: std::sync::Mutex::new(None),
            data_watched: AtomicBool::new(false),
            released: AtomicBool::new(false),
            contenders: Arc::new(Contenders {
                others: std::sync::Mutex::new(match &fired {
                    Some(fired) => Others::NoneYet(fired.clone()),
                    None => Others::Unasked,
                }),
                listed: watch::channel(()).0,
            }),
            _ticket: ticket,
        };
        match (fired, node_event) {
            (Some(fired), _) => {
                let (state, received) = (hold.node_state.clone(), hold.loss.received.clone());
                hold.monitor_after(async move {
                    fired.await;
                    // Something changed in the lock path: not confirmed until the data watch
                    // answers. (Unconfirmed first, then the change is no longer pending: a
                    // local handoff waits throughout.)
                    unconfirm(&state);
                    received.set(None);
                    true
                });
            }
            (None, Some(event)) => {
                let (node, state) = (hold.node.clone(), hold.node_state.clone());
                hold.monitor_after(async move { watch_on(event.await, &node, &state) });
            }
            (None, None) if eager => hold.watch(),
            (None, None) => {}
        }
        hold
    }

    /// Starts the monitor of a node already watched without a request: `first` answers with
    /// that watch's event, and unless it settled the matter (`false`), the node's data is
    /// watched from then on (a request).
    fn monitor_after(&self, first: impl Future<Output = bool> + Send + 'static) {
        let (client, node, state, revocation, received) = (
            self.session.client.clone(),
            self.node.clone(),
            self.node_state.clone(),
            self.revocation.clone(),
            self.loss.received.clone(),
        );
        let count = self.inner.clone();
        let monitor = self.inner.runtime.spawn(async move {
            if first.await {
                count.count_requests(1);
                watch_node(client, node, state, revocation, received).await
            }
        });
        *self.monitor.lock().unwrap() = Some(monitor.abort_handle());
    }

    /// Starts watching the node (once): its deletion by someone else, or a revoke request,
    /// becomes a loss. Started at the grant unless the manager opted out
    /// (`watch_held_nodes(false)`), then on first interest (`lost()`, `is_held()`,
    /// `make_revocable()`, `with_lock`'s abort-on-loss, a local handoff).
    pub(crate) fn watch(&self) {
        self.start_watch(false);
    }

    /// Starts watching the node's data (once), in place of a watch through the lock path's
    /// children: what a revoke request needs.
    fn watch_data(&self) {
        self.start_watch(true);
    }

    fn start_watch(&self, data: bool) {
        if self.released.load(Ordering::SeqCst) || self.loss.born_lost.is_some() {
            return;
        }
        let mut monitor = self.monitor.lock().unwrap();
        if let Some(current) = monitor.as_ref() {
            if !data || self.data_watched.load(Ordering::SeqCst) {
                return;
            }
            current.abort();
            // Its watch is replaced by the data watch below (an unread change of the lock
            // path's children included: the read finds whatever it was).
            self.loss.received.set(None);
            unconfirm(&self.node_state);
        }
        self.data_watched.store(true, Ordering::SeqCst);
        self.inner.count_requests(1);
        let watching = watch_node(
            self.session.client.clone(),
            self.node.clone(),
            self.node_state.clone(),
            self.revocation.clone(),
            self.loss.received.clone(),
        );
        *monitor = Some(self.inner.runtime.spawn(watching).abort_handle());
    }

    /// Waits until the watch on the node has answered once, so that [`loss_reason`]
    /// (Self::loss_reason) then knows whether the node still exists: what a local task checks
    /// before it takes over a node handed on to it. Ends early when the hold is lost.
    /// The same holds for the listing of other contenders, once [`others_waiting`]
    /// (Self::others_waiting) started it.
    pub(crate) async fn confirmed(&self) {
        self.watch();
        let mut state = self.node_state.subscribe();
        let mut listed = self.contenders.listed.subscribe();
        let mut health = self.loss.health.clone();
        settle(&mut state, &mut listed, &mut health, || {
            if self.loss_reason().is_some() {
                return true;
            }
            let listing = matches!(*self.contenders.others.lock().unwrap(), Others::Listing);
            // A change of the lock path's children that the client has received, and the
            // monitor not yet acted on, may be this node's deletion: wait for its read.
            let unread = self.loss.received.children_changed();
            *self.node_state.borrow() != NodeState::Unconfirmed && !listing && !unread
        })
        .await
    }

    /// Whether another contender may be waiting for this lock: `true` unless a listing of the
    /// lock path, made on this hold's session, showed no other node and the children watch it
    /// set has not fired since. The first call starts that listing (one request) and answers
    /// `true`, as does any doubt. A watch's event reaches the client before the answer to any
    /// later request of its session, and is seen here without waiting.
    pub(crate) fn others_waiting(&self) -> bool {
        if self.released.load(Ordering::SeqCst) || self.loss_reason().is_some() {
            return true;
        }
        let mut others = self.contenders.others.lock().unwrap();
        match &mut *others {
            Others::Unasked => {
                *others = Others::Listing;
                drop(others);
                self.list_contenders();
                true
            }
            Others::Listing | Others::Maybe => true,
            Others::NoneYet(changed) => {
                if futures::FutureExt::now_or_never(changed.clone()).is_some() {
                    *others = Others::Maybe;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Completes once another contender may be waiting (see [`others_waiting`]
    /// (Self::others_waiting)): at once if one is known or in doubt, else when the listing
    /// shows one or the children watch fires. Starts the listing if nobody asked yet.
    pub(crate) fn others_appeared(&self) -> BoxFuture<'static, ()> {
        if self.released.load(Ordering::SeqCst) || self.loss_reason().is_some() {
            return Box::pin(std::future::ready(()));
        }
        let contenders = self.contenders.clone();
        // Subscribed before the state is read: a listing that answers after the read is seen.
        let mut listed = contenders.listed.subscribe();
        {
            let mut others = contenders.others.lock().unwrap();
            if matches!(*others, Others::Unasked) {
                *others = Others::Listing;
                drop(others);
                self.list_contenders();
            }
        }
        Box::pin(async move {
            loop {
                let fired = match &*contenders.others.lock().unwrap() {
                    Others::Listing => None,
                    Others::NoneYet(fired) => Some(fired.clone()),
                    Others::Unasked | Others::Maybe => return,
                };
                match fired {
                    Some(fired) => return fired.await,
                    None => {
                        if listed.changed().await.is_err() {
                            return;
                        }
                    }
                }
            }
        })
    }

    /// Lists the lock path's children and watches them (see [`others_waiting`]
    /// (Self::others_waiting)).
    fn list_contenders(&self) {
        let Some((parent, name)) = self.node.rsplit_once('/') else {
            *self.contenders.others.lock().unwrap() = Others::Maybe;
            return;
        };
        let (parent, name) = (parent.to_string(), name.to_string());
        let client = self.session.client.clone();
        let contenders = self.contenders.clone();
        self.inner.count_requests(1);
        self.inner.runtime.spawn(async move {
            let next = match client.list_and_watch_children(&parent).await {
                Ok((children, watcher)) if children.iter().all(|c| *c == name) => {
                    Others::NoneYet(children_change(watcher))
                }
                _ => Others::Maybe,
            };
            let mut others = contenders.others.lock().unwrap();
            if matches!(*others, Others::Listing) {
                *others = next;
            }
            drop(others);
            contenders.listed.send_replace(());
        });
    }

    /// What tells of this hold's loss, apart from the hold (it keeps the node alive).
    pub(crate) fn loss_watch(&self) -> LossWatch {
        self.watch();
        self.loss.clone()
    }

    fn stop_watching(&self) {
        if let Some(monitor) = self.monitor.lock().unwrap().as_ref() {
            monitor.abort();
        }
        // This process deletes the node now: that deletion is not a loss.
        self.loss.received.set(None);
    }

    /// Opts in to revocation: a revoke request (already made or to come) becomes a loss.
    pub(crate) fn make_revocable(&self) {
        self.revocation.revocable.store(true, Ordering::SeqCst);
        self.watch_data();
        if self.revocation.requested.load(Ordering::SeqCst) {
            self.node_state
                .send_replace(NodeState::Lost(LossReason::Revoked));
        }
    }

    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.loss.reason()
    }

    /// Deletes the node through the hold's own session and waits for the answer.
    ///
    /// Cancel safe: until the delete is confirmed, dropping the hold (as a cancelled caller
    /// does) sends the delete again in the background.
    pub(crate) async fn release(&self) -> Result<()> {
        if self.released.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.stop_watching();
        let result = self.delete().await;
        self.released.store(true, Ordering::SeqCst);
        result
    }

    async fn delete(&self) -> Result<()> {
        let lost = |reason| Error::LockLost {
            key: self.key.to_string(),
            reason,
        };
        loop {
            self.inner.count_requests(1);
            match self.session.client.delete(&self.node, None).await {
                Ok(()) => return Ok(()),
                Err(zookeeper_client::Error::NoNode) => {
                    return self.loss_reason().map_or(Ok(()), |r| Err(lost(r)))
                }
                // Retried for as long as the session lives: when it ends, so does the node.
                Err(err) if connection_lost(&err) => {
                    if !wait_reconnect(&self.session.client).await {
                        return Err(lost(LossReason::SessionExpired));
                    }
                    metrics::release_retry(BackendKind::Zk);
                }
                Err(err) => {
                    return Err(match self.loss_reason() {
                        Some(reason) => lost(reason),
                        None => Error::zk("release the lock", &self.node, err),
                    })
                }
            }
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.released.swap(true, Ordering::SeqCst) {
            self.stop_watching();
            delete_in_background(&self.inner, self.session.client.clone(), self.node.clone());
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
async fn settle<A, B, C>(
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

/// The data Curator's `Revoker` writes into a holder's node to ask it to let go.
pub(crate) const REVOKE_MESSAGE: &[u8] = b"__REVOKE__";

/// What the node monitor shares with its hold.
#[derive(Default)]
pub(crate) struct Revocation {
    /// The holder opted in: a revoke request is a loss.
    pub(crate) revocable: AtomicBool,
    /// Someone asked (the node's data is `__REVOKE__`).
    pub(crate) requested: AtomicBool,
}

/// A held node was deleted by someone else: the hold is lost.
fn node_gone(node: &str, state: &watch::Sender<NodeState>) {
    tracing::warn!(%node, "lock node deleted by someone else");
    state.send_replace(NodeState::Lost(LossReason::NodeDeleted));
}

/// A watched node's state is in doubt until its data is read again (a watch that may have
/// missed its deletion was replaced, or the lock path's children changed).
fn unconfirm(state: &watch::Sender<NodeState>) {
    state.send_if_modified(|s| {
        let was = *s == NodeState::Watched;
        if was {
            *s = NodeState::Unconfirmed;
        }
        was
    });
}

/// Acts on an event of the held node's data watch; whether to read and watch the data again.
fn watch_on(event: EventType, node: &str, state: &watch::Sender<NodeState>) -> bool {
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
async fn watch_node(
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

impl BackendHold for Hold {
    fn token(&self) -> FencingToken {
        FencingToken::new(self.czxid, 0)
    }

    fn location(&self) -> &str {
        &self.node
    }

    /// Starts the node's watch if it is not running yet (first interest).
    fn loss_reason(&self) -> Option<LossReason> {
        self.watch();
        Hold::loss_reason(self)
    }

    fn loss_known(&self) -> Option<LossReason> {
        Hold::loss_reason(self)
    }

    fn loss(&self) -> LossSignal {
        Arc::new(self.loss_watch())
    }

    /// Starts no watch: with `watch_held_nodes(false)`, a grant that nobody asks about costs
    /// no request and no task.
    fn loss_unwatched(&self) -> LossSignal {
        Arc::new(self.loss.clone())
    }

    fn others_waiting(&self) -> bool {
        Hold::others_waiting(self)
    }

    fn others_appeared(&self) -> BoxFuture<'static, ()> {
        Hold::others_appeared(self)
    }

    /// Held, and the session connected now: a new grant is not made on a connection that
    /// could not hear of the session's expiry (a disconnect grace keeps holds already granted).
    fn can_regrant(&self) -> bool {
        BackendHold::loss_reason(self).is_none()
            && matches!(
                self.session.client.state(),
                zookeeper_client::SessionState::SyncConnected
            )
    }

    fn confirmed(&self) -> BoxFuture<'_, ()> {
        Box::pin(Hold::confirmed(self))
    }

    fn release(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(Hold::release(self))
    }

    fn make_revocable(&self) {
        Hold::make_revocable(self)
    }

    /// A read node is created (no wait: we hold the write lock) on the write hold's own
    /// session; the write node must be kept if a writer queued between the two.
    fn downgrade(self: Arc<Self>, target: LockTarget) -> BoxFuture<'static, Result<Downgraded>> {
        Box::pin(async move {
            let lost = |reason| Error::LockLost {
                key: target.key.to_string(),
                reason,
            };
            if let Some(reason) = self.loss_reason() {
                return Err(lost(reason));
            }
            let made = create_node(
                &self.inner,
                &self.session,
                &target.path,
                &target.key,
                NodeKind::Read,
                None,
            )
            .await?;
            let children = made.children;
            let read = Hold::new(
                self.inner.clone(),
                self.session.clone(),
                target.key.clone(),
                made.node,
                made.token,
                made.ticket,
                HandedWatch::NoWatch,
            );
            if let Some(reason) = self.loss_reason() {
                // Lost while the read node was made: the read node goes when `read` drops.
                return Err(lost(reason));
            }
            let read_key = NodeKind::Read
                .sort_key(read.node.rsplit('/').next().unwrap_or_default())
                .to_string();
            let write_key = NodeKind::Write
                .sort_key(self.node.rsplit('/').next().unwrap_or_default())
                .to_string();
            let keep_write = children.iter().any(|c| {
                let k = NodeKind::Write.sort_key(c);
                c.contains(WRITE_NAME) && k > write_key.as_str() && k < read_key.as_str()
            });
            Ok(Downgraded {
                read: Arc::new(read),
                keep_write,
            })
        })
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
