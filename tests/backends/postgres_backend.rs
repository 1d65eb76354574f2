//! What only the PostgreSQL backend has, against a real PostgreSQL (the test kit's, on a free
//! port with a throwaway data directory): the holding connection killed from the server side,
//! a restarted or silent server, keys whose ids go stale, the schema made by managers racing to
//! start, the key table's tokens and job windows, the notifications that wake waiters, and the
//! linger. What every backend promises is in `tests/behaviour/`.
//!
//! Every check looks at the server itself where it can: `pg_locks` for what is held, the key
//! table for ids and tokens.

#[path = "../common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::NoTls;
use zklock::{
    current_fencing_token, distributed_lock, Error, FencingToken, LockManager, LossReason,
};

use common::{
    eventually, pg_client, pg_manager as manager, pg_server as server, PG_LEASE as LEASE,
    PG_LOCK_CLASS as LOCK_CLASS,
};

/// The class of a registration of waiters that retry (`zkWI`).
const WAIT_CLASS: i64 = 0x7A6B_5749;
/// The class of a registration of waits in the server's queue (`zkQU`).
const QUEUE_CLASS: i64 = 0x7A6B_5155;
/// How many acquires of one manager wait in the server's queue at a time (the README's bound).
const QUEUED_WAITS: usize = 4;

/// zklock's advisory locks on the server: `(objid, mode, pid)`.
async fn held(client: &tokio_postgres::Client) -> Vec<(i64, String, i32)> {
    client
        .query(
            "SELECT objid::bigint, mode, pid FROM pg_locks \
             WHERE locktype = 'advisory' AND classid::bigint = $1 AND objsubid = 2 AND objid > 0 \
             AND granted",
            &[&LOCK_CLASS],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The id of a lock path in the key table.
async fn id_of(client: &tokio_postgres::Client, path: &str) -> i64 {
    client
        .query_one(
            "SELECT id::bigint FROM zklock_keys WHERE path = $1",
            &[&path],
        )
        .await
        .unwrap()
        .get(0)
}

/// The holding connection killed from the server side (`pg_terminate_backend`): the guard is
/// lost at once, the body of `with_lock` is aborted, and the next holder gets a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_holding_connection_is_lost_and_the_next_token_is_larger() {
    let pg = server();
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let look = pg_client(&pg.url()).await;
    let guard = a.lock("victim").await.unwrap();
    let first = guard.fencing_token();
    let id = id_of(&look, "/zklock/locks/victim").await;
    let locks = held(&look).await;
    let [(objid, _, pid)] = locks.as_slice() else {
        panic!("one lock held: {locks:?}")
    };
    assert_eq!(*objid, id);
    let waiter = tokio::spawn(async move {
        let g = b.lock_timeout("victim", Duration::from_secs(10)).await?;
        Ok::<_, Error>(g.fencing_token())
    });
    let killed = std::time::Instant::now();
    let terminated: bool = look
        .query_one("SELECT pg_terminate_backend($1)", &[pid])
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost at once");
    assert_eq!(reason, LossReason::Disconnected);
    assert!(
        killed.elapsed() < Duration::from_secs(1),
        "{:?}",
        killed.elapsed()
    );
    assert!(!guard.is_held());
    let second = waiter.await.unwrap().unwrap();
    assert!(second > first, "{second} after {first}");
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, Error::LockLost { .. }), "{err}");
    // The manager opens a new connection for the next acquire.
    a.flush().await;
}

/// A server restarted (killed, as in a crash, and started again on the same data): the
/// holder is lost at once, the manager connects again, and tokens keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_makes_the_holder_lost() {
    let mut pg = server();
    let m = manager(&pg.url()).await;
    let guard = m.lock("restart").await.unwrap();
    let first = guard.fencing_token();
    pg.restart().unwrap();
    let reason = tokio::time::timeout(LEASE * 2, guard.lost())
        .await
        .expect("lost after the restart");
    assert_eq!(reason, LossReason::Disconnected);
    drop(guard);
    let again = m
        .lock_timeout("restart", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(again.fencing_token() > first);
    again.release().await.unwrap();
    assert!(held(&pg_client(&pg.url()).await).await.is_empty());
}

