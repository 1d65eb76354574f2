//! PostgreSQL's fencing tokens across a crash that loses commits, against a real PostgreSQL
//! (the test kit's). The server runs with `synchronous_commit = off` and its WAL writer frozen
//! (`PostgresServer::freeze_wal_writer`), then is killed: the commits made since are lost, as
//! a failover to an asynchronous replica loses what the replica had not received. Each test
//! first checks that the key row did go back, so it proves the fault happened, then that every
//! token granted after the crash is above every token granted before it. The same holds across
//! a streaming standby promoted after replication was cut off (it lacks the last grants) and
//! across a restore from an earlier base backup. And tokens stay at the server's clock: the
//! counter does not run ahead of it.

use crate::common;

use std::time::Duration;

use zklock::{FencingToken, LockManager};
use zklock_testkit::PostgresServer;

use common::{eventually, pg_manager as manager, pg_server};

/// A server whose commits do not wait for the WAL flush (new sessions read the setting).
async fn lossy_server() -> PostgresServer {
    let pg = pg_server();
    pg.psql("ALTER SYSTEM SET synchronous_commit = off")
        .unwrap();
    pg.psql("SELECT pg_reload_conf()").unwrap();
    eventually(
        "synchronous_commit = off",
        Duration::from_secs(10),
        || async { pg.psql("SHOW synchronous_commit").unwrap().trim() == "off" },
    )
    .await;
    pg
}

/// The key row's counter, read by `psql` (a read writes nothing).
fn fence(pg: &PostgresServer, path: &str) -> i64 {
    pg.psql(&format!(
        "SELECT fence FROM zklock_keys WHERE path = '{}'",
        path.replace('\'', "''")
    ))
    .unwrap()
    .trim()
    .parse()
    .unwrap()
}

/// One grant of `key` by `m`, released at once: its token.
async fn grant(m: &LockManager, key: &str) -> FencingToken {
    let g = tokio::time::timeout(Duration::from_secs(20), m.lock(key))
        .await
        .expect("granted in time")
        .unwrap();
    let token = g.fencing_token();
    g.release().await.unwrap();
    token
}

/// Every token in `later` is above every token in `earlier`, and `later` increases.
fn assert_above(earlier: &[FencingToken], later: &[FencingToken]) {
    let top = earlier.iter().max().unwrap();
    for t in later {
        assert!(
            t > top,
            "a token after the fault is not above every token before it: {t:?} after {top:?} \
             (the highest of {} before), {later:?} after",
            earlier.len()
        );
    }
    for pair in later.windows(2) {
        assert!(pair[0] < pair[1], "{later:?}");
    }
}

/// A crash loses the last grants of a key (the row goes back): the process whose grants are
/// the last ones kept, and a process that starts after the crash, still get tokens above
/// every token granted before the crash, the lost ones included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_repeat_or_go_back_after_a_crash_loses_commits() {
    let mut pg = lossy_server().await;
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let path = a.path_of("k").unwrap();
    let mut before = vec![grant(&b, "k").await];
    for _ in 0..3 {
        before.push(grant(&a, "k").await);
    }
    pg.psql("CHECKPOINT").unwrap();
    let kept = fence(&pg, &path);

    pg.freeze_wal_writer().unwrap();
    for _ in 0..2 {
        before.push(grant(&b, "k").await);
    }
    let lost = fence(&pg, &path);
    assert!(lost > kept, "{lost} {kept}");
    pg.restart().unwrap();
    let back = fence(&pg, &path);
    assert!(
        back < lost,
        "the crash must lose the last grants' commits: {back} after {lost}"
    );

    let c = manager(&pg.url()).await;
    let mut after = vec![];
    for m in [&a, &c, &b, &a, &c] {
        after.push(grant(m, "k").await);
    }
    assert_above(&before, &after);
    for m in [a, b, c] {
        m.flush().await;
    }
}

