//! What operators see of every backend, and what each backend leaves out on purpose.

use super::*;

/// ZooKeeper-only features (revocation) fail in memory, on Redis and on PostgreSQL with
/// `Error::Unsupported` naming the backend (there is no ZooKeeper client to hand out); the
/// memory-only `lose` fails on ZooKeeper, Redis and PostgreSQL the same way. Each backend
/// shows what it has instead.
pub(crate) async fn backend_specific_features(backend: Backend) {
    let env = Env::start(backend);
    let m = env.process(Queue::Local).await;
    let debug = format!("{m:?}");
    match backend {
        Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => {
            redis_features(&env, &m, &debug).await
        }
        Backend::Postgres => postgres_features(&env, &m, &debug).await,
        Backend::Etcd => etcd_features(&env, &m, &debug).await,
        Backend::MySql => mysql_features(&env, &m, &debug).await,
        Backend::Memory => memory_features(&m, &debug).await,
        Backend::Zookeeper => zookeeper_features(&m, &debug).await,
    }
}

/// Redis: what it leaves out, and what it has instead: the hold is a key that names its
/// holder, and the token is the lock's fence counter.
async fn redis_features(env: &Env, m: &LockManager, debug: &str) {
    assert!(debug.contains("redis"), "{debug}");
    let errors = [
        m.revoke("k").await.unwrap_err(),
        m.revoke_path("/some/lock").await.unwrap_err(),
        m.lose("k", LossReason::SessionExpired).unwrap_err(),
    ];
    for err in &errors {
        assert_unsupported(err, "redis");
    }
    assert!(
        m.client::<zookeeper_client::Client>().is_none(),
        "no ZooKeeper client on Redis"
    );
    assert_eq!(m.lease(), Some(REDIS_LEASE));

    // What Redis has instead.
    let held = m.lock("k").await.unwrap();
    let path = m.path_of("k").unwrap();
    assert_eq!(held.node_path(), env.redis_key("lock", &path));
    let mut conn = env.redis_conn(held.node_path()).await;
    let holder: String = redis::cmd("GET")
        .arg(held.node_path())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(holder.contains(" pid="), "{holder}");
    let fence: i64 = redis::cmd("GET")
        .arg(env.redis_key("fence", &path))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(held.fencing_token().grant(), fence);
    held.release().await.unwrap();
    assert_eq!(
        env.left_behind(std::slice::from_ref(m), &path).await,
        Vec::<String>::new()
    );
}

/// PostgreSQL: what it leaves out, and what it has instead: the hold is an advisory lock on a
/// session that names its process, and the token is the key row's fence, which each grant
/// raises.
async fn postgres_features(env: &Env, m: &LockManager, debug: &str) {
    assert!(debug.contains("postgres"), "{debug}");
    let errors = [
        m.revoke("k").await.unwrap_err(),
        m.revoke_path("/some/lock").await.unwrap_err(),
        m.lose("k", LossReason::SessionExpired).unwrap_err(),
    ];
    for err in &errors {
        assert_unsupported(err, "postgres");
    }
    assert!(
        m.client::<zookeeper_client::Client>().is_none(),
        "no ZooKeeper client on PostgreSQL"
    );
    assert_eq!(m.lease(), Some(PG_LEASE));

    // What PostgreSQL has instead.
    let held = m.lock("k").await.unwrap();
    let path = m.path_of("k").unwrap();
    let look = env.pg_client().await;
    let row = look
        .query_one(
            "SELECT id::bigint, fence FROM zklock_keys WHERE path = $1",
            &[&path],
        )
        .await
        .unwrap();
    let (id, fence): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(
        held.node_path(),
        format!("{path} (advisory lock {PG_LOCK_CLASS},{id})")
    );
    assert_eq!(held.fencing_token().grant(), fence);
    let locks = env.pg_locks(&look, &path).await;
    let [(PG_LOCK_CLASS, mode, pid)] = locks.as_slice() else {
        panic!("one advisory lock of {path}: {locks:?}")
    };
    assert_eq!(mode, "ExclusiveLock");
    let application: String = look
        .query_one(
            "SELECT application_name FROM pg_stat_activity WHERE pid = $1",
            &[pid],
        )
        .await
        .unwrap()
        .get(0);
    assert!(application.contains(" pid="), "{application}");
    held.release().await.unwrap();
    assert_eq!(
        env.left_behind(std::slice::from_ref(m), &path).await,
        Vec::<String>::new()
    );
}

