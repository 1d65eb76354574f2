//! Introspection (holders and waiters with identity, age and token) and revocation.

use crate::common;

use std::time::Duration;

use common::*;
use zklock::{LockKind, LockManager, LossReason};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_holder_and_waiters_in_order_with_identity() {
    let zk = server();
    let a = LockManager::builder(zk.connect_string())
        .identity("checkout-a")
        .connect()
        .await
        .unwrap();
    let b = LockManager::builder(zk.connect_string())
        .identity("checkout-b")
        .connect()
        .await
        .unwrap();
    let held = a.lock("order_9").await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("order_9").await.unwrap().release().await.unwrap() }
    });
    until_children(&a, &a.path_of("order_9").unwrap(), 2).await;
    let info = a.inspect("order_9").await.unwrap();
    assert_eq!(info.kind, LockKind::Mutex);
    assert_eq!(info.key, "order_9");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.waiters.len(), 1);
    let h = &info.holders[0];
    assert_eq!(h.owner.data, "checkout-a");
    assert_eq!(h.owner.pid, Some(std::process::id()));
    assert_eq!(h.token, held.fencing_token());
    assert_eq!(h.mode, "mutex");
    assert!(h.age() < Duration::from_secs(60));
    assert_eq!(info.waiters[0].owner.data, "checkout-b");
    assert!(info.waiters[0].token > h.token);
    let listed = a.list("order_").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].key, "order_9");
    drop(held);
    waiter.await.unwrap();

    // Read/write: two readers hold, a writer waits.
    let r1 = a.rwlock("cfg").unwrap().read().await.unwrap();
    let r2 = b.rwlock("cfg").unwrap().read().await.unwrap();
    let w = tokio::spawn({
        let a = a.clone();
        async move {
            a.rwlock("cfg")
                .unwrap()
                .write()
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        }
    });
    until_children(&a, a.rwlock("cfg").unwrap().path(), 3).await;
    let info = b.inspect("cfg").await.unwrap();
    assert_eq!(info.kind, LockKind::ReadWrite);
    assert_eq!(
        info.holders.iter().map(|c| c.mode).collect::<Vec<_>>(),
        ["read", "read"]
    );
    assert_eq!(
        info.waiters.iter().map(|c| c.mode).collect::<Vec<_>>(),
        ["write"]
    );
    drop((r1, r2));
    w.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_asks_a_revocable_holder_to_let_go() {
    let zk = server();
    let holder = manager(&zk.connect_string()).await;
    let operator = manager(&zk.connect_string()).await;
    let g = holder.lock("stuck").await.unwrap();
    let asked = operator.revoke("stuck").await.unwrap();
    assert_eq!(asked.len(), 1);
    // Asked before opting in: the request still counts once the holder opts in.
    assert!(g.is_held(), "a holder that did not opt in is not forced");
    g.make_revocable();
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .unwrap();
    assert_eq!(reason, LossReason::Revoked);
    g.release().await.ok();

    // Opted in first (builder option), then revoked.
    let revocable = LockManager::builder(zk.connect_string())
        .zookeeper(|zk| zk.revocable(true))
        .connect()
        .await
        .unwrap();
    let g = revocable.lock("stuck").await.unwrap();
    operator.revoke("stuck").await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .unwrap();
    assert_eq!(reason, LossReason::Revoked);
    assert!(!g.is_held());
}
