//! Waiting in PostgreSQL's own lock queue, against a real PostgreSQL (the test kit's): an
//! acquire that finds the lock taken blocks in `pg_advisory_lock` on a connection given to the
//! wait, and the server hands the lock over on release. Checked on the server itself
//! (`pg_locks`, `pg_stat_activity`): grants in the order the server queued the waiters, tokens
//! increasing across the hand-over, the releaser not barging ahead, and that a wait ended any
//! way — its deadline, its acquire dropped (also just as the lock is granted), its connection
//! killed — leaves nothing held and nothing queued.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use zklock::{Error, FencingToken, LockManager};

use common::{
    eventually, pg_client, pg_manager as manager, pg_server as server, PG_LEASE as LEASE,
    PG_LOCK_CLASS as LOCK_CLASS,
};

/// zklock's advisory locks on the server, held (`granted`) or waited for: `(objid, pid)`, the
/// waits in the order the server queued them.
async fn locks(client: &tokio_postgres::Client, granted: bool) -> Vec<(i64, i32)> {
    client
        .query(
            "SELECT objid::bigint, pid FROM pg_locks \
             WHERE locktype = 'advisory' AND classid::bigint = $1 AND objsubid = 2 \
             AND granted = $2 ORDER BY waitstart",
            &[&LOCK_CLASS, &granted],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

async fn held(client: &tokio_postgres::Client) -> Vec<(i64, i32)> {
    locks(client, true).await
}

async fn queued(client: &tokio_postgres::Client) -> Vec<(i64, i32)> {
    locks(client, false).await
}

/// Waits until `n` waits are in the server's queue.
async fn until_queued(look: &tokio_postgres::Client, n: usize) {
    eventually(
        &format!("{n} waits in the server's queue"),
        Duration::from_secs(10),
        || async { queued(look).await.len() == n },
    )
    .await;
}

/// Waiters of four other processes, queued one after the other behind a holder: the server
/// grants them in that order, each with a token above the one before, and the holder, taking
/// the key again right after its release, does not get in ahead of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_the_order_the_server_queued_them() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let holder = manager(&pg.url()).await;
    let first = holder.lock("fifo").await.unwrap();
    let grants: Arc<Mutex<Vec<(usize, FencingToken)>>> = Arc::default();
    let mut tasks = vec![];
    for i in 0..4 {
        let m = manager(&pg.url()).await;
        let grants = grants.clone();
        tasks.push(tokio::spawn(async move {
            let g = m.lock("fifo").await.unwrap();
            grants.lock().unwrap().push((i, g.fencing_token()));
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await.unwrap();
            m.flush().await;
        }));
        until_queued(&look, i + 1).await;
    }
    let token = first.fencing_token();
    first.release().await.unwrap();
    assert!(
        holder.try_lock("fifo").await.unwrap().is_none(),
        "the releaser got in ahead of the queue"
    );
    for t in tasks {
        t.await.unwrap();
    }
    let grants = grants.lock().unwrap().clone();
    let order: Vec<usize> = grants.iter().map(|g| g.0).collect();
    assert_eq!(order, vec![0, 1, 2, 3], "granted out of the queue's order");
    let mut last = token;
    for (i, t) in &grants {
        assert!(
            *t > last,
            "waiter {i}: token {t} not above {last}: {grants:?}"
        );
        last = *t;
    }
    holder.flush().await;
    assert!(held(&look).await.is_empty());
    assert!(queued(&look).await.is_empty());
}

/// A deadline that runs out while the acquire waits in the server's queue: `Timeout`, on time,
/// and the wait is gone from the server's queue at once; nothing is held once the holder
/// lets go, and the waiting manager takes the key afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_in_the_queue_leaves_nothing() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let g = a.lock("deadline").await.unwrap();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let waited = b.lock_timeout("deadline", Duration::from_millis(400)).await;
        assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        eventually(
            "the wait gone from the queue",
            Duration::from_millis(500),
            || async { queued(&look).await.is_empty() },
        )
        .await;
        assert_eq!(held(&look).await.len(), 1, "only a's hold");
    }
    g.release().await.unwrap();
    b.flush().await;
    assert!(held(&look).await.is_empty(), "nothing held once a let go");
    let g = tokio::time::timeout(Duration::from_secs(5), b.lock("deadline"))
        .await
        .expect("b takes the key")
        .unwrap();
    g.release().await.unwrap();
    assert!(held(&look).await.is_empty());
}

