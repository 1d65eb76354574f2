//! TLS to Redis under Sentinel (`rediss+sentinel://`) and to Redis Cluster
//! (`rediss+cluster://`), against the test kit's deployments serving TLS only: every data node,
//! Sentinel and Cluster node on a TLS port, replication, the Sentinels' links and the cluster
//! bus over TLS, client certificates required.
//!
//! Under Sentinel: two managers hold and hand over a lock on the primary with increasing
//! tokens, a hold across a failover is lost to it as the Sentinels announce it, and the lock is
//! held and handed over again on the new primary, every connection (to the Sentinels, their
//! `+switch-master` subscriptions and the primary they name) over TLS. On a Cluster: a key
//! on each primary held at once and handed over, tokens increasing per key, every node checked
//! against one `Tls::server_name` instead of the address it announces, and a failover followed
//! to the replica that took over (a hold lost to it, the key taken again there). On both,
//! `connect` fails within its timeout with `Error::Tls` naming one of the deployment's servers
//! when the client trusts another CA, checks a name their certificates do not list, or gives no
//! client certificate (also with the URL's last server stopped); a plaintext URL to the TLS-only
//! deployment fails within the timeout with `Error::Unreachable`, and so does a TLS URL nobody
//! answers, named as given.

use std::time::{Duration, Instant};

use zklock::{Error, FencingToken, LockManager, LossReason, Tls};
use zklock_testkit::{Certs, ClientAuth, RedisCluster, RedisSentinel};

use crate::cluster::{keys_per_primary, lock_key, replica_of};
use crate::tls_servers::{blocking, certs, fails_in_time, mutual, redis};

/// The lock the Sentinel scenario hands over.
const KEY: &str = "tls_ha_key";
/// How long an acquire may wait for the managers to follow a failover.
const FOLLOW: Duration = Duration::from_secs(30);
/// How long after the Sentinels agree on a new primary a hold may take to be lost to it.
const ANNOUNCED: Duration = Duration::from_secs(5);

fn sentinel_with_tls(certs: &Certs) -> RedisSentinel {
    blocking(|| {
        RedisSentinel::builder()
            .tls(certs, ClientAuth::Required)
            .start()
    })
    .expect("start Redis with Sentinels in TLS mode")
}

fn cluster_with_tls(certs: &Certs) -> RedisCluster {
    blocking(|| {
        RedisCluster::builder()
            .tls(certs, ClientAuth::Required)
            .start()
    })
    .expect("start a Redis Cluster in TLS mode")
}

/// The kit's CA given as PEM text, and its client certificate.
fn mutual_by_pem(certs: &Certs) -> Tls {
    Tls::new()
        .ca_pem(certs.ca_pem())
        .client_cert_files(certs.client_cert_path(), certs.client_key_path())
}

/// `a` takes `key` (within [`FOLLOW`]) while `b` is kept out, `while_held` looks at the
/// servers, `b` queues for it, and `a`'s release hands it to `b`: both grants' tokens, strictly
/// increasing.
async fn hand_over(
    a: &LockManager,
    b: &LockManager,
    key: &str,
    while_held: impl FnOnce(),
) -> [FencingToken; 2] {
    let held = a.lock_timeout(key, FOLLOW).await.expect("granted over TLS");
    assert!(b.try_lock(key).await.unwrap().is_none(), "excluded");
    blocking(while_held);
    let waiter = {
        let (b, key) = (b.clone(), key.to_string());
        tokio::spawn(async move { b.lock_timeout(&key, FOLLOW).await })
    };
    one_holder_one_waiter(a, key).await;
    let first = held.fencing_token();
    held.release().await.unwrap();
    let next = waiter.await.unwrap().expect("handed over to the waiter");
    let second = next.fencing_token();
    assert!(second > first, "{second:?} after {first:?}");
    next.release().await.unwrap();
    [first, second]
}

