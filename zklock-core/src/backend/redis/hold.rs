//! A granted Redis hold: its lease (renewed by the backend's
//! [`watchdog`](super::conn::watchdog)), its loss, its release, its downgrade; and the undo of
//! what an acquire or a downgrade may have left ([`Unfinished`]).
//!
//! - One watchdog per backend renews each hold (compare and `PEXPIRE`) every lease/3, and
//!   makes it lost the moment a renewal fails or is refused, or when the lease could have run
//!   out: at the send time of the last confirmed renewal plus the lease less a
//!   [`margin`](Inner::margin), so before the server lets anyone else in. A connection break
//!   (the command connection's driver ends, a request fails, the hub's pub/sub connection
//!   breaks) makes every hold granted before it lost (on Cluster, every hold on that node; see
//!   [`Breaks`]): the server may have restarted, lost the key and let someone else in.
//! - A local handoff or a linger's re-take first confirms the key with the server (one
//!   request; see `BackendHold::confirmed`): a key deleted or lost on the server is never
//!   handed on within the process.
//! - Releases and undos are compare-and-delete scripts: they delete only what carries the
//!   holder's id. A dropped acquire whose request may have been applied is undone in the
//!   background; [`flush`](crate::backend::Backend::flush) waits for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{watch, Mutex as AsyncMutex};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::conn::breaks::Breaks;
use super::conn::lease::reason;
use super::conn::lease::{extend, lose, HoldState, Side};
use super::conn::watchdog::Renewal;
use super::conn::Inner;
use super::error::{loss_of, server_error, transient};
use super::wire::keys::{self, Keys};
use super::wire::scripts;
use crate::backend::backoff::Backoff;
use crate::backend::others::{Others, OthersState};
use crate::backend::{BackendHold, BoxFuture, Downgraded, LockTarget};
use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, Result};
use crate::types::loss::{Loss, LossReason, LossSignal};
use crate::types::token::FencingToken;

/// The loss signal of a Redis hold: the watchdog's verdict, the deadline passing, or a
/// connection break since the hold's last confirmation, whichever comes first (so a starved
/// watchdog task cannot delay it).
struct RedisLoss(watch::Receiver<HoldState>, Breaks);

impl Loss for RedisLoss {
    fn reason(&self) -> Option<LossReason> {
        reason(&self.0, &self.1)
    }

    fn lost(&self) -> BoxFuture<'static, LossReason> {
        let mut rx = self.0.clone();
        let mut breaks = self.1.subscribe();
        let epochs = self.1.clone();
        Box::pin(async move {
            loop {
                let deadline = {
                    breaks.borrow_and_update();
                    let s = rx.borrow_and_update();
                    if let Some(reason) = s.reason_at(Instant::now(), &epochs) {
                        return reason;
                    }
                    (!s.released).then_some(s.deadline)
                };
                match deadline {
                    Some(deadline) => {
                        tokio::select! {
                            changed = rx.changed() => if changed.is_err() { return LossReason::Closed },
                            _ = breaks.changed() => {}
                            _ = tokio::time::sleep_until(deadline) => {}
                        }
                    }
                    // An ended hold is never lost.
                    None => std::future::pending::<()>().await,
                }
            }
        })
    }
}

/// A mutex hold's watch for other processes: started by the first question (a lingering
/// release, a local handoff), then kept for the hold's life, so a hold taken again and again
/// within its linger asks nothing more.
struct OthersWatch {
    state: OthersState,
    /// The task that listens; aborted when the hold ends.
    task: StdMutex<Option<AbortHandle>>,
    started: AtomicBool,
}

impl OthersWatch {
    fn new() -> OthersWatch {
        OthersWatch {
            state: OthersState::new(),
            task: StdMutex::new(None),
            started: AtomicBool::new(false),
        }
    }

