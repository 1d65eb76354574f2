//! The in-process lock table: tasks of one process share one znode per key, hand it on without
//! a round trip, let other processes in after a bounded run, and survive cancellations.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_process_hand_the_lock_on_locally_with_increasing_tokens() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = m.path_of("inproc").unwrap();
    let holders = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(vec![]));
    let before = m.stats();
    let mut tasks = vec![];
    for _ in 0..32 {
        let (m, holders, tokens, path) = (m.clone(), holders.clone(), tokens.clone(), path.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let g = m.lock("inproc").await.unwrap();
                assert_eq!(
                    holders.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokens.lock().unwrap().push(g.fencing_token());
                // One node for the whole process, whoever holds it.
                assert_eq!(g.node_path().rsplit_once('/').unwrap().0, path);
                tokio::task::yield_now().await;
                holders.fetch_sub(1, Ordering::SeqCst);
                drop(g);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 320);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens must increase across local handoffs"
    );
    assert!(
        tokens.iter().any(|t| t.local() > 0),
        "some grants were local handoffs"
    );
    let requests = m.stats().requests - before.requests;
    // A node costs 3 or 4 requests (create, list, its data watch once contended, delete) and
    // serves up to 33 holds; without the local queue 320 acquires would cost over 1,000.
    assert!(requests < 200, "{requests} requests for 320 acquires");
    m.flush().await;
    assert!(children(&m, &path).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_processes_get_their_turn_after_a_bounded_run_of_local_handoffs() {
    let zk = server();
    let busy = zklock::LockManager::builder(zk.connect_string())
        .max_local_handoffs(4)
        .connect()
        .await
        .unwrap();
    let other = manager(&zk.connect_string()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut hammer = vec![];
    for _ in 0..6 {
        let (busy, stop) = (busy.clone(), stop.clone());
        hammer.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let g = busy.lock("shared").await.unwrap();
                tokio::task::yield_now().await;
                drop(g);
            }
        }));
    }
    // The busy process always has a local waiter; without the bound this would starve.
    let got = tokio::time::timeout(Duration::from_secs(20), other.lock("shared")).await;
    stop.store(true, Ordering::SeqCst);
    let g = got.expect("the other process starved").unwrap();
    assert!(g.is_held());
    drop(g);
    for h in hammer {
        h.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_local_waiters_and_a_cancelled_acquirer_do_not_stall_the_queue() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let blocker = manager(&zk.connect_string()).await;
    let path = m.path_of("q").unwrap();
    // Another process holds the lock: the first local task is acquiring on ZooKeeper, the
    // rest queue locally behind it.
    let held = blocker.lock("q").await.unwrap();
    let acquirer = tokio::spawn({
        let m = m.clone();
        async move { m.lock("q").await.map(|g| g.fencing_token()) }
    });
    until_children(&m, &path, 2).await;
    let mut queued = vec![];
    for i in 0..10 {
        let m = m.clone();
        queued.push(tokio::spawn(async move {
            if i % 2 == 0 {
                // cancelled while queued
                tokio::time::timeout(Duration::from_millis(50), m.lock("q"))
                    .await
                    .is_ok()
            } else {
                let g = m.lock("q").await.unwrap();
                drop(g);
                true
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // let the cancellations happen
    acquirer.abort(); // the task acquiring for the process is cancelled: the duty passes on
    let _ = acquirer.await;
    held.release().await.unwrap();
    let mut got = 0;
    for (i, q) in queued.into_iter().enumerate() {
        let ok = tokio::time::timeout(Duration::from_secs(20), q)
            .await
            .expect("the queue stalled")
            .unwrap();
        if i % 2 == 1 {
            assert!(ok);
            got += 1;
        }
    }
    assert_eq!(got, 5);
    m.flush().await;
    blocker.flush().await;
    assert!(
        children(&m, &path).await.is_empty(),
        "{:?}",
        children(&m, &path).await
    );
}

#[tokio::test]
async fn try_lock_sees_a_local_holder_without_a_round_trip() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let g = m.lock("t").await.unwrap();
    let before = m.stats().requests;
    let other_task = tokio::spawn({
        let m = m.clone();
        async move { m.try_lock("t").await.unwrap().is_none() }
    });
    assert!(
        other_task.await.unwrap(),
        "another task of this process holds it"
    );
    assert_eq!(m.stats().requests, before, "answered from the local table");
    drop(g);
}

/// Hands `key`'s lock on from task to task of `m` up to `n` times, each next task queued
/// before the holder lets go. Stops early when the next task got a node of its own (the node
/// was let go): returns the last guard and how many handoffs kept the node.
async fn hand_on(
    m: &zklock::LockManager,
    key: &str,
    mut g: zklock::LockGuard,
    n: usize,
) -> (zklock::LockGuard, usize) {
    for i in 0..n {
        let next = m.lock(key);
        tokio::pin!(next);
        assert!(
            futures::poll!(&mut next).is_pending(),
            "the next task queues behind the holder"
        );
        let node = g.node_path().to_string();
        drop(g);
        g = tokio::time::timeout(Duration::from_secs(20), next)
            .await
            .expect("the local queue stalled")
            .unwrap();
        if g.node_path() != node {
            return (g, i);
        }
    }
    (g, n)
}

/// The node's creation zxid, read on the server.
async fn czxid(m: &zklock::LockManager, node: &str) -> i64 {
    let (_, stat) = m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .get_data(node)
        .await
        .unwrap();
    stat.czxid
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_other_contenders_local_handoffs_keep_the_node_then_a_waiter_gets_in_within_the_bound(
) {
    const BOUND: usize = 32; // the default max_local_handoffs
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let other = manager(&zk.connect_string()).await;
    let path = m.path_of("kept").unwrap();
    let g = m.lock("kept").await.unwrap();
    let node = g.node_path().to_string();
    let created = czxid(&m, &node).await;
    assert_eq!(g.fencing_token().grant(), created);
    let before = m.stats().requests;

    // (a) Nobody else wants the key: far more handoffs than the bound, one node.
    let (g, kept) = hand_on(&m, "kept", g, 10 * BOUND).await;
    assert_eq!(
        kept,
        10 * BOUND,
        "the node was let go with no other contender"
    );
    assert_eq!(g.node_path(), node);
    assert_eq!(g.fencing_token().grant(), created);
    assert_eq!(g.fencing_token().local() as usize, 10 * BOUND);
    assert_eq!(czxid(&m, &node).await, created, "the same node throughout");
    assert_eq!(children(&m, &path).await.len(), 1);
    // One listing of the lock path (with its children watch) for the whole run.
    let requests = m.stats().requests - before;
    assert!(
        requests <= 1,
        "{requests} requests for {} handoffs",
        10 * BOUND
    );

    // (b) Another process queues: the node goes within the bound's handoffs.
    let waiter = tokio::spawn({
        let other = other.clone();
        async move {
            let g = other.lock("kept").await.unwrap();
            let token = g.fencing_token();
            g.release().await.unwrap();
            token
        }
    });
    // Listed on `m`'s own session: its children watch has fired by the time this answers.
    until_children(&m, &path, 2).await;
    let (g, after) = hand_on(&m, "kept", g, 10 * BOUND).await;
    assert!(
        after <= BOUND,
        "{after} local handoffs after another process queued"
    );
    let theirs = waiter.await.unwrap();
    assert!(theirs.grant() > created);
    assert!(
        g.fencing_token() > theirs,
        "our next node queued behind theirs"
    );
    assert_ne!(g.node_path(), node);
    drop(g);
    m.flush().await;
    other.flush().await;
    assert!(children(&m, &path).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_waiter_gets_in_within_the_bound_of_local_handoffs() {
    const BOUND: usize = 32;
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = m.path_of("mixed").unwrap();
    let g = m.lock("mixed").await.unwrap();
    let node = g.node_path().to_string();
    // A few handoffs first: the children watch is set and nobody else waits.
    let (g, kept) = hand_on(&m, "mixed", g, 5).await;
    assert_eq!(kept, 5);
    let mut curator =
        zklock_testkit::CuratorHold::spawn(&zk.connect_string(), &path, "mutex", 50, 1).unwrap();
    // The JVM may take a while to start (or to be installed on a first run).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while children(&m, &path).await.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Curator never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (g, after) = hand_on(&m, "mixed", g, 10 * BOUND).await;
    assert!(
        after <= BOUND,
        "{after} local handoffs after Curator queued"
    );
    assert_ne!(g.node_path(), node, "the node was let go for Curator");
    let (event, acquired_at) = tokio::task::spawn_blocking(move || {
        let e = curator.next_event(Duration::from_secs(10)).unwrap();
        (e, curator)
    })
    .await
    .map(|((event, at), _)| (event, at))
    .unwrap();
    assert_eq!(event, "acquired");
    assert!(acquired_at <= zklock_testkit::now_epoch_ms());
    drop(g);
    m.flush().await;
}
