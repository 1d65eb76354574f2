//! Regression: a cancelled `release()` must not wedge the lock.
//!
//! Bug guarded against: `Hold::release` sets `released` before it sends the delete. When the
//! release future is dropped after that (a `tokio::time::timeout(short, guard.release())`, a
//! `select!`) before the delete is confirmed, `Hold::drop` sees `released` and skips its
//! background delete. If the delete in flight is then lost with its connection, the node stays on
//! the server until the session ends: every other process waits for a lock nobody holds. The
//! same holds for `Lease::release` (semaphore) and `MultiGuard::release` (`lock_all`).
//!
//! Each test holds a lock through a `Proxy` with a long session timeout (20 s) and drives the
//! release until its delete is on the wire. Then the holder is partitioned, the release is
//! cancelled (`timeout(100 ms, ..)`), and the connection the delete is on is reset, so that the
//! delete never reaches the server. Once the partition heals, a second manager must get the lock
//! within a few seconds (far less than the 20 s the session would keep the node), and no
//! contender node may be left after `flush()`.
//!
//! The last test cancels in the other order: the connection is reset first, and the release is
//! cancelled while it waits to reconnect.

use crate::common;
use crate::faults;

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use common::*;
use faults::*;
use zklock::{LockManager, LockSpec};
use zklock_testkit::Proxy;

/// ZooKeeper's delete opcode.
const DELETE: i32 = 2;
/// Far longer than any bound below: a node left behind would outlive every wait of the test.
const SESSION: Duration = Duration::from_secs(20);
/// How long the second manager may wait for the lock once the partition healed.
const TAKEOVER: Duration = Duration::from_secs(5);

/// When the release is cancelled, relative to the loss of its connection.
#[derive(Clone, Copy, Debug)]
enum Cancel {
    /// While the delete is in flight; then the connection (and the delete with it) is lost.
    InFlight,
    /// After the connection was reset under the delete, while the release waits to reconnect.
    AfterReset,
}

/// Drives `release` until its delete is on the wire, partitions the holder, and cancels the
/// release (`timeout(100 ms, ..)`) before or after resetting the connection the delete is on;
/// the delete never reaches the server. The partition is healed before returning.
async fn cancel_release_mid_flight<F>(proxy: &Proxy, release: F, cancel: Cancel)
where
    F: Future,
    F::Output: Debug,
{
    let deletes = proxy.requests_with(DELETE);
    // Hold every frame back a while, so that the delete is seen by the proxy but not yet sent on.
    proxy.set_delay(Duration::from_millis(300));
    let mut release = Box::pin(release);
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.requests_with(DELETE) == deletes {
        assert!(
            Instant::now() < deadline,
            "the release never sent its delete"
        );
        tokio::select! {
            out = &mut release => panic!("the release completed before the fault: {out:?}"),
            _ = tokio::time::sleep(Duration::from_millis(2)) => {}
        }
    }
    // Partitioned: the delete is held back, and reconnects lead nowhere.
    proxy.blackhole();
    if let Cancel::AfterReset = cancel {
        proxy.reset();
    }
    let out = tokio::time::timeout(Duration::from_millis(100), &mut release).await;
    assert!(
        out.is_err(),
        "the release cannot complete while the holder is partitioned: {out:?}"
    );
    drop(release);
    if let Cancel::InFlight = cancel {
        proxy.reset();
    }
    proxy.set_delay(Duration::ZERO);
    proxy.heal();
}

/// The partitioned manager behind its proxy, a second manager straight on the server.
async fn setup(zk: &ZkServer) -> (Proxy, LockManager, LockManager) {
    let proxy = Proxy::start(&zk.connect_string()).unwrap();
    let holder = manager_with(&proxy.connect_string(), SESSION).await;
    let other = manager_with(&zk.connect_string(), SESSION).await;
    (proxy, holder, other)
}