/// An acquire dropped while it waits in the server's queue: its wait is cancelled on the
/// server (gone from the queue while the holder still holds), and nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_acquire_in_the_queue_is_cancelled_on_the_server() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let g = a.lock("dropped").await.unwrap();
    let b2 = b.clone();
    let waiting = tokio::spawn(async move { b2.lock("dropped").await });
    until_queued(&look, 1).await;
    waiting.abort();
    let _ = waiting.await;
    eventually(
        "the dropped wait cancelled on the server",
        Duration::from_secs(2),
        || async { queued(&look).await.is_empty() },
    )
    .await;
    b.flush().await;
    assert_eq!(held(&look).await.len(), 1, "only a's hold");
    g.release().await.unwrap();
    assert!(held(&look).await.is_empty());
    // b's connections still serve.
    let g = tokio::time::timeout(Duration::from_secs(5), b.lock("dropped"))
        .await
        .expect("b takes the key")
        .unwrap();
    g.release().await.unwrap();
}

/// A process is not held up by its own abandoned waits: a wait in the server's queue whose
/// acquire was dropped is granted the lock when the holder releases at once (its cancel
/// request comes later: the waiting process's traffic is slowed by 100 ms each way), and is
/// undone in the background; the process's next try of the key waits for that undo instead of
/// finding the key held by its own abandoned wait (the mutation that skips the wait for undos
/// fails in the first round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_after_an_abandoned_wait_finds_the_key_free() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", pg.port())).unwrap();
    let a = manager(&pg.url()).await;
    let b = LockManager::builder(relay.url(&pg.url()))
        .postgres(|pg| pg.lease(LEASE))
        .local_queue(false)
        .connect()
        .await
        .unwrap();
    // b's connections are open before its traffic slows down: two acquires of the key at once
    // (each needs a session of its own), the second waiting in the server's queue.
    let first = b.lock("abandoned").await.unwrap();
    let second = tokio::spawn({
        let b = b.clone();
        async move { b.lock("abandoned").await.unwrap().release().await.unwrap() }
    });
    until_queued(&look, 1).await;
    first.release().await.unwrap();
    second.await.unwrap();
    relay.set_delay(Duration::from_millis(100));
    for round in 0..3 {
        let g = a.lock("abandoned").await.unwrap();
        let b2 = b.clone();
        let waiting = tokio::spawn(async move { b2.lock("abandoned").await });
        until_queued(&look, 1).await;
        waiting.abort();
        let _ = waiting.await;
        g.release().await.unwrap();
        let again = tokio::time::timeout(Duration::from_secs(10), b.try_lock("abandoned"))
            .await
            .expect("the try answers")
            .unwrap();
        assert!(
            again.is_some(),
            "round {round}: b's try found the key held by its own abandoned wait"
        );
        again.unwrap().release().await.unwrap();
        b.flush().await;
        assert!(held(&look).await.is_empty(), "round {round}");
    }
}

/// The race of a grant and a drop: the holder releases while the waiter's acquire is dropped,
/// at many offsets. However it falls — the wait cancelled first, or granted and then dropped —
/// no lock is left held by nobody: once the waiter's manager has flushed, nothing is held, and
/// the first holder takes the key again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_racing_a_drop_leaves_nothing_held() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let mut granted = 0;
    for round in 0..60u64 {
        let g = a.lock("race").await.unwrap();
        let b2 = b.clone();
        let got = Arc::new(AtomicUsize::new(0));
        let got2 = got.clone();
        let waiting = tokio::spawn(async move {
            let g = b2.lock("race").await.unwrap();
            got2.fetch_add(1, Ordering::SeqCst);
            // Kept until the task is dropped.
            std::future::pending::<()>().await;
            drop(g);
        });
        until_queued(&look, 1).await;
        let release = g.release();
        let abort = async {
            // A spin, not a sleep: offsets finer than the timer's millisecond.
            let offset = Duration::from_micros(round * 7 % 300);
            let from = std::time::Instant::now();
            while from.elapsed() < offset {
                std::hint::spin_loop();
            }
            waiting.abort();
        };
        let (released, ()) = tokio::join!(release, abort);
        released.unwrap();
        let _ = waiting.await;
        b.flush().await;
        // A connection closed because a cancel may still be on its way releases its lock
        // once the server sees the connection gone: at once, give or take a scheduling.
        eventually(
            &format!(
                "round {round} (granted: {}): nothing held or queued",
                got.load(Ordering::SeqCst)
            ),
            Duration::from_secs(2),
            || async { held(&look).await.is_empty() && queued(&look).await.is_empty() },
        )
        .await;
        granted += got.load(Ordering::SeqCst);
        let again = tokio::time::timeout(Duration::from_secs(2), a.try_lock("race"))
            .await
            .expect("answered")
            .unwrap()
            .expect("the key is free");
        again.release().await.unwrap();
    }
    eprintln!("granted before the drop in {granted} of 60 rounds");
}

