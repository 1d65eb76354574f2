//! The in-memory backend: real exclusion between the tasks of one process, with the same
//! semantics as ZooKeeper's recipes (FIFO, readers share, writers exclude, semaphores count),
//! strictly increasing tokens, and a loss that a test can trigger. For users' unit tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::{oneshot, watch};

use super::{
    Acquisition, Backend, BackendHold, BoxFuture, Downgraded, Inspect, LockTarget, Lose, Step,
    Wanted, HOST_PID,
};
use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, Result};
use crate::types::inspect::{Contender, LockInfo, LockKind, Owner};
use crate::types::loss::{Loss, LossReason, LossSignal};
use crate::types::mode::{HoldMode, Wait};
use crate::types::token::FencingToken;

/// One contender on a lock, in arrival order.
struct Entry {
    id: u64,
    mode: HoldMode,
    /// Leases this entry asks for (semaphores) or still holds once granted.
    units: u32,
    granted: bool,
    /// Wakes the acquirer when the entry is granted.
    wake: Option<oneshot::Sender<()>>,
    /// Tells the holds of this entry that they are lost.
    loss: Arc<watch::Sender<Option<LossReason>>>,
    /// When it arrived, and when it was granted: what inspection shows as since when.
    since: SystemTime,
    /// Its token once its hold was made (0 before).
    token: i64,
}

#[derive(Default)]
struct Lock {
    entries: Vec<Entry>,
    /// The semaphore's size, for lease entries.
    max_leases: u32,
    /// Woken when an entry joins (what a lingering hold watches for, see
    /// [`BackendHold::others_appeared`]).
    arrivals: Arc<tokio::sync::Notify>,
}

impl Lock {
    /// Grants every entry that its predecessors allow, in order, and wakes them.
    fn grant(&mut self) {
        let mut writer_before = false;
        let mut any_before = false;
        let mut leases_used: u32 = 0;
        let mut lease_waiting = false;
        for entry in &mut self.entries {
            let grantable = match entry.mode {
                HoldMode::Exclusive | HoldMode::Write | HoldMode::Leader => !any_before,
                HoldMode::Read => !writer_before,
                HoldMode::Lease => {
                    !lease_waiting && leases_used + entry.units <= self.max_leases.max(1)
                }
            };
            if !entry.granted && grantable {
                entry.granted = true;
                entry.since = SystemTime::now();
                if let Some(wake) = entry.wake.take() {
                    let _ = wake.send(());
                }
            }
            match entry.mode {
                HoldMode::Lease if entry.granted => leases_used += entry.units,
                HoldMode::Lease => lease_waiting = true,
                HoldMode::Exclusive | HoldMode::Write | HoldMode::Leader => writer_before = true,
                HoldMode::Read => {}
            }
            any_before = true;
        }
    }

    fn position(&self, id: u64) -> Option<usize> {
        self.entries.iter().position(|e| e.id == id)
    }
}

struct Shared {
    locks: StdMutex<HashMap<Arc<str>, Lock>>,
    next_id: AtomicU64,
    /// Tokens: one counter for the whole backend, so they strictly increase per key too.
    next_token: AtomicI64,
}

impl Shared {
    fn locks(&self) -> MutexGuard<'_, HashMap<Arc<str>, Lock>> {
        self.locks.lock().unwrap()
    }

    /// What wakes the watchers of arrivals on `path` (a fresh one if the lock is gone: its
    /// holds are lost anyway).
    fn arrivals(&self, path: &Arc<str>) -> Arc<tokio::sync::Notify> {
        self.locks()
            .get(path)
            .map(|lock| lock.arrivals.clone())
            .unwrap_or_default()
    }

    /// Whether `path` has an entry other than `id`, or no longer has `id` (it was lost).
    fn others(&self, path: &Arc<str>, id: u64) -> bool {
        match self.locks().get(path) {
            Some(lock) => lock.entries.iter().any(|e| e.id != id) || lock.position(id).is_none(),
            None => true,
        }
    }

    /// Removes entry `id` of `path` (or one unit of it) and grants whom that lets in.
    fn remove(&self, path: &Arc<str>, id: u64, all_units: bool) {
        let mut locks = self.locks();
        let Some(lock) = locks.get_mut(path) else {
            return;
        };
        if let Some(i) = lock.position(id) {
            let entry = &mut lock.entries[i];
            if !all_units && entry.units > 1 {
                entry.units -= 1;
            } else {
                lock.entries.remove(i);
            }
        }
        lock.grant();
        if lock.entries.is_empty() {
            locks.remove(path);
        }
    }
}

