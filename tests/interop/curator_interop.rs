//! Interop with Apache Curator's InterProcessMutex on the same path, both ways, and with the
//! LeaderSelector built on it.

use crate::common;

use std::time::Duration;

use common::*;
use zklock_testkit::{now_epoch_ms, CuratorHold};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_holding_excludes_zklock_and_zklock_holding_excludes_curator() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = "/interop/jobs/nightly";

    // Curator holds: zklock cannot take it, then gets it after Curator releases.
    let mut curator = CuratorHold::spawn(&zk.connect_string(), path, "mutex", 1500, 1).unwrap();
    let (event, _) = curator.next_event(Duration::from_secs(300)).unwrap();
    assert_eq!(event, "acquired");
    let mutex = m.mutex_at_path(path).unwrap();
    assert!(
        mutex.try_lock().await.unwrap().is_none(),
        "zklock took a lock Curator holds"
    );
    let guard = mutex.lock().await.unwrap();
    let got_at = now_epoch_ms();
    let (event, released_at) = curator.next_event(Duration::from_secs(10)).unwrap();
    assert_eq!(event, "released");
    assert!(
        got_at >= released_at,
        "zklock got the lock at {got_at}, before Curator released at {released_at}"
    );
    assert!(curator.wait().unwrap().success());

    // zklock holds: Curator waits until zklock releases.
    let mut curator = CuratorHold::spawn(&zk.connect_string(), path, "mutex", 10, 1).unwrap();
    until_children(&m, path, 2).await;
    let released_at = now_epoch_ms();
    guard.release().await.unwrap();
    let (event, acquired_at) = curator.next_event(Duration::from_secs(30)).unwrap();
    assert_eq!(event, "acquired");
    assert!(
        acquired_at >= released_at,
        "Curator got the lock at {acquired_at} while zklock held it until {released_at}"
    );
    assert!(curator.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_read_write_lock_shares_and_excludes_with_zklock() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = "/interop/rw/catalog";
    let rw = m.rwlock_at_path(path).unwrap();

    // A Curator writer excludes zklock readers and writers.
    let mut curator = CuratorHold::spawn(&zk.connect_string(), path, "write", 1500, 1).unwrap();
    assert_eq!(
        curator.next_event(Duration::from_secs(300)).unwrap().0,
        "acquired"
    );
    assert!(
        rw.try_read().await.unwrap().is_none(),
        "zklock read inside a Curator write"
    );
    assert!(
        rw.try_write().await.unwrap().is_none(),
        "zklock write inside a Curator write"
    );
    let r = rw.read().await.unwrap();
    let got_at = now_epoch_ms();
    let (event, released_at) = curator.next_event(Duration::from_secs(10)).unwrap();
    assert_eq!(event, "released");
    assert!(got_at >= released_at);
    assert!(curator.wait().unwrap().success());

    // Curator readers and zklock readers share: Curator gets its read lock while we hold ours.
    let mut curator = CuratorHold::spawn(&zk.connect_string(), path, "read", 10, 1).unwrap();
    assert_eq!(
        curator.next_event(Duration::from_secs(30)).unwrap().0,
        "acquired"
    );
    assert!(r.is_held());
    assert!(curator.wait().unwrap().success());

    // zklock's reader excludes a Curator writer until it releases.
    let mut curator = CuratorHold::spawn(&zk.connect_string(), path, "write", 10, 1).unwrap();
    until_children(&m, path, 2).await;
    let released_at = now_epoch_ms();
    r.release().await.unwrap();
    let (event, acquired_at) = curator.next_event(Duration::from_secs(30)).unwrap();
    assert_eq!(event, "acquired");
    assert!(acquired_at >= released_at);
    assert!(curator.wait().unwrap().success());
}

/// Curator's LeaderSelector leads while it holds an InterProcessMutex on its path: a zklock mutex on
/// that path waits for its leadership to end, and holds it off while zklock holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_leader_selector_and_a_zklock_mutex_on_its_path_exclude_each_other() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = "/interop/leader/selector";
    let mutex = m.mutex_at_path(path).unwrap();

    let mut curator =
        CuratorHold::spawn(&zk.connect_string(), path, "selector:jvm-1", 1500, 1).unwrap();
    let (event, _) = curator.next_event(Duration::from_secs(300)).unwrap();
    assert_eq!(event, "acquired");
    assert!(
        mutex.try_lock().await.unwrap().is_none(),
        "zklock took the lock of a Curator leader"
    );
    let guard = mutex.lock().await.unwrap();
    let got_at = now_epoch_ms();
    let (event, released_at) = curator.next_event(Duration::from_secs(10)).unwrap();
    assert_eq!(event, "released");
    assert!(
        got_at >= released_at,
        "zklock got the lock at {got_at}, while Curator led until {released_at}"
    );
    assert!(curator.wait().unwrap().success());

    let mut curator =
        CuratorHold::spawn(&zk.connect_string(), path, "selector:jvm-2", 10, 1).unwrap();
    until_children(&m, path, 2).await;
    let released_at = now_epoch_ms();
    guard.release().await.unwrap();
    let (event, acquired_at) = curator.next_event(Duration::from_secs(30)).unwrap();
    assert_eq!(event, "acquired");
    assert!(
        acquired_at >= released_at,
        "Curator led at {acquired_at} while zklock held the lock until {released_at}"
    );
    assert!(curator.wait().unwrap().success());
}
