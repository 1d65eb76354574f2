//! The Redis backend on Redis Cluster (`redis+cluster://`), against the test kit's Cluster of 3
//! primaries (and their replicas where a test fails one over): every key of a lock in one
//! slot, locks spread over every primary, a failover of a slot's primary reported as a loss
//! with a larger token after it, operators' views over every primary, and bad URLs refused.

use std::collections::BTreeSet;
use std::time::Duration;

use zklock::{Error, LockManager, LossReason};
use zklock_testkit::RedisCluster;

const LEASE: Duration = Duration::from_secs(3);

fn url(cluster: &RedisCluster) -> String {
    format!("redis+cluster://{}", cluster.addrs().join(","))
}

async fn manager(url: &str) -> LockManager {
    LockManager::builder(url)
        .redis(|r| r.lease(LEASE))
        .connect()
        .await
        .expect("connect to the Cluster")
}

async fn start(replicas: usize) -> RedisCluster {
    tokio::task::spawn_blocking(move || RedisCluster::builder().replicas(replicas).start())
        .await
        .unwrap()
        .expect("start a Redis Cluster (test kit)")
}

/// Two managers exclude each other on keys spread over every primary, with increasing tokens,
/// each lock's keys in one slot; `ls` sees locks on every primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_spread_over_the_primaries_and_exclude() {
    let cluster = start(0).await;
    let url = url(&cluster);
    let a = manager(&url).await;
    let b = manager(&url).await;
    let mut nodes = BTreeSet::new();
    let mut guards = vec![];
    for i in 0..24 {
        let key = format!("sku_{i}");
        let first = a.lock(&key).await.unwrap();
        assert!(b.try_lock(&key).await.unwrap().is_none(), "{key}");
        let t1 = first.fencing_token();
        drop(first);
        let second = b.lock(&key).await.unwrap();
        assert!(second.fencing_token() > t1, "{key}");
        guards.push(second);
    }
    // Where the keys landed: every lock's keys in one slot, the locks over every primary.
    let primaries = cluster.primaries().unwrap();
    for &i in &primaries {
        let keys = cluster.command(i, &["KEYS", "zklock:lock:*"]).unwrap();
        for key in keys.array().unwrap_or(&[]) {
            let key = key.text().unwrap();
            let slot = cluster.slot(&key).unwrap();
            let fence = key.replacen("zklock:lock:", "zklock:fence:", 1);
            assert_eq!(cluster.slot(&fence).unwrap(), slot, "{key}");
            assert_eq!(cluster.node_for_key(&key).unwrap(), i, "{key}");
            nodes.insert(i);
        }
    }
    assert_eq!(
        nodes.len(),
        primaries.len(),
        "locks on {nodes:?} of {primaries:?}"
    );
    let listed = b.list("sku_").await.unwrap();
    assert_eq!(listed.len(), 24, "{listed:?}");
    drop(guards);
}

/// Bad Cluster URLs and mismatched deployments are clear errors at connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cluster_urls_are_clear_errors_at_connect() {
    let single = zklock_testkit::RedisServer::start().unwrap();
    let addr = single
        .url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_string();
    let err = LockManager::connect(&format!("redis+cluster://{addr}"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(t) if t.contains("without cluster support")),
        "{err}"
    );
    let err = LockManager::connect(&format!("redis+cluster://u:hunter2@{addr}"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(t) if t.contains("credentials")),
        "{err}"
    );
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let err = LockManager::connect("redis+cluster://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(matches!(&err, Error::Unreachable { .. }), "{err}");

    let cluster = start(0).await;
    // A plain URL of a Cluster node is refused with the form to give.
    let err = LockManager::connect(&cluster.urls()[0]).await.unwrap_err();
    assert!(
        matches!(&err, Error::Config(t) if t.contains("redis+cluster://")),
        "{err}"
    );
    // Slots without a primary.
    let primary = cluster.primaries().unwrap()[0];
    cluster
        .command(primary, &["CLUSTER", "DELSLOTSRANGE", "0", "99"])
        .unwrap();
    let err = LockManager::connect(&format!("redis+cluster://{}", cluster.addr(primary)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(t) if t.contains("100 of its 16384 slots")),
        "{err}"
    );
}

