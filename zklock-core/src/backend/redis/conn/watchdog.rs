//! One watchdog per backend renews every hold's lease: holds register when granted and leave
//! when they end, with no task of their own (a grant or a release spawns nothing and wakes no
//! other thread).
//!
//! The watchdog's task wakes every [`tick`](Watchdog::tick) and starts the renewal of every
//! hold due within the next tick, so a renewal goes out at most one tick early and never late:
//! a hold is due at its last grant or renewal's send time + its lease/3, and the tick is at
//! most a quarter of the shortest first lease (a hand-over's, see `super::waiter_ttl`), so a
//! hold registered just after a tick is still renewed in time. The task ends with the backend.
//!
//! A connection break (see [`Breaks`](super::breaks::Breaks)) makes every hold it reaches lost
//! (it shows at once in each hold's state; the watchdog then makes it final and stops renewing
//! it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use redis::Script;
use tokio::sync::{watch, Mutex as AsyncMutex};
use tokio::time::Instant;

use super::super::wire::keys::Keys;
use super::super::wire::scripts;
use super::lease::{extend, lose, HoldState, Side};
use super::Inner;
use crate::types::loss::LossReason;

/// What the watchdog needs to renew one hold.
pub(crate) struct Renewal {
    pub(crate) keys: Arc<Keys>,
    pub(crate) side: Side,
    pub(crate) id: String,
    pub(crate) state: Arc<watch::Sender<HoldState>>,
    /// Renewals and a downgrade take turns.
    pub(crate) ops: Arc<AsyncMutex<()>>,
    /// When the next renewal is due.
    pub(crate) due: StdMutex<Instant>,
    /// A renewal of it is under way.
    busy: AtomicBool,
}

impl Renewal {
    pub(crate) fn new(
        keys: Arc<Keys>,
        side: Side,
        id: String,
        state: Arc<watch::Sender<HoldState>>,
        ops: Arc<AsyncMutex<()>>,
        due: Instant,
    ) -> Renewal {
        Renewal {
            keys,
            side,
            id,
            state,
            ops,
            due: StdMutex::new(due),
            busy: AtomicBool::new(false),
        }
    }
}

/// The holds a backend renews.
#[derive(Default)]
pub(crate) struct Watchdog {
    holds: StdMutex<HashMap<u64, Arc<Renewal>>>,
    next_id: AtomicU64,
}

impl Watchdog {
    /// How often the watchdog's task looks for due renewals, for a backend with `lease`.
    pub(crate) fn tick(lease: Duration) -> Duration {
        super::waiter_ttl(lease) / 4
    }

    /// Starts renewing a hold; the id to [`remove`](Self::remove) it with.
    pub(crate) fn add(&self, renewal: Renewal) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.holds.lock().unwrap().insert(id, Arc::new(renewal));
        id
    }

    /// Stops renewing a hold (a renewal under way finishes, and finds the hold ended).
    pub(crate) fn remove(&self, id: u64) {
        self.holds.lock().unwrap().remove(&id);
    }

    /// Makes every hold due at `now` (a connection broke).
    fn all_due(&self, now: Instant) {
        for r in self.holds.lock().unwrap().values() {
            *r.due.lock().unwrap() = now;
        }
    }

    /// Renewals due by `by`, marked as under way.
    fn due(&self, by: Instant) -> Vec<(u64, Arc<Renewal>)> {
        self.holds
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, r)| *r.due.lock().unwrap() <= by && !r.busy.swap(true, Ordering::SeqCst))
            .map(|(id, r)| (*id, r.clone()))
            .collect()
    }
}

/// What a renewal's request answers when the primary renewed the lease but too few replicas
/// acknowledged it (see `RedisOptions::replica_acks`); the scripts answer 1 or 0.
const UNACKED: i64 = -1;

