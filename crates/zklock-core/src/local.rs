//! The in-process lock table: one contender znode per process per key. Tasks of this process
//! queue here, in FIFO order, behind the process's node; a release hands the node to the next
//! of them without a ZooKeeper round trip, for at most a bounded run of handoffs, after which
//! the node is let go so that other processes get their turn.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, Weak};

use tokio::sync::oneshot;

use crate::error::{Error, Result};
use crate::guard::{FencingToken, Grant, Hold, HoldMode};
use crate::manager::Inner;
use crate::recipe::contender::{acquire_node, NodeKind, Wait};

/// The local locks of one manager, by lock path and kind.
#[derive(Default)]
pub(crate) struct LocalTable {
    map: StdMutex<TableState>,
}

#[derive(Default)]
struct TableState {
    locks: HashMap<(Arc<str>, NodeKind), Weak<LocalLock>>,
    inserts: usize,
}

impl LocalTable {
    fn entry(&self, path: &Arc<str>, kind: NodeKind, max_handoffs: u32) -> Arc<LocalLock> {
        let mut table = self.map.lock().unwrap();
        let key = (path.clone(), kind);
        if let Some(live) = table.locks.get(&key).and_then(Weak::upgrade) {
            return live;
        }
        let lock = Arc::new(LocalLock {
            path: path.clone(),
            kind,
            max_handoffs,
            state: StdMutex::new(State {
                busy: false,
                handoffs: 0,
                queue: VecDeque::new(),
            }),
        });
        table.locks.insert(key, Arc::downgrade(&lock));
        table.inserts += 1;
        if table.inserts % 256 == 0 {
            table.locks.retain(|_, w| w.strong_count() > 0);
        }
        lock
    }
}

/// One key's local queue.
pub(crate) struct LocalLock {
    path: Arc<str>,
    kind: NodeKind,
    max_handoffs: u32,
    state: StdMutex<State>,
}

struct State {
    /// A local task holds the node, or is acquiring one (it has the baton).
    busy: bool,
    /// Local handoffs of the current node so far.
    handoffs: u32,
    queue: VecDeque<oneshot::Sender<Wake>>,
}

/// What a queued task is woken with.
enum Wake {
    /// The lock, handed on without a round trip.
    Granted(Grant),
    /// The duty to acquire a new node for this process.
    Drive(Baton),
}

/// The duty to acquire the node for the local queue. Dropping it (an acquire that failed or
/// was cancelled) passes it on to the next queued task.
struct Baton {
    lock: Option<Arc<LocalLock>>,
}

impl Baton {
    fn disarm(mut self) {
        self.lock = None;
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            let mut state = lock.state();
            lock.pass_baton(&mut state);
        }
    }
}

fn mode_of(kind: NodeKind) -> HoldMode {
    match kind {
        NodeKind::Mutex => HoldMode::Exclusive,
        NodeKind::Read => HoldMode::Read,
        NodeKind::Write => HoldMode::Write,
        NodeKind::Lease => HoldMode::Lease,
    }
}

impl LocalLock {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// Gives the baton to the next live waiter, or marks the lock idle. Never drops a baton or
    /// grant while `state` is locked.
    fn pass_baton(self: &Arc<Self>, state: &mut State) {
        state.handoffs = 0;
        while let Some(tx) = state.queue.pop_front() {
            match tx.send(Wake::Drive(Baton {
                lock: Some(self.clone()),
            })) {
                Ok(()) => return,
                Err(Wake::Drive(baton)) => baton.disarm(),
                Err(Wake::Granted(_)) => unreachable!("sent a baton"),
            }
        }
        state.busy = false;
    }

    /// Ends a local hold of `node`: hands it to the next live waiter when the run of handoffs
    /// allows and the hold is intact; otherwise passes the baton on and returns the node, which
    /// the caller deletes.
    pub(crate) fn release(self: &Arc<Self>, node: Arc<Hold>) -> Option<Arc<Hold>> {
        let mut state = self.state();
        if node.loss_reason().is_none() {
            while state.handoffs < self.max_handoffs {
                let Some(tx) = state.queue.pop_front() else {
                    break;
                };
                state.handoffs += 1;
                let token = FencingToken::new(node.czxid, state.handoffs);
                let grant = Grant::new(
                    node.clone(),
                    token,
                    mode_of(self.kind),
                    self.path.clone(),
                    Some(self.clone()),
                );
                match tx.send(Wake::Granted(grant)) {
                    Ok(()) => {
                        tracing::debug!(path = %self.path, %token, "zklock: handed off locally");
                        return None;
                    }
                    Err(Wake::Granted(grant)) => drop(grant.defuse()),
                    Err(Wake::Drive(_)) => unreachable!("sent a grant"),
                }
            }
        }
        self.pass_baton(&mut state);
        Some(node)
    }

    /// Lets go of `node` without handing it on locally (a downgrade): the next local waiter
    /// acquires a node of its own.
    pub(crate) fn give_up(self: &Arc<Self>, node: Arc<Hold>) -> Arc<Hold> {
        let mut state = self.state();
        self.pass_baton(&mut state);
        node
    }
}

/// Acquires the lock at `path` for one task: through the local queue when the manager has it
/// on, else with a node of its own. `Ok(None)` only for [`Wait::Never`] when it is taken.
pub(crate) async fn acquire(
    inner: &Arc<Inner>,
    path: &Arc<str>,
    key: &Arc<str>,
    kind: NodeKind,
    wait: Wait,
) -> Result<Option<Grant>> {
    let mode = mode_of(kind);
    let grant = |hold: Hold, local: Option<Arc<LocalLock>>| {
        let token = FencingToken::new(hold.czxid, 0);
        Grant::new(Arc::new(hold), token, mode, path.clone(), local)
    };
    // Readers share at ZooKeeper already; each takes its own node.
    if !inner.config.local_queue || kind == NodeKind::Read {
        return Ok(acquire_node(inner, path, key, kind, wait)
            .await?
            .map(|hold| grant(hold, None)));
    }
    let lock = inner
        .local
        .entry(path, kind, inner.config.max_local_handoffs);
    let receiver = {
        let mut state = lock.state();
        if !state.busy {
            state.busy = true;
            None
        } else if matches!(wait, Wait::Never) {
            return Ok(None);
        } else {
            let (tx, rx) = oneshot::channel();
            state.queue.push_back(tx);
            Some(rx)
        }
    };
    let baton = match receiver {
        None => Baton {
            lock: Some(lock.clone()),
        },
        Some(rx) => {
            let woken = match wait {
                Wait::Until(deadline, waited) => {
                    match tokio::time::timeout_at(deadline, rx).await {
                        Ok(woken) => woken,
                        Err(_) => {
                            return Err(Error::Timeout {
                                key: key.to_string(),
                                waited,
                            })
                        }
                    }
                }
                _ => rx.await,
            };
            match woken {
                Ok(Wake::Granted(grant)) => return Ok(Some(grant)),
                Ok(Wake::Drive(baton)) => baton,
                Err(_) => return Err(Error::Closed),
            }
        }
    };
    // We carry the baton: acquire the node. If this fails or is cancelled, the baton's drop
    // passes the duty on.
    let hold = Box::pin(acquire_node(inner, path, key, kind, wait)).await?;
    match hold {
        Some(hold) => {
            baton.disarm();
            lock.state().handoffs = 0;
            Ok(Some(grant(hold, Some(lock))))
        }
        None => Ok(None),
    }
}