/// etcd: what it leaves out, and what it has instead: the hold is etcd's own mutex key,
/// `<path>/<lease id in hex>` on the manager's lease, naming its process, and the token is the
/// key's create revision; the manager's etcd client is the user's too.
async fn etcd_features(env: &Env, m: &LockManager, debug: &str) {
    assert!(debug.contains("etcd"), "{debug}");
    let errors = [
        m.revoke("k").await.unwrap_err(),
        m.revoke_path("/some/lock").await.unwrap_err(),
        m.lose("k", LossReason::SessionExpired).unwrap_err(),
    ];
    for err in &errors {
        assert_unsupported(err, "etcd");
    }
    assert!(
        m.client::<zookeeper_client::Client>().is_none(),
        "no ZooKeeper client on etcd"
    );
    assert_eq!(m.lease(), Some(ETCD_LEASE));

    // What etcd has instead.
    let held = m.lock("k").await.unwrap();
    let path = m.path_of("k").unwrap();
    let mut client = m
        .client::<etcd_client::Client>()
        .expect("the manager's etcd client");
    let got = client.get(held.node_path(), None).await.unwrap();
    let [kv] = got.kvs() else {
        panic!("one key {}: {:?}", held.node_path(), got.kvs())
    };
    let lease = kv.lease();
    assert_eq!(held.node_path(), format!("{path}/{lease:x}"));
    assert!(String::from_utf8_lossy(kv.value()).contains(" pid="));
    assert_eq!(held.fencing_token().grant(), kv.create_revision());
    assert!(m.stats().requests > 0);
    held.release().await.unwrap();
    assert_eq!(
        env.left_behind(std::slice::from_ref(m), &path).await,
        Vec::<String>::new()
    );
}

/// MySQL: what it leaves out, and what it has instead: the hold is the user lock of the
/// documented name on a session of the manager's, and the token is the lock row's fence,
/// which each grant raises.
async fn mysql_features(env: &Env, m: &LockManager, debug: &str) {
    assert!(debug.contains("mysql"), "{debug}");
    let errors = [
        m.revoke("k").await.unwrap_err(),
        m.revoke_path("/some/lock").await.unwrap_err(),
        m.lose("k", LossReason::SessionExpired).unwrap_err(),
        m.rwlock("k").unwrap().read().await.map(drop).unwrap_err(),
    ];
    for err in &errors {
        assert_unsupported(err, "mysql");
    }
    assert!(
        m.client::<zookeeper_client::Client>().is_none(),
        "no ZooKeeper client on MySQL"
    );
    assert_eq!(m.lease(), Some(MYSQL_LEASE));

    // What MySQL has instead.
    let held = m.lock("k").await.unwrap();
    let path = m.path_of("k").unwrap();
    let name = zklock::mysql_lock_name(&path);
    let (holder, waiters) = env.mysql_sessions(&path);
    let session = holder.expect("the user lock is held");
    assert!(waiters.is_empty(), "{waiters:?}");
    assert_eq!(
        held.node_path(),
        format!("{path} (user lock {name}, session {session})")
    );
    let row = env.mysql_sql(&format!(
        "SELECT fence, holder FROM zklock.zklock_locks WHERE name = '{name}'"
    ));
    let (fence, who) = row.split_once('\t').expect("the lock's row");
    assert_eq!(held.fencing_token().grant(), fence.parse::<i64>().unwrap());
    assert!(who.contains(" pid="), "{who}");
    assert!(m.stats().requests > 0);
    held.release().await.unwrap();
    assert_eq!(
        env.left_behind(std::slice::from_ref(m), &path).await,
        Vec::<String>::new()
    );
}

/// Memory: what it leaves out (and no lease, no requests), and what it has instead: `lose`.
async fn memory_features(m: &LockManager, debug: &str) {
    assert!(debug.contains("memory"), "{debug}");
    let errors = [
        m.revoke("k").await.unwrap_err(),
        m.revoke_path("/some/lock").await.unwrap_err(),
    ];
    for err in &errors {
        assert_unsupported(err, "memory");
    }
    assert!(
        m.client::<zookeeper_client::Client>().is_none(),
        "no ZooKeeper client in memory"
    );
    assert_eq!(m.lease(), None);
    assert_eq!(m.stats(), Default::default());

    // What memory has instead: `lose`, for every recipe of the key.
    let guard = m.lock("k").await.unwrap();
    let lease = m.semaphore("k", 2).unwrap().acquire().await.unwrap();
    m.lose("k", LossReason::Revoked).unwrap();
    assert_eq!(guard.lost().await, LossReason::Revoked);
    assert_eq!(lease.lost().await, LossReason::Revoked);
    assert!(!guard.is_held() && !lease.is_held());
    assert!(matches!(
        m.lose("bad\nkey", LossReason::Revoked),
        Err(Error::InvalidKey { .. })
    ));
}