/// Waits until `key` has a waiter behind its one holder, as `m` inspects it over TLS.
async fn one_holder_one_waiter(m: &LockManager, key: &str) {
    let deadline = Instant::now() + FOLLOW;
    loop {
        let info = m.inspect(key).await.expect("inspect over TLS");
        assert_eq!(info.holders.len(), 1, "{info:?}");
        if !info.waiters.is_empty() {
            assert_eq!(info.waiters.len(), 1, "{info:?}");
            return;
        }
        assert!(Instant::now() < deadline, "nobody queued: {info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `key` exists on data node `i`, asked by the kit over TLS.
fn exists(redis: &RedisSentinel, i: usize, key: &str) -> bool {
    redis.command(i, &["EXISTS", key]).unwrap().int() == Some(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_mutual_tls_holds_and_hands_over_across_a_failover() {
    let certs = certs();
    let redis = sentinel_with_tls(&certs);
    assert!(redis.is_tls());
    let url = redis.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    let a = zklock_redis(&url, mutual_by_pem(&certs)).await;
    let b = zklock_redis(&url, mutual(&certs)).await;
    let lock = format!("zklock:lock:{}", a.path_of(KEY).unwrap());

    let old = blocking(|| redis.primary()).unwrap();
    let before = hand_over(&a, &b, KEY, || assert!(exists(&redis, old, &lock))).await;

    // A hold across the failover is lost to it as the Sentinels announce it (`+switch-master`,
    // heard on subscriptions over TLS): the old primary, still running, says `master` and
    // renews its lease for 8 s and more, so nothing else would tell this soon.
    let kept = a.lock_timeout(KEY, FOLLOW).await.unwrap();
    let new = blocking(|| redis.failover()).expect("a failover over TLS");
    assert_ne!(new, old);
    let lost = tokio::time::timeout(ANNOUNCED, kept.lost()).await;
    assert_eq!(lost, Ok(LossReason::Failover));
    assert!(kept.fencing_token() > before[1]);
    drop(kept);
    assert_eq!(blocking(|| redis.primary()).unwrap(), new);
    let after = hand_over(&a, &b, KEY, || {
        assert!(exists(&redis, new, &lock), "held on the new primary");
    })
    .await;
    assert!(
        after[0] > before[1],
        "tokens after the failover ({after:?}) above those before ({before:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mutual_tls_holds_and_hands_over_keys_on_every_primary() {
    let certs = certs();
    let cluster = cluster_with_tls(&certs);
    assert!(cluster.is_tls());
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    assert_eq!(url.matches("127.0.0.1:").count(), cluster.len(), "{url}");
    let a = zklock_redis(&url, mutual_by_pem(&certs)).await;
    let b = zklock_redis(&url, mutual(&certs)).await;
    // One key whose slot each primary serves, found by asking the nodes over TLS.
    let keys = blocking(|| keys_per_primary(&cluster, &a, "tls_ha", 1));
    assert_eq!(keys.len(), 3, "{keys:?}");

    // `a` holds every key at once, each on its own primary; `b` is kept out of each.
    let mut held = Vec::new();
    for (&primary, key) in keys.iter().map(|(p, k)| (p, &k[0])) {
        let guard = a.lock_timeout(key, FOLLOW).await.expect("granted over TLS");
        assert!(b.try_lock(key).await.unwrap().is_none(), "{key} excluded");
        let name = lock_key(&a, "lock", key);
        let on = blocking(|| cluster.command(primary, &["EXISTS", &name])).unwrap();
        assert_eq!(on.int(), Some(1), "{key} held on node {primary}");
        held.push((key.clone(), guard));
    }
    for (key, guard) in held {
        let first = guard.fencing_token();
        guard.release().await.unwrap();
        let [_, second] = hand_over(&b, &a, &key, || {}).await;
        assert!(second > first, "{key}: {second:?} after {first:?}");
    }
    // Every node checked against one name (which its certificate lists) instead of the
    // address it announces.
    let by_name = zklock_redis(&url, mutual(&certs).server_name("localhost")).await;
    for key in keys.values().map(|k| &k[0]) {
        let held = by_name.lock_timeout(key, FOLLOW).await.expect("granted");
        held.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_follows_a_failover_to_a_node_first_reached_over_tls() {
    let certs = certs();
    let cluster = cluster_with_tls(&certs);
    let url = cluster.url();
    let a = zklock_redis(&url, mutual(&certs)).await;
    let b = zklock_redis(&url, mutual(&certs)).await;
    let (primary, keys) = blocking(|| keys_per_primary(&cluster, &a, "tls_ha_failover", 1))
        .into_iter()
        .next()
        .unwrap();
    let key = &keys[0];
    let kept = a.lock_timeout(key, FOLLOW).await.unwrap();
    // Its replica takes over: the next renewal is answered `-MOVED`, to a node the managers
    // hold no connection to.
    let replica = replica_of(&cluster, primary);
    blocking(|| cluster.failover(replica)).expect("a Cluster failover over TLS");
    let lost = tokio::time::timeout(FOLLOW, kept.lost()).await;
    assert_eq!(lost, Ok(LossReason::Failover));
    let before = kept.fencing_token();
    drop(kept);
    let name = lock_key(&a, "lock", key);
    let [first, _] = hand_over(&a, &b, key, || {
        let on = cluster.command(replica, &["EXISTS", &name]).unwrap();
        assert_eq!(on.int(), Some(1), "held on the new primary, node {replica}");
    })
    .await;
    assert!(first > before, "{first:?} after {before:?}");
}

/// A manager on `url` with `tls`, which must connect.
async fn zklock_redis(url: &str, tls: Tls) -> LockManager {
    redis(url, Some(tls)).await.expect("connect over TLS")
}

/// `connect` fails within the timeout with `Error::Tls` naming one of `servers` and saying
/// `cause`.
async fn refused_naming<F>(connect: F, servers: &[String], cause: &str)
where
    F: std::future::Future<Output = zklock::Result<LockManager>>,
{
    match fails_in_time(connect).await {
        Error::Tls { host, reason } => {
            assert!(servers.contains(&host), "{host} is none of {servers:?}");
            assert!(reason.contains(cause), "{reason}");
        }
        other => panic!("not a TLS error: {other}"),
    }
}

/// Another CA than the one that signed the servers' certificates, and the client certificate.
fn other_ca(certs: &Certs) -> Tls {
    Tls::new()
        .ca_file(certs.other_ca_path())
        .client_cert_files(certs.client_cert_path(), certs.client_key_path())
}

/// What a TLS-only deployment at `url` (`rediss+…`) whose clients must present a certificate
/// refuses, within the timeout: servers trusted by another CA than theirs, a name to check
/// that their certificates do not list, no client certificate, and plaintext (`redis+…`).
/// `servers` are the addresses the URL names.
async fn refusals(url: &str, certs: &Certs, servers: &[String]) {
    refused_naming(redis(url, Some(other_ca(certs))), servers, "not signed").await;
    let wrong_name = mutual(certs).server_name("wrong.example");
    refused_naming(
        redis(url, Some(wrong_name)),
        servers,
        "not valid for this host name",
    )
    .await;
    let no_client_cert = Tls::new().ca_file(certs.ca_path());
    refused_naming(
        redis(url, Some(no_client_cert)),
        servers,
        "client certificate",
    )
    .await;
    // Redis closes a plaintext connection to its TLS port without a word (no TLS alert): the
    // managers see servers that do not answer.
    let plain = url.replacen("rediss+", "redis+", 1);
    let err = fails_in_time(redis(&plain, None)).await;
    assert!(matches!(err, Error::Unreachable { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_refuses_what_does_not_verify_and_plaintext_within_the_timeout() {
    let certs = certs();
    let mut setup = sentinel_with_tls(&certs);
    let (url, sentinels) = (setup.url(), setup.sentinel_addrs());
    refusals(&url, &certs, &sentinels).await;
    // The last Sentinel of the URL stopped: the others' TLS failure is still what is reported.
    blocking(|| setup.kill_sentinel(2)).unwrap();
    refused_naming(
        redis(&url, Some(other_ca(&certs))),
        &sentinels[..2],
        "not signed",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_refuses_what_does_not_verify_and_plaintext_within_the_timeout() {
    let certs = certs();
    let mut cluster = cluster_with_tls(&certs);
    let (url, nodes) = (cluster.url(), cluster.addrs());
    refusals(&url, &certs, &nodes).await;
    // The last node of the URL stopped: the others' TLS failure is still what is reported.
    let last = nodes.len() - 1;
    blocking(|| cluster.kill(last)).unwrap();
    refused_naming(
        redis(&url, Some(other_ca(&certs))),
        &nodes[..last],
        "not signed",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sentinel_or_node_answering_is_named_by_the_tls_url_given() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tls = Tls::new().ca_file(certs().ca_path());
    for url in [
        format!("rediss+sentinel://127.0.0.1:{port}/zklock"),
        format!("rediss+cluster://127.0.0.1:{port}"),
    ] {
        let err = fails_in_time(redis(&url, Some(tls.clone()))).await;
        assert!(matches!(err, Error::Unreachable { .. }), "{err}");
        assert!(err.to_string().contains(&url), "{err}");
    }
}
