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

/// `replica_acks`: a grant counts only once enough replicas acknowledged it. With one of the
/// two replicas frozen, an acquire that asks for both fails with an error that says how many
/// answered, and leaves nothing behind; one that asks for one replica is granted; once the
/// replica is back, both are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acks_count_a_grant_only_once_the_replicas_have_it() {
    let redis = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start Redis with Sentinels (test kit)");
    let url = url(&redis);
    let ack = Duration::from_millis(200);
    let both = LockManager::builder(&url)
        .redis(|r| r.lease(LEASE).replica_acks(2, ack))
        .connect()
        .await
        .unwrap();
    let one = LockManager::builder(&url)
        .redis(|r| r.lease(LEASE).replica_acks(1, ack))
        .connect()
        .await
        .unwrap();
    drop(both.lock("acked").await.expect("both replicas acknowledge"));
    both.flush().await;

    let primary = redis.primary().unwrap();
    let replica = (0..redis.len()).find(|&i| i != primary).unwrap();
    redis.pause(replica).unwrap();
    let err = both.lock("acked").await.unwrap_err();
    assert!(
        matches!(&err, Error::Server { .. }) && err.to_string().contains("only 1 of the 2"),
        "{err}"
    );
    both.flush().await;
    let left = redis.command(primary, &["KEYS", "zklock:lock:*"]).unwrap();
    assert_eq!(left.array().map(<[_]>::len), Some(0), "{left:?}");
    let held = one.lock("acked").await.expect("one replica acknowledges");
    drop(held);
    one.flush().await;
    redis.resume(replica).unwrap();
    drop(both.lock("acked").await.expect("both acknowledge again"));
}

/// A hold whose renewals too few replicas acknowledge is reported lost when the acknowledged
/// lease could run out, though the primary renewed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_renewals_do_not_keep_a_hold() {
    let redis = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start Redis with Sentinels (test kit)");
    let m = LockManager::builder(url(&redis))
        .redis(|r| r.lease(LEASE).replica_acks(2, Duration::from_millis(100)))
        .connect()
        .await
        .unwrap();
    let held = m.lock("renewed").await.unwrap();
    let primary = redis.primary().unwrap();
    let replica = (0..redis.len()).find(|&i| i != primary).unwrap();
    let paused = std::time::Instant::now();
    redis.pause(replica).unwrap();
    let reason = tokio::time::timeout(2 * LEASE, held.lost())
        .await
        .expect("the hold is lost once no renewal is acknowledged");
    redis.resume(replica).unwrap();
    assert_eq!(reason, LossReason::LeaseExpired);
    // Lost within one lease of the last acknowledged renewal, not at once.
    assert!(
        paused.elapsed() <= LEASE + Duration::from_millis(500),
        "{:?}",
        paused.elapsed()
    );
    assert!(paused.elapsed() >= LEASE / 2, "{:?}", paused.elapsed());
}

/// Settings of `replica_acks` that cannot work are refused at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_replica_acks_are_refused_at_connect() {
    for (n, timeout) in [
        (0, Duration::from_millis(100)),
        (1, Duration::ZERO),
        (1, LEASE / 3),
    ] {
        let err = LockManager::builder("redis+sentinel://127.0.0.1:1/zklock")
            .redis(|r| r.lease(LEASE).replica_acks(n, timeout))
            .connect()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Config(t) if t.contains("replica_acks")),
            "{n} {timeout:?}: {err}"
        );
    }
}

/// A server that turns replica under a hold (`REPLICAOF`, as an operator or a failover does)
/// refuses the next renewal with `-READONLY`: the hold is lost to a failover, on a plain
/// `redis://` URL too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_turned_replica_loses_its_holds_to_a_failover() {
    let a = zklock_testkit::RedisServer::start().unwrap();
    let b = zklock_testkit::RedisServer::start().unwrap();
    let m = LockManager::builder(a.url())
        .redis(|r| r.lease(LEASE))
        .connect()
        .await
        .unwrap();
    let held = m.lock("demoted").await.unwrap();
    let addr = b.url();
    let addr = addr.trim_start_matches("redis://").trim_end_matches('/');
    let (host, port) = addr.rsplit_once(':').unwrap();
    let client = redis::Client::open(a.url()).unwrap();
    let mut c = client
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg(host)
        .arg(port)
        .query_async(&mut c)
        .await
        .unwrap();
    let reason = tokio::time::timeout(LEASE, held.lost()).await.unwrap();
    assert_eq!(reason, LossReason::Failover);
}

