//! What only the Redis backend has, against a real `redis-server` (the test kit's, on a free
//! port): its keys, a hold that can no longer renew reported lost before anyone else gets in
//! (a partition, a paused or restarted server), tokens above a lost fence counter, the
//! mutex's queue of waiting processes, and the linger of a mutex (kept after its last
//! release, given up when another process wants it). What every backend promises is in
//! `tests/behaviour/`.

#[path = "../common/mod.rs"]
mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use common::{redis_queue, redis_queued};
use zklock::{Error, LockManager, LossReason};
use zklock_testkit::{Proxy, RedisCluster, RedisSentinel, RedisServer};

/// The lease most tests run with: long enough that a busy 2-core machine never misses a
/// renewal, short enough for loss tests to be quick.
const LEASE: Duration = Duration::from_secs(3);

/// What a busy machine may add to a timer.
const SLACK: Duration = Duration::from_millis(250);

fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server (see the test kit's error)")
}

/// Makes managers that share one lock service (here: one Redis server).
type Factory = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = LockManager> + Send>> + Send + Sync>;

fn factory(url: String, lease: Duration) -> Factory {
    Arc::new(move || {
        let url = url.clone();
        Box::pin(async move {
            LockManager::builder(url)
                .redis(|r| r.lease(lease))
                .connect()
                .await
                .expect("connect to the test Redis")
        })
    })
}

/// Every key of the Redis backend on `url`, sorted.
async fn our_keys(url: &str) -> Vec<String> {
    let client = redis::Client::open(url).unwrap();
    let mut con = client
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("zklock:*")
        .query_async(&mut con)
        .await
        .unwrap();
    keys.sort();
    keys
}

/// Flushes `managers` (their background releases and undos done), then checks that nothing
/// of the Redis backend is left on `url` but the fencing counters.
async fn nothing_left(url: &str, managers: &[&LockManager]) {
    for m in managers {
        m.flush().await;
    }
    assert_eq!(leftovers(url).await, Vec::<String>::new());
}

/// Keys other than the fencing counters, which are kept for ever by design.
async fn leftovers(url: &str) -> Vec<String> {
    our_keys(url)
        .await
        .into_iter()
        .filter(|k| !k.starts_with("zklock:fence:"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_name_the_lock_path_and_the_holder() {
    let redis = server();
    let url = redis.url();
    let m = LockManager::builder(&url)
        .identity("test-7")
        .connect()
        .await
        .unwrap();
    let guard = m.lock("a/b").await.unwrap();
    assert_eq!(guard.node_path(), "zklock:lock:/zklock/locks/a%2Fb");
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    let value: String = redis::cmd("GET")
        .arg(guard.node_path())
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        value.contains(" id=test-7") && value.contains(" pid="),
        "{value}"
    );
    let fence: i64 = redis::cmd("GET")
        .arg("zklock:fence:/zklock/locks/a%2Fb")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(guard.fencing_token().grant(), fence);
    guard.release().await.unwrap();
    assert!(leftovers(&url).await.is_empty());
}

/// What only ZooKeeper has is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_only_features_are_refused() {
    let redis = server();
    let m = LockManager::connect(&redis.url()).await.unwrap();
    let err = m.revoke("k").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unsupported {
                backend: "redis",
                ..
            }
        ),
        "{err}"
    );
    // Another backend's settings would have no effect: refused, naming both backends.
    for err in [
        LockManager::builder(redis.url())
            .zookeeper(|zk| zk.revocable(true).digest_auth("u", "p"))
            .connect()
            .await
            .unwrap_err(),
        LockManager::builder(redis.url())
            .postgres(|pg| pg.lease(Duration::from_secs(3)))
            .connect()
            .await
            .unwrap_err(),
    ] {
        common::assert_refused_as_another_backends(&err, "Redis", "redis");
    }
    let err = LockManager::builder("127.0.0.1:2181")
        .redis(|r| r.lease(Duration::from_secs(3)))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(text) if text.contains("Redis settings were given")
            && text.contains("names ZooKeeper")),
        "{err}"
    );
    let err = LockManager::builder(redis.url())
        .redis(|r| r.lease(Duration::from_millis(10)))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(text) if text.contains("give at least 100ms")),
        "{err}"
    );
    assert!(format!("{m:?}").contains("redis"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_redis_error() {
    let redis = server();
    let url = redis.url();
    drop(redis);
    let err = LockManager::connect(&url).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Server {
                backend: "redis",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_retryable());
}

/// A `redis://` URL that reaches a replica is refused at connect, naming the primary: a
/// replica refuses every write, and one promoted later would not have every lease. The same
/// URL works once the server is a primary again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_refused_at_connect_naming_its_primary() {
    let primary = server();
    let replica = server();
    let mut admin = redis::Client::open(replica.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port())
        .query_async(&mut admin)
        .await
        .unwrap();
    let err = LockManager::connect(&replica.url()).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::Config(_)), "{err}");
    assert!(text.contains("replica"), "{text}");
    assert!(
        text.contains(&format!("127.0.0.1:{}", primary.port())),
        "{text}"
    );
    assert!(!err.is_retryable(), "{text}");

    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut admin)
        .await
        .unwrap();
    let m = LockManager::connect(&replica.url()).await.unwrap();
    drop(m.lock("after_promotion").await.unwrap());
}

