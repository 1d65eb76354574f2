//! The in-process lock table: one backend hold per process per key. Tasks of this process
//! queue here, in FIFO order, behind the process's hold; a release hands the hold to the next
//! of them without a request to the server. While another contender waits for the key (or may:
//! when in doubt), at most a bounded run of handoffs follows, after which the hold is let go so
//! that it gets its turn; while none does, the hold is kept.
//!
//! With a linger ([`LocalConfig::linger`]), the hold of an exclusive hold is kept after the
//! last local release too, while no other contender exists: a later acquire of the key by this
//! process takes it with no request at all (a local handoff, its token extended). A task per
//! lingering hold gives it up when the linger runs out, another contender appears
//! ([`BackendHold::others_appeared`]) or the hold is lost, whichever comes first; so do
//! [`LocalTable::end_lingering`] (the manager's flush) and the table's drop.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, Weak};

use tokio::sync::oneshot;

pub(crate) mod frame;
pub(crate) mod grant;
#[cfg(test)]
mod tests;

pub(crate) use grant::Grant;

use crate::backend::{drive, Backend, BackendHold, LockTarget};
use crate::metrics::Labels;
use crate::types::error::{Error, Result};
use crate::types::loss::LossSignal;
use crate::types::mode::{HoldMode, LockMode, Wait};
use crate::types::token::FencingToken;

/// What the local table is configured with (its part of [`Builder`](crate::Builder)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalConfig {
    /// Tasks of this process queue behind one backend hold per key.
    pub(crate) local_queue: bool,
    /// Local handoffs of one hold, once another contender waits, before it is let go.
    pub(crate) max_local_handoffs: u32,
    /// How long the hold of an exclusive hold (mutex, write) is kept after its last local
    /// release while no other contender exists; zero: not at all.
    pub(crate) linger: std::time::Duration,
    /// Whether grants carry the backend's fencing tokens; without, every grant's token is
    /// [`FencingToken::NONE`] (see [`Builder::fencing_tokens`](crate::Builder::fencing_tokens)).
    pub(crate) tokens: bool,
}

/// The token of a grant of `hold` after `handoffs` local handoffs: the backend's, extended
/// by the handoffs, or none when the manager issues none.
fn token_of(tokens: bool, hold: &dyn BackendHold, handoffs: u32) -> FencingToken {
    if tokens {
        FencingToken::new(hold.token().grant(), handoffs)
    } else {
        FencingToken::NONE
    }
}

/// The local locks of one manager, by lock path and mode.
pub(crate) struct LocalTable {
    /// Which table (so which manager) a grant comes from: frames re-enter only holds of the
    /// same manager, whatever the path.
    id: u64,
    map: StdMutex<TableState>,
    /// The manager's runtime, where its background work runs (a lingering hold's watcher);
    /// `None` for a manager made outside any runtime (the in-memory one may be).
    runtime: Option<tokio::runtime::Handle>,
}

impl Default for LocalTable {
    /// A table whose background work runs on the runtime it was made on, if any.
    fn default() -> LocalTable {
        LocalTable::on(tokio::runtime::Handle::try_current().ok())
    }
}

#[derive(Default)]
struct TableState {
    locks: HashMap<(Arc<str>, HoldMode), Weak<LocalLock>>,
    inserts: usize,
}

impl LocalTable {
    /// A table whose background work runs on `runtime` (the manager's).
    pub(crate) fn on(runtime: Option<tokio::runtime::Handle>) -> LocalTable {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        LocalTable {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            map: StdMutex::default(),
            runtime,
        }
    }

    /// This table's id (see [`Grant::table`]).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Gives up every lingering hold of this table now (released in the background).
    pub(crate) fn end_lingering(&self) {
        let locks: Vec<_> = {
            let table = self.map.lock().unwrap();
            table.locks.values().filter_map(Weak::upgrade).collect()
        };
        for lock in locks {
            let lingering = lock.state().lingering.take();
            // Dropped with the table's and the lock's state unlocked.
            drop(lingering);
        }
    }