/// The in-memory backend; see [`LockManager::in_memory`](crate::LockManager::in_memory).
pub(crate) struct MemoryBackend {
    shared: Arc<Shared>,
    /// Jobs' `at_least` windows: no run before this.
    runs: StdMutex<HashMap<Arc<str>, tokio::time::Instant>>,
}

impl MemoryBackend {
    pub(crate) fn new() -> MemoryBackend {
        MemoryBackend {
            shared: Arc::new(Shared {
                locks: StdMutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                next_token: AtomicI64::new(1),
            }),
            runs: StdMutex::new(HashMap::new()),
        }
    }

    /// Queues an entry on `target`'s lock: the entry, taken out again unless disarmed, the
    /// wake-up of its grant, its loss, and whether it was granted at once.
    fn queue(&self, target: &LockTarget, mode: HoldMode, units: u32, max_leases: u32) -> Queued {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let (loss, _) = watch::channel(None);
        let loss = Arc::new(loss);
        let granted = {
            let mut locks = self.shared.locks();
            let lock = locks.entry(target.path.clone()).or_default();
            if mode == HoldMode::Lease {
                lock.max_leases = max_leases;
            }
            lock.entries.push(Entry {
                id,
                mode,
                units,
                granted: false,
                wake: Some(tx),
                loss: loss.clone(),
                since: SystemTime::now(),
                token: 0,
            });
            lock.grant();
            lock.arrivals.notify_waiters();
            lock.entries[lock.position(id).expect("just pushed")].granted
        };
        Queued {
            // From here on, an acquire that ends without a hold takes its entry out.
            unfinished: Unfinished {
                shared: self.shared.clone(),
                path: target.path.clone(),
                id: Some(id),
            },
            granted: rx,
            loss,
            at_once: granted,
        }
    }

    fn hold(
        &self,
        target: &LockTarget,
        id: u64,
        loss: Arc<watch::Sender<Option<LossReason>>>,
    ) -> Arc<dyn BackendHold> {
        let token = self.shared.next_token.fetch_add(1, Ordering::SeqCst);
        if let Some(lock) = self.shared.locks().get_mut(&target.path) {
            if let Some(at) = lock.position(id) {
                lock.entries[at].token = token;
            }
        }
        let arrivals = self.shared.arrivals(&target.path);
        Arc::new(MemoryHold {
            shared: self.shared.clone(),
            path: target.path.clone(),
            arrivals,
            id,
            token: FencingToken::new(token, 0),
            loss: loss.subscribe(),
            _loss_tx: loss,
            released: AtomicBool::new(false),
        })
    }
}

/// An acquire's entry in a lock's queue (see [`MemoryBackend::queue`]).
struct Queued {
    unfinished: Unfinished,
    granted: oneshot::Receiver<()>,
    loss: Arc<watch::Sender<Option<LossReason>>>,
    at_once: bool,
}

/// One acquire on the memory backend, for the driver: an entry in the lock's queue, granted
/// in queue order. Past a deadline the recipe drops the acquire (and reports the timeout); the
/// entry, dropped, is taken out.
struct Acquire<'a> {
    backend: &'a MemoryBackend,
    target: &'a LockTarget,
    mode: HoldMode,
    units: u32,
    max_leases: u32,
    queued: Option<Queued>,
}

impl Acquire<'_> {
    /// The holds of the granted entry: one, or a semaphore's `units`.
    fn held(&mut self) -> Step {
        let queued = self.queued.take().expect("entered");
        let Queued {
            unfinished, loss, ..
        } = queued;
        let id = unfinished.disarm();
        let n = if self.mode == HoldMode::Lease {
            self.units
        } else {
            1
        };
        Step::Held(
            (0..n)
                .map(|_| self.backend.hold(self.target, id, loss.clone()))
                .collect(),
        )
    }
}