    /// Starts the watch unless it is started: listen on the hub for the first waiter's word,
    /// then look at the queue once (one request); then wait for the word, or any doubt.
    fn start(&self, inner: &Arc<Inner>, keys: &Arc<Keys>, hold: &watch::Sender<HoldState>) {
        if hold.borrow().released || self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let runtime = inner.runtime.clone();
        let (inner, keys, state) = (inner.clone(), keys.clone(), self.state.clone());
        let task = runtime.spawn(async move {
            let verdict = async {
                let mut listener = inner
                    .hub
                    .listen_live(&keys.queue, inner.conn.reply_timeout)
                    .await?;
                if inner.others_queued(&keys).await.ok()? || listener.woken() {
                    return None;
                }
                // Nobody: the hold's process listens for the word of a first waiter (see
                // `scripts::ACQUIRE_MUTEX`), and the queue held no live waiter after it started
                // to. Unless the hold's end said Maybe meanwhile (an abort lands at an await).
                state.nobody();
                listener.wake_up().await;
                None::<()>
            };
            verdict.await;
            // Another process waits or tried, or may have: the listening connection broke,
            // or could not be opened, or the check failed.
            state.maybe();
        });
        *self.task.lock().expect("not poisoned") = Some(task.abort_handle());
        // The hold may have ended while the task started: its end stops nothing yet.
        if hold.borrow().released {
            self.stop();
        }
    }

    /// The hold ended: stop listening, and let whoever waits for a verdict go.
    fn stop(&self) {
        if let Some(task) = self.task.lock().expect("not poisoned").take() {
            task.abort();
        }
        self.state.maybe();
    }
}

/// One granted hold on Redis: a key or a set member carrying this hold's id, with a lease
/// that a watchdog renews every lease/3 while the hold lives. Released when dropped (in the
/// background) or by [`release`](BackendHold::release).
pub(super) struct RedisHold {
    inner: Arc<Inner>,
    keys: Arc<Keys>,
    side: Side,
    id: String,
    /// The user's key, for errors.
    key: Arc<str>,
    token: FencingToken,
    state: Arc<watch::Sender<HoldState>>,
    /// Renewals and a downgrade take turns: a downgrade never races a renewal of the key it
    /// deletes.
    ops: Arc<AsyncMutex<()>>,
    /// Its entry in the backend's watchdog.
    renewal: u64,
    /// The release was confirmed or handed to the background: nothing to do on drop.
    released: AtomicBool,
    /// A mutex hold's watch for other processes that want the lock (`None` for the other
    /// sides, which never tell: others may always be waiting).
    others: Option<OthersWatch>,
}