/// A `redis://` URL that reaches a Sentinel or a Redis Cluster node is refused at connect,
/// saying what to give instead; a replica of the Sentinel's set is refused naming the primary
/// the Sentinel reports, and the primary itself is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_and_a_cluster_node_are_refused_at_connect() {
    let sentinel = RedisSentinel::builder()
        .replicas(1)
        .sentinels(1)
        .start()
        .unwrap();
    let err = LockManager::connect(&sentinel.sentinel_urls()[0])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(text) if text.contains("Sentinel") && text.contains("give")),
        "{err}"
    );
    let primary = sentinel.primary().unwrap();
    let replica = 1 - primary;
    let err = LockManager::connect(&format!("redis://{}/", sentinel.node_addr(replica)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(text) if text.contains(&sentinel.primary_addr().unwrap())),
        "{err}"
    );
    let m = LockManager::connect(&format!("redis://{}/", sentinel.node_addr(primary)))
        .await
        .unwrap();
    drop(m.lock("on_the_primary").await.unwrap());

    let cluster = RedisCluster::builder()
        .primaries(3)
        .replicas(0)
        .start()
        .unwrap();
    for url in cluster.urls() {
        let err = LockManager::connect(&url).await.unwrap_err();
        assert!(
            matches!(&err, Error::Config(text) if text.contains("Cluster") && text.contains("give")),
            "{url}: {err}"
        );
    }
}

