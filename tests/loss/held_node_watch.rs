//! A holder that was alone in its lock path watches its node through the children watch of the
//! listing that granted it, with no request of its own: an uncontended acquire + release costs
//! three requests (create and listing, pipelined, and the delete). The node is still watched:
//! deleted while alone, or after another contender queued, or asked to let go once the holder
//! opted in to revocation, the hold is lost and says why.

use crate::common;

use std::time::Duration;

use common::*;
use zklock::LossReason;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_costs_three_requests() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    // The lock path exists after the first acquire.
    m.lock("cheap").await.unwrap().release().await.unwrap();
    let before = m.stats().requests;
    for _ in 0..20 {
        let g = m.lock("cheap").await.unwrap();
        assert!(g.is_held());
        g.release().await.unwrap();
    }
    let requests = m.stats().requests - before;
    // Create, listing and delete, 20 times; a held node's data watch would make it 80. A
    // loaded machine may drop a connection now and then, and a retried request counts too.
    assert!(
        (60..=70).contains(&requests),
        "{requests} requests for 20 uncontended cycles"
    );
}

/// With `watch_held_nodes(false)` a grant that nobody asks about costs no watch request (the
/// local queue used to start one at every grant, which made the opt-out cost a request more
/// than the default); the first interest (`lost()`) starts the watch, and a deleted node is
/// then a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_held_nodes_unwatched_a_grant_costs_no_watch_until_asked() {
    let zk = server();
    let m = zklock::LockManager::builder(zk.connect_string())
        .zookeeper(|zk| {
            zk.session_timeout(Duration::from_secs(4))
                .watch_held_nodes(false)
        })
        .connect()
        .await
        .unwrap();
    let ops = manager(&zk.connect_string()).await;
    m.lock("lazy").await.unwrap().release().await.unwrap();
    let before = m.stats().requests;
    for _ in 0..20 {
        m.lock("lazy").await.unwrap().release().await.unwrap();
    }
    let requests = m.stats().requests - before;
    // Create, listing and delete, 20 times; a watch per grant would make it 80.
    assert!(
        (60..=70).contains(&requests),
        "{requests} requests for 20 uncontended cycles"
    );
    let held = m.lock("lazy").await.unwrap();
    // `lost()` starts the watch, which finds the node gone.
    delete_and_see_it_lost(&ops, &held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_while_alone_is_a_loss() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let ops = manager(&zk.connect_string()).await;
    a.lock("alone").await.unwrap().release().await.unwrap();
    let held = a.lock("alone").await.unwrap();
    delete_and_see_it_lost(&ops, &held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_after_another_contender_queued_is_a_loss() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let ops = manager(&zk.connect_string()).await;
    let held = a.lock("queued").await.unwrap();
    let before = a.stats().requests;
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("queued").await.unwrap() }
    });
    until_children(&a, &a.path_of("queued").unwrap(), 2).await;
    // The holder's children watch fired: it now watches its node's data (one request).
    eventually(
        "the holder's data watch",
        Duration::from_secs(10),
        || async { a.stats().requests > before },
    )
    .await;
    assert!(held.is_held());
    delete_and_see_it_lost(&ops, &held).await;
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets in")
        .unwrap();
    assert!(next.fencing_token() > held.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_request_reaches_a_holder_that_opted_in_while_alone() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let ops = manager(&zk.connect_string()).await;
    let held = a.lock("revoke-alone").await.unwrap();
    held.make_revocable();
    ops.revoke("revoke-alone").await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .expect("lost() fires");
    assert_eq!(reason, LossReason::Revoked);
}
