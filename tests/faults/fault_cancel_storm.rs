//! Fault: a storm of acquires abandoned at random points — dropped by an outer timeout while
//! creating, listing or waiting; timed out by the library; `try_lock`s; `with_lock` bodies
//! dropped halfway; read and write locks dropped while queued; leadership sought and abandoned,
//! or dropped — across three sessions, under steady contention, with the history checker.
//! Afterwards the lock paths are empty and no watch is left on the server.

use crate::common;
use crate::faults;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use faults::*;
use rand::Rng;
use zklock::LockManager;
use zklock_testkit::{History, Mode, Recorder, ZkServer};

/// Records the end of a hold when dropped: a `with_lock` body dropped halfway ends its hold there.
struct EndOnDrop<'a> {
    rec: &'a Recorder,
    key: &'a str,
}

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        self.rec.release_invoked(self.key);
    }
}

#[derive(Default)]
struct Tally {
    granted: AtomicU64,
    abandoned: AtomicU64,
}

/// One acquire abandoned (or not) at a random point, in one of six ways picked at random.
async fn one(m: LockManager, rec: Recorder, tally: Arc<Tally>) {
    let key = "storm";
    let (way, after) = {
        let mut rng = rand::thread_rng();
        (
            rng.gen_range(0..6),
            Duration::from_micros(rng.gen_range(0..40_000)),
        )
    };
    let hold = Duration::from_millis(3);
    let storm = Storm {
        key,
        after,
        hold,
        rec: &rec,
        tally: &tally,
    };
    match way {
        0 => storm.lock_dropped(&m).await,
        1 | 2 => storm.timed_out_or_tried(&m, way == 1).await,
        3 => storm.with_lock_dropped(&m).await,
        4 => storm.leadership_abandoned(&m).await,
        _ => storm.rw_dropped(&m).await,
    }
}

/// One acquire of the storm: on `key`, abandoned `after` a random time, holding for `hold`
/// when granted, recorded and counted.
struct Storm<'a> {
    key: &'static str,
    after: Duration,
    hold: Duration,
    rec: &'a Recorder,
    tally: &'a Tally,
}

