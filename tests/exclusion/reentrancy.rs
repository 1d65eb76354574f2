//! Reentrant counting in holder frames: nested acquires re-enter without ZooKeeper traffic,
//! concurrent branches of one frame are serialized, spawned tasks start with no frame.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use zklock::current_fencing_token;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_with_lock_reenters_and_the_node_goes_with_the_outermost_hold() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = m.path_of("acct").unwrap();
    let outer = tokio::time::timeout(
        Duration::from_secs(10),
        m.with_lock("acct", async {
            let token = current_fencing_token().unwrap();
            let before = m.stats().requests;
            let inner = m
                .with_lock("acct", async {
                    assert_eq!(current_fencing_token(), Some(token), "same hold");
                    m.with_lock("acct", async { children(&m, &path).await.len() })
                        .await
                        .unwrap()
                })
                .await
                .unwrap();
            // Two re-entries cost no lock request (the children listing above is the test's).
            assert_eq!(m.stats().requests, before);
            assert_eq!(inner, 1, "one node for all three holds");
            children(&m, &path).await.len()
        }),
    )
    .await
    .expect("re-entry must not deadlock")
    .unwrap();
    assert_eq!(outer, 1, "still held after the inner holds ended");
    m.flush().await;
    assert!(children(&m, &path).await.is_empty());
    assert_eq!(current_fencing_token(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_branches_of_one_frame_are_serialized() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let inside = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let branch = |n: u64| {
        let (m, inside, max) = (m.clone(), inside.clone(), max.clone());
        async move {
            m.with_lock("j", async {
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20 + n)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
            })
            .await
            .unwrap()
        }
    };
    m.with_lock("j", async {
        // Both branches share the frame (and the task): re-entry alone would let them in together.
        tokio::join!(branch(0), branch(5), branch(10));
    })
    .await
    .unwrap();
    assert_eq!(
        max.load(Ordering::SeqCst),
        1,
        "two branches were inside at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_tasks_start_with_no_frame() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    m.with_lock("s", async {
        let m2 = m.clone();
        let spawned = tokio::spawn(async move {
            assert_eq!(current_fencing_token(), None);
            m2.try_lock("s").await.unwrap().is_none()
        });
        assert!(
            spawned.await.unwrap(),
            "a spawned task must not re-enter its parent's hold"
        );
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn guard_reenter_and_scope_count_holds() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let other = manager(&zk.connect_string()).await;
    let path = m.path_of("g").unwrap();
    let outer = m.lock("g").await.unwrap();
    let again = outer.reenter();
    assert_eq!(outer.hold_count(), 2);
    assert_eq!(again.fencing_token(), outer.fencing_token());
    drop(outer);
    assert!(again.is_held());
    assert!(
        other.try_lock("g").await.unwrap().is_none(),
        "still held through the re-entry"
    );
    other.flush().await; // its try_lock's node is gone before we count
    let n = again
        .scope(async {
            m.with_lock("g", async { children(&m, &path).await.len() })
                .await
                .unwrap()
        })
        .await;
    assert_eq!(n, 1);
    again.release().await.unwrap();
    assert!(
        other.try_lock("g").await.unwrap().is_some(),
        "released with the last hold"
    );
}

/// Regression: every layer of async fn kept its own copy of the body, so each nesting level
/// multiplied the future's size by five and three levels overflowed a 2 MiB stack in debug
/// builds. Bodies are boxed at the entry points now: nesting adds, it does not multiply.
#[tokio::test]
async fn nested_holds_grow_the_future_linearly_not_geometrically() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let one = std::mem::size_of_val(&m.with_lock("x", async {}));
    let three = std::mem::size_of_val(&m.with_lock("x", async {
        m.with_lock("x", async { m.with_lock("x", async {}).await })
            .await
    }));
    assert!(
        three < 4 * one,
        "one level {one} bytes, three levels {three} bytes"
    );
}
