//! Loss is reported, never hidden: session expiry and a deleted node fire `lost()`, the next
//! holder gets in with a larger token, and a waiter whose session expires gets an error.

use crate::common;

use std::time::Duration;

use common::*;
use zklock::{Error, LossReason};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_session_expiry_fires_lost_and_lets_the_next_in() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let held = a.lock("exp").await.unwrap();
    let old_token = held.fencing_token();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("exp").await.unwrap() }
    });
    until_children(&a, &a.path_of("exp").unwrap(), 2).await;
    assert!(held.is_held());

    expire_session(&a, &zk.connect_string()).await;
    let reason = tokio::time::timeout(Duration::from_secs(20), held.lost())
        .await
        .expect("lost() must fire");
    assert!(
        matches!(
            reason,
            LossReason::SessionExpired | LossReason::Disconnected | LossReason::NodeDeleted
        ),
        "{reason:?}"
    );
    assert!(!held.is_held());

    let next = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("next holder gets in")
        .unwrap();
    assert!(
        next.fencing_token() > old_token,
        "token must increase across holders"
    );
    let released = held.release().await;
    assert!(
        matches!(released, Err(Error::LockLost { .. })),
        "releasing a lost hold says so: {released:?}"
    );
    // The manager opened a new session and locks again.
    drop(next);
    let again = tokio::time::timeout(Duration::from_secs(20), a.lock("exp"))
        .await
        .unwrap()
        .unwrap();
    assert!(again.is_held());
}

#[tokio::test]
async fn deleting_the_node_fires_lost() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let ops = manager(&zk.connect_string()).await;
    let held = a.lock("del").await.unwrap();
    delete_and_see_it_lost(&ops, &held).await;
    assert_eq!(held.loss_reason(), Some(LossReason::NodeDeleted));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_aborts_the_body_when_the_hold_is_lost() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let ops = manager(&zk.connect_string()).await;
    let path = a.path_of("abort").unwrap();
    let result = a
        .with_lock("abort", async {
            let node = children(&ops, &path).await.pop().unwrap();
            ops.client::<zookeeper_client::Client>()
                .expect("a ZooKeeper manager")
                .delete(&format!("{path}/{node}"), None)
                .await
                .unwrap();
            std::future::pending::<()>().await
        })
        .await;
    assert!(
        matches!(
            result,
            Err(Error::LockLost {
                reason: LossReason::NodeDeleted,
                ..
            })
        ),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_whose_session_expires_gets_an_error_and_leaves_nothing() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let path = a.path_of("wexp").unwrap();
    let held = a.lock("wexp").await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.lock("wexp").await }
    });
    until_children(&a, &path, 2).await;
    expire_session(&b, &zk.connect_string()).await;
    let err = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        // Told by the session's end, or first by its node's deletion (the test kit closes the
        // session through a second handle, which may find the first still attached).
        matches!(
            err,
            Error::SessionExpired | Error::Closed | Error::Dequeued { .. }
        ),
        "{err}"
    );
    assert_eq!(
        children(&a, &path).await.len(),
        1,
        "only the holder remains"
    );
    drop(held);
}

#[tokio::test]
async fn unreachable_server_is_a_clear_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let err = zklock::LockManager::builder(format!("127.0.0.1:{port}"))
        .zookeeper(|zk| zk.session_timeout(Duration::from_secs(2)))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    // Nothing listens on the port: refused, and said so before the connect timeout.
    assert!(matches!(err, Error::Refused { .. }), "{err}");
    assert!(err.to_string().contains("check the ports"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnection_loses_the_hold_and_drop_still_deletes_the_node_after_reconnect() {
    let mut zk = server();
    let a = manager_with(&zk.connect_string(), Duration::from_secs(20)).await;
    let path = a.path_of("disc").unwrap();
    let held = a.lock("disc").await.unwrap();
    zk.stop().unwrap();
    // Curator's advice, the default policy: a suspended connection is a lost hold.
    let reason = tokio::time::timeout(Duration::from_secs(15), held.lost())
        .await
        .expect("lost() on disconnect");
    assert_eq!(reason, LossReason::Disconnected);
    // Dropped while disconnected: the delete is retried once the connection is back.
    drop(held);
    zk.restart().unwrap();
    tokio::time::timeout(Duration::from_secs(30), a.flush())
        .await
        .expect("the release finishes");
    assert!(
        children(&a, &path).await.is_empty(),
        "the node was deleted after reconnecting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grace_policy_keeps_the_hold_through_a_short_disconnection() {
    let mut zk = server();
    let a = zklock::LockManager::builder(zk.connect_string())
        .zookeeper(|zk| {
            zk.session_timeout(Duration::from_secs(20))
                .disconnect_policy(zklock::DisconnectPolicy::Grace(Duration::from_secs(10)))
        })
        .connect()
        .await
        .unwrap();
    let held = a.lock("grace").await.unwrap();
    zk.stop().unwrap();
    zk.restart().unwrap();
    // Prove the session is back (a request answered) before judging the hold.
    let client = a
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
    let mut answered = false;
    for _ in 0..100 {
        if client
            .check_stat(held.node_path())
            .await
            .map(|s| s.is_some())
            .unwrap_or(false)
        {
            answered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered, "the session did not come back");
    assert!(
        held.is_held(),
        "a short disconnection within the grace keeps the hold: {:?}",
        held.loss_reason()
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_grace_longer_than_the_session_can_keep_is_refused() {
    let zk = server();
    let err = zklock::LockManager::builder(zk.connect_string())
        .zookeeper(|zk| {
            zk.session_timeout(Duration::from_secs(4))
                .disconnect_policy(zklock::DisconnectPolicy::Grace(Duration::from_secs(3)))
        })
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("grace")),
        "{err}"
    );
}