/// The race of a grant and a deadline: the holder releases around the moment the waiter's
/// deadline runs out, at many offsets. Whether the waiter got the lock (then it releases it)
/// or timed out — its wait ended by the server's `lock_timeout`, or granted just as its
/// acquire was dropped — nothing is left held once its manager has flushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_racing_a_deadline_leaves_nothing_held() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let (mut got, mut timed_out) = (0, 0);
    for round in 0..40u64 {
        let g = a.lock("deadline-race").await.unwrap();
        let b2 = b.clone();
        let deadline = Duration::from_millis(200);
        let started = std::time::Instant::now();
        let waiting = tokio::spawn(async move { b2.lock_timeout("deadline-race", deadline).await });
        // Released from 2 ms before the deadline to 2 ms after it.
        let at = deadline - Duration::from_millis(2) + Duration::from_micros(round * 100);
        tokio::time::sleep(at.saturating_sub(Duration::from_millis(5))).await;
        while started.elapsed() < at {
            std::hint::spin_loop();
        }
        g.release().await.unwrap();
        match waiting.await.unwrap() {
            Ok(g) => {
                got += 1;
                g.release().await.unwrap();
            }
            Err(Error::Timeout { .. }) => timed_out += 1,
            Err(e) => panic!("round {round}: {e}"),
        }
        b.flush().await;
        eventually(
            &format!("round {round}: nothing held or queued"),
            Duration::from_secs(2),
            || async { held(&look).await.is_empty() && queued(&look).await.is_empty() },
        )
        .await;
    }
    eprintln!("granted in {got} rounds, timed out in {timed_out}");
}

/// The waiting connection killed by the server (`pg_terminate_backend`) while it is queued:
/// the wait held nothing, and the acquire queues again on a new connection (at the back) and
/// is granted when the holder lets go, with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_connection_killed_in_the_queue_waits_again() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let g = a.lock("killed").await.unwrap();
    let b2 = b.clone();
    let waiting = tokio::spawn(async move {
        let g = b2.lock("killed").await.unwrap();
        let token = g.fencing_token();
        g.release().await.unwrap();
        token
    });
    until_queued(&look, 1).await;
    let pid = queued(&look).await[0].1;
    look.execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    eventually(
        "queued again on a new connection",
        Duration::from_secs(10),
        || async { queued(&look).await.iter().any(|q| q.1 != pid) },
    )
    .await;
    assert_eq!(held(&look).await.len(), 1, "only a's hold");
    let first = g.fencing_token();
    g.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("granted once a let go")
        .unwrap();
    assert!(second > first, "{first} {second}");
    b.flush().await;
    assert!(held(&look).await.is_empty());
    assert!(queued(&look).await.is_empty());
}

/// A wait in the server's queue longer than the lease: the waiting connection is not checked
/// while it waits (a check would wait behind the wait), and the hold it is granted is alive:
/// the session is asked once more after the grant, not taken as lost, and it stays held past
/// another lease (the connection's checks resumed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_longer_than_the_lease_is_granted_a_live_hold() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let g = a.lock("long").await.unwrap();
    let b2 = b.clone();
    let waiting = tokio::spawn(async move { b2.lock("long").await.unwrap() });
    until_queued(&look, 1).await;
    let pid = queued(&look).await[0].1;
    tokio::time::sleep(LEASE * 2).await;
    assert!(!waiting.is_finished());
    assert_eq!(
        queued(&look).await,
        vec![(queued(&look).await[0].0, pid)],
        "the same connection waits all along"
    );
    g.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("granted once a let go")
        .unwrap();
    assert!(got.is_held(), "{:?}", got.loss_reason());
    tokio::time::sleep(LEASE + LEASE / 2).await;
    assert!(got.is_held(), "{:?}", got.loss_reason());
    got.release().await.unwrap();
    assert!(held(&look).await.is_empty());
}

