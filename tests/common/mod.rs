//! Shared set-up for zklock's integration tests: a real ZooKeeper per test, managers on it,
//! and helpers that look at the znodes themselves.
//!
//! Every helper of the tests is in this folder. A test binary includes this module as
//! `#[path = "../common/mod.rs"] mod common;`, and beside it, the same way, the ones it needs of
//! `cuts.rs` (the cut-at-every-request sweeps), `faults.rs` (the fault scenarios' workers and
//! end checks) and `fence.rs` (the fence scenarios every store passes).
#![allow(dead_code)]

use std::time::Duration;

use zklock::{zookeeper_client, LockManager};
pub use zklock_testkit::ZkServer;

/// Starts a real standalone ZooKeeper on a free loopback port (installing it if missing).
pub fn server() -> ZkServer {
    ZkServer::start().expect("start a ZooKeeper server (see the test kit's log in the error)")
}

/// A manager with a short session timeout, as tests need.
pub async fn manager(connect: &str) -> LockManager {
    manager_with(connect, Duration::from_secs(4)).await
}

pub async fn manager_with(connect: &str, session_timeout: Duration) -> LockManager {
    LockManager::builder(connect)
        .zookeeper(|zk| zk.session_timeout(session_timeout))
        .connect()
        .await
        .expect("connect to the test server")
}

/// Children of `path`, empty when the path does not exist.
pub async fn children(m: &LockManager, path: &str) -> Vec<String> {
    match m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .list_children(path)
        .await
    {
        Ok(c) => c,
        Err(zookeeper_client::Error::NoNode) => vec![],
        Err(e) => panic!("list {path}: {e}"),
    }
}

/// Every znode path in the tree below `root` (excluding `/zookeeper`).
pub async fn tree(m: &LockManager, root: &str) -> Vec<String> {
    let client = m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
    let mut out = vec![];
    let mut todo = vec![root.to_string()];
    while let Some(p) = todo.pop() {
        let kids = match client.list_children(&p).await {
            Ok(k) => k,
            Err(zookeeper_client::Error::NoNode) => continue,
            Err(e) => panic!("list {p}: {e}"),
        };
        for k in kids {
            let child = if p == "/" {
                format!("/{k}")
            } else {
                format!("{p}/{k}")
            };
            if child == "/zookeeper" {
                continue;
            }
            out.push(child.clone());
            todo.push(child);
        }
    }
    out.sort();
    out
}

/// Waits (bounded) until `path` has `n` children: used to order waiters, never to assume.
pub async fn until_children(m: &LockManager, path: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if children(m, path).await.len() == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} never reached {n} children"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Expires `m`'s session from the server side, as Curator's KillSession did: a second handle
/// with the same session id and password, then closed.
pub async fn expire_session(m: &LockManager, connect: &str) {
    expire_session_noting(m, connect, || {}).await
}

/// [`expire_session`], calling `attached` each time a second handle has taken the session over:
/// a test that records the expiry as a silent fault of the victim's workers records it there.
///
/// That moment is the one to record. The session ends at whichever try succeeds, maybe not the
/// first (the original can win it back), and every grant the original got on it was asked for
/// before the twin attached (the server drops the original's connection then), while every
/// grant the expiry lets others have comes after the twin closes it. A fault recorded once
/// before the first try leaves out an acquire the victim started between a try it won back and
/// the one that expired it, and the checker called that grant's overlap a violation.
pub async fn expire_session_noting(m: &LockManager, connect: &str, mut attached: impl FnMut()) {
    use zookeeper_client::SessionState;
    let original = m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
    let session = original.session().clone();
    let mut attempts = Vec::new();
    // A second handle attaches to the session (the server drops the original's connection) and
    // closes it. The original, kicked off, reconnects at once and may win the session back
    // before the twin's close goes out: then the session lives on. So follow the original's
    // states from before the twin attaches: `Expired` is done, connected again is another try.
    for _ in 0..50 {
        let mut states = original.state_watcher();
        let twin = zookeeper_client::Client::connector()
            .with_session(session.clone())
            .with_session_timeout(Duration::from_secs(4))
            .with_connection_timeout(Duration::from_secs(2))
            .connect(connect)
            .await;
        match twin {
            Ok(twin) => {
                attached();
                drop(twin)
            }
            Err(zookeeper_client::Error::SessionExpired) => attached(),
            Err(e) => {
                attempts.push(format!("twin: {e}"));
                continue;
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if original.state() == SessionState::Expired {
                return;
            }
            match tokio::time::timeout_at(deadline, states.changed()).await {
                Ok(SessionState::Expired) => return,
                Ok(SessionState::SyncConnected | SessionState::ConnectedReadOnly) => {
                    eprintln!("expire_session: the original won its session back; trying again");
                    attempts.push("won back".into());
                    break;
                }
                Ok(_) => {}
                Err(_) => {
                    attempts.push(format!("still {:?}", original.state()));
                    break;
                }
            }
        }
    }
    panic!("could not expire the session: {attempts:?}");
}

/// Deletes `held`'s node through `ops` (as an operator would), and checks that the hold says
/// it is lost, because its node was deleted.
pub async fn delete_and_see_it_lost(ops: &LockManager, held: &zklock::LockGuard) {
    ops.client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .delete(held.node_path(), None)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(10), held.lost())
        .await
        .expect("lost() fires");
    assert_eq!(reason, zklock::LossReason::NodeDeleted);
    assert!(!held.is_held());
}

