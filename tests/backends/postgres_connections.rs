//! A manager's server connections stay bounded on PostgreSQL, whatever its tasks do: each
//! acquire and hold of one lock id needs a session of its own, so without a bound 40 waiting
//! tasks of one key (the local queue off) or 40 readers would open 40 connections. With it,
//! the manager opens at most `MAX_CONNECTIONS` (16) holding connections beside its listening
//! one, the tasks beyond wait in the process for a connection, and every one of them still
//! gets its turn, one holder at a time. Checked on the server (`pg_stat_activity`).

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zklock::LockManager;

use common::{pg_client, pg_server, PG_LEASE as LEASE};

/// The backend's holding connections at most, and its listening one.
const BOUND: i64 = 16 + 1;

/// How many tasks contend: well above the bound.
const TASKS: usize = 40;

/// The sessions of the manager named `identity` (in its `application_name`).
async fn sessions(look: &tokio_postgres::Client, identity: &str) -> i64 {
    look.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE '%' || $1 || '%'",
        &[&identity],
    )
    .await
    .unwrap()
    .get(0)
}

/// The most sessions of `identity` seen over `rounds` looks 100 ms apart.
async fn peak(look: &tokio_postgres::Client, identity: &str, rounds: usize) -> i64 {
    let mut most = 0;
    for _ in 0..rounds {
        most = most.max(sessions(look, identity).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_of_one_key_stay_within_the_connection_bound() {
    let pg = pg_server();
    let url = pg.url();
    let look = pg_client(&url).await;
    let identity = "bounded-conns";
    let m = LockManager::builder(&url)
        .postgres(|pg| pg.lease(LEASE))
        .local_queue(false)
        .identity(identity)
        .connect()
        .await
        .unwrap();
    let other = LockManager::builder(&url)
        .postgres(|pg| pg.lease(LEASE))
        .connect()
        .await
        .unwrap();

    // TASKS waiters of one key, behind another process's hold.
    let first = other.lock("k").await.unwrap();
    let holding = Arc::new(AtomicUsize::new(0));
    let most_holding = Arc::new(AtomicUsize::new(0));
    let waiters: Vec<_> = (0..TASKS)
        .map(|_| {
            let (m, holding, most) = (m.clone(), holding.clone(), most_holding.clone());
            tokio::spawn(async move {
                let g = m.lock_timeout("k", Duration::from_secs(60)).await.unwrap();
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                holding.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
            })
        })
        .collect();
    let waiting = peak(&look, identity, 15).await;
    assert!(
        waiting <= BOUND,
        "{TASKS} waiting tasks of one key opened {waiting} sessions (bound {BOUND})"
    );
    // They do wait at the server, on more than one connection (4 in its queue).
    assert!(waiting >= 5, "only {waiting} sessions for {TASKS} waiters");
    first.release().await.unwrap();
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("a waiter never got its turn")
            .unwrap();
    }
    assert_eq!(
        most_holding.load(Ordering::SeqCst),
        1,
        "two tasks held at once"
    );

    // TASKS readers of one key, each holding a moment: at most the bound hold at once, and all
    // get in.
    let rw = m.rwlock("r").unwrap();
    let readers: Vec<_> = (0..TASKS)
        .map(|_| {
            let rw = rw.clone();
            tokio::spawn(async move {
                let g = rw.read_timeout(Duration::from_secs(60)).await.unwrap();
                tokio::time::sleep(Duration::from_millis(300)).await;
                g.release().await.unwrap();
            })
        })
        .collect();
    let reading = peak(&look, identity, 10).await;
    assert!(
        reading <= BOUND,
        "{TASKS} readers of one key opened {reading} sessions (bound {BOUND})"
    );
    for r in readers {
        tokio::time::timeout(Duration::from_secs(60), r)
            .await
            .expect("a reader never got in")
            .unwrap();
    }
    assert!(sessions(&look, identity).await <= BOUND);
}
