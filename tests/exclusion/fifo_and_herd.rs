//! FIFO order across sessions, no herd (a release wakes at most the waiters that watch it: the
//! next `WINDOW` above it, never all of them), and a drain that costs O(1) requests per waiter.

/// How many nodes ahead of it a waiter watches (its predecessor and the node before it): each
/// release is seen by at most this many waiters.
const WINDOW: u64 = 2;

use crate::common;

use std::sync::{Arc, Mutex};

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_lock_in_the_order_they_queued() {
    let zk = server();
    let holder = manager(&zk.connect_string()).await;
    let path = holder.path_of("fifo").unwrap();
    let first = holder.lock("fifo").await.unwrap();
    let order = Arc::new(Mutex::new(vec![]));
    let mut waiters = vec![];
    let mut managers = vec![];
    for i in 0..6 {
        let m = manager(&zk.connect_string()).await;
        managers.push(m.clone());
        let order = order.clone();
        waiters.push(tokio::spawn(async move {
            let g = m.lock("fifo").await.unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        // The next waiter starts only once this one's node exists.
        until_children(&holder, &path, i + 2).await;
    }
    first.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..6).collect::<Vec<_>>());
    // Waiter i watches the two nodes nearest ahead of it and sees each go once; behind a longer
    // queue taken in order, the listing after the first one went finds its predecessor alone,
    // so it watches nothing more: min(i + 1, 2) events at most, and at least its
    // predecessor's. A herd would wake every waiter on every change of the lock path.
    for (i, m) in managers.iter().enumerate() {
        let events = m.stats().predecessor_events;
        assert!(
            (1..=(i as u64 + 1).min(WINDOW)).contains(&events),
            "waiter {i} got {events} events from the nodes ahead"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_queued_waiters_costs_constant_requests_each() {
    let zk = server();
    // The local queue off: every waiter queues on ZooKeeper with a node of its own.
    let m = zklock::LockManager::builder(zk.connect_string())
        .local_queue(false)
        .connect()
        .await
        .unwrap();
    let path = m.path_of("drain").unwrap();
    let first = m.lock("drain").await.unwrap();
    let n = 300;
    let mut waiters = vec![];
    for _ in 0..n {
        let m = m.clone();
        waiters.push(tokio::spawn(async move {
            m.lock("drain").await.unwrap().release().await.unwrap()
        }));
    }
    until_children(&m, &path, n + 1).await;
    let before = m.stats();
    first.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    let after = m.stats();
    let requests = after.requests - before.requests;
    // Per waiter: a watch on each of the two nodes nearest ahead (some may have been set before
    // `before`), one listing when only its predecessor was left of them while more nodes sorted
    // below, a watch on the new node before its predecessor if that listing found one, a watch
    // on its own node, and its delete. Listing the children again on every wake (Curator)
    // would cost O(n) bytes per waiter; a herd would cost O(n) events per release.
    assert!(
        requests <= (WINDOW + 4) * n as u64 + 5,
        "{requests} requests to drain {n} waiters"
    );
    let events = after.predecessor_events - before.predecessor_events;
    assert!(
        events <= WINDOW * n as u64,
        "{events} events to drain {n} waiters"
    );
    m.flush().await;
    assert!(children(&m, &path).await.is_empty());
}