    /// Whether this table keeps the hold at `location` (see [`BackendHold::location`])
    /// lingering: held by this process for no task.
    pub(crate) fn is_lingering(&self, location: &str) -> bool {
        let locks: Vec<_> = {
            let table = self.map.lock().unwrap();
            table.locks.values().filter_map(Weak::upgrade).collect()
        };
        locks.iter().any(|lock| {
            lock.state()
                .lingering
                .as_ref()
                .is_some_and(|l| l.hold.location() == location)
        })
    }

    fn entry(&self, path: &Arc<str>, mode: HoldMode, config: LocalConfig) -> Arc<LocalLock> {
        let mut table = self.map.lock().unwrap();
        let key = (path.clone(), mode);
        if let Some(live) = table.locks.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        let lock = Arc::new(LocalLock {
            table: self.id,
            runtime: self.runtime.clone(),
            path: path.clone(),
            mode,
            max_handoffs: config.max_local_handoffs,
            tokens: config.tokens,
            linger: match mode {
                HoldMode::Exclusive | HoldMode::Write => config.linger,
                _ => std::time::Duration::ZERO,
            },
            holder_changed: tokio::sync::Notify::new(),
            state: StdMutex::new(State {
                busy: false,
                handoffs: 0,
                turn: 0,
                holder: None,
                queue: VecDeque::new(),
                prune_at: PRUNE_FLOOR,
                lingering: None,
            }),
        });
        table.locks.insert(key, Arc::downgrade(&lock));
        table.inserts += 1;
        if table.inserts.is_multiple_of(256) {
            table.locks.retain(|_, w| w.strong_count() > 0);
        }
        lock
    }
}

impl Drop for LocalTable {
    /// The manager is gone: so are its lingering holds.
    fn drop(&mut self) {
        self.end_lingering();
    }
}

/// One key's local queue.
pub(crate) struct LocalLock {
    table: u64,
    /// See [`LocalTable::runtime`].
    runtime: Option<tokio::runtime::Handle>,
    path: Arc<str>,
    mode: HoldMode,
    max_handoffs: u32,
    /// See [`LocalConfig::tokens`].
    tokens: bool,
    /// See [`LocalConfig::linger`]; zero for the modes that do not linger.
    linger: std::time::Duration,
    state: StdMutex<State>,
    /// Woken when a local task starts holding a hold (queued tasks then watch its loss).
    holder_changed: tokio::sync::Notify,
}

struct State {
    /// A local task holds the hold, or is acquiring one (it has the duty).
    busy: bool,
    /// Local handoffs of the current hold so far.
    handoffs: u32,
    /// Counts changes of hands (a grant, a duty passed): a grant or duty of an older turn has
    /// been superseded and must not touch the queue any more.
    turn: u64,
    /// How the current holder's loss shows, while a local task holds a hold: queued tasks
    /// watch it, so that a lost hold kept by user code does not keep them waiting for ever.
    holder: Option<LossSignal>,
    queue: VecDeque<oneshot::Sender<Wake>>,
    /// The queue's length at which it is next cleared of waiters that are gone: twice what
    /// the last clearing left, at least [`PRUNE_FLOOR`].
    prune_at: usize,
    /// The hold kept after the last local release (only while `busy` is false).
    lingering: Option<Lingering>,
}

/// The shortest queue that is cleared of waiters that are gone (see [`State::enqueue`]).
const PRUNE_FLOOR: usize = 64;

impl State {
    /// Puts a waiter at the end of the queue. A waiter that timed out or was dropped leaves
    /// its place behind (its sender, whose receiver is gone) until a release or a passed duty
    /// reaches it; while one holder keeps the lock, waiters that keep giving up would grow
    /// the queue for as long as it holds. So the queue is cleared of them whenever it has
    /// doubled since the last clearing: its length stays within twice the live waiters the
    /// last clearing left, or [`PRUNE_FLOOR`], at a constant cost per waiter.
    fn enqueue(&mut self, tx: oneshot::Sender<Wake>) {
        if self.queue.len() >= self.prune_at {
            self.queue.retain(|tx| !tx.is_closed());
            self.prune_at = (self.queue.len() * 2).max(PRUNE_FLOOR);
            self.queue.shrink_to(self.prune_at);
        }
        self.queue.push_back(tx);
    }
}

