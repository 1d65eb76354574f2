//! The Redis fence (`RedisFence`) on a Redis Cluster, through the `redis` crate's cluster
//! connection (`ClusterConnection`), against the test kit's Cluster of 3 primaries: with a
//! prefix that carries the data's hash tag (`zklock:accepted:{sku_7}`), the token key and the
//! data keys share one slot, so the check and the write stay one script on one node: a stale
//! write is refused, equal and newer ones accepted, concurrent writers end with the newest
//! token's write, the tokens of a `redis+cluster://` lock manager fence in grant order. Without
//! the shared tag the write is refused by the Cluster (`CROSSSLOT`) with nothing written. The
//! fence's script is loaded on first use (`NOSCRIPT`, then `SCRIPT LOAD` that the cluster
//! connection sends to every node).

use crate::cluster;
use crate::fence;

use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::AsyncCommands;
use zklock::fence::{Fence, FenceError, FencedScript, Outcome, RedisFence, RedisWrite};
use zklock::FencingToken;
use zklock_testkit::RedisCluster;

use cluster::{blocking, cluster_manager, cluster_url, start_cluster};
use fence::Subject;

/// The fenced write of the scenarios: the value and the log in one script.
const SET_AND_LOG: &str = r#"
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
return redis.call('LLEN', KEYS[2])
"#;

async fn connect(cluster: &RedisCluster) -> (ClusterClient, ClusterConnection) {
    let client = ClusterClient::new(cluster.urls()).expect("a cluster client");
    let conn = client
        .get_async_connection()
        .await
        .expect("connect to the Cluster");
    (client, conn)
}

/// The fence of `resource`: its token key `zklock:accepted:{<resource>}<resource>`, in the slot
/// of the resource's data keys (`value:{<resource>}`, `log:{<resource>}`).
fn fence_of(conn: &ClusterConnection, resource: &str) -> RedisFence<ClusterConnection> {
    RedisFence::on(conn.clone()).with_prefix(format!("zklock:accepted:{{{resource}}}"))
}

struct ClusterSubject {
    client: ClusterClient,
    conn: ClusterConnection,
    script: FencedScript,
}

impl Subject for ClusterSubject {
    async fn another(&self) -> Self {
        ClusterSubject {
            client: self.client.clone(),
            conn: self.client.get_async_connection().await.unwrap(),
            script: self.script.clone(),
        }
    }

    async fn write(&self, resource: &str, token: FencingToken, value: &str) -> Outcome {
        let keys = [
            format!("value:{{{resource}}}"),
            format!("log:{{{resource}}}"),
        ];
        fence_of(&self.conn, resource)
            .fenced_write(
                resource,
                token,
                RedisWrite::script(&self.script, &keys, &[value]),
            )
            .await
            .unwrap()
            .map(|_| ())
    }

    async fn value(&self, resource: &str) -> Option<String> {
        self.conn
            .clone()
            .get(format!("value:{{{resource}}}"))
            .await
            .unwrap()
    }

    async fn log(&self, resource: &str) -> Vec<String> {
        self.conn
            .clone()
            .lrange(format!("log:{{{resource}}}"), 0, -1)
            .await
            .unwrap()
    }

    async fn last(&self, resource: &str) -> Option<FencingToken> {
        fence_of(&self.conn, resource)
            .last_token(resource)
            .await
            .unwrap()
    }
}

/// A stale `SET` is refused, a newer and an equal one accepted; the token key lives in the slot
/// (and on the node) of the data key; every scenario of the fences passes on the Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_write_is_refused_and_a_newer_accepted_with_the_token_beside_the_data() {
    let cluster = start_cluster(0, 1000);
    let (client, conn) = connect(&cluster).await;
    let fence = RedisFence::on(conn.clone()).with_prefix("zklock:accepted:{sku_7}");
    let (data, token_key) = ("stock:{sku_7}", fence.key_of("sku_7"));
    assert_eq!(token_key, "zklock:accepted:{sku_7}sku_7");
    let (old, new) = (FencingToken::new(10, 0), FencingToken::new(11, 0));
    let set = |token, v: i64| fence.fenced_write("sku_7", token, RedisWrite::set(data, v));
    assert_eq!(
        set(old, 5).await.unwrap(),
        Outcome::Accepted(redis::Value::Okay)
    );
    assert_eq!(
        set(new, 4).await.unwrap(),
        Outcome::Accepted(redis::Value::Okay)
    );
    assert_eq!(set(old, 9).await.unwrap(), Outcome::Stale { last: new });
    assert_eq!(
        set(new, 3).await.unwrap(),
        Outcome::Accepted(redis::Value::Okay)
    );
    let value: i64 = conn.clone().get(data).await.unwrap();
    assert_eq!(value, 3, "the stale write changed nothing");
    assert_eq!(fence.last_token("sku_7").await.unwrap(), Some(new));

    // One slot, one node: both keys are read on the slot's primary without a redirect.
    let slot = blocking(|| cluster.slot(data)).unwrap();
    assert_eq!(blocking(|| cluster.slot(&token_key)).unwrap(), slot);
    let owner = blocking(|| cluster.node_for_key(data)).unwrap();
    let raw = blocking(|| cluster.command(owner, &["GET", &token_key]))
        .unwrap()
        .text();
    assert_eq!(raw, Some(new.to_sortable_string()));
    let raw = blocking(|| cluster.command(owner, &["GET", data]))
        .unwrap()
        .text();
    assert_eq!(raw.as_deref(), Some("3"));

    // The scenarios every fence passes, each resource in a slot of its own.
    let s = ClusterSubject {
        client,
        conn,
        script: FencedScript::new(SET_AND_LOG),
    };
    fence::older_refused_newer_accepted(&s, "sku_1").await;
    for seed in 0..3 {
        fence::concurrent_writers(&s, &format!("hot_{seed}"), 20, 4, seed).await;
    }
}