/// After the takeover: the holder's background work ends, and no contender node is left.
async fn assert_nothing_left(holder: &LockManager, other: &LockManager) {
    tokio::time::timeout(Duration::from_secs(10), holder.flush())
        .await
        .expect("the holder's background releases finish once the partition healed");
    other.flush().await;
    assert_no_contenders(
        &other
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(5),
    )
    .await;
}

async fn mutex_release_cancelled(cancel: Cancel) {
    let zk = server();
    let (proxy, holder, other) = setup(&zk).await;
    let key = "wedge-mutex";
    let path = holder.path_of(key).unwrap();
    let guard = holder.lock(key).await.unwrap();
    holder.flush().await;

    cancel_release_mid_flight(&proxy, guard.release(), cancel).await;

    let healed = Instant::now();
    let taken = other.lock_timeout(key, TAKEOVER).await;
    println!(
        "{cancel:?}: second manager after a cancelled release: {:?} in {:?}",
        taken.as_ref().map(|g| g.fencing_token()),
        healed.elapsed()
    );
    let left = children(&other, &path).await;
    let guard = taken.unwrap_or_else(|e| {
        panic!(
            "the lock is wedged after a release cancelled {cancel:?}: a second manager could not \
             take it within {TAKEOVER:?} ({e}); nodes left under {path}: {left:?}"
        )
    });
    guard.release().await.unwrap();
    assert_nothing_left(&holder, &other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_release_cancelled_in_flight_leaves_no_node_and_lets_the_next_holder_in() {
    mutex_release_cancelled(Cancel::InFlight).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_release_cancelled_in_flight_leaves_no_node_and_frees_the_lease() {
    let zk = server();
    let (proxy, holder, other) = setup(&zk).await;
    let key = "wedge-lease";
    let lease = holder.semaphore(key, 1).unwrap().acquire().await.unwrap();
    let node = lease.node_path().to_string();
    holder.flush().await;

    cancel_release_mid_flight(&proxy, lease.release(), Cancel::InFlight).await;

    let healed = Instant::now();
    let taken = other
        .semaphore(key, 1)
        .unwrap()
        .acquire_timeout(TAKEOVER)
        .await;
    println!(
        "second manager after a cancelled lease release: {:?} in {:?}",
        taken.as_ref().map(|l| l.fencing_token()),
        healed.elapsed()
    );
    let still_there = other
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .check_stat(&node)
        .await
        .unwrap()
        .is_some();
    let lease = taken.unwrap_or_else(|e| {
        panic!(
            "the semaphore is wedged after a cancelled lease release: a second manager could not \
             take its only lease within {TAKEOVER:?} ({e}); the cancelled lease {node} is still \
             on the server: {still_there}"
        )
    });
    lease.release().await.unwrap();
    assert_nothing_left(&holder, &other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_release_cancelled_in_flight_leaves_no_node_and_lets_the_next_holder_in() {
    let zk = server();
    let (proxy, holder, other) = setup(&zk).await;
    let specs = || [LockSpec::mutex("wedge-a"), LockSpec::mutex("wedge-b")];
    let all = holder.lock_all(specs(), None).await.unwrap();
    holder.flush().await;

    cancel_release_mid_flight(&proxy, all.release(), Cancel::InFlight).await;

    let healed = Instant::now();
    let taken = other.lock_all(specs(), Some(TAKEOVER)).await;
    println!(
        "second manager after a cancelled multi-lock release: {:?} in {:?}",
        taken.as_ref().map(|g| g.tokens()),
        healed.elapsed()
    );
    let left = contenders(
        &other
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
    )
    .await;
    let all = taken.unwrap_or_else(|e| {
        panic!(
            "the multi-lock is wedged after a cancelled release: a second manager could not take \
             it within {TAKEOVER:?} ({e}); contender nodes left: {left:?}"
        )
    });
    all.release().await.unwrap();
    assert_nothing_left(&holder, &other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutex_release_cancelled_while_reconnecting_leaves_no_node() {
    mutex_release_cancelled(Cancel::AfterReset).await;
}
