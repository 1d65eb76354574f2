//! Scheduled jobs run once across the fleet, on a real ZooKeeper (and in memory): concurrent
//! runs skip, `at_least` holds across the running process's exit (by the server's clock),
//! `at_most` stops a stuck run and frees the job, `required` turns a skip into an error.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use zklock::{Error, LockManager, LossReason, Ran};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_of_a_job_run_it_once() {
    let zk = server();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut managers = Vec::new();
    for _ in 0..3 {
        managers.push(manager(&zk.connect_string()).await);
    }
    let mut tasks = Vec::new();
    for m in managers {
        let (running, most, runs) = (running.clone(), most.clone(), runs.clone());
        tasks.push(tokio::spawn(async move {
            m.job("nightly")
                .unwrap()
                .run(async {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    running.fetch_sub(1, Ordering::SeqCst);
                })
                .await
                .unwrap()
        }));
    }
    let mut ran = 0;
    for t in tasks {
        if let Ran::Ran(()) = t.await.unwrap() {
            ran += 1;
        }
    }
    // The three started together: one ran, the others found it held (a late starter may run
    // after the first ended: never two at once).
    assert!(ran >= 1);
    assert_eq!(runs.load(Ordering::SeqCst), ran);
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two instances ran the job at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_holds_across_the_runners_exit_by_the_servers_clock() {
    let zk = server();
    let window = Duration::from_secs(3);
    let started = Instant::now();
    {
        // The first instance runs the job quickly and exits.
        let a = manager(&zk.connect_string()).await;
        let ran = a
            .job("report")
            .unwrap()
            .at_least(window)
            .run(async { 1 })
            .await;
        assert_eq!(ran.unwrap(), Ran::Ran(1));
        a.flush().await;
    }
    let b = manager(&zk.connect_string()).await;
    let job = b.job("report").unwrap().at_least(window);
    assert_eq!(
        job.run(async { 2 }).await.unwrap(),
        Ran::Skipped,
        "ran again within at_least of the first run's start"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match job.run(async { 2 }).await.unwrap() {
            Ran::Ran(2) => break,
            _ => {
                assert!(Instant::now() < deadline, "the job never ran again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    // Server and test share this machine's clock: the second run came no sooner than the window.
    assert!(
        started.elapsed() >= window - Duration::from_millis(50),
        "ran again after {:?}, inside the {window:?} window",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_stops_a_stuck_run_and_frees_the_job() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let stuck = tokio::spawn(async move {
        let started = Instant::now();
        let result = a
            .job("stuck")
            .unwrap()
            .at_most(Duration::from_millis(500))
            .run(std::future::pending::<()>())
            .await;
        (result, started.elapsed())
    });
    let (result, took) = tokio::time::timeout(Duration::from_secs(10), stuck)
        .await
        .expect("at_most stopped the run")
        .unwrap();
    assert!(
        matches!(
            result,
            Err(Error::LockLost {
                reason: LossReason::HoldLimit,
                ..
            })
        ),
        "{result:?}"
    );
    assert!(took >= Duration::from_millis(500), "{took:?}");
    // The lock was given up: another instance runs the job at once.
    assert_eq!(
        b.job("stuck").unwrap().run(async { 3 }).await.unwrap(),
        Ran::Ran(3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_job_that_is_skipped_is_an_error() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let job_a = a.job("exclusive").unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move { job_a.run(async { rx.await.ok() }).await });
    until_children(&b, &format!("{}/exclusive", b.namespace()), 1).await;
    let skipped = b
        .job("exclusive")
        .unwrap()
        .required(true)
        .run(async {})
        .await;
    assert!(
        matches!(&skipped, Err(Error::JobSkipped { key }) if key == "exclusive"),
        "{skipped:?}"
    );
    tx.send(()).unwrap();
    assert_eq!(running.await.unwrap().unwrap(), Ran::Ran(Some(())));
}

#[tokio::test]
async fn in_memory_jobs_skip_and_keep_their_window() {
    let m = LockManager::in_memory();
    let job = m.job("tick").unwrap().at_least(Duration::from_millis(300));
    assert_eq!(job.run(async { 1 }).await.unwrap(), Ran::Ran(1));
    assert_eq!(job.run(async { 2 }).await.unwrap(), Ran::Skipped);
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(job.run(async { 3 }).await.unwrap(), Ran::Ran(3));
}
