//! What only the MySQL / MariaDB backend has, against a real MariaDB (the test kit's, on a free
//! port with a throwaway data directory): a bare `GET_LOCK` client on the documented name, the
//! holding session killed from outside, a restarted server, a crash that loses the last
//! commits, a replica, the narrow account, and the kill of a dropped acquire's session. What
//! every backend promises is in `tests/behaviour/`.
//!
//! Every check looks at the server itself where it can: `IS_USED_LOCK` for who holds, the
//! process list for who waits.

use std::time::Duration;

use mysql_async::prelude::Queryable;
use zklock::{Error, LockManager, LossReason};
use zklock_testkit::{MariaDbServer, Relay};

use crate::common::{eventually, MYSQL_LEASE as LEASE};

fn server() -> MariaDbServer {
    MariaDbServer::start().expect("start MariaDB (see the test kit's error)")
}

async fn manager(url: &str) -> LockManager {
    LockManager::builder(url)
        .mysql(|my| my.lease(LEASE))
        .connect()
        .await
        .expect("connect to the test MariaDB")
}

/// `sql` as the server's root, its output trimmed.
fn root(server: &MariaDbServer, sql: &str) -> String {
    tokio::task::block_in_place(|| server.root_sql(sql)).expect("run SQL on the test MariaDB")
}

/// The session that holds `key`'s user lock, if any.
fn holder_of(server: &MariaDbServer, m: &LockManager, key: &str) -> Option<u64> {
    let name = zklock::mysql_lock_name(&m.path_of(key).unwrap());
    root(server, &format!("SELECT IS_USED_LOCK('{name}')"))
        .parse()
        .ok()
}

/// How many sessions wait in `GET_LOCK` for `key`'s user lock.
fn waiting_for(server: &MariaDbServer, m: &LockManager, key: &str) -> usize {
    let name = zklock::mysql_lock_name(&m.path_of(key).unwrap());
    root(
        server,
        &format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' \
             AND INFO LIKE 'SELECT GET_LOCK(''{name}'',%'"
        ),
    )
    .parse()
    .unwrap()
}

/// Another client that takes the documented name with a bare `GET_LOCK` excludes zklock's
/// holders, and is excluded by them; zklock's tokens keep increasing around it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_get_lock_client_and_zklock_exclude_each_other() {
    let db = server();
    let m = manager(&db.url()).await;
    let name = zklock::mysql_lock_name(&m.path_of("interop").unwrap());
    assert!(name.starts_with("zklock:locks/interop:"), "{name}");
    let mut bare = mysql_async::Conn::new(mysql_async::Opts::from_url(&db.url()).unwrap())
        .await
        .unwrap();
    let first = m.lock("interop").await.unwrap().fencing_token();
    m.flush().await;

    let got: Option<i64> = bare
        .query_first(format!("SELECT GET_LOCK('{name}', 0)"))
        .await
        .unwrap();
    assert_eq!(got, Some(1), "the bare client takes the free name");
    assert!(m.try_lock("interop").await.unwrap().is_none());
    let waiting = tokio::spawn({
        let m = m.clone();
        async move { m.lock("interop").await.unwrap() }
    });
    eventually(
        "the zklock waiter in GET_LOCK",
        Duration::from_secs(10),
        || async { waiting_for(&db, &m, "interop") == 1 },
    )
    .await;
    let _: Option<i64> = bare
        .query_first(format!("SELECT RELEASE_LOCK('{name}')"))
        .await
        .unwrap();
    let held = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("zklock gets the name once the bare client lets go")
        .unwrap();
    assert!(held.fencing_token() > first);
    let got: Option<i64> = bare
        .query_first(format!("SELECT GET_LOCK('{name}', 0)"))
        .await
        .unwrap();
    assert_eq!(got, Some(0), "zklock's holder excludes the bare client");
    held.release().await.unwrap();
}

/// A holding session ended from outside (`KILL`) is a lost hold, reported within the lease;
/// the next holder's token is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holding_session_is_a_lost_hold() {
    let db = server();
    let (a, b) = (manager(&db.url()).await, manager(&db.url()).await);
    let held = a.lock("killed").await.unwrap();
    let session = holder_of(&db, &a, "killed").expect("held by a session");
    tokio::task::block_in_place(|| db.kill_connection(session)).unwrap();
    let reason = tokio::time::timeout(LEASE, held.lost())
        .await
        .expect("the loss is reported within the lease");
    assert!(
        matches!(reason, LossReason::Disconnected | LossReason::LeaseExpired),
        "{reason:?}"
    );
    let next = b.lock("killed").await.unwrap();
    assert!(next.fencing_token() > held.fencing_token());
    assert!(matches!(held.release().await, Err(Error::LockLost { .. })));
    next.release().await.unwrap();
}