impl RedisHold {
    /// The hold of `id`, granted for `lease` (what the server was told: the backend's, or a
    /// hand-over's first lease, which the waiter asked for) by a request sent at `sent` (or
    /// applied after it) in connection epoch `epoch`; starts its watchdog. A connection break
    /// since `epoch` makes it lost from the start (callers retry instead where they can).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        inner: Arc<Inner>,
        keys: Arc<Keys>,
        side: Side,
        id: String,
        key: Arc<str>,
        token: FencingToken,
        sent: Instant,
        lease: Duration,
        epoch: u64,
    ) -> RedisHold {
        let (state, _) = watch::channel(HoldState {
            deadline: Inner::deadline_for(sent, lease),
            epoch,
            slot: keys.slot,
            lost: None,
            released: false,
        });
        let due = sent + lease / 3;
        let state = Arc::new(state);
        let ops = Arc::new(AsyncMutex::new(()));
        let renewal = inner.watchdog.add(Renewal::new(
            keys.clone(),
            side,
            id.clone(),
            state.clone(),
            ops.clone(),
            due,
        ));
        RedisHold {
            inner,
            keys,
            side,
            id,
            key,
            token,
            state,
            ops,
            renewal,
            released: AtomicBool::new(false),
            others: (side == Side::Mutex).then(OthersWatch::new),
        }
    }

    fn location(&self) -> &str {
        match self.side {
            Side::Mutex | Side::Exclusive => &self.keys.exclusive,
            Side::Shared => &self.keys.shared,
        }
    }

    /// What releasing this hold deletes.
    fn undo(&self) -> Undo {
        match self.side {
            Side::Mutex => Undo::Mutex {
                id: self.id.clone(),
                member: String::new(),
            },
            Side::Exclusive | Side::Shared => Undo::Any(vec![self.id.clone()]),
        }
    }

    fn loss_reason(&self) -> Option<LossReason> {
        reason(&self.state.subscribe(), &self.inner.breaks)
    }

    /// Asks the server whether the key still carries this hold's id (and, for an exclusive
    /// key, whether no later grant advanced the lock's fence past this hold's token), renewing
    /// the lease if so: one request. Anything else makes the hold lost: the key is gone or
    /// someone else's (NodeDeleted), the request failed (Disconnected), or no answer came
    /// before the lease could run out (LeaseExpired).
    async fn check(&self) {
        if self.loss_reason().is_some() {
            return;
        }
        let inner = &self.inner;
        let keys = &self.keys;
        let deadline = self.state.borrow().deadline;
        let epoch = inner.breaks.epoch();
        let sent = Instant::now();
        let acks = inner.acks;
        let request = inner.conn.run(&keys.exclusive, None, |mut c| {
            let call = match self.side {
                Side::Mutex | Side::Exclusive => {
                    let mut call = scripts::Call::new(
                        &scripts::CONFIRM_EXCLUSIVE,
                        &[&keys.exclusive, &keys.fence],
                    );
                    call.arg(&self.id)
                        .arg(inner.lease_ms())
                        .arg(self.token.grant());
                    call
                }
                Side::Shared => {
                    let mut call = scripts::Call::new(&scripts::RENEW_SHARED, &[&keys.shared]);
                    call.arg(&self.id).arg(inner.lease_ms());
                    call
                }
            };
            async move {
                let confirmed = call.invoke::<i64>(&mut c).await?;
                // Confirmed, but the renewal it carried is not on enough replicas: the hold
                // stays held until its deadline, which does not move.
                if confirmed == 1 && Inner::acked(acks, &mut c).await?.is_err() {
                    return Ok(-1);
                }
                Ok(confirmed)
            }
        });
        let reason = match tokio::time::timeout_at(deadline, request).await {
            Ok(Ok(-1)) => return,
            Ok(Ok(1)) => {
                extend(&self.state, inner.deadline(sent), epoch, &inner.breaks);
                if self.loss_reason().is_none() {
                    return;
                }
                LossReason::Disconnected
            }
            Ok(Ok(_)) => LossReason::NodeDeleted,
            Ok(Err(e)) => {
                tracing::debug!(key = %self.location(), error = %e, "zklock: a Redis hold could not be confirmed");
                loss_of(&e)
            }
            Err(_) => LossReason::LeaseExpired,
        };
        inner.watchdog.remove(self.renewal);
        lose(&self.state, reason, self.location());
    }

    /// Ends the hold locally: no more renewals, its deadline no longer matters, and nothing
    /// watches for other processes.
    fn end(&self) {
        self.inner.watchdog.remove(self.renewal);
        self.state.send_modify(|s| s.released = true);
        if let Some(others) = &self.others {
            others.stop();
        }
    }

    /// The watch for other processes, started if it is not (not for an ended hold).
    fn others(&self) -> Option<&OthersWatch> {
        let others = self.others.as_ref()?;
        others.start(&self.inner, &self.keys, &self.state);
        Some(others)
    }

    fn lost_error(&self, reason: LossReason) -> Error {
        Error::LockLost {
            key: self.key.to_string(),
            reason,
        }
    }

    async fn release(&self) -> Result<()> {
        if self.released.load(Ordering::SeqCst) {
            return Ok(());
        }
        let lost_before = self.loss_reason();
        self.inner.watchdog.remove(self.renewal);
        // Retried until the lease could have run out: the key is gone by then anyway.
        let until = self.state.borrow().deadline;
        let deleted = self.inner.delete(&self.keys, &self.undo(), until).await;
        self.released.store(true, Ordering::SeqCst);
        let lost_now = self.loss_reason();
        self.end();
        match (lost_before, deleted) {
            (Some(reason), _) => Err(self.lost_error(reason)),
            (None, Ok(true)) => Ok(()),
            (None, Ok(false)) => lost_now.map_or(Ok(()), |r| Err(self.lost_error(r))),
            (None, Err(e)) => Err(match lost_now {
                Some(reason) => self.lost_error(reason),
                None => server_error("release the lock", e),
            }),
        }
    }
}

