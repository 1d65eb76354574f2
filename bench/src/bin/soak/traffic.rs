//! The soak's mixed traffic: every recipe a backend offers, on a fixed set of keys, from two
//! managers whose settings differ, with dropped acquires (timeouts that cancel them) and tries
//! among the plain ones. Each worker loops until told to stop and counts its cycles; a failed
//! cycle (a fault cut the connection, a session ended) counts as an error and the worker goes
//! on.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use zklock_core::{Error, LockManager};

/// The mutex keys the workers share: a fixed set, so that nothing on the server may grow with
/// the number of cycles.
const KEYS: [&str; 3] = ["soak-a", "soak-b", "soak-c"];

/// What the workers share: the stop flag and the counts.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) stop: AtomicBool,
    pub(crate) cycles: AtomicU64,
    pub(crate) errors: AtomicU64,
    /// How often each kind of error was seen: the worker's work and the error's text.
    pub(crate) kinds: Mutex<BTreeMap<String, u64>>,
    /// The longest cycle of each work, over its workers: a worker that stands still (a
    /// waiter nobody lets in, a thread nobody gives back) shows here.
    pub(crate) longest: Mutex<BTreeMap<String, Duration>>,
}

impl Counts {
    fn done(&self, work: Work, outcome: Result<(), Error>) {
        match outcome {
            Ok(()) => self.cycles.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                let kind = format!("{work:?}: {e}");
                *self
                    .kinds
                    .lock()
                    .expect("not poisoned")
                    .entry(kind)
                    .or_default() += 1;
                self.errors.fetch_add(1, Ordering::Relaxed)
            }
        };
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
    let mut longest = Duration::ZERO;
    while !counts.stop.load(Ordering::Relaxed) {
        let key = KEYS[rng.gen_range(0..KEYS.len())];
        let started = Instant::now();
        let ok = match work {
            Work::Mutex => mutex(&manager, key).await,
            Work::Try => try_lock(&manager, key).await,
            Work::Dropped => dropped(&manager, key, rng.gen_range(1..=5)).await,
            Work::ReadWrite => read_write(&manager, rng.gen_range(0..4) == 0).await,
            Work::Lease => lease(&manager).await,
            Work::Job => job(&manager).await,
            Work::Leader => leader(&manager, &participant).await,
        };
        longest = longest.max(started.elapsed());
        let failed = ok.is_err();
        counts.done(work, ok);
        if failed {
            // A fault: let the backend reconnect rather than spin on it.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut longests = counts.longest.lock().expect("not poisoned");
    let entry = longests.entry(format!("{work:?}")).or_default();
    *entry = (*entry).max(longest);
}

async fn mutex(manager: &LockManager, key: &str) -> Result<(), Error> {
    let g = manager.lock(key).await?;
    tokio::task::yield_now().await;
    g.release().await
}

async fn try_lock(manager: &LockManager, key: &str) -> Result<(), Error> {
    match manager.try_lock(key).await? {
        Some(g) => g.release().await,
        None => Ok(()),
    }
}

async fn dropped(manager: &LockManager, key: &str, ms: u64) -> Result<(), Error> {
    match tokio::time::timeout(Duration::from_millis(ms), manager.lock(key)).await {
        Err(_) => Ok(()),
        Ok(held) => held?.release().await,
    }
}

async fn read_write(manager: &LockManager, write: bool) -> Result<(), Error> {
    let lock = manager.rwlock("soak-rw")?;
    let held = if write {
        lock.write().await?
    } else {
        lock.read().await?
    };
    held.release().await
}

async fn lease(manager: &LockManager) -> Result<(), Error> {
    let semaphore = manager.semaphore("soak-slots", 2)?;
    semaphore.acquire().await?.release().await
}

async fn job(manager: &LockManager) -> Result<(), Error> {
    let job = manager.job("soak-job")?.at_least(Duration::from_millis(20));
    job.run(tokio::task::yield_now()).await.map(|_| ())
}

async fn leader(manager: &LockManager, participant: &str) -> Result<(), Error> {
    let latch = manager.leader_latch("soak-leader", participant)?;
    match latch.lead_timeout(Duration::from_millis(50)).await {
        Ok(leadership) => {
            drop(leadership);
            Ok(())
        }
        Err(Error::Timeout { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}