/// A server stopped (as in a crash) and started again: the holder is lost, and the tokens of
/// later grants are above every earlier one even though the server lost its last commits
/// (`innodb_flush_log_at_trx_commit=0`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_a_crash_that_loses_the_last_commits() {
    let mut db = MariaDbServer::builder()
        .lose_last_commits()
        .start()
        .expect("start MariaDB");
    let m = manager(&db.url()).await;
    let mut last = zklock::FencingToken::NONE;
    for _ in 0..20 {
        let g = m.lock("crash").await.unwrap();
        assert!(g.fencing_token() > last);
        last = g.fencing_token();
        g.release().await.unwrap();
    }
    let held = m.lock("crash").await.unwrap();
    last = last.max(held.fencing_token());
    tokio::task::block_in_place(|| db.stop()).unwrap();
    let reason = tokio::time::timeout(LEASE * 2, held.lost())
        .await
        .expect("a crashed server is a lost hold");
    assert!(
        matches!(reason, LossReason::Disconnected | LossReason::LeaseExpired),
        "{reason:?}"
    );
    tokio::task::block_in_place(|| db.restart()).unwrap();
    let m = manager(&db.url()).await;
    let after = m.lock("crash").await.unwrap();
    assert!(
        after.fencing_token() > last,
        "{:?} after {last:?}",
        after.fencing_token()
    );
    after.release().await.unwrap();
}

/// A server with `read_only` set (a replica) is refused at connect, with a message that says
/// why; the same server once writable is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_refused_at_connect() {
    let db = server();
    root(&db, "SET GLOBAL read_only = 1");
    let err = LockManager::connect(&db.url()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Config(msg) if msg.contains("read_only") && msg.contains("primary")),
        "{err}"
    );
    root(&db, "SET GLOBAL read_only = 0");
    let m = manager(&db.url()).await;
    m.lock("writable").await.unwrap().release().await.unwrap();
}

/// An account without `CREATE` is told what to run when the table is missing, and works once
/// the table is there (made here by the full account, as `zklock setup` would have an
/// administrator do).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_narrow_account_needs_only_the_table() {
    let db = server();
    let err = LockManager::connect(&db.narrow_url()).await.unwrap_err();
    assert!(
        matches!(&err, Error::Config(msg) if msg.contains("zklock_locks") && msg.contains("setup")),
        "{err}"
    );
    let setup = LockManager::builder(db.url())
        .setup_sql(Some("'zklock_narrow'@'%'"))
        .unwrap()
        .unwrap();
    assert!(
        setup.contains("CREATE TABLE IF NOT EXISTS zklock_locks"),
        "{setup}"
    );
    manager(&db.url()).await;
    let narrow = manager(&db.narrow_url()).await;
    let first = narrow.lock("narrow").await.unwrap();
    let token = first.fencing_token();
    first.release().await.unwrap();
    let second = narrow.lock("narrow").await.unwrap();
    assert!(second.fencing_token() > token);
    second.release().await.unwrap();
}

/// An acquire dropped while it waits in the server's queue leaves no session waiting (its
/// session is killed from a sibling), and the same process's next acquire, once the holder
/// lets go, gets the lock at once: no killed waiter took it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_leaves_no_session_waiting() {
    let db = server();
    let (a, b) = (manager(&db.url()).await, manager(&db.url()).await);
    let held = a.lock("dropped").await.unwrap();
    for _ in 0..3 {
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.lock("dropped").await }
        });
        eventually(
            "the waiter in GET_LOCK",
            Duration::from_secs(10),
            || async { waiting_for(&db, &b, "dropped") == 1 },
        )
        .await;
        waiting.abort();
        let _ = waiting.await;
        b.flush().await;
        assert_eq!(
            waiting_for(&db, &b, "dropped"),
            0,
            "a killed waiter still waits"
        );
    }
    held.release().await.unwrap();
    a.flush().await;
    let next = b
        .try_lock("dropped")
        .await
        .unwrap()
        .expect("free: no dropped waiter took it");
    next.release().await.unwrap();
}

