//! The soak's mixed traffic: every recipe a backend offers, on a fixed set of keys, from two
//! managers whose settings differ, with dropped acquires (timeouts that cancel them) and tries
//! among the plain ones. Each worker loops until told to stop and counts its cycles; a failed
//! cycle (a fault cut the connection, a session ended) counts as an error and the worker goes
//! on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use zklock_core::LockManager;

/// The mutex keys the workers share: a fixed set, so that nothing on the server may grow with
/// the number of cycles.
const KEYS: [&str; 3] = ["soak-a", "soak-b", "soak-c"];

/// What the workers share: the stop flag and the counts.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) stop: AtomicBool,
    pub(crate) cycles: AtomicU64,
    pub(crate) errors: AtomicU64,
}

impl Counts {
    fn done(&self, ok: bool) {
        let counter = if ok { &self.cycles } else { &self.errors };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a worker does once per cycle.
#[derive(Clone, Copy, Debug)]
enum Work {
    /// lock, release, on a key of [`KEYS`].
    Mutex,
    /// `try_lock`, release when granted.
    Try,
    /// `lock` dropped after 1 to 5 ms, or released when granted before.
    Dropped,
    /// A read or (one time in four) a write of one read/write lock.
    ReadWrite,
    /// One lease of a semaphore of 2.
    Lease,
    /// A job with a 20 ms `at_least` window, run or skipped.
    Job,
    /// A leader election: lead for a moment, then step down.
    Leader,
}

/// Starts the workers on `managers` until `counts.stop` is set. `semaphores`: the backend
/// offers them.
pub(crate) fn start(
    managers: &[LockManager],
    counts: &Arc<Counts>,
    semaphores: bool,
) -> Vec<JoinHandle<()>> {
    let mut plan = vec![
        Work::Mutex,
        Work::Mutex,
        Work::Mutex,
        Work::Try,
        Work::Dropped,
        Work::ReadWrite,
        Work::ReadWrite,
        Work::Job,
        Work::Leader,
    ];
    if semaphores {
        plan.push(Work::Lease);
    }
    let mut tasks = Vec::new();
    for (m, manager) in managers.iter().enumerate() {
        for (w, work) in plan.iter().enumerate() {
            let (manager, counts, work) = (manager.clone(), counts.clone(), *work);
            let seed = (m * 100 + w) as u64;
            tasks.push(tokio::spawn(worker(manager, counts, work, seed)));
        }
    }
    tasks
}

async fn worker(manager: LockManager, counts: Arc<Counts>, work: Work, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let participant = format!("soak-{seed}");
    while !counts.stop.load(Ordering::Relaxed) {
        let key = KEYS[rng.gen_range(0..KEYS.len())];
        let ok = match work {
            Work::Mutex => mutex(&manager, key).await,
            Work::Try => try_lock(&manager, key).await,
            Work::Dropped => dropped(&manager, key, rng.gen_range(1..=5)).await,
            Work::ReadWrite => read_write(&manager, rng.gen_range(0..4) == 0).await,
            Work::Lease => lease(&manager).await,
            Work::Job => job(&manager).await,
            Work::Leader => leader(&manager, &participant).await,
        };
        counts.done(ok);
        if !ok {
            // A fault: let the backend reconnect rather than spin on it.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn mutex(manager: &LockManager, key: &str) -> bool {
    match manager.lock(key).await {
        Ok(g) => {
            tokio::task::yield_now().await;
            g.release().await.is_ok()
        }
        Err(_) => false,
    }
}

async fn try_lock(manager: &LockManager, key: &str) -> bool {
    match manager.try_lock(key).await {
        Ok(Some(g)) => g.release().await.is_ok(),
        Ok(None) => true,
        Err(_) => false,
    }
}

async fn dropped(manager: &LockManager, key: &str, ms: u64) -> bool {
    match tokio::time::timeout(Duration::from_millis(ms), manager.lock(key)).await {
        Err(_) => true,
        Ok(Ok(g)) => g.release().await.is_ok(),
        Ok(Err(_)) => false,
    }
}

async fn read_write(manager: &LockManager, write: bool) -> bool {
    let Ok(lock) = manager.rwlock("soak-rw") else {
        return false;
    };
    let held = if write {
        lock.write().await
    } else {
        lock.read().await
    };
    match held {
        Ok(g) => g.release().await.is_ok(),
        Err(_) => false,
    }
}

async fn lease(manager: &LockManager) -> bool {
    let Ok(semaphore) = manager.semaphore("soak-slots", 2) else {
        return false;
    };
    match semaphore.acquire().await {
        Ok(lease) => lease.release().await.is_ok(),
        Err(_) => false,
    }
}

async fn job(manager: &LockManager) -> bool {
    let Ok(job) = manager.job("soak-job") else {
        return false;
    };
    let job = job.at_least(Duration::from_millis(20));
    job.run(tokio::task::yield_now()).await.is_ok()
}

async fn leader(manager: &LockManager, participant: &str) -> bool {
    let Ok(latch) = manager.leader_latch("soak-leader", participant) else {
        return false;
    };
    match latch.lead_timeout(Duration::from_millis(50)).await {
        Ok(leadership) => {
            drop(leadership);
            true
        }
        Err(zklock_core::Error::Timeout { .. }) => true,
        Err(_) => false,
    }
}
