//! Managers with credentials protect their lock nodes: another tenant can neither delete nor
//! revoke them, and gets a clear error instead of a lock.

mod common;

use common::*;
use zklock::{zookeeper_client, Error, LockManager};

#[tokio::test]
async fn another_tenant_cannot_delete_or_revoke_your_contender_nodes() {
    let zk = server();
    let billing = LockManager::builder(zk.connect_string())
        .digest_auth("billing", "s3cret")
        .connect()
        .await
        .unwrap();
    let intruder = LockManager::builder(zk.connect_string())
        .digest_auth("shop", "other")
        .connect()
        .await
        .unwrap();
    let held = billing.lock("invoice_1").await.unwrap();
    let client = intruder.zk_client();
    assert_eq!(
        client.delete(held.node_path(), None).await,
        Err(zookeeper_client::Error::NoAuth)
    );
    assert_eq!(
        client
            .set_data(held.node_path(), b"__REVOKE__", None)
            .await
            .map(|_| ()),
        Err(zookeeper_client::Error::NoAuth)
    );
    assert!(held.is_held());
    // The intruder cannot queue on the protected lock path either: a clear error, no node.
    match intruder.try_lock("invoice_1").await {
        Err(Error::NoAuth { path, .. }) => assert_eq!(path, billing.path_of("invoice_1").unwrap()),
        other => panic!("expected NoAuth, got {other:?}"),
    }
    assert_eq!(
        children(&billing, &billing.path_of("invoice_1").unwrap())
            .await
            .len(),
        1
    );
    // The same credentials (another instance of the billing service) can lock and unlock.
    let twin = LockManager::builder(zk.connect_string())
        .digest_auth("billing", "s3cret")
        .connect()
        .await
        .unwrap();
    assert!(twin.try_lock("invoice_1").await.unwrap().is_none());
    held.release().await.unwrap();
    assert!(twin.try_lock("invoice_1").await.unwrap().is_some());
}