/// A hold kept after its last local release, for the next local acquire to take with no
/// request.
struct Lingering {
    hold: Arc<dyn BackendHold>,
    /// Dropped when the hold is taken again or given up: ends the task that watches it.
    _stop: oneshot::Sender<()>,
}

/// What an acquire found in the local lock.
enum Admission {
    /// A lingering hold, taken again.
    Lingered(Grant),
    /// The duty to acquire a backend hold for this turn.
    Acquire(u64),
    /// A place in the queue.
    Queued(oneshot::Receiver<Wake>),
}

/// What a queued task is woken with.
enum Wake {
    /// The lock, handed on without a round trip.
    Granted(Grant),
    /// The duty to acquire a new hold for this process.
    Acquire(AcquireDuty),
}

/// The duty to acquire the hold for the local queue. Dropping it (an acquire that failed or
/// was cancelled) passes it on to the next queued task.
struct AcquireDuty {
    lock: Option<Arc<LocalLock>>,
    turn: u64,
}

impl AcquireDuty {
    fn disarm(mut self) {
        self.lock = None;
    }
}

impl Drop for AcquireDuty {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            let mut state = lock.state();
            if state.turn == self.turn {
                lock.pass_duty(&mut state);
            }
        }
    }
}

/// A local hold's place in its key's local queue: the turn it was given.
#[derive(Clone)]
pub(crate) struct LocalTurn {
    lock: Arc<LocalLock>,
    turn: u64,
}

impl LocalTurn {
    /// Ends this turn's hold of `hold`; see [`LocalLock::release`]. A holder it is handed to
    /// gets `labels` for its metrics.
    pub(crate) fn release(
        self,
        hold: Arc<dyn BackendHold>,
        labels: &Labels,
    ) -> Option<Arc<dyn BackendHold>> {
        self.lock.release(hold, self.turn, labels)
    }

    /// Lets go of `hold` without handing it on locally (a downgrade): the next local waiter
    /// acquires a hold of its own.
    pub(crate) fn give_up(self, hold: Arc<dyn BackendHold>) -> Arc<dyn BackendHold> {
        let mut state = self.lock.state();
        if state.turn == self.turn {
            self.lock.pass_duty(&mut state);
        }
        hold
    }
}

impl LocalLock {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Gives the duty to the next live waiter, or marks the lock idle. Never drops a duty or
    /// grant while `state` is locked.
    fn pass_duty(self: &Arc<Self>, state: &mut State) {
        state.handoffs = 0;
        state.holder = None;
        state.turn += 1;
        while let Some(tx) = state.queue.pop_front() {
            match tx.send(Wake::Acquire(AcquireDuty {
                lock: Some(self.clone()),
                turn: state.turn,
            })) {
                Ok(()) => return,
                Err(Wake::Acquire(duty)) => duty.disarm(),
                Err(Wake::Granted(_)) => unreachable!("sent a duty"),
            }
        }
        state.busy = false;
    }

