//! Regression: acquire deadlines hold during connection trouble.
//!
//! Bug guarded against: `lock_timeout` applies its deadline only to the wait for a predecessor's
//! deletion. Getting a live client (`live_client`, up to 2 x the session timeout), the create and
//! listing (until the client gives up on a dead connection), and `wait_connected` (up to the
//! session timeout per state change) ignore it, and `try_lock` has no bound at all: in a partition
//! `lock_timeout(200 ms)` and `try_lock()` block for about 1.4 x the session timeout.
//!
//! Each test puts a manager with a 10 s session timeout behind a `Proxy`, partitions it, and
//! requires the call to return within a small bound (`lock_timeout(200 ms)`: an error within
//! 1.5 s; `try_lock`: anything but a lock within 2.5 s), both right after the cut (the client does
//! not know yet) and once the client saw the disconnection. After the partition heals, nothing
//! may be left behind.

use crate::common;
use crate::faults;

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use common::*;
use faults::*;
use zklock::zookeeper_client::SessionState;
use zklock::LockManager;
use zklock_testkit::Proxy;

const SESSION: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_millis(200);
/// How long `lock_timeout(WAIT)` may take in a partition.
const LOCK_TIMEOUT_BOUND: Duration = Duration::from_millis(1_500);
/// How long `try_lock()` may take in a partition: a wait of about 2 s for the connection, with
/// some slack for scheduling.
const TRY_LOCK_BOUND: Duration = Duration::from_millis(2_500);

/// Runs `call`, bounded far beyond what the bug takes, and returns its outcome and duration.
async fn measure<F: Future>(what: &str, call: F) -> (F::Output, Duration)
where
    F::Output: Debug,
{
    let started = Instant::now();
    let out = tokio::time::timeout(3 * SESSION, call)
        .await
        .unwrap_or_else(|_| panic!("{what} had not returned after {:?}", 3 * SESSION));
    let took = started.elapsed();
    println!("{what} in a partition: {out:?} after {took:?}");
    (out, took)
}

async fn lock_timeout_in_partition(m: &LockManager, when: &str) {
    let (out, took) = measure(
        &format!("lock_timeout({WAIT:?}) {when}"),
        m.lock_timeout("deadline", WAIT),
    )
    .await;
    assert!(
        took < LOCK_TIMEOUT_BOUND,
        "lock_timeout({WAIT:?}) {when} returned after {took:?} (bound {LOCK_TIMEOUT_BOUND:?}): \
         the deadline is ignored during connection trouble; it returned {out:?}"
    );
    assert!(
        out.is_err(),
        "lock_timeout {when} cannot take a lock in a partition: {out:?}"
    );
}

async fn try_lock_in_partition(m: &LockManager, when: &str) {
    let (out, took) = measure(&format!("try_lock() {when}"), m.try_lock("deadline")).await;
    assert!(
        took < TRY_LOCK_BOUND,
        "try_lock() {when} returned after {took:?} (bound {TRY_LOCK_BOUND:?}): it blocks during \
         connection trouble; it returned {out:?}"
    );
    assert!(
        !matches!(out, Ok(Some(_))),
        "try_lock {when} cannot take a lock in a partition: {out:?}"
    );
}

/// A manager behind a proxy, a direct one to check from, and the proxy.
async fn setup(zk: &ZkServer) -> (Proxy, LockManager, LockManager) {
    let proxy = Proxy::start(&zk.connect_string()).unwrap();
    let m = manager_with(&proxy.connect_string(), SESSION).await;
    let direct = manager(&zk.connect_string()).await;
    // The lock path exists, so that the acquires below go straight to their create.
    direct
        .lock("deadline")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    (proxy, m, direct)
}

/// Waits (bounded) until `m`'s client has noticed that its connection is dead.
async fn until_disconnected(m: &LockManager) {
    eventually(
        "the client to notice the partition",
        2 * SESSION,
        || async {
            m.client::<zookeeper_client::Client>()
                .expect("a ZooKeeper manager")
                .state()
                == SessionState::Disconnected
        },
    )
    .await;
}

/// Heals the partition; then nothing of the partitioned manager may be left.
async fn heal_and_check(proxy: &Proxy, m: &LockManager, direct: &LockManager) {
    proxy.heal();
    tokio::time::timeout(3 * SESSION, m.flush())
        .await
        .expect("background cleanups end once the partition healed");
    assert_no_contenders(
        &direct
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        2 * SESSION,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeout_returns_in_time_right_after_a_partition_begins() {
    let zk = server();
    let (proxy, m, direct) = setup(&zk).await;
    proxy.blackhole();
    lock_timeout_in_partition(&m, "right after the cut").await;
    heal_and_check(&proxy, &m, &direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_returns_promptly_right_after_a_partition_begins() {
    let zk = server();
    let (proxy, m, direct) = setup(&zk).await;
    proxy.blackhole();
    try_lock_in_partition(&m, "right after the cut").await;
    heal_and_check(&proxy, &m, &direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_timeout_returns_in_time_while_disconnected() {
    let zk = server();
    let (proxy, m, direct) = setup(&zk).await;
    proxy.blackhole();
    until_disconnected(&m).await;
    lock_timeout_in_partition(&m, "while disconnected").await;
    heal_and_check(&proxy, &m, &direct).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_returns_promptly_while_disconnected() {
    let zk = server();
    let (proxy, m, direct) = setup(&zk).await;
    proxy.blackhole();
    until_disconnected(&m).await;
    try_lock_in_partition(&m, "while disconnected").await;
    heal_and_check(&proxy, &m, &direct).await;
}