/// While a task waits in the server's queue for one key, its manager's other acquires (of
/// free keys) and its holds' checks are not held up behind the wait: they go to other
/// connections, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_keys_are_not_held_up_by_a_wait_in_the_queue() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let g = a.lock("busy").await.unwrap();
    let b2 = b.clone();
    let waiting = tokio::spawn(async move { b2.lock("busy").await.unwrap() });
    until_queued(&look, 1).await;
    for i in 0..20 {
        let started = std::time::Instant::now();
        let other = b.lock(&format!("free-{i}")).await.unwrap();
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "held up for {:?}",
            started.elapsed()
        );
        other.release().await.unwrap();
    }
    assert_eq!(queued(&look).await.len(), 1, "the wait is still queued");
    g.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("granted once a let go")
        .unwrap();
    got.release().await.unwrap();
    assert!(held(&look).await.is_empty());
}

/// A reader that waits in the server's queue stays behind a writer that waits by retrying (a
/// manager's waits beyond the queue's bound): the writer's intent holds the reader's wait, so
/// the writer gets in first when the holder lets go, and the reader after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_in_the_queue_waits_behind_a_retrying_writer() {
    /// The class of a waiting writer's intent (`zkIN`).
    const INTENT_CLASS: i64 = 0x7A6B_494E;
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let (h, w, r) = (
        manager(&pg.url()).await,
        manager(&pg.url()).await,
        manager(&pg.url()).await,
    );
    // w's waits in the server's queue all taken, on other keys.
    let mut others = vec![];
    for i in 0..4 {
        let key = format!("other-{i}");
        others.push(h.lock(&key).await.unwrap());
        let w2 = w.clone();
        tokio::spawn(async move { w2.lock(&key).await.unwrap().release().await.unwrap() });
        until_queued(&look, i + 1).await;
    }
    let held_write = h.rwlock("rw").unwrap().write().await.unwrap();
    let w2 = w.clone();
    let writer = tokio::spawn(async move {
        let g = w2.rwlock("rw").unwrap().write().await.unwrap();
        let at = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(200)).await;
        g.release().await.unwrap();
        at
    });
    eventually("the writer's intent", Duration::from_secs(10), || async {
        look.query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
             AND classid::bigint = $1 AND objsubid = 2 AND granted",
            &[&INTENT_CLASS],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
            == 1
    })
    .await;
    let r2 = r.clone();
    let reader = tokio::spawn(async move {
        let g = r2.rwlock("rw").unwrap().read().await.unwrap();
        let at = std::time::Instant::now();
        g.release().await.unwrap();
        at
    });
    // The reader's wait is in the server's queue (behind the intent).
    eventually("the reader waits", Duration::from_secs(10), || async {
        look.query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
            == 5
    })
    .await;
    held_write.release().await.unwrap();
    let (wrote, read) = (writer.await.unwrap(), reader.await.unwrap());
    assert!(
        wrote < read,
        "the reader got in ahead of the waiting writer"
    );
    for g in others {
        g.release().await.unwrap();
    }
    for m in [&h, &w, &r] {
        m.flush().await;
    }
    eventually("nothing held", Duration::from_secs(5), || async {
        held(&look).await.is_empty()
    })
    .await;
}