/// A holder cut off from Redis (a partition: its connection through a proxy goes silent)
/// reports its hold lost when the lease could have run out, before the server lets the next
/// holder in; the next holder's token is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_lost_before_the_next_holder_gets_in() {
    let redis = server();
    let proxy = Proxy::start(&format!("127.0.0.1:{}", redis.port())).unwrap();
    let lease = Duration::from_secs(1);
    let holder = LockManager::builder(format!("redis://{}/", proxy.connect_string()))
        .redis(|r| r.lease(lease))
        .connect()
        .await
        .unwrap();
    let next = LockManager::builder(redis.url())
        .redis(|r| r.lease(lease))
        .connect()
        .await
        .unwrap();
    let guard = holder.lock("part").await.unwrap();
    let first = guard.fencing_token();
    // Renewals keep it alive past several leases.
    tokio::time::sleep(lease * 2).await;
    assert!(guard.is_held());
    let waiter = tokio::spawn(async move {
        let g = next.lock("part").await.unwrap();
        (std::time::Instant::now(), g.fencing_token(), g)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.blackhole();
    let cut = std::time::Instant::now();
    let reason = tokio::time::timeout(lease * 3, guard.lost())
        .await
        .expect("the hold must be reported lost");
    let lost_at = std::time::Instant::now();
    assert_eq!(reason, LossReason::LeaseExpired);
    assert!(!guard.is_held());
    // By the lease after the last renewal went out (before the cut), give or take scheduling.
    let after = lost_at.duration_since(cut);
    assert!(after <= lease + SLACK, "lost only after {after:?}");
    let (got_at, second, g) = tokio::time::timeout(lease * 5, waiter)
        .await
        .expect("the next holder gets in once the lease ran out")
        .unwrap();
    eprintln!(
        "lost {:?} after the cut; the next holder got in {:?} after the loss",
        lost_at.duration_since(cut),
        got_at.checked_duration_since(lost_at)
    );
    assert!(
        lost_at < got_at,
        "the loss must be reported before the next holder gets in (it came {:?} after)",
        lost_at.duration_since(got_at)
    );
    assert!(second > first, "{second} after {first}");
    drop(g);
    proxy.heal();
    drop(guard);
}

/// The Redis server frozen (SIGSTOP) past the lease: the holder's renewal gets no answer, so
/// its hold is reported lost; once the server runs again the lease has run out on its clock,
/// and the next holder gets in with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_makes_the_holder_lost_and_the_next_token_larger() {
    let redis = server();
    let lease = Duration::from_secs(1);
    let f = factory(redis.url(), lease);
    let (holder, next) = (f().await, f().await);
    let guard = holder.lock("frozen").await.unwrap();
    let first = guard.fencing_token();
    let body = holder.with_lock("frozen-body", async {
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
    tokio::pin!(body);
    // Let the body's hold be granted before the pause.
    let _ = tokio::time::timeout(Duration::from_millis(200), &mut body).await;
    redis.pause().unwrap();
    let paused = std::time::Instant::now();
    let reason = tokio::time::timeout(lease * 3, guard.lost())
        .await
        .expect("lost while the server is paused");
    assert_eq!(reason, LossReason::LeaseExpired);
    let lost_after = paused.elapsed();
    assert!(lost_after <= lease + SLACK, "{lost_after:?}");
    // with_lock aborts its body on the loss.
    let aborted = tokio::time::timeout(lease * 3, &mut body)
        .await
        .expect("the body is aborted");
    assert!(
        matches!(
            aborted,
            Err(Error::LockLost {
                reason: LossReason::LeaseExpired,
                ..
            })
        ),
        "{aborted:?}"
    );
    tokio::time::sleep(lease).await;
    redis.resume().unwrap();
    let second = next
        .lock_timeout("frozen", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(second.fencing_token() > first);
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, Error::LockLost { .. }), "{err}");
    // The lost holder's release did not touch the next holder's key.
    assert!(second.is_held());
    second.release().await.unwrap();
}

/// A server restart (nothing persisted) is a failed renewal: the hold is lost at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_makes_the_holder_lost() {
    let mut redis = server();
    let lease = Duration::from_secs(2);
    let m = factory(redis.url(), lease)().await;
    let guard = m.lock("restart").await.unwrap();
    redis.restart().unwrap();
    let reason = tokio::time::timeout(lease * 2, guard.lost())
        .await
        .expect("lost after the restart");
    assert!(
        matches!(reason, LossReason::Disconnected | LossReason::NodeDeleted),
        "{reason}"
    );
    drop(guard);
    // The manager reconnects for the next acquire.
    let again = m
        .lock_timeout("restart", Duration::from_secs(5))
        .await
        .unwrap();
    again.release().await.unwrap();
}

#[zklock::distributed_lock("global_{id}")]
async fn through_the_global_manager(id: u32) -> Result<zklock::FencingToken, Error> {
    let _ = id;
    Ok(zklock::current_fencing_token().expect("in a frame"))
}

/// `ZKLOCK_CONNECT=redis://...` makes the global manager (and the attribute without
/// `manager = ...`) run on Redis. The only test of this binary that uses the global manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_manager_from_a_redis_url() {
    let redis = server();
    std::env::set_var("ZKLOCK_CONNECT", redis.url());
    let global = zklock::global().await.unwrap();
    assert!(format!("{global:?}").contains("redis"));
    let first = through_the_global_manager(1).await.unwrap();
    let second = through_the_global_manager(1).await.unwrap();
    assert!(second > first);
    global.flush().await;
    assert!(leftovers(&redis.url()).await.is_empty());
}

/// The fence counter lost (a restart without persistence, here: deleted): the next token is
/// still larger than every token before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_even_when_the_fence_counter_is_lost() {
    let mut redis = server();
    let m = factory(redis.url(), LEASE)().await;
    let mut last = m.lock("fence").await.unwrap().fencing_token();
    for _ in 0..3 {
        let t = m.lock("fence").await.unwrap().fencing_token();
        assert!(t > last);
        last = t;
    }
    m.flush().await;
    redis.restart().unwrap();
    let again = m
        .lock_timeout("fence", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        again.fencing_token() > last,
        "{} after {last}",
        again.fencing_token()
    );
}