impl Drop for RedisHold {
    fn drop(&mut self) {
        if !self.released.swap(true, Ordering::SeqCst) {
            let until = self.state.borrow().deadline;
            self.end();
            let (inner, keys, undo) = (self.inner.clone(), self.keys.clone(), self.undo());
            // The process's next acquire of the lock waits for the delete: it never finds
            // the lock held by this dropped hold.
            let undoing = inner.undos.start(&keys.path);
            self.inner.background.spawn(&self.inner.runtime, async move {
                if let Err(e) = inner.delete(&keys, &undo, until).await {
                    tracing::warn!(key = %keys.exclusive, error = %e, "zklock: could not release a Redis lock; it ends when its lease runs out");
                }
                drop(undoing);
            });
        }
    }
}

impl BackendHold for RedisHold {
    fn token(&self) -> FencingToken {
        self.token
    }

    /// The Redis key the hold lives in (a sorted set's, for readers and leases).
    fn location(&self) -> &str {
        RedisHold::location(self)
    }

    fn loss_reason(&self) -> Option<LossReason> {
        RedisHold::loss_reason(self)
    }

    fn loss(&self) -> LossSignal {
        Arc::new(RedisLoss(self.state.subscribe(), self.inner.breaks.clone()))
    }

    /// One request to the server before a local handoff or a linger's re-take: the key must
    /// still carry this hold's id, and no other grant of the lock may have come since this
    /// hold's (a key deleted from outside, evicted, or lost in a restart, then granted to
    /// another process); else the hold is lost, and the local waiter acquires afresh. The
    /// lease is renewed on the way.
    fn confirmed(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.check())
    }

    /// A mutex hold: whether another process queued for the lock, or tried it, since the
    /// hold's watch started (the first call starts it, and answers yes until it is set up:
    /// one request). Other holds: always, as they cannot tell.
    fn others_waiting(&self) -> bool {
        self.others()
            .is_none_or(|o| o.state.now() != Others::Nobody)
    }

    /// Completes once [`others_waiting`](Self::others_waiting) may be true: for a mutex hold,
    /// when another process queues or tries, or the hub's connection breaks; at once for the
    /// others. What ends a lingering mutex hold.
    fn others_appeared(&self) -> BoxFuture<'static, ()> {
        match self.others() {
            Some(o) => Box::pin(o.state.appeared()),
            None => Box::pin(std::future::ready(())),
        }
    }

    fn release(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(RedisHold::release(self))
    }

    /// Revocation is ZooKeeper's (Curator's `__REVOKE__`); nothing asks a Redis hold to let go.
    /// One script adds the read hold and deletes the write key, so no writer gets in between
    /// and the write hold need not be kept.
    fn downgrade(self: Arc<Self>, target: LockTarget) -> BoxFuture<'static, Result<Downgraded>> {
        Box::pin(async move {
            let lost = |reason| Error::LockLost {
                key: target.key.to_string(),
                reason,
            };
            if let Some(reason) = self.loss_reason() {
                return Err(lost(reason));
            }
            let _turn = self.ops.lock().await;
            let inner = &self.inner;
            let read_id = inner.new_id();
            // Until the answer is in, the read hold may exist: undone if this ends otherwise.
            let mut unfinished = Unfinished::new(
                inner.clone(),
                self.keys.clone(),
                Undo::Any(vec![read_id.clone()]),
            );
            unfinished.armed = true;
            let epoch = inner.breaks.epoch();
            let sent = Instant::now();
            let keys = &self.keys;
            let done = inner
                .conn
                .run(&keys.exclusive, Some(inner.conn.reply_timeout), |mut c| {
                    let mut invocation = scripts::DOWNGRADE.key(&keys.exclusive);
                    invocation
                        .key(&keys.shared)
                        .arg(&self.id)
                        .arg(&read_id)
                        .arg(inner.lease_ms())
                        .arg(&keys.channel);
                    async move { invocation.invoke_async::<i64>(&mut c).await }
                })
                .await
                .map_err(|e| server_error("downgrade the write lock", e))?;
            if done != 1 {
                unfinished.armed = false;
                lose(&self.state, LossReason::NodeDeleted, &keys.exclusive);
                return Err(lost(self.loss_reason().unwrap_or(LossReason::NodeDeleted)));
            }
            unfinished.armed = false;
            // The write key is gone: this hold has ended.
            self.released.store(true, Ordering::SeqCst);
            self.end();
            let read = RedisHold::new(
                inner.clone(),
                keys.clone(),
                Side::Shared,
                read_id,
                target.key.clone(),
                self.token,
                sent,
                inner.lease,
                epoch,
            );
            Ok(Downgraded {
                read: Arc::new(read),
                keep_write: false,
            })
        })
    }
}