/// The watchdog's task: every tick, starts the renewals due within the next one; on a
/// connection break, at once, which makes every hold granted before it lost.
pub(crate) async fn run(inner: Weak<Inner>, tick: Duration) {
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let Some(mut breaks) = inner.upgrade().map(|b| b.breaks.subscribe()) else {
        return;
    };
    loop {
        let broke = tokio::select! {
            _ = ticks.tick() => false,
            changed = breaks.changed() => changed.is_ok(),
        };
        let Some(backend) = inner.upgrade() else {
            return;
        };
        if broke {
            backend.watchdog.all_due(Instant::now());
        }
        for (id, renewal) in backend.watchdog.due(Instant::now() + tick) {
            let inner = backend.clone();
            backend
                .runtime
                .spawn(async move { renew(&inner, id, &renewal).await });
        }
    }
}

/// How soon a renewal the Cluster refused for a moment (see `conn::passing`) is tried again,
/// at most (a tenth of the lease when that is shorter).
const PASSING_RETRY: Duration = Duration::from_millis(100);

/// Renews one hold once; makes it lost (and stops renewing it) the moment the renewal fails
/// or is refused, or when the lease could have run out before it was confirmed. A Cluster
/// that cannot serve for a moment (`-CLUSTERDOWN`, `-TRYAGAIN`, `-MASTERDOWN`) is asked again
/// soon instead, until the deadline.
async fn renew(inner: &Inner, id: u64, r: &Renewal) {
    let (script, key): (&Script, &str) = match r.side {
        Side::Mutex | Side::Exclusive => (&*scripts::RENEW_EXCLUSIVE, &r.keys.exclusive),
        Side::Shared => (&*scripts::RENEW_SHARED, &r.keys.shared),
    };
    let _turn = r.ops.lock().await;
    let (deadline, done) = {
        let s = r.state.borrow();
        let reason = s.reason_at(Instant::now(), &inner.breaks);
        (
            s.deadline,
            if s.released {
                Some(LossReason::Closed)
            } else {
                reason
            },
        )
    };
    let outcome = if done.is_some() {
        done
    } else {
        let epoch = inner.breaks.epoch();
        let sent = Instant::now();
        let acks = inner.acks;
        let renewal = inner.conn.run(key, None, |mut c| {
            let mut invocation = script.key(key);
            invocation.arg(&r.id).arg(inner.lease_ms());
            async move {
                let renewed = invocation.invoke_async::<i64>(&mut c).await?;
                // Renewed, but too few replicas acknowledged it: the deadline stays.
                if renewed == 1 && Inner::acked(acks, &mut c).await?.is_err() {
                    return Ok(UNACKED);
                }
                Ok(renewed)
            }
        });
        match tokio::time::timeout_at(deadline, renewal).await {
            Ok(Ok(1)) => {
                extend(&r.state, inner.deadline(sent), epoch, &inner.breaks);
                *r.due.lock().unwrap() = sent + inner.lease / 3;
                r.state.borrow().lost
            }
            Ok(Ok(UNACKED)) => {
                tracing::debug!(key = %key, "zklock: a Redis lease renewal was not acknowledged by enough replicas in time");
                *r.due.lock().unwrap() = sent + inner.lease / 3;
                r.state.borrow().lost
            }
            Ok(Ok(_)) => Some(LossReason::NodeDeleted),
            Ok(Err(e)) if super::super::error::passing(&e) => {
                // The Cluster cannot serve for a moment (a failover elsewhere under way): the
                // key is where it was, and its deadline still stands. Tried again soon; the
                // hold is lost at its deadline if no renewal gets through by then.
                tracing::debug!(key = %key, error = %e, "zklock: a Redis lease renewal was refused for now; trying again");
                *r.due.lock().unwrap() = Instant::now() + PASSING_RETRY.min(inner.lease / 10);
                r.state.borrow().lost
            }
            Ok(Err(e)) => {
                tracing::debug!(key = %key, error = %e, "zklock: a Redis lease renewal failed");
                Some(super::super::error::loss_of(&e))
            }
            Err(_) => Some(LossReason::LeaseExpired),
        }
    };
    match outcome {
        None => r.busy.store(false, Ordering::SeqCst),
        Some(reason) => {
            inner.watchdog.remove(id);
            lose(&r.state, reason, key);
        }
    }
}