    /// Ends the hold of `hold` given at `turn`: hands it to the next live waiter when the run of
    /// handoffs allows (no other contender waits, or the bound is not reached) and the hold is
    /// intact; otherwise passes the duty on and returns the
    /// hold, which the caller deletes. A turn already superseded (its hold was lost and the
    /// queue moved on without it) only returns the hold.
    fn release(
        self: &Arc<Self>,
        hold: Arc<dyn BackendHold>,
        turn: u64,
        labels: &Labels,
    ) -> Option<Arc<dyn BackendHold>> {
        let mut state = self.state();
        if state.turn != turn {
            return Some(hold);
        }
        // Asked only when a local task waits: a backend may start a watch to answer
        // (ZooKeeper with `watch_held_nodes(false)`), which a hold about to be deleted does
        // not need.
        if self.max_handoffs > 0 && !state.queue.is_empty() && hold.loss_reason().is_none() {
            // The taker confirms the hold (`BackendHold::confirmed`) before it relies on it.
            while !state.queue.is_empty() {
                // The bound holds while another contender waits, or may wait (when in doubt);
                // asking on the first handoff starts the backend's watch for one. The token's
                // local part bounds every run.
                let others = hold.others_waiting();
                if (others && state.handoffs >= self.max_handoffs) || state.handoffs == u32::MAX {
                    break;
                }
                let Some(tx) = state.queue.pop_front() else {
                    break;
                };
                state.handoffs += 1;
                state.turn += 1;
                let token = token_of(self.tokens, &*hold, state.handoffs);
                let grant = Grant::new(
                    self.table,
                    hold.clone(),
                    token,
                    self.mode,
                    self.path.clone(),
                    Some(LocalTurn {
                        lock: self.clone(),
                        turn: state.turn,
                    }),
                    labels,
                );
                match tx.send(Wake::Granted(grant)) {
                    Ok(()) => {
                        labels.local_handoff();
                        tracing::debug!(path = %self.path, %token, "zklock: handed off locally");
                        return None;
                    }
                    Err(Wake::Granted(grant)) => drop(grant.defuse()),
                    Err(Wake::Acquire(_)) => unreachable!("sent a grant"),
                }
            }
        }
        if state.queue.is_empty() && self.linger_on_release(&mut state, &hold) {
            return None;
        }
        self.pass_duty(&mut state);
        Some(hold)
    }