/// Which statement an acquire sends first, read from the server's statement log: for a key
/// this process has not found taken lately, a try (`pg_try_advisory_lock`, cheaper for the
/// server than a wait's statement, and all a free key needs); once it found the key taken, a
/// wait in the server's queue (`pg_advisory_lock`); and within a second of that, the wait at
/// once, since a try would most likely be refused first (a round trip lost). The mutation that
/// never counts a key contended sends a try before the third acquire's wait; the one that
/// always does sends a wait for the first, free key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_key_is_tried_and_a_key_found_taken_lately_is_waited_for_at_once() {
    let pg = server();
    pg.psql("ALTER SYSTEM SET log_statement = 'all'").unwrap();
    pg.psql("ALTER SYSTEM SET log_line_prefix = '[%a] '")
        .unwrap();
    pg.psql("SELECT pg_reload_conf()").unwrap();
    eventually("statements logged", Duration::from_secs(10), || async {
        pg.psql("SHOW log_statement").unwrap().trim() == "all"
    })
    .await;
    let look = pg_client(&pg.url()).await;
    let a = manager(&pg.url()).await;
    let b = LockManager::builder(pg.url())
        .postgres(|pg| pg.lease(LEASE))
        .identity("first-statement")
        .connect()
        .await
        .unwrap();
    // A free key.
    b.lock("first").await.unwrap().release().await.unwrap();
    // Taken by another process, twice in a row.
    for _ in 0..2 {
        let g = a.lock("first").await.unwrap();
        let b2 = b.clone();
        let waiting =
            tokio::spawn(async move { b2.lock("first").await.unwrap().release().await.unwrap() });
        until_queued(&look, 1).await;
        g.release().await.unwrap();
        waiting.await.unwrap();
    }
    let log = std::fs::read_to_string(pg.log_path()).unwrap();
    let (try_lock, wait_lock) = (
        format!("pg_try_advisory_lock({LOCK_CLASS}"),
        format!("pg_advisory_lock({LOCK_CLASS}"),
    );
    let firsts: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("first-statement]"))
        .filter_map(|l| {
            if l.contains(&try_lock) {
                Some("try")
            } else if l.contains(&wait_lock) {
                Some("wait")
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        firsts,
        ["try", "try", "wait", "wait"],
        "b's attempts at the lock, in order: the free key, the key taken (a try refused, then \
         a wait), the key taken again within a second (the wait at once)"
    );
}

/// How many statements the server cancelled at a client's request, from its log.
fn cancels_in_log(pg: &zklock_testkit::PostgresServer) -> usize {
    std::fs::read_to_string(pg.log_path())
        .unwrap_or_default()
        .matches("canceling statement due to user request")
        .count()
}

/// A cancel reaches only the wait whose acquire was dropped. One task's acquires are dropped
/// while they wait in the server's queue, beside a task whose acquires are never dropped, on
/// one manager and one key that another process takes again and again, 60 ms at a time. The manager reaches
/// the server through a relay that plays PostgreSQL's late second cancel signal: every cancel
/// request is sent again once the cancelled statement has answered and a later statement of
/// the same session has run for 20 ms. No acquire that was not dropped may fail, nor any
/// dropped one with an error; the dropped waits were cancelled on the server; nothing is left
/// held or queued. (With cancel requests, and no retry of a statement cancelled by someone
/// else, the undisturbed task's wait met the late signal and `lock()` failed with 57014.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_s_cancel_fails_no_other_acquire() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let relay = zklock_testkit::LateCancel::start(&format!("127.0.0.1:{}", pg.port())).unwrap();
    let holder = manager(&pg.url()).await;
    let m = LockManager::builder(relay.url(&pg.url()))
        .postgres(|pg| pg.lease(LEASE))
        .local_queue(false)
        .connect()
        .await
        .unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    let failures: Arc<Mutex<Vec<String>>> = Arc::default();
    let (dropped, undisturbed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    // Takes the key for 60 ms at a time: the others wait in the server's queue, long enough
    // for a late signal to land while they wait.
    let taking = tokio::spawn(async move {
        while tokio::time::Instant::now() < until {
            let g = holder.lock("late").await.unwrap();
            tokio::time::sleep(Duration::from_millis(60)).await;
            g.release().await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        holder.flush().await;
    });
    let dropping = tokio::spawn({
        let (m, failures, dropped) = (m.clone(), failures.clone(), dropped.clone());
        async move {
            let mut i = 0u64;
            while tokio::time::Instant::now() < until {
                i += 1;
                let within = Duration::from_millis(3 + i % 12);
                match tokio::time::timeout(within, m.lock("late")).await {
                    Err(_) => {
                        dropped.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(Ok(g)) => g.release().await.unwrap(),
                    Ok(Err(e)) => failures.lock().unwrap().push(format!("dropped task: {e}")),
                }
            }
        }
    });
    let steady = tokio::spawn({
        let (m, failures, undisturbed) = (m.clone(), failures.clone(), undisturbed.clone());
        async move {
            while tokio::time::Instant::now() < until {
                match m.lock_timeout("late", Duration::from_secs(10)).await {
                    Ok(g) => {
                        undisturbed.fetch_add(1, Ordering::SeqCst);
                        g.release().await.unwrap();
                    }
                    Err(e) => failures
                        .lock()
                        .unwrap()
                        .push(format!("undisturbed task: {e}")),
                }
            }
        }
    });
    for t in [taking, dropping, steady] {
        t.await.unwrap();
    }
    let stats = relay.stats();
    eprintln!(
        "{} acquires dropped, {} undisturbed granted, relay: {stats:?}",
        dropped.load(Ordering::SeqCst),
        undisturbed.load(Ordering::SeqCst)
    );
    assert_eq!(*failures.lock().unwrap(), Vec::<String>::new());
    m.flush().await;
    assert!(held(&look).await.is_empty(), "a lock left held");
    assert!(queued(&look).await.is_empty(), "a wait left queued");
    let cancelled = cancels_in_log(&pg);
    assert!(
        cancelled >= 10,
        "only {cancelled} dropped waits were cancelled on the server: the test exercised no cancels"
    );
    assert!(undisturbed.load(Ordering::SeqCst) > 0);
}

/// A wait in the server's queue cancelled by someone else (an operator's `pg_cancel_backend`
/// of the waiting session): the acquire is not failed by it, and is granted once the holder
/// releases (the mutation that fails the acquire on a 57014 it did not ask for fails here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_cancelled_by_an_operator_goes_on() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let g = a.lock("operator").await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.lock_timeout("operator", Duration::from_secs(20)).await }
    });
    // When the wait in the server's queue began (seconds since the epoch).
    let since = || async {
        let rows = look
            .query(
                "SELECT extract(epoch FROM waitstart)::float8, pid FROM pg_locks \
                 WHERE locktype = 'advisory' AND classid::bigint = $1 AND objsubid = 2 \
                 AND NOT granted",
                &[&LOCK_CLASS],
            )
            .await
            .unwrap();
        rows.first()
            .map(|r| (r.get::<_, f64>(0), r.get::<_, i32>(1)))
    };
    for _ in 0..3 {
        until_queued(&look, 1).await;
        let (began, pid) = since().await.expect("queued");
        let cancelled: bool = look
            .query_one("SELECT pg_cancel_backend($1)", &[&pid])
            .await
            .unwrap()
            .get(0);
        assert!(cancelled);
        // The wait is sent again: queued once more, later, by a session that may be another.
        eventually(
            "the cancelled wait sent again",
            Duration::from_secs(5),
            || async { since().await.is_some_and(|(t, _)| t > began) },
        )
        .await;
        assert!(
            !waiting.is_finished(),
            "the acquire ended on a cancel it did not ask for"
        );
    }
    until_queued(&look, 1).await;
    g.release().await.unwrap();
    let granted = waiting
        .await
        .unwrap()
        .expect("granted after the operator's cancels");
    granted.release().await.unwrap();
    b.flush().await;
    a.flush().await;
    assert!(held(&look).await.is_empty());
}

