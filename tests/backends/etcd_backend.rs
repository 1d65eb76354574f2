//! The etcd backend against a real etcd from the test kit: connect errors, exclusion with
//! increasing tokens, etcd's own key layout, and what a lost lease or a deleted key does.

use std::time::Duration;

use zklock::{Error, LockManager};
use zklock_testkit::EtcdServer;

fn etcd() -> EtcdServer {
    EtcdServer::start().expect("start etcd (test kit)")
}

async fn manager(etcd: &EtcdServer) -> LockManager {
    LockManager::builder(etcd.url())
        .etcd(|e| e.lease(Duration::from_secs(3)))
        .connect()
        .await
        .expect("connect to etcd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_exclude_each_other_with_increasing_tokens() {
    let etcd = etcd();
    let (a, b) = (manager(&etcd).await, manager(&etcd).await);
    let first = a.lock("sku_7").await.unwrap();
    assert!(b.try_lock("sku_7").await.unwrap().is_none());
    let waiting = tokio::spawn(async move {
        let g = b.lock("sku_7").await.unwrap();
        let t = g.fencing_token();
        drop(g);
        b.flush().await;
        t
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    let t1 = first.fencing_token();
    drop(first);
    let t2 = waiting.await.unwrap();
    assert!(t2 > t1, "{t2:?} > {t1:?}");
    a.flush().await;
    let left = etcd
        .etcdctl(&["get", "--prefix", "/zklock", "--keys-only"])
        .unwrap();
    assert!(left.trim().is_empty(), "left behind: {left}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_member_is_reported_in_about_a_second() {
    let started = std::time::Instant::now();
    let err = LockManager::connect("etcd://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