/// Fails the primary that holds the one lock key (`zklock:lock:*`) over to its replica
/// (`CLUSTER FAILOVER`): the Cluster back, the old primary, the replica that took over, and
/// the key.
async fn fail_over_the_locks_primary(
    cluster: RedisCluster,
) -> (RedisCluster, usize, usize, String) {
    let primary = primary_holding(&cluster, "zklock:lock:*");
    let key = cluster
        .command(primary, &["KEYS", "zklock:lock:*"])
        .unwrap();
    let key = key
        .array()
        .and_then(|a| a.first())
        .and_then(|k| k.text())
        .expect("the lock's key");
    let replica = cluster
        .replicas()
        .unwrap()
        .into_iter()
        .find(|&r| cluster.primary_of(r).unwrap() == Some(primary))
        .expect("a replica of the lock's primary");
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.failover(replica).unwrap();
        cluster
    })
    .await
    .unwrap();
    (cluster, primary, replica, key)
}

/// A failover of the primary that holds a lock's slot (`CLUSTER FAILOVER` on its replica):
/// the hold is lost (the old primary answers `-MOVED` for the slot now), and the next grant,
/// on the new primary, has a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_of_the_slots_primary_loses_the_hold_and_the_token_goes_on() {
    let cluster = start(1).await;
    let url = url(&cluster);
    let a = manager(&url).await;
    let b = manager(&url).await;
    let held = a.lock("order-7").await.unwrap();
    let before = held.fencing_token();
    let (cluster, _, replica, key) = fail_over_the_locks_primary(cluster).await;
    assert_eq!(cluster.node_for_key(&key).unwrap(), replica);
    let reason = tokio::time::timeout(2 * LEASE, held.lost())
        .await
        .expect("the hold is reported lost after the failover");
    assert!(
        matches!(reason, LossReason::Failover | LossReason::Disconnected),
        "{reason:?}"
    );
    drop(held);
    let again = tokio::time::timeout(4 * LEASE, b.lock("order-7"))
        .await
        .expect("granted on the new primary")
        .unwrap();
    assert!(again.fencing_token() > before);
    assert!(a.try_lock("order-7").await.unwrap().is_none());
}

/// The notify channels (`zklock:notify:<hub id>`) node `i` has subscribers for.
fn notify_channels(cluster: &RedisCluster, i: usize) -> BTreeSet<String> {
    let reply = cluster
        .command(i, &["PUBSUB", "CHANNELS", "zklock:notify:*"])
        .unwrap();
    reply
        .array()
        .unwrap_or(&[])
        .iter()
        .filter_map(|c| c.text())
        .collect()
}