impl Acquisition for Acquire<'_> {
    fn enter(&mut self) -> BoxFuture<'_, Result<()>> {
        self.queued = Some(
            self.backend
                .queue(self.target, self.mode, self.units, self.max_leases),
        );
        Box::pin(async { Ok(()) })
    }

    fn attempt(&mut self) -> BoxFuture<'_, Result<Step>> {
        let at_once = self.queued.as_ref().is_some_and(|q| q.at_once);
        let step = if at_once { self.held() } else { Step::Busy };
        Box::pin(async move { Ok(step) })
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(async move {
            let queued = self.queued.as_mut().expect("entered");
            let _ = (&mut queued.granted).await;
            Ok(self.held())
        })
    }

    fn give_up(&mut self) -> BoxFuture<'_, ()> {
        self.queued = None;
        Box::pin(async {})
    }
}

/// An entry of an acquire in progress: removed if the acquire ends without a hold.
struct Unfinished {
    shared: Arc<Shared>,
    path: Arc<str>,
    id: Option<u64>,
}

impl Unfinished {
    /// The entry is granted: kept. Its id.
    fn disarm(mut self) -> u64 {
        self.id.take().expect("armed")
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.shared.remove(&self.path, id, true);
        }
    }
}

impl Backend for MemoryBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Memory
    }

    fn acquisition<'a>(
        &'a self,
        target: &'a LockTarget,
        wanted: Wanted,
        _wait: Wait,
    ) -> Result<Box<dyn Acquisition + 'a>> {
        let (mode, units, max_leases) = match wanted {
            Wanted::Hold(mode) => (mode.into(), 1, 0),
            Wanted::Leases { max, n } => (HoldMode::Lease, n, max),
        };
        Ok(Box::new(Acquire {
            backend: self,
            target,
            mode,
            units,
            max_leases,
            queued: None,
        }))
    }

    /// The process's monotonic clock stands in for a server's.
    fn claim_run<'a>(
        &'a self,
        target: &'a LockTarget,
        at_least: std::time::Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let now = tokio::time::Instant::now();
            let mut runs = self.runs.lock().unwrap();
            if runs.get(&target.path).is_some_and(|until| *until > now) {
                return Ok(false);
            }
            runs.insert(target.path.clone(), now + at_least);
            Ok(true)
        })
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    fn loser(&self) -> std::result::Result<&dyn Lose, &'static str> {
        Ok(self)
    }

    fn inspector(&self) -> std::result::Result<&dyn Inspect, &'static str> {
        Ok(self)
    }
}

impl Lose for MemoryBackend {
    /// Makes every hold on `path` (and on its semaphore parts) lost with `reason`, and lets the
    /// lock go to the next contenders, as a server does when a session expires.
    fn lose(&self, path: &str, reason: LossReason) {
        let mut locks = self.shared.locks();
        for (p, lock) in locks.iter_mut() {
            if &**p != path {
                continue;
            }
            lock.entries.retain(|e| {
                if e.granted {
                    e.loss.send_replace(Some(reason));
                }
                !e.granted
            });
            lock.grant();
        }
        locks.retain(|_, lock| !lock.entries.is_empty());
    }
}

/// A hold granted by the in-memory backend.
struct MemoryHold {
    shared: Arc<Shared>,
    path: Arc<str>,
    /// Wakes on a new entry on the lock (see [`BackendHold::others_appeared`]).
    arrivals: Arc<tokio::sync::Notify>,
    id: u64,
    token: FencingToken,
    loss: watch::Receiver<Option<LossReason>>,
    _loss_tx: Arc<watch::Sender<Option<LossReason>>>,
    released: AtomicBool,
}

impl MemoryHold {
    fn let_go(&self) {
        if !self.released.swap(true, Ordering::SeqCst) && self.loss.borrow().is_none() {
            self.shared.remove(&self.path, self.id, false);
        }
    }
}

impl Drop for MemoryHold {
    fn drop(&mut self) {
        self.let_go();
    }
}

/// The loss signal of a memory hold.
struct MemoryLoss(watch::Receiver<Option<LossReason>>);

impl Loss for MemoryLoss {
    fn reason(&self) -> Option<LossReason> {
        *self.0.borrow()
    }

    fn lost(&self) -> BoxFuture<'static, LossReason> {
        let mut rx = self.0.clone();
        Box::pin(async move {
            loop {
                if let Some(reason) = *rx.borrow_and_update() {
                    return reason;
                }
                if rx.changed().await.is_err() {
                    return LossReason::Closed;
                }
            }
        })
    }
}

impl BackendHold for MemoryHold {
    fn token(&self) -> FencingToken {
        self.token
    }

    fn location(&self) -> &str {
        &self.path
    }

    fn loss_reason(&self) -> Option<LossReason> {
        *self.loss.borrow()
    }