    /// Keeps `hold`, whose last local holder lets go with nobody queued, lingering if the
    /// linger is on, the hold intact, no other contender known, the token's local part not
    /// used up, and a runtime at hand for the task that gives it up. Returns whether it did.
    fn linger_on_release(self: &Arc<Self>, state: &mut State, hold: &Arc<dyn BackendHold>) -> bool {
        if self.linger.is_zero() || state.handoffs == u32::MAX || hold.loss_reason().is_some() {
            return false;
        }
        // The watcher that gives the hold up runs on the manager's runtime, never on the one
        // that released (a short-lived runtime would end it, and the hold would linger while
        // others wait).
        let Some(runtime) = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok())
        else {
            return false;
        };
        let mut appeared = hold.others_appeared();
        if futures::FutureExt::now_or_never(appeared.as_mut()).is_some() {
            // Another contender waits (or the backend cannot tell): it gets the hold now.
            return false;
        }
        state.busy = false;
        state.holder = None;
        state.turn += 1;
        let (stop, stopped) = oneshot::channel();
        state.lingering = Some(Lingering {
            hold: hold.clone(),
            _stop: stop,
        });
        let (lock, turn, linger, loss) = (self.clone(), state.turn, self.linger, hold.loss());
        runtime.spawn(async move {
            tokio::select! {
                // Taken again, or given up by the table.
                _ = stopped => return,
                _ = tokio::time::sleep(linger) => {}
                _ = appeared => {}
                _ = loss.lost() => {}
            }
            lock.end_lingering(turn);
        });
        tracing::debug!(path = %self.path, "zklock: the hold lingers");
        true
    }

    /// Gives up the hold lingering since `turn`, if it still does.
    fn end_lingering(&self, turn: u64) {
        let mut state = self.state();
        let lingering = if state.turn == turn {
            state.lingering.take()
        } else {
            None
        };
        drop(state);
        if lingering.is_some() {
            tracing::debug!(path = %self.path, "zklock: a lingering hold is given up");
        }
    }

    /// Takes the lingering hold, if any, for a new local holder: a local handoff, with no
    /// request. A hold that can no longer be granted ([`BackendHold::can_regrant`]) is given
    /// up instead (returned in `Err`, for the caller to drop once `state` is unlocked).
    fn take_lingering(
        self: &Arc<Self>,
        state: &mut State,
        labels: &Labels,
    ) -> std::result::Result<Option<Grant>, Lingering> {
        let Some(lingering) = state.lingering.take() else {
            return Ok(None);
        };
        let hold = lingering.hold.clone();
        if state.handoffs == u32::MAX || !hold.can_regrant() {
            return Err(lingering);
        }
        state.busy = true;
        state.handoffs += 1;
        state.turn += 1;
        state.holder = Some(hold.loss_unwatched());
        let token = token_of(self.tokens, &*hold, state.handoffs);
        let grant = Grant::new(
            self.table,
            hold,
            token,
            self.mode,
            self.path.clone(),
            Some(LocalTurn {
                lock: self.clone(),
                turn: state.turn,
            }),
            labels,
        );
        labels.local_handoff();
        tracing::debug!(path = %self.path, %token, "zklock: took the lingering hold again");
        Ok(Some(grant))
    }

    /// The current turn and how its holder's loss shows, if a local task holds a hold.
    fn current(&self) -> (u64, Option<LossSignal>) {
        let state = self.state();
        (state.turn, state.holder.clone())
    }

    /// Whether a local task holds a hold that is lost.
    fn holder_lost(&self, state: &State) -> bool {
        state.holder.as_ref().is_some_and(|h| h.reason().is_some())
    }

    /// The holder of `turn` lost its hold: if it still has the queue, the queue moves on
    /// without it (its own release later only deletes its hold).
    fn abandon(self: &Arc<Self>, turn: u64) {
        let mut state = self.state();
        if state.turn == turn && self.holder_lost(&state) {
            tracing::debug!(path = %self.path, "zklock: a lost local hold is kept; the local queue moves on");
            self.pass_duty(&mut state);
        }
    }

    /// Starts the turn `turn` (the duty's) of a holder of a hold of its own.
    fn hold(self: &Arc<Self>, turn: u64, hold: &Arc<dyn BackendHold>) -> LocalTurn {
        let mut state = self.state();
        state.handoffs = 0;
        state.holder = Some(hold.loss_unwatched());
        drop(state);
        self.holder_changed.notify_waiters();
        LocalTurn {
            lock: self.clone(),
            turn,
        }
    }
}

/// Acquires `target` in `mode` for one task: through the local queue when `config` has it on,
/// else with a backend hold of its own. `Ok(None)` only for [`Wait::Never`] when it is taken.
/// Counted in the metrics of `labels`: as a waiter while it waits (not a try), and each hold
/// the backend grants.
pub(crate) async fn acquire(
    backend: &dyn Backend,
    table: &LocalTable,
    config: LocalConfig,
    target: &LockTarget,
    mode: LockMode,
    wait: Wait,
    labels: &Labels,
) -> Result<Option<Grant>> {
    let path = &target.path;
    let key = &target.key;
    let _waiting = (!matches!(wait, Wait::Never)).then(|| labels.waiting());
    let grant = |hold: Arc<dyn BackendHold>, local: Option<LocalTurn>| {
        labels.backend_grants(1);
        let token = if config.tokens {
            hold.token()
        } else {
            FencingToken::NONE
        };
        Grant::new(
            table.id,
            hold,
            token,
            mode.into(),
            path.clone(),
            local,
            labels,
        )
    };
    // Readers share at the backend already, and each participant of a leader latch stands
    // for itself: each takes its own hold.
    if !config.local_queue || matches!(mode, LockMode::Read | LockMode::Leader) {
        return Ok(drive::acquire(backend, target, mode, wait)
            .await?
            .map(|hold| grant(hold, None)));
    }
    let lock = table.entry(path, mode.into(), config);
    let duty = loop {
        let rx = match admit(&lock, wait, labels) {
            None => return Ok(None),
            Some(Admission::Acquire(turn)) => {
                break AcquireDuty {
                    lock: Some(lock.clone()),
                    turn,
                }
            }
            Some(Admission::Lingered(grant)) => {
                lock.holder_changed.notify_waiters();
                match confirmed(grant).await {
                    Some(grant) => return Ok(Some(grant)),
                    None => continue,
                }
            }
            Some(Admission::Queued(rx)) => rx,
        };
        match queued_turn(&lock, rx, wait, key).await? {
            // Handed over by the last holder: ours once its hold is confirmed still there;
            // otherwise dropping it passed the lock on, and we queue again.
            Wake::Granted(grant) => {
                if let Some(grant) = confirmed(grant).await {
                    return Ok(Some(grant));
                }
            }
            Wake::Acquire(duty) => break duty,
        }
    };
    // We carry the duty: acquire the hold. If this fails or is cancelled, the duty's drop
    // passes the duty on.
    let hold = drive::acquire(backend, target, mode, wait).await?;
    match hold {
        Some(hold) => {
            let turn = lock.hold(duty.turn, &hold);
            duty.disarm();
            Ok(Some(grant(hold, Some(turn))))
        }
        None => Ok(None),
    }
}

