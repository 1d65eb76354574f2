//! An annotated fn holds its lock exactly while its body runs: released on return, on `?`, on
//! panic and on cancellation, and a bounded wait (`timeout = "..."`) returns the timeout error
//! and leaves nothing behind.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::FutureExt;
use zklock::{distributed_lock, LockManager};

#[derive(Debug)]
enum AppError {
    Lock(zklock::Error),
    NotFound,
}

impl From<zklock::Error> for AppError {
    fn from(err: zklock::Error) -> AppError {
        AppError::Lock(err)
    }
}

async fn find(id: u64) -> Result<u64, AppError> {
    if id == 0 {
        Err(AppError::NotFound)
    } else {
        Ok(id)
    }
}

/// Asserts that the body holds the lock (one contender node), then fails through `?`.
#[distributed_lock("user_{id}", manager = m)]
async fn fails_through_question_mark(m: &LockManager, id: u64) -> Result<u64, AppError> {
    assert_eq!(
        children(m, &m.path_of(&format!("user_{id}"))?).await.len(),
        1
    );
    let found = find(0).await?;
    Ok(found + id)
}

/// Asserts that the body holds the lock, says so, then panics.
#[distributed_lock("user_{id}", manager = m)]
async fn panics(m: &LockManager, id: u64, held: &AtomicBool) -> Result<u64, AppError> {
    assert_eq!(
        children(m, &m.path_of(&format!("user_{id}"))?).await.len(),
        1
    );
    held.store(true, Ordering::SeqCst);
    panic!("the handler panics while holding the lock");
}

#[distributed_lock("user_{id}", manager = m)]
async fn never_ends(m: &LockManager, id: u64) -> Result<u64, AppError> {
    std::future::pending::<()>().await;
    Ok(id)
}

#[distributed_lock("user_{id}", manager = m, timeout = "300ms")]
async fn bounded_wait(m: &LockManager, id: u64) -> Result<u64, AppError> {
    Ok(id)
}

async fn no_children(m: &LockManager, key: &str) {
    m.flush().await;
    let path = m.path_of(key).unwrap();
    assert_eq!(
        children(m, &path).await,
        Vec::<String>::new(),
        "the lock on {key} was left held"
    );
}

/// Another session gets the lock at once: proves it was released, not just the node gone.
async fn free_for_another_session(other: &LockManager, key: &str) {
    let guard = tokio::time::timeout(Duration::from_secs(10), other.lock(key))
        .await
        .expect("the lock is free")
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn released_on_question_mark() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let other = manager(&zk.connect_string()).await;
    let result = fails_through_question_mark(&m, 1).await;
    assert!(matches!(result, Err(AppError::NotFound)), "{result:?}");
    no_children(&m, "user_1").await;
    free_for_another_session(&other, "user_1").await;
}

#[tokio::test]
async fn released_on_panic() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let other = manager(&zk.connect_string()).await;
    let held = AtomicBool::new(false);
    let caught = std::panic::AssertUnwindSafe(panics(&m, 2, &held))
        .catch_unwind()
        .await;
    assert!(caught.is_err(), "the body's panic goes through");
    assert!(
        held.load(Ordering::SeqCst),
        "the body panicked while holding"
    );
    no_children(&m, "user_2").await;
    free_for_another_session(&other, "user_2").await;

    // In a spawned task: the panic ends the task and the lock is released all the same.
    let held = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn({
        let (m, held) = (m.clone(), held.clone());
        async move { panics(&m, 3, &held).await }
    });
    assert!(task.await.unwrap_err().is_panic());
    assert!(
        held.load(Ordering::SeqCst),
        "the body panicked while holding"
    );
    no_children(&m, "user_3").await;
    free_for_another_session(&other, "user_3").await;
}

#[tokio::test]
async fn released_on_cancellation_while_holding() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let other = manager(&zk.connect_string()).await;
    let path = m.path_of("user_4").unwrap();
    let mut call = Box::pin(never_ends(&m, 4));
    // Poll until the body holds the lock, then drop the call.
    let watch = async {
        until_children(&other, &path, 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::select! {
        _ = &mut call => panic!("the body never ends"),
        _ = watch => {}
    }
    assert_eq!(children(&other, &path).await.len(), 1, "held while running");
    drop(call);
    no_children(&m, "user_4").await;
    free_for_another_session(&other, "user_4").await;
}

#[tokio::test]
async fn cancelled_while_waiting_leaves_no_node() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let holder = manager(&zk.connect_string()).await;
    let path = m.path_of("user_5").unwrap();
    let held = holder.lock("user_5").await.unwrap();
    let mut call = Box::pin(never_ends(&m, 5));
    tokio::select! {
        _ = &mut call => panic!("the call cannot get the lock"),
        // The call queues behind the holder with a node of its own...
        _ = until_children(&holder, &path, 2) => {}
    }
    // ...which goes away when the call is dropped.
    drop(call);
    m.flush().await;
    assert_eq!(children(&m, &path).await.len(), 1, "only the holder's node");
    held.release().await.unwrap();
    no_children(&m, "user_5").await;
}

#[tokio::test]
async fn timeout_returns_the_timeout_error_and_leaves_nothing() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let holder = manager(&zk.connect_string()).await;
    let path = m.path_of("user_6").unwrap();
    let held = holder.lock("user_6").await.unwrap();
    let start = Instant::now();
    let result = bounded_wait(&m, 6).await;
    let waited = start.elapsed();
    match result {
        Err(AppError::Lock(zklock::Error::Timeout { key, waited: w })) => {
            assert_eq!(key, "user_6");
            assert_eq!(w, Duration::from_millis(300));
        }
        other => panic!("expected the timeout error, got {other:?}"),
    }
    assert!(
        waited >= Duration::from_millis(300),
        "gave up early: {waited:?}"
    );
    assert!(waited < Duration::from_secs(5), "gave up late: {waited:?}");
    m.flush().await;
    assert_eq!(children(&m, &path).await.len(), 1, "only the holder's node");
    held.release().await.unwrap();
    // Free, the same call gets the lock well within its timeout.
    assert_eq!(bounded_wait(&m, 6).await.unwrap(), 6);
    no_children(&m, "user_6").await;
}