/// `lock_all` takes locks on Redis in one global order: two managers asking for the same two
/// keys in opposite orders do not deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_in_opposite_orders() {
    use zklock::LockSpec;
    let redis = server();
    let f = factory(redis.url(), LEASE);
    let (a, b) = (f().await, f().await);
    let mut tasks = vec![];
    for (m, keys) in [(a, ["x", "y"]), (b, ["y", "x"])] {
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let both = m
                    .lock_all(keys.map(LockSpec::mutex), Some(Duration::from_secs(10)))
                    .await
                    .unwrap();
                drop(both);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Processes waiting for a mutex get it in the order they asked (their first refused
/// attempt), one release waking the next: three managers queue behind a holder, one at a
/// time, and get in in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_processes_get_a_mutex_in_the_order_they_asked() {
    let redis = server();
    let url = redis.url();
    let f = factory(url.clone(), LEASE);
    let holder = f().await;
    let held = holder.lock("fifo").await.unwrap();
    let order: Arc<std::sync::Mutex<Vec<usize>>> = Arc::default();
    let mut tasks = vec![];
    for i in 0..3 {
        let (m, order) = (f().await, order.clone());
        tasks.push(tokio::spawn(async move {
            let g = m.lock("fifo").await.unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
            m.flush().await;
        }));
        redis_queued(&url, "fifo", i + 1).await;
    }
    held.release().await.unwrap();
    for t in tasks {
        tokio::time::timeout(LEASE, t)
            .await
            .expect("every waiter gets in")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    nothing_left(&url, &[&holder]).await;
}

/// A queued waiter that stops answering (its connections go silent through a proxy, as a
/// crashed or frozen process's would) does not hold up the processes behind it for longer
/// than its liveness in the queue (the waiter TTL: lease/3, here 1 s): the release's word to
/// it is lost, and the next waiter gets in on its own refresh once the silent one has dropped
/// out, long before any lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_waiter_at_the_head_of_the_queue_does_not_block_the_next() {
    let redis = server();
    let url = redis.url();
    let proxy = Proxy::start(&format!("127.0.0.1:{}", redis.port())).unwrap();
    let f = factory(url.clone(), LEASE);
    let holder = f().await;
    let held = holder.lock("silent").await.unwrap();
    let silent = LockManager::builder(format!("redis://{}/", proxy.connect_string()))
        .redis(|r| r.lease(LEASE))
        .connect()
        .await
        .unwrap();
    let silent_task = tokio::spawn(async move {
        let g = silent.lock("silent").await;
        (g, silent)
    });
    redis_queued(&url, "silent", 1).await;
    let next = f().await;
    let next_task = tokio::spawn(async move {
        let g = next.lock("silent").await.unwrap();
        (std::time::Instant::now(), g)
    });
    redis_queued(&url, "silent", 2).await;
    proxy.blackhole();
    let released = std::time::Instant::now();
    held.release().await.unwrap();
    let waiter_ttl = LEASE / 3;
    let (got, g) = tokio::time::timeout(waiter_ttl * 2 + SLACK, next_task)
        .await
        .expect("the next waiter gets in once the silent one dropped out")
        .unwrap();
    eprintln!(
        "the next waiter got in {:?} after the release",
        got - released
    );
    // The silent one is out of the queue, and does not hold the key.
    assert_eq!(redis_queue(&url, "silent").await.len(), 0);
    drop(g);
    // Back in touch, it queues again and gets in.
    proxy.heal();
    let (g, silent) = tokio::time::timeout(LEASE * 3, silent_task)
        .await
        .expect("the silent waiter gets in once healed")
        .unwrap();
    g.unwrap().release().await.unwrap();
    silent.flush().await;
}

/// A queued waiter that gives up (its timeout ends) leaves the queue, and a waiter behind it
/// is woken by the next release as if it had never been there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_queue() {
    let redis = server();
    let url = redis.url();
    let f = factory(url.clone(), LEASE);
    let (holder, quitter, patient) = (f().await, f().await, f().await);
    let held = holder.lock("quit").await.unwrap();
    let quit = tokio::spawn(async move {
        let r = quitter
            .lock_timeout("quit", Duration::from_millis(300))
            .await;
        quitter.flush().await;
        r.map(|_| ())
    });
    redis_queued(&url, "quit", 1).await;
    let wait = tokio::spawn(async move {
        let g = patient.lock("quit").await.unwrap();
        drop(g);
        patient.flush().await;
    });
    redis_queued(&url, "quit", 2).await;
    assert!(quit.await.unwrap().is_err(), "the lock is held: a timeout");
    assert_eq!(
        redis_queue(&url, "quit").await.len(),
        1,
        "only the patient one waits"
    );
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_millis(500), wait)
        .await
        .expect("the release wakes the patient waiter")
        .unwrap();
    nothing_left(&url, &[&holder]).await;
}