/// `flush` waits for every registration of waiters that gave up: acquires that waited in the
/// server's queue and acquires that waited by retrying (their listening session's
/// registrations), all dropped; once `flush` returns, the manager's listening session holds no
/// registration (a wait's registration otherwise lingers for a moment after it ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_waits_for_the_registrations_of_waiters_that_gave_up() {
    const WAIT_CLASS: i64 = 0x7A6B_5749;
    const QUEUE_CLASS: i64 = 0x7A6B_5155;
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let registrations = |class: i64| {
        let look = &look;
        async move {
            let rows = look
                .query(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                     AND classid::bigint = $1 AND objsubid = 2",
                    &[&class],
                )
                .await
                .unwrap();
            rows[0].get::<_, i64>(0)
        }
    };
    let holder = manager(&pg.url()).await;
    let m = LockManager::builder(pg.url())
        .postgres(|pg| pg.lease(LEASE))
        .local_queue(false)
        .connect()
        .await
        .unwrap();
    for round in 0..3 {
        let g = holder.lock("gave-up").await.unwrap();
        let waiters: Vec<_> = (0..7)
            .map(|_| {
                let m = m.clone();
                tokio::spawn(async move { m.lock("gave-up").await })
            })
            .collect();
        eventually(
            "waits queued in the server and retrying waiters registered",
            Duration::from_secs(10),
            || async {
                registrations(QUEUE_CLASS).await > 0 && registrations(WAIT_CLASS).await > 0
            },
        )
        .await;
        for w in &waiters {
            w.abort();
        }
        for w in waiters {
            let _ = w.await;
        }
        m.flush().await;
        assert_eq!(
            (
                registrations(WAIT_CLASS).await,
                registrations(QUEUE_CLASS).await
            ),
            (0, 0),
            "round {round}: a registration held after flush"
        );
        assert!(queued(&look).await.is_empty(), "round {round}");
        g.release().await.unwrap();
        holder.flush().await;
    }
}

