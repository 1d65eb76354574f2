//! What the cut-at-every-request sweeps share, whatever the backend: the protocols a victim
//! runs, the kinds of cut, how a run is recorded for the history checker, and the sweep over
//! every request boundary. Each backend's file (`cut_every_request*.rs`) says how its victim is
//! cut off (the ZooKeeper proxy, the test kit's relay) and what "nothing left" means there.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use zklock::{
    current_fencing_token, FencingToken, Leadership, Lease, LockGuard, LockManager, LossReason,
};
use zklock_testkit::{Mode, Recorder};

/// How long a victim waits for its lock, and the other process for its own after the cut.
pub const WAIT: Duration = Duration::from_secs(20);
/// How long a victim holds in a run that is not cut off for good.
pub const HOLD: Duration = Duration::from_millis(100);
/// A job's `at_least` window: longer than any run of a sweep.
pub const WINDOW: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Mutex,
    /// The victim queues behind a holder of another process and is handed the lock.
    Handover,
    Read,
    Write,
    /// A lease of a semaphore of one.
    Semaphore,
    /// `job(key).at_least(WINDOW).run(..)`.
    Job,
    Leader,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The reply withheld, the connection reset: the client reconnects at once.
    Reset,
    /// The reply withheld, the client cut off, and its future dropped while it waits.
    Cancel,
    /// The reply withheld and the client cut off for good, as a killed process or a dead host.
    Kill,
}

pub const CUTS: [Cut; 3] = [Cut::Reset, Cut::Cancel, Cut::Kill];

/// What a protocol's take gives: a guard, a lease or a leadership.
pub enum Held {
    Guard(LockGuard),
    Lease(Lease),
    Lead(Leadership),
}

impl Held {
    pub fn token(&self) -> FencingToken {
        match self {
            Held::Guard(g) => g.fencing_token(),
            Held::Lease(l) => l.fencing_token(),
            Held::Lead(l) => l.epoch(),
        }
    }

    pub async fn lost(&self) -> LossReason {
        match self {
            Held::Guard(g) => g.lost().await,
            Held::Lease(l) => l.lost().await,
            Held::Lead(l) => l.lost().await,
        }
    }

    pub async fn release(self) -> zklock::Result<()> {
        match self {
            Held::Guard(g) => g.release().await,
            Held::Lease(l) => l.release().await,
            Held::Lead(l) => l.leave().await,
        }
    }
}

impl Protocol {
    /// The victim's mode in the history (a reader shares; everything else excludes).
    pub fn mode(self) -> Mode {
        match self {
            Protocol::Read => Mode::Shared,
            _ => Mode::Exclusive,
        }
    }

    /// Takes the lock `key` of this protocol (the other process takes the conflicting side:
    /// a writer against a reader; the lock of a job's name).
    pub async fn take(self, m: &LockManager, key: &str, other: bool) -> zklock::Result<Held> {
        Ok(match self {
            Protocol::Mutex | Protocol::Handover | Protocol::Job => {
                Held::Guard(m.lock_timeout(key, WAIT).await?)
            }
            Protocol::Read if !other => Held::Guard(m.rwlock(key)?.read_timeout(WAIT).await?),
            Protocol::Read | Protocol::Write => {
                Held::Guard(m.rwlock(key)?.write_timeout(WAIT).await?)
            }
            Protocol::Semaphore => Held::Lease(m.semaphore(key, 1)?.acquire_timeout(WAIT).await?),
            Protocol::Leader => {
                let id = if other { "other" } else { "victim" };
                Held::Lead(m.leader_latch(key, id)?.lead_timeout(WAIT).await?)
            }
        })
    }
}

/// Takes, holds `hold` (stopping when told of a loss), releases; records it all.
pub async fn take_hold_release(
    protocol: Protocol,
    m: &LockManager,
    key: &str,
    rec: &Recorder,
    other: bool,
    hold: Duration,
) {
    let mode = if other {
        Mode::Exclusive
    } else {
        protocol.mode()
    };
    rec.acquire_invoked(key, mode);
    let held = match protocol.take(m, key, other).await {
        Ok(held) => held,
        Err(e) => {
            rec.acquire_failed(key, mode, e);
            return;
        }
    };
    rec.acquire_ok(key, mode, held.token().as_u128());
    tokio::select! {
        biased;
        reason = held.lost() => rec.lost(key, reason),
        _ = tokio::time::sleep(hold) => {}
    }
    rec.release_invoked(key);
    match held.release().await {
        Ok(()) => rec.release_ok(key),
        Err(e) => rec.release_failed(key, e),
    }
}

/// Runs the job `key` with its `at_least` window: the body records its hold (from its start
/// to its end: the lock is given up after) and counts itself in `bodies`.
pub async fn run_job(
    m: &LockManager,
    key: &str,
    rec: &Recorder,
    bodies: &AtomicUsize,
    hold: Duration,
) {
    rec.acquire_invoked(key, Mode::Exclusive);
    let job = match m.job(key) {
        Ok(job) => job.at_least(WINDOW),
        Err(e) => return rec.acquire_failed(key, Mode::Exclusive, e),
    };
    let started = AtomicBool::new(false);
    let ran = job
        .run(async {
            let token = current_fencing_token().expect("a job's body runs in a frame");
            rec.acquire_ok(key, Mode::Exclusive, token.as_u128());
            started.store(true, Ordering::SeqCst);
            bodies.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            rec.release_invoked(key);
        })
        .await;
    match ran {
        Ok(zklock::Ran::Ran(())) => rec.release_ok(key),
        Ok(zklock::Ran::Skipped) => rec.acquire_failed(key, Mode::Exclusive, "skipped"),
        // The body was stopped: its hold was lost while it ran.
        Err(e) if started.load(Ordering::SeqCst) => rec.lost(key, e),
        Err(e) => rec.acquire_failed(key, Mode::Exclusive, e),
    }
}

/// Whether every kind of cut runs at every k (`ZKLOCK_CUTS=all`), or one kind per k.
pub fn all_cuts() -> bool {
    std::env::var("ZKLOCK_CUTS").is_ok_and(|v| v == "all")
}

/// Runs `protocol` once uncut (`run(key, None)` answers how many requests the victim sent),
/// then once per request boundary k and kind of cut. In CI each k gets one kind, rotating from
/// `offset`, and the last k also `Kill` when `kill_last` (a partition that begins while the
/// victim holds: the run that checks its loss deadline against the server's).
pub async fn sweep<F, Fut>(protocol: Protocol, offset: usize, kill_last: bool, mut run: F)
where
    F: FnMut(String, Option<(u64, Cut)>) -> Fut,
    Fut: Future<Output = u64>,
{
    let started = std::time::Instant::now();
    let n = run(format!("{protocol:?}_uncut").to_lowercase(), None).await;
    assert!(n > 0, "{protocol:?} sent no request");
    let mut runs = 0;
    for k in 1..=n {
        let mut cuts: Vec<Cut> = if all_cuts() {
            CUTS.to_vec()
        } else {
            vec![CUTS[(k as usize + offset) % CUTS.len()]]
        };
        if kill_last && k == n && !cuts.contains(&Cut::Kill) {
            cuts.push(Cut::Kill);
        }
        for how in cuts {
            let key = format!("{protocol:?}_{k}_{how:?}").to_lowercase();
            run(key, Some((k, how))).await;
            runs += 1;
        }
    }
    eprintln!(
        "{protocol:?}: {n} requests, {runs} cut runs, every one checked, in {:?}",
        started.elapsed()
    );
}