impl Storm<'_> {
    /// Dropped by an outer timeout at whatever await point it reached.
    async fn lock_dropped(&self, m: &LockManager) {
        let Storm {
            key,
            after,
            hold,
            rec,
            tally,
        } = *self;
        rec.acquire_invoked(key, Mode::Exclusive);
        match tokio::time::timeout(after, m.lock(key)).await {
            Ok(Ok(guard)) => {
                rec.acquire_ok(key, Mode::Exclusive, guard.fencing_token().as_u128());
                tally.granted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                rec.release_invoked(key);
                drop(guard);
            }
            Ok(Err(e)) => rec.acquire_failed(key, Mode::Exclusive, e),
            Err(_) => {
                rec.acquire_failed(key, Mode::Exclusive, "dropped");
                tally.abandoned.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// The library's own timeout (`timeout`), or try_lock.
    async fn timed_out_or_tried(&self, m: &LockManager, timeout: bool) {
        let Storm {
            key,
            after,
            hold,
            rec,
            tally,
        } = *self;
        rec.acquire_invoked(key, Mode::Exclusive);
        let got = if timeout {
            m.lock_timeout(key, after).await.map(Some)
        } else {
            m.try_lock(key).await
        };
        match got {
            Ok(Some(guard)) => {
                rec.acquire_ok(key, Mode::Exclusive, guard.fencing_token().as_u128());
                tally.granted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                rec.release_invoked(key);
                guard.release().await.unwrap();
                rec.release_ok(key);
            }
            Ok(None) | Err(zklock::Error::Timeout { .. }) => {
                rec.acquire_failed(key, Mode::Exclusive, "not now");
                tally.abandoned.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    /// A with_lock whose future is dropped, maybe halfway through its body.
    async fn with_lock_dropped(&self, m: &LockManager) {
        let Storm {
            key,
            after,
            hold,
            rec,
            tally,
        } = *self;
        rec.acquire_invoked(key, Mode::Exclusive);
        let body = async {
            let token = zklock::current_fencing_token().expect("inside the hold");
            rec.acquire_ok(key, Mode::Exclusive, token.as_u128());
            tally.granted.fetch_add(1, Ordering::SeqCst);
            let _end = EndOnDrop { rec, key };
            tokio::time::sleep(hold).await;
        };
        // Bound first: the body (and so its end) is dropped before the outcome is recorded.
        let outcome = tokio::time::timeout(after, m.with_lock(key, body)).await;
        match outcome {
            Ok(result) => result.unwrap(),
            Err(_) => {
                rec.acquire_failed(key, Mode::Exclusive, "dropped (maybe halfway)");
                tally.abandoned.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Leadership sought and abandoned while queued, or given up by dropping it.
    async fn leadership_abandoned(&self, m: &LockManager) {
        let Storm {
            after,
            hold,
            rec,
            tally,
            ..
        } = *self;
        let latch = m.leader_latch("storm", rec.worker()).unwrap();
        let name = "leader:storm";
        rec.acquire_invoked(name, Mode::Exclusive);
        match tokio::time::timeout(after, latch.lead()).await {
            Ok(Ok(leadership)) => {
                rec.acquire_ok(name, Mode::Exclusive, leadership.epoch().as_u128());
                tally.granted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                rec.release_invoked(name);
                drop(leadership);
            }
            Ok(Err(e)) => rec.acquire_failed(name, Mode::Exclusive, e),
            Err(_) => {
                rec.acquire_failed(name, Mode::Exclusive, "dropped");
                tally.abandoned.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Read and write locks dropped while queued.
    async fn rw_dropped(&self, m: &LockManager) {
        let Storm {
            key,
            after,
            hold,
            rec,
            tally,
        } = *self;
        let rw = m.rwlock(key).unwrap();
        let name = "rw:storm";
        let write = rand::thread_rng().gen_bool(0.3);
        let mode = if write { Mode::Exclusive } else { Mode::Shared };
        rec.acquire_invoked(name, mode);
        let got = if write {
            tokio::time::timeout(after, rw.write()).await
        } else {
            tokio::time::timeout(after, rw.read()).await
        };
        match got {
            Ok(Ok(guard)) => {
                rec.acquire_ok(name, mode, guard.fencing_token().as_u128());
                tally.granted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                rec.release_invoked(name);
                drop(guard);
            }
            Ok(Err(e)) => rec.acquire_failed(name, mode, e),
            Err(_) => {
                rec.acquire_failed(name, mode, "dropped");
                tally.abandoned.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_cancelled_acquires_leaves_the_lock_paths_empty() {
    let zk = server();
    let history = History::new();
    let mut managers = Vec::new();
    for _ in 0..3 {
        managers.push(manager(&zk.connect_string()).await);
    }
    let crew = Crew::new();
    let steady = steady_workers(&managers, &history, &crew);
    let tally = Arc::new(Tally::default());
    let n = storm(&managers, &history, &tally).await;
    crew.stop();
    for t in steady {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("workers stop")
            .unwrap();
    }

    let report = history.check();
    eprintln!(
        "fault_cancel_storm: {n} storm acquires, {} granted, {} abandoned; {}",
        tally.granted.load(Ordering::SeqCst),
        tally.abandoned.load(Ordering::SeqCst),
        report.summary()
    );
    report.assert_ok();
    assert!(tally.abandoned.load(Ordering::SeqCst) > 0);
    assert!(tally.granted.load(Ordering::SeqCst) > 0);
    assert_nothing_left(&zk, &managers).await;
}

/// Mutex, election and read/write workers of each manager on the storm's key, all along.
fn steady_workers(
    managers: &[LockManager],
    history: &History,
    crew: &Crew,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut steady = Vec::new();
    for (i, m) in managers.iter().enumerate() {
        let work = Work {
            wait: Duration::from_secs(20),
            hold: Duration::from_millis(15),
            think: Duration::from_millis(5),
        };
        steady.push(tokio::spawn(mutex_worker(
            m.clone(),
            "storm".into(),
            history.recorder(&format!("steady-{i}")),
            crew.clone(),
            work,
        )));
        steady.push(tokio::spawn(leader_worker(
            m.clone(),
            "storm".into(),
            format!("steady-{i}"),
            history.recorder(&format!("steady-leader-{i}")),
            crew.clone(),
            work,
        )));
        steady.push(tokio::spawn(rw_worker(
            m.clone(),
            "storm".into(),
            history.recorder(&format!("steady-rw-{i}")),
            crew.clone(),
            work,
            3,
        )));
    }
    steady
}

/// 20 batches of 12 acquires abandoned (or not) at random points, spread over the managers;
/// answers how many.
async fn storm(managers: &[LockManager], history: &History, tally: &Arc<Tally>) -> usize {
    let mut n = 0;
    for _batch in 0..20 {
        let mut storm = Vec::new();
        for _ in 0..12 {
            n += 1;
            let m = managers[n % managers.len()].clone();
            storm.push(tokio::spawn(one(
                m,
                history.recorder(&format!("storm-{n}")),
                tally.clone(),
            )));
        }
        for t in storm {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("a storm acquire ends")
                .unwrap();
        }
    }
    n
}

/// Once the background deletes finish, the lock paths are empty and no contender or watch is
/// left on the server.
async fn assert_nothing_left(zk: &ZkServer, managers: &[LockManager]) {
    for m in managers {
        tokio::time::timeout(Duration::from_secs(20), m.flush())
            .await
            .expect("background deletes finish");
    }
    let m = &managers[0];
    for path in [
        m.path_of("storm").unwrap(),
        m.rwlock("storm").unwrap().path().to_string(),
    ] {
        assert!(
            children(m, &path).await.is_empty(),
            "{path} keeps {:?}",
            children(m, &path).await
        );
    }
    assert_no_contenders(
        &m.client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(5),
    )
    .await;
    assert_no_watches(
        || zk.four_letter("wchp").into_iter().collect(),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
}
