//! FIFO order across sessions, no herd (one wake per release), and a drain that costs O(1)
//! requests per waiter.

mod common;

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
    // Each release woke exactly one waiter: no herd.
    let woken: u64 = managers.iter().map(|m| m.stats().predecessor_events).sum();
    assert_eq!(
        woken, 6,
        "watch events on predecessors, one per release expected"
    );
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
    // Per waiter: one watch on its predecessor (maybe a second), a watch on its own node once
    // held, and its delete. Listing the children again on every wake (Curator) would cost
    // O(n) bytes per waiter; a herd would cost O(n) events per release.
    assert!(
        requests <= 5 * n as u64 + 5,
        "{requests} requests to drain {n} waiters"
    );
    assert!(after.predecessor_events - before.predecessor_events <= n as u64);
    m.flush().await;
    assert!(children(&m, &path).await.is_empty());
}
