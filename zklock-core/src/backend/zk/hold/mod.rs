//! A granted contender node: its session, its release, and what it is to the layers above
//! (a `BackendHold`). One concern per file below: the watch on the node ([`monitor`]), the
//! loss signal ([`loss`]), other contenders ([`others`]), the downgrade ([`downgrade`]).

mod downgrade;
mod loss;
mod monitor;
mod others;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::acquire::floor::DirTicket;
use super::acquire::{FromGranted, Granted, HandedWatch};
use super::error::{connection_lost, zk_error};
use super::session::{delete_in_background, wait_reconnect, Health, Session};
use super::Inner;
use crate::backend::{BackendHold, BoxFuture, Downgraded, LockTarget, Revocable, SharedHold};
use crate::metrics;
use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, Result};
use crate::types::loss::{LossReason, LossSignal};
use crate::types::token::FencingToken;
use loss::settle;
use loss::LossWatch;
use monitor::{
    children_change, data_event, unconfirm, watch_node, watch_on, MonitoredWatch, NodeState,
    ReceivedWatch, Revocation,
};
use others::{Contenders, Others};

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
    /// The hold of the node an acquire was granted, with the watches it set on the way.
    pub(crate) fn granted(granted: Granted) -> Hold {
        Hold::new(
            granted.inner,
            granted.session,
            granted.key,
            granted.node,
            granted.token,
            granted.ticket,
            granted.watch,
        )
    }

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
        mut given: HandedWatch,
    ) -> Hold {
        let health = inner.session.health.subscribe();
        let (epoch, born_lost) = state_at_grant(&health.borrow(), &session);
        let revocation = Arc::new(Revocation::default());
        revocation
            .revocable
            .store(inner.config.revocable, Ordering::SeqCst);
        let eager = inner.config.watch_held_nodes;
        // A revocable hold watches the data from the start (a revoke request changes no child).
        // Likewise the data watch set while waiting: a revocable hold reads the data again.
        let usable = eager && !inner.config.revocable && born_lost.is_none();
        // A watch not used stays in `given`, dropped as the hold is returned.
        let handed = usable
            .then(|| take_handed(&mut given, &revocation))
            .flatten();
        let received = Arc::new(ReceivedWatch::default());
        received.set(handed.as_ref().map(shared_watch));
        let (node_state, _) = watch::channel(if handed.is_some() {
            NodeState::Watched
        } else {
            NodeState::Unconfirmed
        });
        let others = match &handed {
            Some(MonitoredWatch::Children(fired)) => Others::NoneYet(fired.clone()),
            _ => Others::Unasked,
        };
        let hold = Hold {
            inner,
            session,
            key,
            node,
            czxid: token.grant(),
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
                others: std::sync::Mutex::new(others),
                listed: watch::channel(()).0,
            }),
            _ticket: ticket,
        };
        hold.start_monitor(handed, eager);
        hold
    }

    /// Starts the new hold's monitor: through the watch `handed` to it (no request until that
    /// watch fires), else by watching the node's data now if `eager` (one request, sent by
    /// the monitor task), else not yet (see [`watch`](Self::watch)).
    fn start_monitor(&self, handed: Option<MonitoredWatch>, eager: bool) {
        match handed {
            Some(MonitoredWatch::Children(fired)) => {
                let (state, received) = (self.node_state.clone(), self.loss.received.clone());
                self.monitor_after(async move {
                    fired.await;
                    // Something changed in the lock path: not confirmed until the data watch
                    // answers. (Unconfirmed first, then the change is no longer pending: a
                    // local handoff waits throughout.)
                    unconfirm(&state);
                    received.set(None);
                    true
                });
            }
            Some(MonitoredWatch::Data(event)) => {
                let (node, state) = (self.node.clone(), self.node_state.clone());
                self.monitor_after(async move { watch_on(event.await, &node, &state) });
            }
            None if eager => self.watch(),
            None => {}
        }
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

    /// Waits until the watch on the node has answered once, so that [`loss_reason`](Self::loss_reason)
    /// then knows whether the node still exists: what a local task checks
    /// before it takes over a node handed on to it. Ends early when the hold is lost.
    /// The same holds for the listing of other contenders, once [`others_waiting`](Self::others_waiting)
    /// started it.
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
                    metrics::release_retry(BackendKind::ZooKeeper);
                }
                Err(err) => {
                    return Err(match self.loss_reason() {
                        Some(reason) => lost(reason),
                        None => zk_error("release the lock", &self.node, err),
                    })
                }
            }
        }
    }
}

/// The health epoch a hold granted on `session` starts in (`health` being its session
/// health now), and why it is void from the start, if it is: the session has since been
/// replaced, or is unhealthy.
fn state_at_grant(health: &Health, session: &Session) -> (u64, Option<LossReason>) {
    if health.session.generation != session.generation {
        // Granted on a session that has since been replaced: its node went with it.
        (health.epoch, Some(LossReason::SessionExpired))
    } else if !health.ok {
        (
            health.epoch,
            Some(health.reason.unwrap_or(LossReason::Disconnected)),
        )
    } else {
        (health.epoch, None)
    }
}

/// Takes the watch out of `given` (leaving [`HandedWatch::NoWatch`]) for a new hold that
/// uses it, as the hold's monitor waits on it; a revoke request its waiter saw is noted in
/// `revocation`. `None` when nothing was handed.
fn take_handed(given: &mut HandedWatch, revocation: &Revocation) -> Option<MonitoredWatch> {
    match std::mem::replace(given, HandedWatch::NoWatch) {
        HandedWatch::Children(watcher) => Some(MonitoredWatch::Children(children_change(watcher))),
        HandedWatch::OwnNode(watch) => {
            if watch.revoke_requested {
                revocation.requested.store(true, Ordering::SeqCst);
            }
            Some(MonitoredWatch::Data(data_event(watch.fired)))
        }
        HandedWatch::NoWatch => None,
    }
}

/// Another handle on the same watch event, for what the synchronous checks see
/// ([`ReceivedWatch`]).
fn shared_watch(watch: &MonitoredWatch) -> MonitoredWatch {
    match watch {
        MonitoredWatch::Children(fired) => MonitoredWatch::Children(fired.clone()),
        MonitoredWatch::Data(event) => MonitoredWatch::Data(event.clone()),
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

impl Revocable for Hold {
    fn make_revocable(&self) {
        Hold::make_revocable(self)
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

    fn revocable(&self) -> Option<&dyn Revocable> {
        Some(self)
    }

    /// A read node is created (no wait: we hold the write lock) on the write hold's own
    /// session; the write node must be kept if a writer queued between the two.
    fn downgrade(self: Arc<Self>, target: LockTarget) -> BoxFuture<'static, Result<Downgraded>> {
        downgrade::downgrade(self, target)
    }
}

impl FromGranted for SharedHold {
    /// A granted node becomes a hold at once, in the same poll.
    fn from_granted(granted: Granted) -> Self {
        Arc::new(Hold::granted(granted))
    }
}