/// A manager listens to one Sentinel for failovers while it lives, and its subscription ends
/// with it (no connection left behind per manager a process opened and closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sentinel_subscription_ends_with_the_manager() {
    let redis =
        tokio::task::spawn_blocking(|| RedisSentinel::builder().replicas(1).sentinels(1).start())
            .await
            .unwrap()
            .expect("start Redis with a Sentinel (test kit)");
    let subscribers = |redis: &RedisSentinel| {
        let list = redis
            .sentinel_command(0, &["CLIENT", "LIST", "TYPE", "pubsub"])
            .unwrap()
            .text()
            .unwrap_or_default();
        list.lines().filter(|l| l.contains("sub=1")).count()
    };
    let before = subscribers(&redis);
    let m = manager(&url(&redis)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while subscribers(&redis) != before + 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the manager never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(m);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while subscribers(&redis) != before {
        assert!(
            std::time::Instant::now() < deadline,
            "the subscription outlived its manager"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sentinels that ask for a password of their own: a manager given it with
/// `sentinel_password` connects, excludes, and listens to every Sentinel's `+switch-master`;
/// one without it, or with a wrong one, is refused at connect with an error that names the
/// setting and never the password. The option on a URL without Sentinels is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_with_a_password_of_their_own_take_sentinel_password() {
    let redis = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start Redis with Sentinels (test kit)");
    const SECRET: &str = "s3ntinel-secret";
    // Asked while the test kit can still ask the Sentinels (it has no password for them).
    let primary = redis.primary_addr().unwrap();
    for j in 0..redis.len() {
        redis
            .sentinel_command(
                j,
                &["ACL", "SETUSER", "default", "on", &format!(">{SECRET}")],
            )
            .expect("set the Sentinel's password");
    }
    let url = url(&redis);
    let with = |password: Option<&'static str>| {
        let url = url.clone();
        async move {
            LockManager::builder(url)
                .redis(move |r| match password {
                    Some(p) => r.lease(LEASE).sentinel_password(p),
                    None => r.lease(LEASE),
                })
                .connect()
                .await
        }
    };
    for password in [None, Some("wrong-password")] {
        match with(password).await {
            Err(Error::Config(text)) => {
                assert!(text.contains("sentinel_password"), "{text}");
                assert!(
                    !text.contains(SECRET) && !text.contains("wrong-password"),
                    "{text}"
                );
            }
            other => panic!("{password:?}: {:?}", other.map(|_| ())),
        }
    }
    let a = with(Some(SECRET))
        .await
        .expect("connect with the Sentinels' password");
    let b = with(Some(SECRET))
        .await
        .expect("connect with the Sentinels' password");
    let held = a.lock("order-3").await.unwrap();
    assert!(b.try_lock("order-3").await.unwrap().is_none());
    // Every Sentinel has both managers' `+switch-master` subscriptions (authenticated).
    for addr in redis.sentinel_addrs() {
        let client = redis::Client::open(format!("redis://:{SECRET}@{addr}/")).unwrap();
        let mut c = client
            .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            // Sentinels know no PUBSUB: their client list shows each subscriber (`sub=1`).
            let clients: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut c)
                .await
                .unwrap();
            let n = clients.lines().filter(|l| l.contains(" sub=1 ")).count();
            if n >= 2 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the Sentinel at {addr} has {n} +switch-master subscribers"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    held.release().await.unwrap();
    assert!(b.try_lock("order-3").await.unwrap().is_some());
    // The setting names Sentinels' credentials: a plain URL refuses it.
    let plain = LockManager::builder(format!("redis://{primary}/"))
        .redis(|r| r.sentinel_password("x"))
        .connect()
        .await;
    match plain {
        Err(Error::Config(text)) => assert!(text.contains("redis+sentinel://"), "{text}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}