/// The tokens of a `redis+cluster://` manager's successive holders of a key fence in grant
/// order: the first holder's write after the second's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tokens_of_cluster_locks_fence_in_grant_order() {
    let cluster = start_cluster(0, 1000);
    let (_client, conn) = connect(&cluster).await;
    let fence = RedisFence::on(conn.clone()).with_prefix("zklock:accepted:{sku_9}");
    let url = cluster_url(&cluster, 0);
    let a = cluster_manager(&url, Duration::from_secs(3)).await;
    let b = cluster_manager(&url, Duration::from_secs(3)).await;
    let first = a.lock("sku_9").await.unwrap();
    let stale = first.fencing_token();
    let write = |v: &str| RedisWrite::set("stock:{sku_9}", v.to_string());
    assert!(first
        .fenced(&fence)
        .write(write("a"))
        .await
        .unwrap()
        .is_accepted());
    first.release().await.unwrap();
    let second = b.lock("sku_9").await.unwrap();
    assert!(second.fencing_token() > stale);
    assert!(second
        .fenced(&fence)
        .write(write("b"))
        .await
        .unwrap()
        .is_accepted());
    // The first holder, late (as if paused past its lease), with its token (a guard's fenced
    // write names the lock's path as the resource).
    let resource = a.path_of("sku_9").unwrap();
    assert_eq!(
        fence.last_token(&resource).await.unwrap(),
        Some(second.fencing_token())
    );
    assert_eq!(
        fence
            .fenced_write(&resource, stale, write("a, late"))
            .await
            .unwrap(),
        Outcome::Stale {
            last: second.fencing_token()
        }
    );
    let value: String = conn.clone().get("stock:{sku_9}").await.unwrap();
    assert_eq!(value, "b");
    second.release().await.unwrap();
}

/// Without a shared hash tag, the token key and the data key are in different slots: the
/// Cluster refuses the script (`CROSSSLOT`), the error says so, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_in_two_slots_are_a_clear_crossslot_error_and_write_nothing() {
    let cluster = start_cluster(0, 1000);
    let (_client, conn) = connect(&cluster).await;
    let fence = RedisFence::on(conn.clone());
    let (data, token_key) = ("stock:{sku_7}", fence.key_of("sku_7"));
    assert_eq!(token_key, "zklock:accepted:sku_7");
    assert_ne!(
        blocking(|| cluster.slot(data)).unwrap(),
        blocking(|| cluster.slot(&token_key)).unwrap(),
        "the test needs the keys in two slots"
    );
    let err = fence
        .fenced_write("sku_7", FencingToken::new(5, 0), RedisWrite::set(data, 1))
        .await
        .expect_err("keys in two slots");
    let text = err.to_string();
    eprintln!("fence_redis_cluster: keys in two slots: {text}");
    // The error names the token key and says how to put it in the keys' slot.
    assert!(matches!(&err, FenceError::Invalid(_)), "{err:?}");
    assert!(
        text.contains("zklock:accepted:") && text.contains("with_prefix"),
        "{text}"
    );
    let value: Option<String> = conn.clone().get(data).await.unwrap();
    assert_eq!(value, None, "nothing written");
    assert_eq!(fence.last_token("sku_7").await.unwrap(), None);
}

/// The fence's scripts are loaded on first use on a Cluster with replicas, also while a
/// replica is down (the cluster connection sends `SCRIPT LOAD` to every node), and run again
/// on a new primary after a failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_load_on_first_use_with_a_node_down_and_after_a_failover() {
    let mut cluster = start_cluster(1, 1000);
    let (_client, conn) = connect(&cluster).await;
    let fence = RedisFence::on(conn.clone()).with_prefix("zklock:accepted:{sku_3}");
    let data = "stock:{sku_3}";
    let owner = blocking(|| cluster.node_for_key(data)).unwrap();
    let replica = blocking(|| cluster::replica_of(&cluster, owner));
    // A replica of another primary down: every slot is still served.
    let other = blocking(|| {
        cluster
            .replicas()
            .unwrap()
            .into_iter()
            .find(|&r| r != replica)
            .unwrap()
    });
    blocking(|| cluster.kill(other)).unwrap();
    let script = FencedScript::new("return redis.call('INCR', KEYS[1])");
    let first = tokio::time::timeout(
        Duration::from_secs(20),
        fence.fenced_write(
            "sku_3",
            FencingToken::new(1, 0),
            RedisWrite::script(&script, &[data], &[] as &[&str]),
        ),
    )
    .await
    .expect("the fenced write answers");
    eprintln!("fence_redis_cluster: first fenced script with a replica down: {first:?}");
    let first = first.expect("a fenced script with a replica down");
    assert_eq!(first, Outcome::Accepted(redis::Value::Int(1)));
    // The slot's primary fails over: its replica has the script too.
    blocking(|| cluster.failover(replica)).unwrap();
    let again = fence
        .fenced_write(
            "sku_3",
            FencingToken::new(2, 0),
            RedisWrite::script(&script, &[data], &[] as &[&str]),
        )
        .await
        .expect("the fenced script after a failover");
    assert_eq!(again, Outcome::Accepted(redis::Value::Int(2)));
    assert_eq!(
        fence
            .fenced_write(
                "sku_3",
                FencingToken::new(1, 0),
                RedisWrite::script(&script, &[data], &[] as &[&str]),
            )
            .await
            .unwrap(),
        Outcome::Stale {
            last: FencingToken::new(2, 0)
        }
    );
}
