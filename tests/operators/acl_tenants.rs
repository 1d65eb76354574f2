//! Managers with credentials protect their lock nodes: another tenant can neither delete nor
//! revoke them, and gets a clear error instead of a lock.

use crate::common;

use common::*;
use zklock::{zookeeper_client, Error, LockManager};

#[tokio::test]
async fn another_tenant_cannot_delete_or_revoke_your_contender_nodes() {
    let zk = server();
    let billing = LockManager::builder(zk.connect_string())
        .zookeeper(|zk| zk.digest_auth("billing", "s3cret"))
        .connect()
        .await
        .unwrap();
    let intruder = LockManager::builder(zk.connect_string())
        .zookeeper(|zk| zk.digest_auth("shop", "other"))
        .connect()
        .await
        .unwrap();
    let held = billing.lock("invoice_1").await.unwrap();
    let client = intruder
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
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
        .zookeeper(|zk| zk.digest_auth("billing", "s3cret"))
        .connect()
        .await
        .unwrap();
    assert!(twin.try_lock("invoice_1").await.unwrap().is_none());
    held.release().await.unwrap();
    assert!(twin.try_lock("invoice_1").await.unwrap().is_some());
}

/// A path whose ACL lets others delete the tenant's nodes is refused with a clear error, and
/// nothing is held or left: made first by a client without credentials (the lock path, or
/// one re-created open after the tenant's was reaped). A path the tenant made itself passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_path_others_may_delete_in_is_refused() {
    let zk = server();
    let anonymous = manager(&zk.connect_string()).await;
    let tenant = LockManager::builder(zk.connect_string())
        .zookeeper(|zk| zk.digest_auth("billing", "s3cret"))
        .connect()
        .await
        .unwrap();
    // An anonymous manager locked the key first: the path it made is open to anyone. A child
    // keeps the path from being reaped once the lock is let go: made while the anonymous hold
    // still keeps the path (made after the release, it raced the server's reaping of the
    // emptied path, and failed with NoNode now and then).
    let path = tenant.path_of("invoice_9").unwrap();
    let open = anonymous.lock("invoice_9").await.unwrap();
    anonymous
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .create(
            &format!("{path}/keep-open"),
            b"",
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .map(drop)
        .or_else(|e| {
            if e == zookeeper_client::Error::NodeExists {
                Ok(())
            } else {
                Err(e)
            }
        })
        .unwrap();
    open.release().await.unwrap();
    match tenant.try_lock("invoice_9").await {
        Err(Error::UnprotectedPath { path: p, acl }) => {
            assert_eq!(p, path);
            assert!(acl.contains("world:anyone"), "{acl}");
        }
        other => panic!("expected UnprotectedPath, got {other:?}"),
    }
    match tenant.lock("invoice_9").await {
        Err(Error::UnprotectedPath { .. }) => {}
        other => panic!("expected UnprotectedPath, got {other:?}"),
    }
    tenant.flush().await;
    assert_eq!(
        children(&tenant, &path).await,
        vec!["keep-open".to_string()],
        "the refused acquires left a node"
    );
    // Where the tenant made the path, its nodes are safe, and it locks.
    let own = tenant.lock("invoice_10").await.unwrap();
    assert_eq!(
        anonymous
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .delete(own.node_path(), None)
            .await,
        Err(zookeeper_client::Error::NoAuth)
    );
    own.release().await.unwrap();
    // Once the open path is gone (reaped when empty) and made again by the tenant, it locks.
    anonymous
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .delete(&format!("{path}/keep-open"), None)
        .await
        .unwrap();
    let _ = anonymous
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .delete(&path, None)
        .await;
    let got = tenant.lock("invoice_9").await.unwrap();
    assert!(got.is_held());
    assert_eq!(
        anonymous
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .delete(got.node_path(), None)
            .await,
        Err(zookeeper_client::Error::NoAuth),
        "the path the tenant made again protects its node"
    );
}