/// The server's clock, in µs since the epoch.
async fn server_clock_us(look: &tokio_postgres::Client) -> i64 {
    look.query_one(
        "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Waits until an acquire started after `since` (the server's clock) waits by retrying and
/// has its place in line for a wait in the server's queue; adds its connection to `retrying`
/// (those of the retrying waiters before it).
///
/// Its connection is the one that sent a try (a mutex's attempt that does not block) after
/// `since` and is none of `retrying`'s. An acquire takes its place in line once its first try
/// found the key taken, before its next try: so a second try seen on that connection says it
/// has its place.
async fn until_in_line(look: &tokio_postgres::Client, since: i64, retrying: &mut Vec<i32>) {
    let tries = || async {
        look.query(
            "SELECT pid, floor(extract(epoch FROM query_start) * 1000000)::bigint \
             FROM pg_stat_activity WHERE pid <> pg_backend_pid() \
             AND query LIKE 'WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock(%'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, i32>(0), r.get::<_, i64>(1)))
        .collect::<Vec<_>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut first: Option<(i32, i64)> = None;
    loop {
        let now = tries().await;
        match first {
            None => {
                first = now
                    .into_iter()
                    .find(|(pid, at)| *at > since && !retrying.contains(pid));
            }
            Some((pid, at)) => {
                if now.iter().any(|&(p, later)| p == pid && later > at) {
                    retrying.push(pid);
                    return;
                }
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no retrying waiter in line (first try seen: {first:?})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A manager's acquires beyond its waits in the server's queue take freed waits in the order
/// they came: four of its acquires wait in the server's queue, six more start one after the
/// other and wait by retrying; when the holder lets go, all ten are granted in the order they
/// started (with the permits taken by whichever retrying waiter looked first, a later one
/// often got in ahead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_beyond_the_server_s_queue_take_freed_waits_in_the_order_they_came() {
    let pg = server();
    let look = pg_client(&pg.url()).await;
    let holder = manager(&pg.url()).await;
    let m = LockManager::builder(pg.url())
        .postgres(|pg| pg.lease(LEASE))
        .local_queue(false)
        .connect()
        .await
        .unwrap();
    // Ten connections open beforehand (each acquire of the key needs its own), so that each
    // acquire below finds the key taken within a round trip of starting.
    let warm: Vec<_> = (0..10)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move { m.lock("line").await.unwrap().release().await.unwrap() })
        })
        .collect();
    for w in warm {
        w.await.unwrap();
    }
    let g = holder.lock("line").await.unwrap();
    let grants: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut tasks = vec![];
    let mut retrying = vec![];
    for i in 0..10 {
        let since = server_clock_us(&look).await;
        let (m, grants) = (m.clone(), grants.clone());
        tasks.push(tokio::spawn(async move {
            let g = m.lock("line").await.unwrap();
            grants.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(30)).await;
            g.release().await.unwrap();
        }));
        if i < 4 {
            until_queued(&look, i + 1).await;
        } else {
            until_in_line(&look, since, &mut retrying).await;
        }
    }
    assert_eq!(
        queued(&look).await.len(),
        4,
        "the server's queue holds four waits"
    );
    g.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let grants = grants.lock().unwrap().clone();
    assert_eq!(
        grants,
        (0..10).collect::<Vec<_>>(),
        "granted out of the order they came"
    );
    m.flush().await;
    assert!(held(&look).await.is_empty());
}
