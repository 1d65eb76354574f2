//! Nested annotated calls on the same key re-enter (no second node, no deadlock), and the body
//! reads its fencing token with `zklock::current_fencing_token()`.

use crate::common;

use std::time::Duration;

use common::*;
use zklock::{distributed_lock, Error, FencingToken, LockManager};

#[distributed_lock("account_{id}", manager = m)]
async fn outer(m: &LockManager, id: u64) -> Result<(usize, usize, FencingToken), Error> {
    let path = m.path_of(&format!("account_{id}"))?;
    let before = children(m, &path).await.len();
    let token = zklock::current_fencing_token().expect("a token inside the body");
    let (inside, inner_token) = inner(m, id).await?;
    assert_eq!(
        zklock::current_fencing_token(),
        Some(token),
        "the outer token is back after the inner call"
    );
    assert_eq!(inner_token, token, "a re-entry holds the same grant");
    Ok((before, inside, token))
}

#[distributed_lock("account_{id}", manager = m)]
async fn inner(m: &LockManager, id: u64) -> Result<(usize, FencingToken), Error> {
    let path = m.path_of(&format!("account_{id}"))?;
    let token = zklock::current_fencing_token().expect("a token inside the body");
    Ok((children(m, &path).await.len(), token))
}

#[distributed_lock("other_{id}", manager = m)]
async fn different_key(m: &LockManager, id: u64) -> Result<FencingToken, Error> {
    let outer_token = zklock::current_fencing_token().unwrap();
    let token = inner(m, id).await?.1;
    assert_ne!(token, outer_token, "the innermost hold's token");
    assert_eq!(zklock::current_fencing_token(), Some(outer_token));
    Ok(token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_annotated_calls_on_the_same_key_reenter() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let (before, inside, token) = tokio::time::timeout(Duration::from_secs(15), outer(&m, 1))
        .await
        .expect("the nested call re-enters instead of waiting for itself")
        .unwrap();
    assert_eq!((before, inside), (1, 1), "one node for both holds");
    assert!(
        zklock::current_fencing_token().is_none(),
        "no frame outside"
    );
    m.flush().await;
    assert!(children(&m, &m.path_of("account_1").unwrap())
        .await
        .is_empty());

    // The next holder of the key, in another session, gets a larger token.
    let other = manager(&zk.connect_string()).await;
    let next = other.lock("account_1").await.unwrap();
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fencing_token_is_the_innermost_holds() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let token = tokio::time::timeout(Duration::from_secs(15), different_key(&m, 2))
        .await
        .expect("no deadlock")
        .unwrap();
    let guard = m.lock("account_2").await.unwrap();
    assert!(guard.fencing_token() > token, "tokens increase per key");
}
