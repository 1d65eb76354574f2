//! A job's `at_least` window survives a claim cut at every one of its requests (ZooKeeper).
//!
//! The claim reads the run record (request 1), writes it to learn the server's time (request
//! 2), and when the job runs, writes the new window (request 3). Each test cuts one instance's
//! claim after request k — the request applied by the server, its reply withheld, the
//! connection reset (the client reconnects at once), or reset and cut off until the future is
//! cancelled — and then asks what the server holds: the recorded window never moved back, and
//! no two runs' bodies started within one window.
//!
//! (Redis claims in one script, a single request; PostgreSQL in one statement.)

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zklock::{LockManager, Ran};
use zklock_testkit::{AfterDrop, Proxy};

/// ZooKeeper's opcodes for getData and setData: the claim's requests (the job's lock, free
/// here, sends neither).
const GET_DATA: i32 = 4;
const SET_DATA: i32 = 5;
const WINDOW: Duration = Duration::from_secs(60);

/// The recorded `not-before` (server ms) of the job at `lock_path`, if any.
async fn not_before(m: &LockManager, lock_path: &str) -> Option<i64> {
    let (data, _) = m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .get_data(&format!("{lock_path}%RUN"))
        .await
        .ok()?;
    String::from_utf8(data)
        .ok()?
        .strip_prefix("not-before=")?
        .parse()
        .ok()
}

/// Runs the job `key` once on a manager behind a proxy that withholds the reply to the
/// claim's `k`-th request and then does `after`; returns whether its body ran.
async fn cut_claim(connect: &str, key: &str, k: u64, after: AfterDrop) -> bool {
    let proxy = Proxy::start(connect).unwrap();
    let cut = common::manager(&proxy.connect_string()).await;
    proxy.drop_reply_to_nth_with(&[GET_DATA, SET_DATA], k, after);
    let ran = Arc::new(AtomicUsize::new(0));
    let body = {
        let ran = ran.clone();
        async move {
            ran.fetch_add(1, Ordering::SeqCst);
        }
    };
    let job = cut.job(key).unwrap().at_least(WINDOW);
    // Cut off for good, the claim waits for its reply: the timeout cancels it.
    let outcome = tokio::time::timeout(Duration::from_secs(3), job.run(body)).await;
    assert!(
        !proxy.drop_pending(),
        "the claim sent fewer than {k} requests"
    );
    proxy.heal();
    // Its lock given up (the claim's end dropped the guard), so the next instance's run is
    // decided by the window, not by this lock.
    cut.flush().await;
    drop(cut);
    let ran = ran.load(Ordering::SeqCst) > 0;
    if let Ok(Ok(Ran::Ran(()))) = outcome {
        assert!(ran);
    }
    ran
}

/// Inside a recorded window, a claim cut after any of its requests leaves the window as it
/// was, and the next instance skips. (Before: the second request wrote `claiming` over the
/// window, and a claim cut there left no window at all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_cut_inside_a_window_leaves_it_whole() {
    let zk = common::server();
    let connect = zk.connect_string();
    let m = common::manager(&connect).await;
    let key = "nightly";
    let path = m.path_of(key).unwrap();
    assert!(matches!(
        m.job(key).unwrap().at_least(WINDOW).run(async {}).await,
        Ok(Ran::Ran(()))
    ));
    let recorded = not_before(&m, &path)
        .await
        .expect("the run recorded its window");
    for after in [AfterDrop::Reset, AfterDrop::ResetAndBlackhole] {
        // The claim skips after its second request: there is no third.
        for k in 1..=2 {
            let ran = cut_claim(&connect, key, k, after).await;
            assert!(
                !ran,
                "a run inside the window (cut after request {k}, {after:?})"
            );
            assert_eq!(
                not_before(&m, &path).await,
                Some(recorded),
                "the window changed (cut after request {k}, {after:?})"
            );
            // Skipped for its window, not for a lock still held.
            common::until_children(&m, &path, 0).await;
            let next = common::manager(&connect).await;
            assert_eq!(
                next.job(key)
                    .unwrap()
                    .at_least(WINDOW)
                    .run(async {})
                    .await
                    .unwrap(),
                Ran::Skipped,
                "the next instance ran inside the window (cut after request {k}, {after:?})"
            );
            next.flush().await;
        }
    }
}

/// Once a window is over, a claim cut after any of its requests either recorded a new window
/// (and then no instance runs inside it, not even the cut one) or left the old one: the window
/// never moves back, and at most one body runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_cut_after_a_window_never_moves_it_back() {
    let zk = common::server();
    let connect = zk.connect_string();
    let m = common::manager(&connect).await;
    for after in [AfterDrop::Reset, AfterDrop::ResetAndBlackhole] {
        for k in 1..=3 {
            let key = format!("hourly_{k}_{after:?}");
            let path = m.path_of(&key).unwrap();
            // A window of 1 s, over by the time of the cut claim.
            assert!(matches!(
                m.job(&key)
                    .unwrap()
                    .at_least(Duration::from_secs(1))
                    .run(async {})
                    .await,
                Ok(Ran::Ran(()))
            ));
            let old = not_before(&m, &path).await.expect("a recorded window");
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let cut_ran = cut_claim(&connect, &key, k, after).await;
            let now = not_before(&m, &path).await.expect("a recorded window");
            assert!(
                now >= old,
                "the window moved back (cut after request {k}, {after:?})"
            );
            common::until_children(&m, &path, 0).await;
            let next = common::manager(&connect).await;
            let next_ran = matches!(
                next.job(&key)
                    .unwrap()
                    .at_least(WINDOW)
                    .run(async {})
                    .await
                    .unwrap(),
                Ran::Ran(())
            );
            next.flush().await;
            assert!(
                !(cut_ran && next_ran),
                "two runs within one window (cut after request {k}, {after:?})"
            );
            if now > old {
                assert!(
                    !next_ran,
                    "a run inside the window the cut claim recorded (cut after request {k}, {after:?})"
                );
            }
        }
    }
}
