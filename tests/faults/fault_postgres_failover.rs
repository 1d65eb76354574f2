//! PostgreSQL behind a multi-host URL (`host1,host2` with `target_session_attrs=read-write`),
//! its primary frozen (SIGSTOP), its standby promoted (as a failover tool would), then the old
//! primary woken: it still runs as a primary and takes connections.
//!
//! PostgreSQL has no failover of its own and nothing in the woken old primary says it was
//! replaced but its timeline: every promotion raises the new primary's. A process that has used
//! the promoted primary refuses the old one from then on (its timeline is older); a process that
//! never reached the new primary cannot tell them apart, and takes locks on the old one that
//! exclude nobody on the new. That is what fencing the old primary (stopping it, as Patroni and
//! every failover tool do) is for; `docs/backends/postgres.md` says so.

use crate::common;

use std::time::Duration;

use common::{eventually, PG_LEASE};
use zklock::{Error, LockManager};
use zklock_testkit::PostgresServer;

/// The bound of every wait for progress after a fault.
const PROGRESS: Duration = Duration::from_secs(30);

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The URL naming `first`, then `then`, for a primary (`target_session_attrs=read-write`).
fn multi_host(first: &PostgresServer, then: &PostgresServer) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        first.port(),
        then.port()
    )
}

async fn manager(url: &str, identity: &str) -> LockManager {
    LockManager::builder(url)
        .identity(identity)
        .connect_timeout(Duration::from_secs(10))
        .postgres(|pg| pg.lease(PG_LEASE))
        .connect()
        .await
        .expect("connect through the multi-host URL")
}

/// The old primary frozen, the standby promoted, the old primary woken, then the new primary
/// stopped. Proves: the holder on the frozen primary is told its loss; a manager that used the
/// promoted primary (timeline 2), whose next connection lands on the woken old one (timeline 1,
/// still a primary, the URL's other host), refuses it with `Error::Config` naming both
/// timelines and takes no lock there; a manager that never reached the new primary connects to
/// the old one and locks there: the overlap that only fencing the old primary prevents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_woken_old_primary_is_refused_by_a_process_that_used_the_promoted_one() {
    let primary = blocking(common::pg_server);
    let mut standby = blocking(|| primary.start_standby(None)).expect("a streaming standby");
    let a = manager(&multi_host(&primary, &standby), "a").await;
    let guard = a.lock("sku_1").await.expect("granted on the primary");

    blocking(|| primary.pause()).unwrap();
    let reason = tokio::time::timeout(PROGRESS, guard.lost())
        .await
        .expect("the holder on the frozen primary is told");
    drop(guard);
    blocking(|| standby.promote()).expect("the standby promoted");

    // b lists the promoted standby first, and holds sku_1 there.
    let b = manager(&multi_host(&standby, &primary), "b").await;
    let held_b = tokio::time::timeout(PROGRESS, b.lock("sku_1"))
        .await
        .expect("granted in time")
        .expect("granted on the promoted standby");
    blocking(|| primary.resume()).unwrap();
    assert_eq!(
        blocking(|| primary.psql("SELECT pg_is_in_recovery()"))
            .unwrap()
            .trim(),
        "f",
        "the woken old primary is still a primary"
    );

    // The new primary stops: b's next connection lands on the URL's other host, the woken old
    // primary, and is refused.
    blocking(|| standby.stop()).unwrap();
    let lost_b = tokio::time::timeout(PROGRESS, held_b.lost())
        .await
        .expect("b is told its hold ended with the new primary");
    drop(held_b);
    let refused = tokio::time::timeout(PROGRESS, b.lock_timeout("sku_2", Duration::from_secs(10)))
        .await
        .expect("an answer in time");
    let err = refused.expect_err("a lock on the old primary is refused");
    assert!(
        matches!(&err, Error::Config(text) if text.contains("timeline 1") && text.contains("timeline 2")),
        "{err}"
    );
    let locks_of = |id: &str| {
        blocking(|| {
            primary.psql(&format!(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid \
                 WHERE l.locktype = 'advisory' AND s.application_name LIKE '%id={id}%'"
            ))
        })
        .unwrap()
        .trim()
        .to_string()
    };
    assert_eq!(locks_of("b"), "0", "no lock of b on the old primary");

    // c never reached the new primary: the old one is a primary to it, and it locks there.
    let c = manager(&multi_host(&primary, &standby), "c").await;
    let held_c = tokio::time::timeout(PROGRESS, c.lock("sku_1"))
        .await
        .expect("granted in time")
        .expect("granted on the old primary");
    eventually("c's lock on the old primary", PROGRESS, || async {
        locks_of("c") != "0"
    })
    .await;
    common::say(&format!(
        "fault_postgres_failover: the frozen primary's holder told {reason:?}; b, told {lost_b:?} \
         when the new primary stopped, refused the woken old primary ({err}); c, which never \
         reached the new primary, locked on the old one"
    ));
    drop(held_c);
}