/// Keys that look alike get ids of their own; an id that went stale (the row renamed under a
/// manager that cached it) is noticed at the next acquire, which then excludes with a
/// manager that looked the path up afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_ids_never_collide_and_stale_ids_are_noticed() {
    let pg = server();
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let look = pg_client(&pg.url()).await;
    let keys = ["a/b", "a%2Fb", "a_b", "A/b", "a/b/", "x"];
    let mut guards = vec![];
    for k in keys {
        guards.push(
            a.try_lock(k)
                .await
                .unwrap()
                .expect("free: no other key shares its id"),
        );
    }
    for k in keys {
        assert!(b.try_lock(k).await.unwrap().is_none(), "{k} held");
    }
    let mut ids: Vec<i64> = held(&look).await.iter().map(|l| l.0).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), keys.len());
    drop(guards);
    a.flush().await;

    // a has cached the id of "x"; the row is renamed, as if the table was rebuilt.
    look.execute(
        "UPDATE zklock_keys SET path = path || '-renamed' WHERE path = '/zklock/locks/x'",
        &[],
    )
    .await
    .unwrap();
    let fresh = manager(&pg.url()).await;
    let held_by_fresh = fresh.lock("x").await.unwrap();
    assert!(
        a.try_lock("x").await.unwrap().is_none(),
        "the stale id must not let a in"
    );
    held_by_fresh.release().await.unwrap();
    let g = a.lock_timeout("x", Duration::from_secs(5)).await.unwrap();
    assert!(g.fencing_token() > FencingToken::new(0, 0));
    drop(g);
    a.flush().await;
    assert!(held(&look).await.is_empty());
}

/// Managers starting at the same moment on a fresh server all make (or find) the key table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_creation_races_safely() {
    let pg = server();
    let url = pg.url();
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                LockManager::builder(url)
                    .postgres(|pg| pg.lease(LEASE))
                    .connect()
                    .await
            })
        })
        .collect();
    let mut managers = vec![];
    for s in starts {
        managers.push(s.await.unwrap().expect("every manager starts"));
    }
    let g = managers[0].lock("schema").await.unwrap();
    assert!(managers[3].try_lock("schema").await.unwrap().is_none());
    drop(g);
}

/// Semaphores, revocation and ZooKeeper's options are refused with errors that name them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_does_not_fit_is_refused() {
    let pg = server();
    let m = manager(&pg.url()).await;
    let err = m
        .semaphore("slots", 2)
        .unwrap()
        .acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unsupported {
                backend: "postgres",
                ..
            }
        ),
        "{err}"
    );
    // Another backend's settings would have no effect: refused, naming both backends.
    for err in [
        LockManager::builder(pg.url())
            .zookeeper(|zk| zk.revocable(true).digest_auth("u", "p"))
            .connect()
            .await
            .unwrap_err(),
        LockManager::builder(pg.url())
            .redis(|r| r.lease(Duration::from_secs(3)))
            .connect()
            .await
            .unwrap_err(),
    ] {
        common::assert_refused_as_another_backends(&err, "PostgreSQL", "postgres");
    }
    let err = LockManager::builder(pg.url())
        .postgres(|pg| pg.lease(Duration::from_millis(10)))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(text) if text.contains("liveness checks go out every lease/3")),
        "{err}"
    );
    let err = LockManager::builder("postgres://nobody:secret@127.0.0.1:1/db")
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Server {
                backend: "postgres",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_retryable());
    assert!(!err.to_string().contains("secret"), "{err}");
}