    fn loss(&self) -> LossSignal {
        Arc::new(MemoryLoss(self.loss.clone()))
    }

    fn confirmed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// When another entry joins the lock (or this one was lost).
    fn others_appeared(&self) -> BoxFuture<'static, ()> {
        let (shared, path, id) = (self.shared.clone(), self.path.clone(), self.id);
        let arrivals = self.arrivals.clone();
        Box::pin(async move {
            loop {
                let arrived = arrivals.notified();
                tokio::pin!(arrived);
                arrived.as_mut().enable();
                if shared.others(&path, id) {
                    return;
                }
                arrived.await;
            }
        })
    }

    fn release(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if let Some(reason) = self.loss_reason() {
                self.released.store(true, Ordering::SeqCst);
                return Err(Error::LockLost {
                    key: self.path.to_string(),
                    reason,
                });
            }
            self.let_go();
            Ok(())
        })
    }

    /// Nothing asks a memory hold to let go: revocation is ZooKeeper's.
    /// The read entry takes the write entry's place in the queue, so no queued writer gets in
    /// between; the write hold is then let go.
    fn downgrade(self: Arc<Self>, target: LockTarget) -> BoxFuture<'static, Result<Downgraded>> {
        Box::pin(async move {
            if let Some(reason) = self.loss_reason() {
                return Err(Error::LockLost {
                    key: target.key.to_string(),
                    reason,
                });
            }
            let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
            let (loss, _) = watch::channel(None);
            let loss = Arc::new(loss);
            let token;
            {
                let mut locks = self.shared.locks();
                // Lost meanwhile (`lose` took the entry out): nothing to continue.
                let place = locks
                    .get_mut(&self.path)
                    .and_then(|lock| lock.position(self.id).map(|at| (lock, at)));
                let Some((lock, at)) = place else {
                    return Err(Error::LockLost {
                        key: target.key.to_string(),
                        reason: self.loss_reason().unwrap_or(LossReason::NodeDeleted),
                    });
                };
                token = self.shared.next_token.fetch_add(1, Ordering::SeqCst);
                lock.entries.insert(
                    at + 1,
                    Entry {
                        id,
                        mode: HoldMode::Read,
                        units: 1,
                        granted: true,
                        wake: None,
                        loss: loss.clone(),
                        since: SystemTime::now(),
                        token,
                    },
                );
            }
            let read = Arc::new(MemoryHold {
                shared: self.shared.clone(),
                path: self.path.clone(),
                arrivals: self.arrivals.clone(),
                id,
                token: FencingToken::new(token, 0),
                loss: loss.subscribe(),
                _loss_tx: loss,
                released: AtomicBool::new(false),
            });
            Ok(Downgraded {
                read,
                keep_write: false,
            })
        })
    }
}

/// What the in-memory "server" holds: every entry of a lock, granted ones as holders and the
/// others as waiters in arrival order, all of this process.
impl Inspect for MemoryBackend {
    fn inspect<'a>(
        &'a self,
        path: &'a str,
        kind: Option<LockKind>,
    ) -> BoxFuture<'a, Result<LockInfo>> {
        let locks = self.shared.locks();
        let entries = locks.get(path).map_or(&[][..], |l| &l.entries[..]);
        let kind = kind.unwrap_or_else(|| {
            entries
                .first()
                .map_or(LockKind::Mutex, |e| e.mode.lock_kind())
        });
        let owner = Owner::parse(format!("zklock {}", *HOST_PID).as_bytes());
        let (mut holders, mut waiters) = (vec![], vec![]);
        for e in entries {
            let contender = Contender {
                node: format!("entry {}", e.id),
                mode: e.mode.name(),
                owner: owner.clone(),
                since: e.since,
                token: FencingToken::new(if e.granted { e.token } else { 0 }, 0),
                session: 0,
                lingering: false,
                location: path.to_string(),
            };
            if e.granted {
                holders.push(contender);
            } else {
                waiters.push(contender);
            }
        }
        let info = LockInfo::at(path, kind, holders, waiters);
        Box::pin(std::future::ready(Ok(info)))
    }

    fn lock_paths<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<String>>> {
        let prefix = format!("{namespace}/");
        let paths = self
            .shared
            .locks()
            .keys()
            .filter(|p| p.starts_with(&prefix))
            .map(|p| p.to_string())
            .collect();
        Box::pin(std::future::ready(Ok(paths)))
    }
}
