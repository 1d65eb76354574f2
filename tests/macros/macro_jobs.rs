//! `#[distributed_lock]` with the job options on a real ZooKeeper: a call skipped because another
//! instance holds the job returns `Ran::Skipped` (or `Error::JobSkipped` when the fn's return
//! type has no `Ran`), `at_least` skips a call on another session within the window by the
//! server's clock, `at_most` stops the body, `timeout` waits for the job, and the attribute's
//! job is the same lock as `LockManager::job` on its key.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use zklock::{distributed_lock, Error, FencingToken, LockManager, LossReason, Ran};

#[distributed_lock("digest_{day}", skip_if_locked, manager = m)]
async fn digest(m: &LockManager, day: u32) -> Result<Ran<(u32, Option<FencingToken>)>, Error> {
    Ok((day, zklock::current_fencing_token()))
}

#[distributed_lock("digest_{day}", skip_if_locked, manager = m)]
async fn digest_or_error(m: &LockManager, day: u32) -> Result<u32, Error> {
    Ok(day)
}

/// Holds the job `name` through the library until the returned sender is dropped.
async fn hold_job(m: &LockManager, name: &str) -> tokio::sync::oneshot::Sender<()> {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let job = m.job(name).unwrap();
    tokio::spawn(async move {
        job.run(async {
            started_tx.send(()).unwrap();
            let _ = stop_rx.await;
        })
        .await
        .unwrap()
    });
    started_rx.await.unwrap();
    stop_tx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_skipped_while_another_instance_runs_the_job_returns_skipped_or_job_skipped() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let stop = hold_job(&a, "digest_7").await;

    assert_eq!(digest(&b, 7).await.unwrap(), Ran::Skipped);
    let err = digest_or_error(&b, 7).await.unwrap_err();
    assert!(
        matches!(&err, Error::JobSkipped { key } if key == "digest_7"),
        "{err:?}"
    );
    // Another day is another job: it runs meanwhile.
    assert_eq!(digest_or_error(&b, 8).await.unwrap(), 8);

    drop(stop);
    b.flush().await;
    a.flush().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (day, token) = loop {
        // The holder's release reaches the server in the background.
        match digest(&b, 7).await.unwrap() {
            Ran::Ran(ran) => break ran,
            Ran::Skipped => assert!(Instant::now() < deadline, "the job stayed held"),
        }
        until_children(&b, &format!("{}/digest_7", b.namespace()), 0).await;
    };
    assert_eq!(day, 7);
    assert!(token.is_some(), "the body runs in a holder frame");
}

#[distributed_lock("report", skip_if_locked, at_least = "2s", manager = m)]
async fn report(m: &LockManager) -> Result<Ran<&'static str>, Error> {
    Ok("sent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_least_skips_calls_on_other_sessions_within_the_window() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let started = Instant::now();
    assert_eq!(report(&a).await.unwrap(), Ran::Ran("sent"));
    a.flush().await;
    drop(a);
    // The job's lock is free; its window is not.
    assert_eq!(report(&b).await.unwrap(), Ran::Skipped);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "too slow to check"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while report(&b).await.unwrap() == Ran::Skipped {
        assert!(Instant::now() < deadline, "the job never ran again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_millis(1950),
        "ran again after {:?}",
        started.elapsed()
    );
}

#[distributed_lock("stuck", skip_if_locked, at_most = "300ms", manager = m)]
async fn stuck(m: &LockManager, forever: bool) -> Result<Ran<()>, Error> {
    if forever {
        std::future::pending::<()>().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_stops_the_body_and_frees_the_job() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(10), stuck(&a, true))
        .await
        .expect("at_most stopped the body")
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::LockLost {
                reason: LossReason::HoldLimit,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    a.flush().await;
    assert_eq!(stuck(&b, false).await.unwrap(), Ran::Ran(()));
}

#[distributed_lock("invoices", timeout = "20s", at_most = "1m", manager = m)]
async fn invoices(m: &LockManager) -> Result<Ran<u32>, Error> {
    Ok(3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_timeout_a_call_waits_for_the_job_instead_of_skipping() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let stop = hold_job(&a, "invoices").await;
    let waiting = tokio::spawn(async move { invoices(&b).await });
    // The waiter has queued behind the holder: then the holder ends.
    until_children(&a, &format!("{}/invoices", a.namespace()), 2).await;
    drop(stop);
    assert_eq!(waiting.await.unwrap().unwrap(), Ran::Ran(3));
}