/// Waits (at most 10 s) until every primary has subscribers for the same notify channels, and
/// there are some: each manager whose tasks wait listens on every primary, so that a
/// release's word reaches it from the node that published it, not over the Cluster bus.
async fn every_primary_listened(cluster: &RedisCluster) -> BTreeSet<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let primaries = cluster.primaries().unwrap();
        let sets: Vec<_> = primaries
            .iter()
            .map(|&i| notify_channels(cluster, i))
            .collect();
        if !sets[0].is_empty() && sets.iter().all(|s| *s == sets[0]) {
            return sets[0].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the primaries {primaries:?} listen for {sets:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A manager whose task waits listens for wake-ups on every primary, and after a failover on
/// the new primary, no longer on the demoted one; the waiter is then granted the lock on the
/// new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_manager_listens_on_every_primary_and_follows_a_failover() {
    let cluster = start(1).await;
    let url = url(&cluster);
    let a = manager(&url).await;
    let b = manager(&url).await;
    let held = a.lock("order-9").await.unwrap();
    let before = held.fencing_token();
    let waiting = tokio::spawn(async move {
        let guard = b.lock("order-9").await;
        (b, guard)
    });
    let listened = every_primary_listened(&cluster).await;
    let (cluster, primary, replica, _) = fail_over_the_locks_primary(cluster).await;
    let reason = tokio::time::timeout(2 * LEASE, held.lost())
        .await
        .expect("the hold is reported lost after the failover");
    assert!(
        matches!(reason, LossReason::Failover | LossReason::Disconnected),
        "{reason:?}"
    );
    drop(held);
    let (b, guard) = tokio::time::timeout(4 * LEASE, waiting)
        .await
        .expect("the waiter is granted the lock on the new primary")
        .unwrap();
    let guard = guard.unwrap();
    assert!(guard.fencing_token() > before);
    // The waiter's manager listens on the new primary, and no longer on the demoted one.
    let after = every_primary_listened(&cluster).await;
    assert!(
        cluster.primaries().unwrap().contains(&replica),
        "the replica took over"
    );
    // The waiter's hub is the one that listened before the failover.
    assert!(
        !after.is_disjoint(&listened),
        "{after:?} against {listened:?}"
    );
    let demoted = notify_channels(&cluster, primary);
    assert!(
        demoted.is_disjoint(&after),
        "the demoted node {primary} still has {demoted:?}"
    );
    drop(guard);
    drop(b);
}

/// The primary that holds a key matching `pattern`.
fn primary_holding(cluster: &RedisCluster, pattern: &str) -> usize {
    cluster
        .primaries()
        .unwrap()
        .into_iter()
        .find(|&i| {
            let keys = cluster.command(i, &["KEYS", pattern]).unwrap();
            keys.array().is_some_and(|a| !a.is_empty())
        })
        .unwrap_or_else(|| panic!("no primary holds {pattern}"))
}

/// A break of a manager's connections to one primary loses the holds on that primary only: a
/// hold on another primary is kept, renewed past several leases, and still excludes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_of_one_primarys_connections_loses_only_the_holds_on_it() {
    let cluster = start(0).await;
    let url = url(&cluster);
    let a = manager(&url).await;
    let b = manager(&url).await;
    // Two locks on two different primaries.
    let first = a.lock("crate-0").await.unwrap();
    let here = primary_holding(&cluster, "zklock:lock:*");
    let mut other = None;
    for i in 1..64 {
        let key = format!("crate-{i}");
        let guard = a.lock(&key).await.unwrap();
        let pattern = format!("zklock:lock:*{key}");
        if primary_holding(&cluster, &pattern) != here {
            other = Some((key, guard));
            break;
        }
    }
    let (other_key, kept) = other.expect("a key on another primary");
    // A waiter of `crate-0` in manager a, so that it listens (pub/sub) on every primary too.
    let waiting = {
        let a = a.clone();
        tokio::spawn(async move { a.lock_timeout("crate-0", 4 * LEASE).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Every client connection of the first lock's primary is cut (a's command and pub/sub
    // connections to it among them).
    cluster
        .command(here, &["CLIENT", "KILL", "TYPE", "normal"])
        .unwrap();
    cluster
        .command(here, &["CLIENT", "KILL", "TYPE", "pubsub"])
        .unwrap();
    let reason = tokio::time::timeout(2 * LEASE, first.lost())
        .await
        .expect("the hold on the cut primary is lost");
    assert_eq!(reason, LossReason::Disconnected);
    // The hold on the other primary outlives several leases, renewed, and still excludes.
    tokio::time::sleep(2 * LEASE).await;
    assert!(kept.is_held(), "the hold on the other primary was lost");
    assert!(b.try_lock(&other_key).await.unwrap().is_none());
    drop(first);
    let again = waiting.await.unwrap().expect("the waiter gets crate-0");
    drop(again);
    drop(kept);
    let next = b.lock(&other_key).await.unwrap();
    drop(next);
}