/// On a server that waits for the flush of every commit (`synchronous_commit = on`, its
/// default), a grant whose token is the clock's reading does not: it commits asynchronously,
/// so a crash with the WAL writer frozen loses it (the row goes back, which proves the commit
/// did not wait), and every token granted after the crash is still above every token before
/// it, the lost ones included: they were clock readings, and the clock is ahead of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_token_commits_without_waiting_and_a_crash_that_loses_it_is_safe() {
    let mut pg = pg_server();
    assert_eq!(pg.psql("SHOW synchronous_commit").unwrap().trim(), "on");
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let path = a.path_of("async").unwrap();
    let mut before = vec![grant(&a, "async").await, grant(&b, "async").await];
    pg.psql("CHECKPOINT").unwrap();
    let kept = fence(&pg, &path);

    pg.freeze_wal_writer().unwrap();
    for m in [&a, &b, &a] {
        before.push(grant(m, "async").await);
    }
    let lost = fence(&pg, &path);
    assert!(lost > kept, "{lost} {kept}");
    pg.restart().unwrap();
    let back = fence(&pg, &path);
    assert!(
        back < lost,
        "a clock token's commit waited for the flush: {back} after {lost}"
    );

    let c = manager(&pg.url()).await;
    let mut after = vec![];
    for m in [&c, &a, &b, &c] {
        after.push(grant(m, "async").await);
    }
    assert_above(&before, &after);
    for m in [a, b, c] {
        m.flush().await;
    }
}

/// The server's clock in µs, as the backend reads it.
async fn server_us(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Processes taking turns at a key get tokens floored by the server's clock and never ahead
/// of it: the counter does not run ahead of the clock however many grants there are (were it
/// ahead, a crash that lost its last raise could let a later grant repeat a token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stay_at_the_server_clock() {
    let pg = pg_server();
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let look = common::pg_client(&pg.url()).await;
    let mut last = None;
    for i in 0..12 {
        let m = if i % 2 == 0 { &a } else { &b };
        let from = server_us(&look).await;
        let token = grant(m, "clock").await;
        let to = server_us(&look).await;
        assert!(
            token.grant() >= from && token.grant() <= to,
            "grant {i}: token {token} outside the server's clock [{from}, {to}]"
        );
        assert!(last.is_none_or(|l| l < token), "{last:?} {token}");
        last = Some(token);
    }
    for m in [a, b] {
        m.flush().await;
    }
}

/// A counter ahead of the clock (left by an earlier version, which reserved blocks of 2^20
/// tokens, or after the server's clock stepped back): a grant whose token is above the clock
/// waits for its commit's flush whatever `synchronous_commit` says, so a crash does not lose
/// it and a later grant does not repeat it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_above_the_clock_is_flushed_before_it_is_given() {
    let mut pg = lossy_server().await;
    let a = manager(&pg.url()).await;
    let path = a.path_of("ahead").unwrap();
    let mut before = vec![grant(&a, "ahead").await];
    // An hour ahead.
    pg.psql(&format!(
        "UPDATE zklock_keys SET fence = fence + 3600000000 WHERE path = '{path}'"
    ))
    .unwrap();
    pg.psql("CHECKPOINT").unwrap();
    let kept = fence(&pg, &path);

    pg.freeze_wal_writer().unwrap();
    before.push(grant(&a, "ahead").await);
    assert!(before[1].grant() > kept, "{before:?} {kept}");
    pg.restart().unwrap();
    assert!(
        fence(&pg, &path) >= before[1].grant(),
        "the grant above the clock was flushed"
    );

    let c = manager(&pg.url()).await;
    let after = vec![grant(&c, "ahead").await, grant(&a, "ahead").await];
    assert_above(&before, &after);
    for m in [a, c] {
        m.flush().await;
    }
}

/// The fault the tests above rely on, checked on the real server: with the WAL writer frozen
/// and `synchronous_commit = off`, a crash loses an update the server had committed; an update
/// that asked for its flush (`synchronous_commit = local`, as zklock's grants above the clock
/// do) survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loses_what_was_not_flushed() {
    let mut pg = lossy_server().await;
    pg.psql("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0), (2, 0)")
        .unwrap();
    pg.psql("CHECKPOINT").unwrap();
    pg.freeze_wal_writer().unwrap();
    pg.psql(
        "UPDATE t SET v = 2 WHERE id = 2 \
         AND set_config('synchronous_commit', 'local', true) IS NOT NULL",
    )
    .unwrap();
    // After it: the flushed commit wrote the log up to itself, and no further.
    pg.psql("UPDATE t SET v = 2 WHERE id = 1").unwrap();
    assert_eq!(pg.psql("SELECT v FROM t ORDER BY id").unwrap(), "2\n2\n");
    pg.restart().unwrap();
    assert_eq!(pg.psql("SELECT v FROM t ORDER BY id").unwrap(), "0\n2\n");
}