/// A URL that reaches a standby (in recovery) is refused, at connect and by a manager whose
/// connections land there after a restart: a standby's advisory locks would exclude only its
/// own sessions, never the primary's. Without fencing tokens nothing else would stop it (no
/// write to refuse).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_refused_even_without_tokens() {
    let mut pg = server();
    let url = pg.url();
    let untokened = || LockManager::builder(&url).fencing_tokens(false).connect();
    let before = untokened().await.unwrap();
    drop(before.lock("stock").await.unwrap());
    pg.restart_as_standby().unwrap();
    assert_eq!(pg.psql("SELECT pg_is_in_recovery()").unwrap().trim(), "t");

    let err = untokened().await.unwrap_err();
    assert!(
        matches!(&err, Error::Config(text) if text.contains("standby")),
        "{err}"
    );
    assert!(!err.is_retryable());
    // The manager from before the restart opens its connections anew: on the standby, its
    // acquires fail with the same error rather than take a lock of the standby's own.
    let err = before
        .lock_timeout("stock", Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(text) if text.contains("standby")),
        "{err}"
    );
}

/// A job's `at_least` window is kept in the key table, by the server's clock: a second run
/// inside it, from another manager, is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_keep_their_window_in_the_key_table() {
    let pg = server();
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let window = Duration::from_secs(30);
    let first = a
        .job("nightly")
        .unwrap()
        .at_least(window)
        .run(async { 1 })
        .await
        .unwrap();
    assert_eq!(first.ran(), Some(1));
    let second = b
        .job("nightly")
        .unwrap()
        .at_least(window)
        .run(async { 2 })
        .await
        .unwrap();
    assert_eq!(second.ran(), None, "inside the window");
}

#[distributed_lock("global_{id}")]
async fn through_the_global_manager(id: u32) -> Result<FencingToken, Error> {
    let _ = id;
    Ok(current_fencing_token().unwrap())
}

/// `ZKLOCK_CONNECT=postgres://...` gives the attribute's global manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_manager_from_a_postgres_url() {
    let pg = server();
    std::env::set_var(
        "ZKLOCK_CONNECT",
        pg.url().replace("postgres://", "postgresql://"),
    );
    let t1 = through_the_global_manager(1).await.unwrap();
    let t2 = through_the_global_manager(1).await.unwrap();
    assert!(t2 > t1);
    let m = zklock::global().await.unwrap();
    assert!(format!("{m:?}").contains("postgres"), "{m:?}");
}

/// A server that stops answering (SIGSTOP) past the lease: the holder is reported lost by the
/// deadline of its liveness checks, and once the server runs again it ends the silent
/// session (`idle_session_timeout`), so the next holder gets in with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_makes_the_holder_lost_by_its_lease() {
    let pg = server();
    let lease = Duration::from_secs(1);
    let holder = LockManager::builder(pg.url())
        .postgres(|pg| pg.lease(lease))
        .connect()
        .await
        .unwrap();
    let next = manager(&pg.url()).await;
    let guard = holder.lock("frozen").await.unwrap();
    let first = guard.fencing_token();
    pg.pause().unwrap();
    let paused = std::time::Instant::now();
    let reason = tokio::time::timeout(lease * 3, guard.lost())
        .await
        .expect("lost while the server is silent");
    assert_eq!(reason, LossReason::LeaseExpired);
    assert!(
        paused.elapsed() <= lease + Duration::from_millis(250),
        "{:?}",
        paused.elapsed()
    );
    pg.resume().unwrap();
    let second = next
        .lock_timeout("frozen", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(second.fencing_token() > first);
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, Error::LockLost { .. }), "{err}");
    assert!(second.is_held());
    second.release().await.unwrap();
}

/// The registrations of waiters that retry on notified releases (`zkWI`), on the server:
/// `(objid, pid)`.
async fn registrations(client: &tokio_postgres::Client) -> Vec<(i64, i32)> {
    registrations_of(client, WAIT_CLASS).await
}

