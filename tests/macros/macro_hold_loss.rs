//! When the hold is lost while the body runs, `on_lost = "abort"` (the default) drops the body
//! at its next await and returns the lock-lost error; `on_lost = "continue"` lets it finish.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use zklock::{distributed_lock, Error, LockManager, LossReason};

/// Deletes this call's contender node from another session (as an operator or a revocation
/// would), then keeps awaiting.
async fn delete_my_node(m: &LockManager, ops: &LockManager, key: &str) {
    let path = m.path_of(key).unwrap();
    let mut nodes = children(ops, &path).await;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    let node = nodes.pop().unwrap();
    ops.client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .delete(&format!("{path}/{node}"), None)
        .await
        .unwrap();
}

#[distributed_lock("job_{id}", manager = m)]
async fn aborted(
    m: &LockManager,
    ops: &LockManager,
    id: u32,
    finished: &AtomicBool,
) -> Result<u32, Error> {
    delete_my_node(m, ops, &format!("job_{id}")).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(id)
}

#[distributed_lock("job_{id}", manager = m, on_lost = "continue")]
async fn carries_on(
    m: &LockManager,
    ops: &LockManager,
    id: u32,
    finished: &AtomicBool,
) -> Result<u32, Error> {
    delete_my_node(m, ops, &format!("job_{id}")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    finished.store(true, Ordering::SeqCst);
    Ok(id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_hold_aborts_the_body_with_the_lock_lost_error() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let ops = manager(&zk.connect_string()).await;
    let finished = AtomicBool::new(false);
    let result = tokio::time::timeout(Duration::from_secs(15), aborted(&m, &ops, 1, &finished))
        .await
        .expect("the body is aborted well before its sleep ends");
    match result {
        Err(Error::LockLost { key, reason }) => {
            assert_eq!(key, "job_1");
            assert_eq!(reason, LossReason::NodeDeleted);
        }
        other => panic!("expected the lock-lost error, got {other:?}"),
    }
    assert!(
        !finished.load(Ordering::SeqCst),
        "the body ran past the loss"
    );
    m.flush().await;
    assert!(children(&m, &m.path_of("job_1").unwrap()).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lost_continue_lets_the_body_finish() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let ops = manager(&zk.connect_string()).await;
    let finished = AtomicBool::new(false);
    let result = tokio::time::timeout(Duration::from_secs(15), carries_on(&m, &ops, 2, &finished))
        .await
        .expect("the body ends");
    assert_eq!(result.unwrap(), 2);
    assert!(finished.load(Ordering::SeqCst));
}