/// What a release or an undo deletes.
#[derive(Debug, Clone)]
pub(super) enum Undo {
    /// A mutex hold of `id`, and (unless empty) the queue `member` of a waiter.
    Mutex { id: String, member: String },
    /// Whatever carries one of these ids: the exclusive key (a writer's), a writer's intent,
    /// shared-set members.
    Any(Vec<String>),
}

/// The ids of an acquire (or downgrade) whose request may have been applied: undone in the
/// background when dropped armed.
pub(super) struct Unfinished {
    inner: Arc<Inner>,
    keys: Arc<Keys>,
    undo: Option<Undo>,
    pub(super) armed: bool,
}

impl Unfinished {
    pub(super) fn new(inner: Arc<Inner>, keys: Arc<Keys>, undo: Undo) -> Unfinished {
        Unfinished {
            inner,
            keys,
            undo: Some(undo),
            armed: false,
        }
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Some(undo) = self.undo.take() else { return };
        let inner = self.inner.clone();
        let keys = self.keys.clone();
        // Whatever the request left expires with its lease anyway.
        let until = Instant::now() + inner.lease;
        let undoing = inner.undos.start(&keys.path);
        self.inner.background.spawn(&self.inner.runtime, async move {
            if let Err(e) = inner.delete(&keys, &undo, until).await {
                tracing::warn!(key = %keys.exclusive, error = %e, "zklock: could not undo an acquire on Redis; what it left ends when its lease runs out");
            }
            drop(undoing);
        });
    }
}
impl Inner {
    /// Whether the mutex of `keys` has a live waiter in its queue (see
    /// [`scripts::OTHERS_QUEUED`]).
    async fn others_queued(&self, keys: &Keys) -> redis::RedisResult<bool> {
        let n = self
            .conn
            .run(&keys.queue, Some(self.conn.reply_timeout), |mut c| {
                let mut invocation = scripts::OTHERS_QUEUED.key(&keys.queue);
                invocation.key(&keys.alive);
                async move { invocation.invoke_async::<i64>(&mut c).await }
            })
            .await?;
        Ok(n == 1)
    }

    /// Deletes what `undo` names in `keys` and wakes waiters; retried on connection trouble
    /// until `until`. Whether something was deleted.
    async fn delete(&self, keys: &Keys, undo: &Undo, until: Instant) -> redis::RedisResult<bool> {
        let mut backoff = Backoff::requests();
        loop {
            let freed = self
                .conn
                .run(&keys.exclusive, Some(self.conn.reply_timeout), |mut c| {
                    let call = match undo {
                        Undo::Mutex { id, member } => {
                            let mut call = scripts::Call::new(
                                &scripts::RELEASE_MUTEX,
                                &[&keys.exclusive, &keys.queue, &keys.alive, &keys.fence],
                            );
                            call.arg(id)
                                .arg(member)
                                .arg(keys::NOTIFY_PREFIX)
                                .arg(&keys.channel);
                            call
                        }
                        Undo::Any(ids) => {
                            let mut call = scripts::Call::new(
                                &scripts::RELEASE,
                                &[&keys.exclusive, &keys.shared, &keys.intent],
                            );
                            call.arg(&keys.channel).arg(ids);
                            call
                        }
                    };
                    async move { call.invoke::<i64>(&mut c).await }
                })
                .await;
            match freed {
                Ok(n) => return Ok(n == 1),
                Err(e) if transient(&e) && Instant::now() + backoff.peek() < until => {
                    crate::metrics::release_retry(BackendKind::Redis);
                    backoff.wait().await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}