/// ZooKeeper: `lose` left out; inspection from the server, its client, a session timeout.
async fn zookeeper_features(m: &LockManager, debug: &str) {
    assert!(debug.contains("zookeeper"), "{debug}");
    let err = m.lose("k", LossReason::SessionExpired).unwrap_err();
    assert_unsupported(&err, "zookeeper");
    let held = m.lock("k").await.unwrap();
    let info = m.inspect("k").await.unwrap();
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].token, held.fencing_token());
    assert_eq!(m.list("k").await.unwrap().len(), 1);
    assert!(m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .list_children("/")
        .await
        .is_ok());
    assert!(m.lease().is_some_and(|t| t > Duration::ZERO));
    assert!(m.stats().requests > 0);
}

/// What `inspect`, `inspect_path` and `list` (and so `zklock ls / status / top`) show, read
/// from the server: the holder of a mutex and a waiter from another process, who each is (this
/// host and pid), since when, the holder's token; then the waiter as the next holder; a
/// reader as a read/write lock's holder; and nothing once all is released. In memory the
/// "server" is the manager's own lock table.
pub(crate) async fn operators_see_holders_and_waiters(backend: Backend) {
    let env = Env::start(backend);
    // Strict managers: in memory, "processes" are clones of one manager, and a waiter there
    // must wait at the backend, not in the local queue.
    let ops = env.process(Queue::Strict).await;
    let key = "ops/sku_7";
    let path = ops.path_of(key).unwrap();
    let first = env.process(Queue::Strict).await;
    let second = env.process(Queue::Strict).await;
    let started = std::time::SystemTime::now() - Duration::from_secs(5);
    let held = first.lock(key).await.unwrap();
    let waiter = tokio::spawn(async move {
        let g = second.lock(key).await.unwrap();
        let token = g.fencing_token();
        (second, g, token)
    });
    eventually("the waiter shows", Duration::from_secs(30), || async {
        ops.inspect(key).await.unwrap().waiters.len() == 1
    })
    .await;
    let me = std::process::id();
    let recent = |c: &zklock::Contender| {
        c.since >= started && c.since <= std::time::SystemTime::now() + Duration::from_secs(5)
    };
    let info = ops.inspect(key).await.unwrap();
    assert_eq!(
        (info.key.as_str(), info.path.as_str()),
        (key, path.as_str())
    );
    assert_eq!(info.kind, zklock::LockKind::Mutex);
    let [h] = info.holders.as_slice() else {
        panic!("one holder: {info:?}")
    };
    assert_eq!(h.token, held.fencing_token(), "{info:?}");
    assert_eq!(h.owner.pid, Some(me), "{info:?}");
    assert!(h.owner.host.is_some(), "{info:?}");
    assert!(recent(h), "since {:?}: {info:?}", h.since);
    let w = &info.waiters[0];
    assert_eq!(w.owner.pid, Some(me), "{info:?}");
    assert!(recent(w), "since {:?}: {info:?}", w.since);
    assert_eq!(ops.inspect_path(&path).await.unwrap().holders, info.holders);
    let listed = ops.list("ops/").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!((listed[0].key.as_str(), listed[0].waiters.len()), (key, 1));
    assert!(ops.list("other/").await.unwrap().is_empty());

    // The waiter is the next holder, with its own token.
    held.release().await.unwrap();
    let (second, next, token) = waiter.await.unwrap();
    let info = ops.inspect(key).await.unwrap();
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].token, token, "{info:?}");
    // A waiter's registration on the server may end just after its grant (PostgreSQL's
    // registration is let go by the process once its task holds).
    eventually("no waiter is shown", Duration::from_secs(10), || async {
        ops.inspect(key).await.unwrap().waiters.is_empty()
    })
    .await;
    next.release().await.unwrap();

    // A reader holds the read/write lock of another key, where the backend has them.
    if backend != Backend::MySql {
        let read = first.rwlock("ops/cfg").unwrap().read().await.unwrap();
        let info = ops.inspect("ops/cfg").await.unwrap();
        assert_eq!(info.kind, zklock::LockKind::ReadWrite, "{info:?}");
        assert_eq!(info.holders.len(), 1, "{info:?}");
        assert_eq!(info.holders[0].mode, "read", "{info:?}");
        read.release().await.unwrap();
    }

    for m in [&first, &second] {
        m.flush().await;
    }
    eventually("nothing is shown", Duration::from_secs(10), || async {
        ops.list("ops/").await.unwrap().is_empty()
    })
    .await;
}