/// A holder cut off from the server (a partition: nothing reaches either side) is reported
/// lost within the lease, and the server frees its lock by itself after about the lease (the
/// session's `wait_timeout`, which zklock sets to the lease; the server's own default is 8
/// hours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_freed_by_the_server() {
    let db = server();
    let relay = Relay::start(&format!("127.0.0.1:{}", db.port())).unwrap();
    let cut_off = manager(&relay.url(&db.url())).await;
    let held = cut_off.lock("partitioned").await.unwrap();
    assert!(holder_of(&db, &cut_off, "partitioned").is_some());
    relay.blackhole();
    let reason = tokio::time::timeout(LEASE, held.lost())
        .await
        .expect("the cut-off holder is told within the lease");
    assert!(
        matches!(reason, LossReason::Disconnected | LossReason::LeaseExpired),
        "{reason:?}"
    );
    let cut_at = std::time::Instant::now();
    eventually(
        "the server frees the cut-off holder's lock",
        LEASE * 2,
        || async { holder_of(&db, &cut_off, "partitioned").is_none() },
    )
    .await;
    assert!(cut_at.elapsed() <= LEASE + Duration::from_secs(1));
    let other = manager(&db.url()).await;
    let next = other.lock("partitioned").await.unwrap();
    assert!(next.fencing_token() > held.fencing_token());
    next.release().await.unwrap();
    relay.heal();
}

/// Whether session `id` is still on the server.
fn session_alive(server: &MariaDbServer, id: u64) -> bool {
    root(
        server,
        &format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {id}"),
    ) == "1"
}

/// An acquire given up while its session holds the lock (here: cut off by its timeout while
/// its token's raise is on the way) has that session ended from a sibling (`KILL <id>`). The
/// relay holds the kill back 3 s, as a slow network may: meanwhile the process goes on, its
/// other holds taking sessions from its pool. The late kill must end the given-up session
/// only: every later hold stays held on the server, the process's next try of the lock waits
/// for the kill (an undo) and then gets it, and nothing is left behind. This is the
/// MySQL counterpart of PostgreSQL's late cancel: were the session given back to the pool
/// before its kill (as a design that kills only the statement, `KILL QUERY`, would), the kill
/// would end a later hold's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_that_arrives_late_reaches_no_later_hold() {
    let db = server();
    let relay = Relay::start(&format!("127.0.0.1:{}", db.port())).unwrap();
    let m = manager(&relay.url(&db.url())).await;
    // The token's raise (its statement's first preparation on a session) and every kill reach
    // the server late; the raise still within the reply timeout (a third of the lease).
    relay.hold_back_requests_with(b"INSERT INTO zklock_locks", Duration::from_millis(700));
    relay.hold_back_requests_with(b"KILL ", Duration::from_secs(3));

    let cut = tokio::time::timeout(Duration::from_millis(300), m.lock("late")).await;
    assert!(
        cut.is_err(),
        "the acquire is cut off during its token's raise"
    );
    let doomed = holder_of(&db, &m, "late").expect("the given-up session still holds the lock");

    // The process's next try of the lock (which does not wait in the server's queue) waits
    // for the kill; meanwhile the process goes on, taking sessions for other holds.
    let again = tokio::spawn({
        let m = m.clone();
        async move { m.try_lock("late").await }
    });
    let mut others = Vec::new();
    for i in 0..3 {
        let key = format!("late-{i}");
        let guard = m.lock(&key).await.unwrap();
        others.push((key, guard));
    }
    let again = again.await.unwrap().unwrap().expect(
        "the process's next try of the lock waits for its own given-up acquire's kill, then gets it",
    );
    assert!(!session_alive(&db, doomed));
    assert!(
        relay.held_back() >= 2,
        "the raise and the kill were held back"
    );
    others.push(("late".to_string(), again));
    for (key, guard) in &others {
        let holder = holder_of(&db, &m, key);
        assert!(
            holder.is_some_and(|id| id != doomed && session_alive(&db, id)),
            "{key}: the late kill reached a later hold (held by {holder:?}, the given-up session was {doomed})"
        );
        assert!(guard.is_held(), "{key}");
    }
    for (key, guard) in others {
        guard.release().await.unwrap();
        assert_eq!(holder_of(&db, &m, &key), None, "{key} left behind");
    }
}
