//! Multi-locks: all or nothing under one deadline, one global order (no deadlock between
//! overlapping sets), and nothing left after a failure.

use crate::common;

use std::time::Duration;

use common::*;
use zklock::{Error, LockSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_do_not_deadlock() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let mut tasks = vec![];
    for i in 0..20 {
        let (m, specs) = if i % 2 == 0 {
            (
                a.clone(),
                vec![LockSpec::mutex("acct_1"), LockSpec::mutex("acct_2")],
            )
        } else {
            (
                b.clone(),
                vec![LockSpec::mutex("acct_2"), LockSpec::mutex("acct_1")],
            )
        };
        tasks.push(tokio::spawn(async move {
            let g = m.lock_all(specs, None).await.unwrap();
            assert!(g.is_held());
            tokio::task::yield_now().await;
            g.release().await.unwrap();
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("deadlock")
            .unwrap();
    }
}

#[tokio::test]
async fn all_or_nothing_under_one_deadline() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let busy = b.rwlock("ledger").unwrap().write().await.unwrap();
    let err = a
        .lock_all(
            [
                LockSpec::mutex("acct_1"),
                LockSpec::read("ledger"),
                LockSpec::semaphore("slots", 2),
            ],
            Some(Duration::from_millis(400)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    a.flush().await;
    // What was taken before the timeout was released.
    assert!(b.try_lock("acct_1").await.unwrap().is_some());
    assert!(b
        .semaphore("slots", 1)
        .unwrap()
        .try_acquire()
        .await
        .unwrap()
        .is_some());
    drop(busy);
    b.flush().await;
    let all = a
        .lock_all(
            [
                LockSpec::mutex("acct_1"),
                LockSpec::read("ledger"),
                LockSpec::mutex("acct_1"),
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(all.tokens().len(), 2, "a key given twice is taken once");
    let conflicting = a
        .lock_all([LockSpec::read("x"), LockSpec::write("x")], None)
        .await;
    assert!(matches!(conflicting, Err(Error::InvalidArgument(_))));
}

/// A `lock_all` that times out has given up the locks it took when it returns: nobody else is
/// kept waiting for them, with no `flush()` (before: they were released in the background and
/// stayed held for a while). The node of the acquire that timed out, which holds nothing, is
/// deleted in the background, as every timed-out or cancelled acquire's is: `flush()` waits
/// for that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_lock_all_holds_nothing_when_it_returns() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    // B's requests take a while to arrive: a release left to the background is still on its
    // way when B's call returns.
    let slow = zklock_testkit::Proxy::start(&zk.connect_string()).unwrap();
    let b = manager(&slow.connect_string()).await;
    slow.set_delay(Duration::from_millis(30));
    let busy = a.lock("b_busy").await.unwrap();
    let free = a.path_of("a_free").unwrap();
    let taken = a.path_of("b_busy").unwrap();
    for round in 0..5 {
        let err = b
            .lock_all(
                [LockSpec::mutex("a_free"), LockSpec::mutex("b_busy")],
                Some(Duration::from_millis(400)),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert_eq!(
            children(&a, &free).await,
            Vec::<String>::new(),
            "the lock it took is still held (round {round})"
        );
        b.flush().await;
        assert_eq!(
            children(&a, &taken).await.len(),
            1,
            "its waiting node is left after flush (round {round})"
        );
    }
    drop(busy);
}
