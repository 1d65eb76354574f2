//! The Redis backend under Sentinel (`redis+sentinel://`), against the test kit's primary with
//! two replicas and three Sentinels: it follows the primary across failovers, reports every
//! hold lost to a failover before the new primary can grant the key to anyone else where it
//! can know (the Sentinels' `+switch-master`, a `-READONLY` reply, the break of its
//! connection), and hands out tokens above every token of the old primary; and bad URLs are
//! clear errors at connect.

use std::time::Duration;

use zklock::{Error, LockManager, LossReason};
use zklock_testkit::RedisSentinel;

const LEASE: Duration = Duration::from_secs(3);

fn url(redis: &RedisSentinel) -> String {
    let hosts: Vec<String> = redis.sentinel_addrs();
    format!(
        "redis+sentinel://{}/{}",
        hosts.join(","),
        redis.master_name()
    )
}

async fn manager(url: &str) -> LockManager {
    LockManager::builder(url)
        .redis(|r| r.lease(LEASE))
        .connect()
        .await
        .expect("connect through the Sentinels")
}

/// A manual failover: the holder's hold is lost (`Failover`), a new acquire is granted on the
/// new primary with a larger token, and two managers keep excluding each other there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_loses_the_hold_and_the_next_token_is_larger() {
    let redis = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start Redis with Sentinels (test kit)");
    let url = url(&redis);
    let a = manager(&url).await;
    let b = manager(&url).await;
    let held = a.lock("order-1").await.unwrap();
    let before = held.fencing_token();
    assert!(b.try_lock("order-1").await.unwrap().is_none());
    let old = redis.primary().unwrap();
    let new = tokio::task::spawn_blocking(move || {
        let new = redis.failover().unwrap();
        (redis, new)
    });
    let reason = tokio::time::timeout(Duration::from_secs(30), held.lost())
        .await
        .expect("the hold is reported lost after the failover");
    assert_eq!(reason, LossReason::Failover);
    let (redis, new) = new.await.unwrap();
    assert_ne!(old, new);
    drop(held);
    let again = tokio::time::timeout(Duration::from_secs(30), b.lock("order-1"))
        .await
        .expect("the lock is granted on the new primary")
        .unwrap();
    assert!(
        again.fencing_token() > before,
        "{:?} after {before:?}",
        again.fencing_token()
    );
    assert!(a.try_lock("order-1").await.unwrap().is_none());
    drop(again);
    drop(redis);
}

/// Bad Sentinel URLs are clear errors at connect, naming what is wrong and never a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sentinel_urls_are_clear_errors_at_connect() {
    let redis =
        tokio::task::spawn_blocking(|| RedisSentinel::builder().replicas(1).sentinels(1).start())
            .await
            .unwrap()
            .expect("start Redis with a Sentinel (test kit)");
    let sentinel = &redis.sentinel_addrs()[0];
    let err = LockManager::connect(&format!("redis+sentinel://u:hunter2@{sentinel}/nosuch"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(t) if t.contains("\"nosuch\"") && t.contains("SENTINEL MASTERS")),
        "{err}"
    );
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let data = redis.node_addr(redis.primary().unwrap());
    let err = LockManager::connect(&format!("redis+sentinel://{data}/zklock"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(t) if t.contains("not a Sentinel")),
        "{err}"
    );
    let err = LockManager::connect("redis+sentinel://127.0.0.1:1/zklock")
        .await
        .unwrap_err();
    assert!(matches!(&err, Error::Unreachable { .. }), "{err}");
    let err = LockManager::connect(&format!("redis+sentinel://{sentinel}"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(t) if t.contains("master")),
        "{err}"
    );
}