/// A streaming standby promoted while tokens are being handed out, after replication was cut
/// off (a relay in front of the primary, blackholed: the standby hears nothing more): the
/// primary dies, the standby is promoted without the last grants (its key row is behind every
/// token the primary gave since the cut, which proves they were lost), and every token granted
/// on the promoted standby is above every token the old primary gave, the lost ones included.
/// A grant on the old primary as it dies is either answered before or refused with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stay_above_across_a_standby_promotion_that_lost_grants() {
    let mut primary = pg_server();
    let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", primary.port())).unwrap();
    let standby = primary.start_standby(Some(relay.port())).unwrap();
    let (a, b) = (manager(&primary.url()).await, manager(&primary.url()).await);
    let path = a.path_of("promoted").unwrap();
    let mut before = vec![];
    for m in [&a, &b, &a] {
        before.push(grant(m, "promoted").await);
    }
    // The standby has every grant so far.
    eventually("the standby caught up", Duration::from_secs(20), || async {
        standby
            .psql(&format!(
                "SELECT fence FROM zklock_keys WHERE path = '{}'",
                path.replace('\'', "''")
            ))
            .is_ok_and(|f| {
                f.trim()
                    .parse::<i64>()
                    .is_ok_and(|f| f == fence(&primary, &path))
            })
    })
    .await;

    // Replication cut off; grants go on on the primary, busy while it dies.
    relay.blackhole();
    for m in [&b, &a, &b] {
        before.push(grant(m, "promoted").await);
    }
    let given = fence(&primary, &path);
    let busy = {
        let a = a.clone();
        tokio::spawn(async move {
            let mut tokens = vec![];
            // Until the server dies under it (a minute at most).
            for _ in 0..100_000 {
                match tokio::time::timeout(Duration::from_secs(5), a.lock("promoted")).await {
                    Ok(Ok(g)) => {
                        tokens.push(g.fencing_token());
                        let _ = g.release().await;
                    }
                    // Refused (the server died under it) or never answered: no token.
                    Ok(Err(_)) | Err(_) => break,
                }
            }
            tokens
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    primary.stop().unwrap();
    before.extend(busy.await.unwrap());
    standby.promote().unwrap();
    let back: i64 = standby
        .psql(&format!(
            "SELECT fence FROM zklock_keys WHERE path = '{}'",
            path.replace('\'', "''")
        ))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        back < given,
        "the promoted standby must lack the grants made after the cut: {back} against {given}"
    );

    // The processes of the old primary, pointed at the new one, and a new process.
    let c = manager(&standby.url()).await;
    let d = manager(&standby.url()).await;
    let mut after = vec![];
    for m in [&c, &d, &c, &d] {
        after.push(grant(m, "promoted").await);
    }
    assert_above(&before, &after);
    for m in [a, b, c, d] {
        m.flush().await;
    }
}

/// The server restored from a base backup taken earlier (every grant since is gone from its
/// key row): tokens granted after the restore are above every token granted before it, the
/// ones the backup does not know of included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_stay_above_after_a_restore_from_an_earlier_base_backup() {
    let mut pg = pg_server();
    let a = manager(&pg.url()).await;
    let path = a.path_of("restored").unwrap();
    let mut before = vec![grant(&a, "restored").await];
    let backup = pg.base_backup().unwrap();
    let kept = fence(&pg, &path);
    for _ in 0..5 {
        before.push(grant(&a, "restored").await);
    }
    let given = fence(&pg, &path);
    assert!(given > kept);
    pg.restore(&backup).unwrap();
    assert_eq!(
        fence(&pg, &path),
        kept,
        "the restore must bring the key row back to the backup's"
    );

    let b = manager(&pg.url()).await;
    let mut after = vec![];
    for m in [&b, &a, &b] {
        after.push(grant(m, "restored").await);
    }
    assert_above(&before, &after);
    for m in [a, b] {
        m.flush().await;
    }
}