/// A try never queues, and is refused while others wait even if the key is free for a moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_never_queues() {
    let redis = server();
    let url = redis.url();
    let f = factory(url.clone(), LEASE);
    let (a, b) = (f().await, f().await);
    let held = a.lock("try").await.unwrap();
    assert!(b.try_lock("try").await.unwrap().is_none());
    assert!(redis_queue(&url, "try").await.is_empty());
    drop(held);
    a.flush().await;
    assert!(b.try_lock("try").await.unwrap().is_some());
}

/// A hand-over's word that arrives late — after the short lease it gave ran out and someone
/// else took the key — must not make the waiter a second holder: a hand-over counts only if
/// its token exceeds the lock's last token when the waiter was last refused. The late word is
/// forged here (a `PUBLISH` on the waiter's own channel, with an old token), as a pub/sub
/// connection that lagged would deliver it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_hand_over_does_not_make_a_second_holder() {
    let redis = server();
    let url = redis.url();
    let f = factory(url.clone(), LEASE);
    let (holder, waiter) = (f().await, f().await);
    let held = holder.lock("late").await.unwrap();
    let waiting = tokio::spawn(async move {
        let g = waiter.lock("late").await.unwrap();
        let token = g.fencing_token();
        g.release().await.unwrap();
        waiter.flush().await;
        token
    });
    redis_queued(&url, "late", 1).await;
    let member = redis_queue(&url, "late").await.remove(0);
    let (hub, id) = member.split_once(' ').expect("<hub id> <holder id>");
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    // The waiter queued itself; its process subscribes to its channel beside that (a word
    // missed before the subscription is covered by a new attempt once it is live). Forge the
    // word only once it can be heard.
    let channel = format!("zklock:notify:{hub}");
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let (_, n): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut con)
                .await
                .unwrap();
            if n > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the waiter's process subscribes to its channel");
    let receivers: i64 = redis::cmd("PUBLISH")
        .arg(&channel)
        .arg(format!("zklock:wake:/zklock/locks/late\n1\n{id}"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(receivers, 1, "the waiter's process listens on its channel");
    // Woken, it must try again and be refused (the key is held), not take the stale word.
    tokio::time::sleep(LEASE / 3).await;
    assert!(
        !waiting.is_finished(),
        "a late hand-over made a second holder"
    );
    assert!(held.is_held());
    let held_token = held.fencing_token();
    held.release().await.unwrap();
    let token = tokio::time::timeout(LEASE, waiting)
        .await
        .expect("the waiter gets in after the release")
        .unwrap();
    assert!(token > held_token);
    holder.flush().await;
}

/// A manager that keeps a mutex lingering for 30 s after its last release: far longer than
/// any test below waits, so a newcomer that gets in did so because the linger was given up.
async fn lingering(url: &str) -> LockManager {
    LockManager::builder(url)
        .redis(|r| r.lease(LEASE))
        .linger(Duration::from_secs(30))
        .connect()
        .await
        .expect("connect to the test Redis")
}

/// Who holds `key`'s mutex on Redis (the key's value: a holder id), if anyone.
async fn holder_of(url: &str, key: &str) -> Option<String> {
    let client = redis::Client::open(url).unwrap();
    let mut con = client
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    redis::cmd("GET")
        .arg(format!("zklock:lock:/zklock/locks/{key}"))
        .query_async(&mut con)
        .await
        .unwrap()
}

/// The server's `MONITOR` stream (every command it runs, those of scripts included), and a
/// wait for the first line that contains all of `parts`.
struct Monitor(std::pin::Pin<Box<dyn futures::Stream<Item = String> + Send>>);

impl Monitor {
    async fn start(url: &str) -> Monitor {
        let client = redis::Client::open(url).unwrap();
        let monitor = client.get_async_monitor().await.unwrap();
        Monitor(Box::pin(monitor.into_on_message::<String>()))
    }

    async fn until(&mut self, what: &str, parts: &[&str]) {
        use futures::StreamExt;
        tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(line) = self.0.next().await {
                if parts.iter().all(|p| line.contains(p)) {
                    return;
                }
            }
            panic!("the MONITOR stream ended before {what}");
        })
        .await
        .unwrap_or_else(|_| panic!("never saw {what}"));
    }

    /// Until a lingering hold of `key` has looked at its queue (`scripts::OTHERS_QUEUED`, whose
    /// `ZRANGE` of the queue no uncontended acquire or release runs): from then on, only the
    /// first waiter's word can tell it someone wants the key.
    async fn until_checked(&mut self, key: &str) {
        let queue = format!("\"ZRANGE\" \"zklock:queue:/zklock/locks/{key}\" \"0\" \"0\"");
        self.until(
            "the lingering hold's look at its queue",
            &["[0 lua]", &queue],
        )
        .await;
    }
}

