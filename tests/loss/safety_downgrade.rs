//! Regression: `downgrade()` of a write hold whose session expired must refuse, not create a
//! read hold on the renewed session.
//!
//! Bug guarded against: `rwlock::downgrade` creates the read node through `live_client()`, which
//! is the manager's *renewed* session when the write hold's session expired, without checking that
//! the write hold is still held. The write node is gone with the old session, so the new read node
//! protects nothing. When another writer got in after the expiry, the read node sorts behind it,
//! the downgrade sees "a writer between" and keeps the (gone) write node instead of releasing it,
//! and returns a read guard that answers `is_held() == true` while the other writer holds: two
//! holders. Without a waiter it still creates a read node on a session that never held the lock
//! (and then fails releasing the write node).
//!
//! Expected: `Error::LockLost`, no node created, none left behind.

use crate::common;

use std::time::Duration;

use common::*;
use faults::*;
use zklock::Error;

use crate::faults;

/// Waits (bounded) until `m` works on a new session (not `old`), connected.
async fn until_renewed(m: &zklock::LockManager, old: zklock::zookeeper_client::SessionId) {
    eventually(
        "the manager to renew its session",
        Duration::from_secs(30),
        || async {
            let client = m
                .client::<zookeeper_client::Client>()
                .expect("a ZooKeeper manager");
            client.session_id() != old
                && client.state() == zklock::zookeeper_client::SessionState::SyncConnected
        },
    )
    .await;
}

/// Waits (bounded) until `guard` reports its hold lost.
async fn until_lost(guard: &zklock::LockGuard) {
    let reason = tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("the write hold is reported lost after its session expired");
    println!("write hold lost: {reason}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrading_an_expired_write_hold_while_another_writer_holds_is_refused() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let key = "doc";
    let rw = a.rwlock(key).unwrap();
    let path = rw.path().to_string();
    let write = rw.write().await.unwrap();

    // A writer of another process queues behind, and gets in once the session expires.
    let other = tokio::spawn({
        let b = b.clone();
        async move { b.rwlock(key).unwrap().write().await.unwrap() }
    });
    until_children(&b, &path, 2).await;
    let old = a
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .session_id();
    expire_session(&a, &zk.connect_string()).await;
    until_lost(&write).await;
    until_renewed(&a, old).await;
    let other = tokio::time::timeout(Duration::from_secs(20), other)
        .await
        .expect("the other writer gets in after the expiry")
        .unwrap();
    let other_node = other.node_path().rsplit('/').next().unwrap().to_string();

    let downgraded = tokio::time::timeout(Duration::from_secs(20), write.downgrade())
        .await
        .expect("the downgrade returns");
    match downgraded {
        Err(Error::LockLost { .. }) => {}
        Ok(read) => panic!(
            "two holders: downgrading an expired write hold returned a read hold (node {}, \
             is_held() = {}) while another process holds the write lock (node {other_node})",
            read.node_path(),
            read.is_held()
        ),
        Err(e) => panic!("the downgrade must fail with LockLost, got: {e}"),
    }
    tokio::time::timeout(Duration::from_secs(20), a.flush())
        .await
        .expect("background work ends");
    assert_eq!(
        children(&b, &path).await,
        vec![other_node],
        "only the other writer's node may be left"
    );
    other.release().await.unwrap();
    assert_no_contenders(
        &b.client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrading_an_expired_write_hold_is_refused_and_creates_no_node() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let observer = manager(&zk.connect_string()).await;
    let key = "doc";
    let rw = a.rwlock(key).unwrap();
    let path = rw.path().to_string();
    let write = rw.write().await.unwrap();

    let old = a
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .session_id();
    expire_session(&a, &zk.connect_string()).await;
    until_lost(&write).await;
    until_renewed(&a, old).await;
    // The expired session's node is gone; from here on any change of the path's children is a
    // node made (or removed) by the downgrade.
    until_children(&observer, &path, 0).await;
    let before = observer
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .check_stat(&path)
        .await
        .unwrap();

    let downgraded = tokio::time::timeout(Duration::from_secs(20), write.downgrade())
        .await
        .expect("the downgrade returns");
    let refused = matches!(downgraded, Err(Error::LockLost { .. }));
    let described = format!("{downgraded:?}");
    drop(downgraded);
    tokio::time::timeout(Duration::from_secs(20), a.flush())
        .await
        .expect("background work ends");
    let after = observer
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .check_stat(&path)
        .await
        .unwrap();
    let left = children(&observer, &path).await;
    println!(
        "downgrade after expiry: {described}; children version {:?} -> {:?}; left {left:?}",
        before.map(|s| s.cversion),
        after.map(|s| s.cversion)
    );
    assert!(
        refused,
        "the downgrade must fail with LockLost: {described}"
    );
    assert!(left.is_empty(), "nodes left behind: {left:?}");
    assert_eq!(
        before.map(|s| s.cversion),
        after.map(|s| s.cversion),
        "the downgrade of an expired hold created a read node on the renewed session"
    );
}