/// What the local queue says to an acquire of `lock` now: take the lingering hold again, go
/// and acquire a hold (carrying the duty), or wait in line; `None` for a try that finds the
/// lock busy.
fn admit(lock: &Arc<LocalLock>, wait: Wait, labels: &Labels) -> Option<Admission> {
    let mut stale = None;
    let admission = {
        let mut state = lock.state();
        if state.busy && lock.holder_lost(&state) {
            // The holder's hold is lost but user code keeps it: it holds nothing up. (A
            // queued task would have moved the queue on already; a try must too.)
            lock.pass_duty(&mut state);
        }
        if !state.busy {
            match lock.take_lingering(&mut state, labels) {
                Ok(Some(grant)) => Admission::Lingered(grant),
                taken => {
                    stale = taken.err();
                    state.busy = true;
                    Admission::Acquire(state.turn)
                }
            }
        } else if matches!(wait, Wait::Never) {
            return None;
        } else {
            let (tx, rx) = oneshot::channel();
            state.enqueue(tx);
            Admission::Queued(rx)
        }
    };
    // A lingering hold that could not be taken again is released in the background.
    drop(stale);
    Some(admission)
}

/// Waits in `lock`'s line until woken, by `wait`'s deadline.
async fn queued_turn(
    lock: &Arc<LocalLock>,
    rx: oneshot::Receiver<Wake>,
    wait: Wait,
    key: &str,
) -> Result<Wake> {
    let woken = match wait {
        Wait::Until(deadline, waited) => tokio::time::timeout_at(deadline, lock.wait_turn(rx))
            .await
            .map_err(|_| Error::Timeout {
                key: key.to_string(),
                waited,
            })?,
        _ => lock.wait_turn(rx).await,
    };
    woken.map_err(|_| Error::Closed)
}

/// A grant handed over locally or taken again from the linger, once its hold is confirmed
/// still there (someone may have deleted it; once the hold's watch has answered, this costs
/// nothing); `None` when it was lost meanwhile: dropping it passed the lock on.
async fn confirmed(grant: Grant) -> Option<Grant> {
    grant.hold().confirmed().await;
    grant.loss_reason().is_none().then_some(grant)
}

impl LocalLock {
    /// Waits in the local queue until woken, watching the current holder meanwhile: a hold
    /// that is lost (session expired, hold deleted) but kept by user code no longer holds the
    /// queue up.
    async fn wait_turn(
        self: &Arc<Self>,
        mut rx: oneshot::Receiver<Wake>,
    ) -> std::result::Result<Wake, oneshot::error::RecvError> {
        loop {
            let changed = self.holder_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (turn, holder) = self.current();
            let lost = async {
                match holder {
                    Some(holder) => holder.lost().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                woken = &mut rx => return woken,
                _ = lost => self.abandon(turn),
                _ = changed => {}
            }
        }
    }
}