/// Polls `cond` every 20 ms until it holds; fails, naming `what`, after `within`. Used to
/// order a test's steps, never to assume one happened.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The length and seed of a soak: `ZKLOCK_SOAK_SECS` (at least 5; `default_secs` when unset) and
/// `ZKLOCK_SOAK_SEED` (random when unset). Prints both, past the harness's capture, so that a
/// failed run can be replayed.
pub fn soak_settings(name: &str, default_secs: u64) -> (u64, u64) {
    let secs: u64 = std::env::var("ZKLOCK_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_secs)
        .max(5);
    let seed: u64 = std::env::var("ZKLOCK_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    say(&format!(
        "{name}: {secs} s, seed {seed} (ZKLOCK_SOAK_SECS, ZKLOCK_SOAK_SEED to change)"
    ));
    (secs, seed)
}

/// Prints past the test harness's capture, so that a soak's report shows in CI's log.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// How the tests' own connections to Redis (to look at keys, or a fence's store) wait: up to
/// 10 s to connect and for each reply. The client's defaults (1 s, 500 ms) are what a test
/// process starved of CPU beside other test binaries can miss on a server nothing faults.
pub fn unhurried() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(10)))
}

/// The members of a mutex's waiting queue on Redis, first first (the key in the default
/// namespace).
pub async fn redis_queue(url: &str, key: &str) -> Vec<String> {
    let client = redis::Client::open(url).unwrap();
    let mut con = client
        .get_multiplexed_async_connection_with_config(&unhurried())
        .await
        .unwrap();
    redis::cmd("ZRANGE")
        .arg(format!("zklock:queue:/zklock/locks/{key}"))
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap()
}

/// Waits until `n` processes wait in `key`'s queue on Redis.
pub async fn redis_queued(url: &str, key: &str, n: usize) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while redis_queue(url, key).await.len() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} waiters never queued for {key}"));
}

/// The lease of the PostgreSQL tests' managers (their sessions' `idle_session_timeout`): long
/// enough that a busy 2-core machine never misses a liveness check, short enough for loss
/// tests to be quick.
pub const PG_LEASE: Duration = Duration::from_secs(3);

/// The lease of the MySQL tests' managers (their sessions' `wait_timeout`, whole seconds): as
/// [`PG_LEASE`], long enough for a busy machine, short enough for loss tests.
pub const MYSQL_LEASE: Duration = Duration::from_secs(3);

/// The class (first key) of zklock's advisory locks (`zkLK`), as `pg_locks.classid` shows it.
pub const PG_LOCK_CLASS: i64 = 0x7A6B_4C4B;

/// Starts a real PostgreSQL of the test kit on a free loopback port.
pub fn pg_server() -> zklock_testkit::PostgresServer {
    zklock_testkit::PostgresServer::start().expect("start postgres (see the test kit's error)")
}

/// A manager on the PostgreSQL at `url`, with [`PG_LEASE`].
pub async fn pg_manager(url: &str) -> LockManager {
    LockManager::builder(url)
        .postgres(|pg| pg.lease(PG_LEASE))
        .connect()
        .await
        .expect("connect to the test PostgreSQL")
}

/// A plain PostgreSQL client on `url`, its connection driven by a task of its own: what a test
/// looks at the server's locks and sessions with, beside the managers it tests.
pub async fn pg_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test PostgreSQL");
    tokio::spawn(connection);
    client
}

/// `err` refuses another backend's settings for a connect string that names `backend`
/// (`Redis`, `PostgreSQL`): a configuration error that names the backend, says where its own
/// settings go (`Builder::<method>`), and shows no password.
pub fn assert_refused_as_another_backends(err: &zklock::Error, backend: &str, method: &str) {
    let text = err.to_string();
    assert!(matches!(err, zklock::Error::Config(_)), "{err}");
    assert!(
        text.contains(&format!("names {backend}")) && text.contains(&format!("Builder::{method}")),
        "says which backend the URL names, and where its settings go: {text}"
    );
    assert!(!text.contains("secret"), "no password in {text}");
}