/// The registrations of `class` on the server: `(objid, pid)`.
async fn registrations_of(client: &tokio_postgres::Client, class: i64) -> Vec<(i64, i32)> {
    client
        .query(
            "SELECT objid::bigint, pid FROM pg_locks \
             WHERE locktype = 'advisory' AND classid::bigint = $1 AND objsubid = 2 AND granted",
            &[&class],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// The waits in the server's queue for zklock's locks: `(objid, mode, pid)`, in the order the
/// server queued them (`waitstart`).
async fn queued(client: &tokio_postgres::Client) -> Vec<(i64, String, i32)> {
    client
        .query(
            "SELECT objid::bigint, mode, pid FROM pg_locks \
             WHERE locktype = 'advisory' AND classid::bigint = $1 AND objsubid = 2 \
             AND NOT granted ORDER BY waitstart",
            &[&LOCK_CLASS],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// A task of `m` waiting for `key`: its guard and when it got it.
fn waiter(
    m: &LockManager,
    key: &str,
) -> tokio::task::JoinHandle<(zklock::LockGuard, std::time::Instant)> {
    let (m, key) = (m.clone(), key.to_string());
    tokio::spawn(async move {
        let guard = m.lock(&key).await.unwrap();
        (guard, std::time::Instant::now())
    })
}

/// `a` holds one key more than a manager waits for in the server's queue (`{prefix}0..`), and
/// `b` waits for each, one after the other: the first ones wait in the server's queue, the last
/// one retries on notified releases, registered. Returns a's guards, b's waiters and the keys'
/// ids.
async fn queue_then_retry(
    a: &LockManager,
    b: &LockManager,
    look: &tokio_postgres::Client,
    prefix: &str,
) -> (
    Vec<zklock::LockGuard>,
    Vec<tokio::task::JoinHandle<(zklock::LockGuard, std::time::Instant)>>,
    Vec<i64>,
) {
    let (mut guards, mut waiters, mut ids) = (vec![], vec![], vec![]);
    for i in 0..=QUEUED_WAITS {
        let key = format!("{prefix}{i}");
        guards.push(a.lock(&key).await.unwrap());
        ids.push(id_of(look, &a.path_of(&key).unwrap()).await);
        waiters.push(waiter(b, &key));
        let id = ids[i];
        if i < QUEUED_WAITS {
            eventually("b's wait in the queue", Duration::from_secs(10), || async {
                queued(look).await.iter().any(|q| q.0 == id)
            })
            .await;
        } else {
            eventually("b's registration", Duration::from_secs(10), || async {
                registrations(look).await.iter().any(|r| r.0 == id)
            })
            .await;
            assert!(
                !queued(look).await.iter().any(|q| q.0 == id),
                "the wait beyond the bound is not in the server's queue"
            );
        }
    }
    (guards, waiters, ids)
}
/// The key row's `(fence, block)`.
async fn fence_and_block(client: &tokio_postgres::Client, path: &str) -> (i64, Option<i64>) {
    let row = client
        .query_one(
            "SELECT fence, block FROM zklock_keys WHERE path = $1",
            &[&path],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Every grant of the server's lock writes its token to the key row (no process keeps tokens
/// of its own, which a crash that lost the row's last raise would make stale): the row's
/// `fence` is the last token granted, whichever process took the key, and `block` (an earlier
/// version's reservation tag) is cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_grant_writes_its_token_to_the_key_row() {
    let pg = server();
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let look = pg_client(&pg.url()).await;
    let path = a.path_of("blk").unwrap();
    a.lock("blk").await.unwrap().release().await.unwrap();
    // A row as an earlier version left it: a block's tag.
    look.execute(
        "UPDATE zklock_keys SET block = 42 WHERE path = $1",
        &[&path],
    )
    .await
    .unwrap();
    let mut tokens = vec![];
    for m in [&a, &a, &b, &a, &b, &b] {
        let g = m.lock("blk").await.unwrap();
        tokens.push(g.fencing_token());
        g.release().await.unwrap();
        assert_eq!(
            fence_and_block(&look, &path).await,
            (tokens.last().unwrap().grant(), None),
            "{tokens:?}"
        );
    }
    for pair in tokens.windows(2) {
        assert!(pair[0] < pair[1], "{tokens:?}");
    }
}

/// A release notifies only while another process waits by retrying: many cycles with nobody
/// waiting send no notification, nor does a release whose waiter waits in the server's queue
/// (the server hands it the lock); a waiter beyond the queue's bound registers in `pg_locks`,
/// the release that follows wakes it at once, and the registrations go with the last waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_notifies_only_when_someone_waits() {
    use futures::StreamExt;
    let pg = server();
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let look = pg_client(&pg.url()).await;
    let (listen, mut connection) = tokio_postgres::connect(&pg.url(), NoTls).await.unwrap();
    let notified = Arc::new(AtomicUsize::new(0));
    let count = notified.clone();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if matches!(m, tokio_postgres::AsyncMessage::Notification(_)) {
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    listen.batch_execute("LISTEN zklock_release").await.unwrap();

    for _ in 0..20 {
        a.lock("quiet").await.unwrap().release().await.unwrap();
    }
    // A notification sent would arrive before this round trip's answer on the listening
    // connection; wait a little more anyway.
    listen.batch_execute("SELECT 1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(notified.load(Ordering::SeqCst), 0, "nobody waited");
    assert!(registrations(&look).await.is_empty());
    // A wait answered within a few ms is not registered; on a loaded machine a free key's
    // answer can take longer, and its registration (which wakes nobody) then lasts half a
    // second after the wait.
    eventually(
        "no registration of a wait in the server's queue",
        Duration::from_secs(2),
        || async { registrations_of(&look, QUEUE_CLASS).await.is_empty() },
    )
    .await;

    let (mut guards, mut waiters, ids) = queue_then_retry(&a, &b, &look, "quiet").await;
    // The waits in the server's queue are registered (for holders to hear of them).
    eventually(
        "the queued waits' registrations",
        Duration::from_secs(10),
        || async {
            let r = registrations_of(&look, QUEUE_CLASS).await;
            ids[..QUEUED_WAITS]
                .iter()
                .all(|id| r.iter().any(|r| r.0 == *id))
        },
    )
    .await;
    // The release of the key whose waiter retries wakes it at once. (First, while every wait
    // in the server's queue is taken: a wait freed there goes to the retrying waiter at once.)
    let released = std::time::Instant::now();
    guards.pop().unwrap().release().await.unwrap();
    let (guard, got) = waiters.pop().unwrap().await.unwrap();
    let after = got.duration_since(released);
    assert!(after < Duration::from_millis(300), "woken after {after:?}");
    eventually("the notification", Duration::from_secs(10), || async {
        notified.load(Ordering::SeqCst) >= 1
    })
    .await;
    guard.release().await.unwrap();
    listen.batch_execute("SELECT 1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = notified.load(Ordering::SeqCst);

    // A release with a waiter in the server's queue: handed over with no notification.
    let released = std::time::Instant::now();
    guards.remove(0).release().await.unwrap();
    let (guard, got) = waiters.remove(0).await.unwrap();
    assert!(got.duration_since(released) < Duration::from_millis(300));
    listen.batch_execute("SELECT 1").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        notified.load(Ordering::SeqCst),
        before,
        "the queued waiter needs no notification"
    );
    guard.release().await.unwrap();
    for (g, w) in guards.into_iter().zip(waiters) {
        g.release().await.unwrap();
        w.await.unwrap().0.release().await.unwrap();
    }
    eventually(
        "no registration once nobody waits",
        Duration::from_secs(10),
        || async {
            registrations(&look).await.is_empty()
                && registrations_of(&look, QUEUE_CLASS).await.is_empty()
        },
    )
    .await;
    assert!(held(&look).await.is_empty());
}

/// The listening connection killed while tasks wait: the hub connects again and registers
/// the waiters again (the one retrying on notified releases, and those in the server's queue),
/// so the next release still wakes the one retrying at once (not by the fallback poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listening_connection_registers_its_waiters_again() {
    let pg = server();
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let look = pg_client(&pg.url()).await;
    let (mut guards, mut waiters, ids) = queue_then_retry(&a, &b, &look, "relisten").await;
    let id = *ids.last().unwrap();
    let pid = registrations(&look)
        .await
        .iter()
        .find(|r| r.0 == id)
        .map(|r| r.1)
        .unwrap();
    look.execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    eventually(
        "b registered again on a new connection",
        Duration::from_secs(10),
        || async {
            let queued = registrations_of(&look, QUEUE_CLASS).await;
            registrations(&look)
                .await
                .iter()
                .any(|r| r.0 == id && r.1 != pid)
                && ids[..QUEUED_WAITS]
                    .iter()
                    .all(|id| queued.iter().any(|r| r.0 == *id && r.1 != pid))
        },
    )
    .await;
    // The waiter was woken by the reconnection and went back to waiting, registered.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = std::time::Instant::now();
    guards.pop().unwrap().release().await.unwrap();
    let (guard, got) = waiters.pop().unwrap().await.unwrap();
    let after = got.duration_since(released);
    assert!(after < Duration::from_millis(300), "woken after {after:?}");
    guard.release().await.unwrap();
    for (g, w) in guards.into_iter().zip(waiters) {
        g.release().await.unwrap();
        w.await.unwrap().0.release().await.unwrap();
    }
    assert!(held(&look).await.is_empty());
}

/// An update of the key row in progress (a job's record, an administrator) holds up a grant of
/// the key, which writes the row, until its transaction ends; the grant then goes through with
/// a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_of_the_key_row_in_progress_holds_up_a_grant_until_it_ends() {
    let pg = server();
    let m = manager(&pg.url()).await;
    let g = m.lock("busy-row").await.unwrap();
    let first = g.fencing_token();
    g.release().await.unwrap();
    let path = m.path_of("busy-row").unwrap();
    let mut updater = pg_client(&pg.url()).await;
    let t = updater.transaction().await.unwrap();
    t.execute(
        "UPDATE zklock_keys SET run_after = now() WHERE path = $1",
        &[&path],
    )
    .await
    .unwrap();
    let m2 = m.clone();
    let pending = tokio::spawn(async move {
        let g = m2.lock("busy-row").await.unwrap();
        let token = g.fencing_token();
        g.release().await.unwrap();
        token
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!pending.is_finished(), "held up by the row's update");
    t.rollback().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("granted once the update ended")
        .unwrap();
    assert!(second > first, "{first} {second}");
}

/// The linger on PostgreSQL: after its last release a manager keeps the advisory lock, takes it
/// again as a local handoff (the token's local part goes up), gives it up at once when another
/// process starts waiting (its registration is notified to every process), and on `flush`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_lock_is_taken_again_and_given_up_when_another_process_waits() {
    let pg = server();
    let a = LockManager::builder(pg.url())
        .postgres(|pg| pg.lease(LEASE))
        .linger(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let b = manager(&pg.url()).await;
    let look = pg_client(&pg.url()).await;
    let first = a.lock("lg").await.unwrap();
    let t1 = first.fencing_token();
    first.release().await.unwrap();
    a.flush().await;
    assert!(
        held(&look).await.is_empty(),
        "flush gives up a lingering lock"
    );

    let g = a.lock("lg").await.unwrap();
    let t2 = g.fencing_token();
    g.release().await.unwrap();
    assert_eq!(held(&look).await.len(), 1, "the lock lingers");
    let g = a.lock("lg").await.unwrap();
    let t3 = g.fencing_token();
    assert_eq!(t3.grant(), t2.grant(), "taken again with no request");
    assert!(t1 < t2 && t2 < t3, "{t1} {t2} {t3}");
    g.release().await.unwrap();
    assert_eq!(held(&look).await.len(), 1, "the lock lingers");

    // Another process waits: it gets the key long before the linger runs out.
    let started = std::time::Instant::now();
    let by_b = tokio::time::timeout(Duration::from_secs(5), b.lock("lg"))
        .await
        .expect("the lingering lock was given up")
        .unwrap();
    assert!(by_b.fencing_token() > t3);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    let t4 = by_b.fencing_token();
    by_b.release().await.unwrap();
    let g = a.lock("lg").await.unwrap();
    assert!(g.fencing_token() > t4);
    drop(g);
    a.flush().await;
    b.flush().await;
    assert!(held(&look).await.is_empty());
}

/// A local handoff asks the holding session first: a session ended by the server while this
/// process had not heard of it yet (its connection silent) must not hand the lock to the
/// next local task once another process got the key, with a smaller token. (Before: the
/// handoff trusted the connection's state, and the local task held beside the other process.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_handoff_of_a_terminated_session_hands_on_nothing() {
    let pg = server();
    let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", pg.port())).unwrap();
    let a = manager(&relay.url(&pg.url())).await;
    let b = manager(&pg.url()).await;
    let look = pg_client(&pg.url()).await;
    let first = a.lock("handed").await.unwrap();
    let next = {
        let a = a.clone();
        tokio::spawn(async move { a.lock_timeout("handed", Duration::from_secs(30)).await })
    };
    // The next local task queues behind the holder.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let locks = held(&look).await;
    let [(_, _, pid)] = locks.as_slice() else {
        panic!("one lock held: {locks:?}")
    };
    // The holder's session ends on the server, which A does not hear: its connection is cut.
    relay.blackhole();
    let terminated: bool = look
        .query_one("SELECT pg_terminate_backend($1)", &[pid])
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    let other = b
        .lock_timeout("handed", Duration::from_secs(10))
        .await
        .expect("the key is free once the session ended");
    // A's holder lets go: the next local task must not be granted a lock the server gave B.
    drop(first);
    let early = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            if next.is_finished() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        early.is_err(),
        "the local task was answered while the other process holds the key"
    );
    assert!(other.is_held());
    let after = other.fencing_token();
    other.release().await.unwrap();
    relay.heal();
    let got = next
        .await
        .unwrap()
        .expect("the local task gets the lock from the server");
    assert!(
        got.fencing_token() > after,
        "{} after {after}",
        got.fencing_token()
    );
    assert!(got.is_held());
}

/// A writer downgrades while another process's writer waits in the server's queue for the same
/// lock. PostgreSQL refuses `pg_try_advisory_lock_shared` while a conflicting request waits,
/// even to the session that holds the exclusive lock: the downgrade must still keep the hold
/// (as a read hold), and the queued writer gets in only once the read hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_keeps_its_hold_with_a_writer_queued_in_the_server() {
    let pg = server();
    let (a, b) = (manager(&pg.url()).await, manager(&pg.url()).await);
    let look = pg_client(&pg.url()).await;
    let w = a.rwlock("downgraded").unwrap().write().await.unwrap();
    let write_token = w.fencing_token();
    let queued = tokio::spawn(async move {
        let g = b.rwlock("downgraded").unwrap().write().await.unwrap();
        let token = g.fencing_token();
        g.release().await.unwrap();
        token
    });
    // The other writer waits in PostgreSQL's own queue for the lock.
    let waiting = || async {
        look.query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
             AND classid::bigint = $1 AND objsubid = 2 AND NOT granted",
            &[&LOCK_CLASS],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
            == 1
    };
    eventually(
        "the writer queued in the server",
        Duration::from_secs(10),
        waiting,
    )
    .await;
    let r = w.downgrade().await.expect("the downgrade keeps the hold");
    assert!(r.is_held());
    assert!(r.fencing_token() > write_token);
    // Still queued: the read hold keeps the writer out.
    assert!(waiting().await);
    assert!(!queued.is_finished());
    let read_token = r.fencing_token();
    r.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .expect("the queued writer gets in once the read hold ends")
        .unwrap();
    assert!(next > read_token, "{next} after {read_token}");
}