/// The linger on Redis: after its last release a manager keeps the mutex key, takes it again
/// as a local handoff (no request: the token's server part stays, its local part goes up), and
/// gives it up at once when another process queues for it (the first waiter's word, sent by
/// its refused attempt to the holder's hub), long before the linger runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_mutex_is_taken_again_and_given_up_when_another_process_queues() {
    let redis = server();
    let url = redis.url();
    let mut monitor = Monitor::start(&url).await;
    let a = lingering(&url).await;
    let b = factory(url.clone(), LEASE)().await;
    let first = a.lock("lg").await.unwrap();
    let t1 = first.fencing_token();
    first.release().await.unwrap();
    monitor.until_checked("lg").await;
    let kept = holder_of(&url, "lg").await.expect("the key lingers");
    assert!(kept.contains(" hub="), "{kept}");

    let g = a.lock("lg").await.unwrap();
    let t2 = g.fencing_token();
    assert_eq!(t2.grant(), t1.grant(), "taken again with no request");
    assert!(t2 > t1, "{t1} {t2}");
    g.release().await.unwrap();
    assert_eq!(holder_of(&url, "lg").await, Some(kept), "the key lingers");

    let started = std::time::Instant::now();
    let by_b = tokio::time::timeout(Duration::from_secs(5), b.lock("lg"))
        .await
        .expect("the lingering key was given up")
        .unwrap();
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    assert!(by_b.fencing_token() > t2);
    let t3 = by_b.fencing_token();
    by_b.release().await.unwrap();
    let g = a.lock("lg").await.unwrap();
    assert!(g.fencing_token() > t3);
    drop(g);
    nothing_left(&url, &[&a, &b]).await;
}

/// A process already queued when the hold first lingers sent its word before anyone listened
/// (it is lost): the hold's one look at the queue finds it, and the key goes to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_queued_before_the_linger_gets_the_key() {
    let redis = server();
    let url = redis.url();
    let a = lingering(&url).await;
    let b = factory(url.clone(), LEASE)().await;
    let held = a.lock("early").await.unwrap();
    let t1 = held.fencing_token();
    let waiting = tokio::spawn(async move {
        let g = b.lock("early").await.unwrap();
        let token = g.fencing_token();
        g.release().await.unwrap();
        b.flush().await;
        token
    });
    redis_queued(&url, "early", 1).await;
    // Released with a waiter on Redis and none in this process: it lingers only until its
    // look at the queue answers.
    drop(held);
    let token = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the queued waiter gets the key")
        .unwrap();
    assert!(token > t1);
    nothing_left(&url, &[&a]).await;
}

/// A try from another process is refused while the key lingers, and tells the holder: the key
/// is given up, and a later try gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_from_another_process_ends_the_linger() {
    let redis = server();
    let url = redis.url();
    let mut monitor = Monitor::start(&url).await;
    let a = lingering(&url).await;
    let b = factory(url.clone(), LEASE)().await;
    a.lock("tried").await.unwrap().release().await.unwrap();
    monitor.until_checked("tried").await;
    assert!(b.try_lock("tried").await.unwrap().is_none(), "it lingers");
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let g = loop {
        if let Some(g) = b.try_lock("tried").await.unwrap() {
            break g;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a try did not end the linger"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(g);
    nothing_left(&url, &[&b, &a]).await;
}

/// The connection that would carry the first waiter's word breaks while a key lingers (the
/// server closes every pub/sub client): a word may have been lost, so the key is given up at
/// once instead of being kept until the linger runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_mutex_is_given_up_when_its_pubsub_connection_breaks() {
    let redis = server();
    let url = redis.url();
    let mut monitor = Monitor::start(&url).await;
    let a = lingering(&url).await;
    a.lock("cut").await.unwrap().release().await.unwrap();
    monitor.until_checked("cut").await;
    assert!(holder_of(&url, "cut").await.is_some(), "it lingers");
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(killed, 1, "the manager's hub is the one pub/sub client");
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while holder_of(&url, "cut").await.is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "still lingering after its pub/sub connection broke"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.flush().await;
}
