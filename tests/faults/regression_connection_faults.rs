//! Regressions found by the fault tests (issue 7), each test named after its bug.
//!
//! 1. Requests in flight when the connection is reset (or times out) were not treated as a
//!    connection loss.
//!
//! zookeeper-client fails the requests in flight with the transport's own error (`Error::Custom`:
//! "connection reset by peer", "no response from connection in ...") and gives
//! `Error::ConnectionLoss` only when the server closes the connection cleanly. zklock retried only
//! on `ConnectionLoss`, so a reset in the middle of a release gave up on the delete and left the
//! node behind for as long as the session lived — every other process then waited for a lock
//! nobody held — and a reset in the middle of an acquire's create failed the acquire.
//!
//! 2. A lost reply to the first create on a fresh lock path failed the acquire. The create had
//!    failed on the server for want of the path, but the client could not know; looking for the
//!    node by its prefix then found no path at all, and that error ended the acquire instead of
//!    making the path and creating again.

use crate::common;
use crate::faults;

use std::time::Duration;

use common::*;
use faults::*;
use zklock_testkit::{Proxy, CREATE_OPCODES};

const DELETE: i32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_failed_by_a_reset_connection_are_retried_as_a_connection_loss() {
    let zk = server();
    let proxy = Proxy::start(&zk.connect_string()).unwrap();
    let direct = manager(&zk.connect_string()).await;
    let m = manager_with(&proxy.connect_string(), Duration::from_secs(10)).await;

    // A release in the background (drop) whose delete is in flight when the connection resets.
    let path = m.path_of("dropped").unwrap();
    let guard = m.lock("dropped").await.unwrap();
    proxy.set_delay(Duration::from_millis(300));
    let deletes = proxy.requests_with(DELETE);
    drop(guard);
    eventually(
        "the delete to be in flight",
        Duration::from_secs(10),
        || async { proxy.requests_with(DELETE) > deletes },
    )
    .await;
    proxy.reset();
    proxy.set_delay(Duration::ZERO);
    tokio::time::timeout(Duration::from_secs(20), m.flush())
        .await
        .expect("the release finishes after reconnecting");
    assert!(
        children(&direct, &path).await.is_empty(),
        "the node of a dropped guard must not outlive a reset connection"
    );

    // An awaited release, likewise.
    let path = m.path_of("released").unwrap();
    let guard = m.lock("released").await.unwrap();
    proxy.set_delay(Duration::from_millis(300));
    let deletes = proxy.requests_with(DELETE);
    let release = tokio::spawn(async move { guard.release().await });
    eventually(
        "the delete to be in flight",
        Duration::from_secs(10),
        || async { proxy.requests_with(DELETE) > deletes },
    )
    .await;
    proxy.reset();
    proxy.set_delay(Duration::ZERO);
    let released = tokio::time::timeout(Duration::from_secs(20), release)
        .await
        .expect("the release returns")
        .unwrap();
    assert!(
        matches!(released, Ok(()) | Err(zklock::Error::LockLost { .. })),
        "{released:?}"
    );
    assert!(
        children(&direct, &path).await.is_empty(),
        "an awaited release must delete the node after a reset connection"
    );

    // An acquire whose create is in flight when the connection resets completes.
    let path = m.path_of("acquired").unwrap();
    direct
        .lock("acquired")
        .await
        .unwrap()
        .release()
        .await
        .unwrap(); // the path exists
    proxy.set_delay(Duration::from_millis(300));
    let creates = proxy.stats().creates;
    let acquire = tokio::spawn({
        let m = m.clone();
        async move { m.lock("acquired").await }
    });
    eventually(
        "the create to be in flight",
        Duration::from_secs(10),
        || async { proxy.stats().creates > creates },
    )
    .await;
    proxy.reset();
    proxy.set_delay(Duration::ZERO);
    let guard = tokio::time::timeout(Duration::from_secs(20), acquire)
        .await
        .expect("the acquire returns")
        .unwrap()
        .expect("the acquire survives a reset connection");
    assert_eq!(children(&direct, &path).await.len(), 1);
    guard.release().await.unwrap();

    m.flush().await;
    assert_no_contenders(
        &direct
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_to_the_first_create_on_a_fresh_lock_path_is_retried() {
    let zk = server();
    let proxy = Proxy::start(&zk.connect_string()).unwrap();
    let direct = manager(&zk.connect_string()).await;
    let m = manager(&proxy.connect_string()).await;
    let path = m.path_of("never_locked_before").unwrap();
    assert!(children(&direct, &path).await.is_empty());
    proxy.drop_reply_to_nth(&CREATE_OPCODES, 1);
    let guard = tokio::time::timeout(Duration::from_secs(20), m.lock("never_locked_before"))
        .await
        .expect("the acquire returns")
        .expect("the acquire makes the path and creates again");
    assert_eq!(proxy.stats().replies_dropped, 1);
    assert_eq!(children(&direct, &path).await.len(), 1);
    guard.release().await.unwrap();
    m.flush().await;
    assert_no_contenders(
        &direct
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
}
