//! The linger: a process that releases a key and takes it again while no other process wants
//! it pays no request; the node is given up as soon as another contender appears (zklock or
//! Curator), when the linger runs out, on flush and on the manager's drop; a lingering node
//! whose session expired or that someone deleted is never taken again.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use zklock::{FencingToken, LockManager};

const LONG: Duration = Duration::from_secs(30);

async fn lingering_manager(connect: &str, linger: Duration) -> LockManager {
    LockManager::builder(connect)
        .zookeeper(|zk| zk.session_timeout(Duration::from_secs(4)))
        .linger(linger)
        .connect()
        .await
        .expect("connect to the test server")
}

/// Takes `key` twice and lets go, so that its node lingers (the first release starts the
/// listing of other contenders, the second finds it answered): the node and the last token.
async fn linger_node(m: &LockManager, key: &str) -> (String, FencingToken) {
    drop(m.lock(key).await.unwrap());
    let g = m.lock(key).await.unwrap();
    let node = g.node_path().to_string();
    let token = g.fencing_token();
    drop(g);
    assert!(lingers(m, key, &node).await, "{node} lingers");
    (node, token)
}

/// Whether `m` reports the node `node` of `key` as lingering.
async fn lingers(m: &LockManager, key: &str, node: &str) -> bool {
    let info = m.inspect(key).await.unwrap();
    info.holders
        .iter()
        .any(|h| h.lingering && node.ends_with(&format!("/{}", h.node)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_a_lingering_key_again_sends_no_request_and_the_token_increases() {
    let zk = server();
    let m = lingering_manager(&zk.connect_string(), LONG).await;
    let path = m.path_of("again").unwrap();
    let g = m.lock("again").await.unwrap();
    let node = g.node_path().to_string();
    let mut last = g.fencing_token();
    drop(g);
    // The first taking again waits for the listing of other contenders (started by the
    // first release) once.
    let g = m.lock("again").await.unwrap();
    assert!(g.fencing_token() > last);
    last = g.fencing_token();
    drop(g);
    let before = m.stats();
    for _ in 0..200 {
        let g = m.lock("again").await.unwrap();
        assert_eq!(g.node_path(), node, "the lingering node is taken again");
        assert!(g.fencing_token() > last, "tokens must increase");
        assert_eq!(g.fencing_token().grant(), last.grant());
        last = g.fencing_token();
        drop(g);
    }
    let requests = m.stats().requests - before.requests;
    assert_eq!(requests, 0, "{requests} requests for 200 re-acquires");
    // Between holds, the node lingers: inspect says so; ZooKeeper shows the one node.
    assert!(lingers(&m, "again", &node).await);
    assert_eq!(children(&m, &path).await.len(), 1);
    // try_lock takes it again too.
    let g = m.try_lock("again").await.unwrap().expect("nobody holds it");
    assert!(g.fencing_token() > last);
    assert!(!lingers(&m, "again", &node).await, "held, not lingering");
    drop(g);
    m.flush().await;
    assert!(children(&m, &path).await.is_empty(), "flush gives it up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_gets_a_lingering_key_at_once_not_after_the_linger() {
    let zk = server();
    let m = lingering_manager(&zk.connect_string(), LONG).await;
    let other = manager(&zk.connect_string()).await;
    let path = m.path_of("wanted").unwrap();
    let (node, mine) = linger_node(&m, "wanted").await;
    let started = Instant::now();
    let theirs = other
        .lock_timeout("wanted", Duration::from_secs(10))
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "waited {waited:?} for a lingering node (linger {LONG:?})"
    );
    assert!(theirs.fencing_token() > mine);
    assert_eq!(
        children(&other, &path).await.len(),
        1,
        "the lingering node went"
    );
    // The lingering process now queues behind the other like anyone.
    assert!(m.try_lock("wanted").await.unwrap().is_none(), "two holders");
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move { m.lock("wanted").await.unwrap() })
    };
    until_children(&other, &path, 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !waiter.is_finished(),
        "got the lock while the other held it"
    );
    let last = theirs.fencing_token();
    theirs.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(g.fencing_token() > last);
    assert_ne!(g.node_path(), node);
    drop(g);
    m.flush().await;
    other.flush().await;
    assert!(children(&other, &path).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_waiter_gets_a_lingering_key_at_once() {
    let zk = server();
    let m = lingering_manager(&zk.connect_string(), LONG).await;
    let path = m.path_of("jvm").unwrap();
    let (node, _) = linger_node(&m, "jvm").await;
    let mut curator =
        zklock_testkit::CuratorHold::spawn(&zk.connect_string(), &path, "mutex", 50, 1).unwrap();
    // The JVM may take a while to start (or to be installed on a first run): the wait counts
    // from Curator's node, not from the spawn.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    let queued_at = loop {
        let kids = children(&m, &path).await;
        if kids.len() >= 2 || !kids.iter().any(|k| node.ends_with(k.as_str())) {
            break zklock_testkit::now_epoch_ms();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Curator never queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let (event, acquired_at) = tokio::task::spawn_blocking(move || {
        let e = curator.next_event(Duration::from_secs(20)).unwrap();
        (e, curator)
    })
    .await
    .map(|((event, at), _)| (event, at))
    .unwrap();
    assert_eq!(event, "acquired");
    let waited = acquired_at.saturating_sub(queued_at);
    assert!(
        waited < 5_000,
        "Curator waited {waited} ms for a lingering node (linger {LONG:?})"
    );
    assert!(!children(&m, &path)
        .await
        .iter()
        .any(|k| node.ends_with(k.as_str())));
    m.flush().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_a_lingering_node_whose_session_expired_is_never_taken_again() {
    let zk = server();
    let m = lingering_manager(&zk.connect_string(), LONG).await;
    let other = manager(&zk.connect_string()).await;
    let path = m.path_of("expiring").unwrap();
    let (node, mine) = linger_node(&m, "expiring").await;
    expire_session(&m, &zk.connect_string()).await;
    // The server deleted the node with its session: the other process gets the lock.
    let theirs = other
        .lock_timeout("expiring", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(theirs.fencing_token() > mine);
    let kids = children(&other, &path).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    assert!(!node.ends_with(&kids[0]), "the expired node is gone");
    // The first process must not take its old node again: it queues a node of its own
    // (taking the old one again would send no create) and waits for the other holder.
    let waiter = {
        let m = m.clone();
        tokio::spawn(async move { m.lock("expiring").await.unwrap() })
    };
    eventually(
        "the first process to queue a new node",
        Duration::from_secs(10),
        || async {
            assert!(
                !waiter.is_finished(),
                "two holders: the expired lingering node was taken again"
            );
            children(&other, &path).await.len() >= 2
        },
    )
    .await;
    assert!(
        !waiter.is_finished(),
        "two holders: the expired lingering node was taken again"
    );
    let last = theirs.fencing_token();
    theirs.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(g.node_path(), node);
    assert!(g.fencing_token() > last);
    assert!(g.is_held());
    let kids = children(&other, &path).await;
    assert_eq!(kids.len(), 1);
    assert!(g.node_path().ends_with(&kids[0]));
    drop(g);
    m.flush().await;
    other.flush().await;
    assert!(children(&other, &path).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_node_deleted_by_someone_else_is_not_taken_again() {
    let zk = server();
    let m = lingering_manager(&zk.connect_string(), LONG).await;
    let admin = manager(&zk.connect_string()).await;
    let path = m.path_of("deleted").unwrap();
    let (node, mine) = linger_node(&m, "deleted").await;
    admin
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .delete(&node, None)
        .await
        .unwrap();
    // The node's watch tells `m` (its event comes before the answer to a later request of the
    // same session), which gives the node up.
    eventually(
        "the deleted node to stop lingering",
        Duration::from_secs(5),
        || async {
            !m.inspect("deleted")
                .await
                .unwrap()
                .holders
                .iter()
                .any(|h| h.lingering)
        },
    )
    .await;
    let g = m.lock("deleted").await.unwrap();
    assert_ne!(g.node_path(), node, "a deleted node was taken again");
    assert!(g.fencing_token() > mine);
    assert!(g.is_held());
    assert_eq!(children(&m, &path).await.len(), 1);
    drop(g);
    m.flush().await;
    assert!(children(&admin, &path).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_node_is_given_up_when_the_linger_runs_out_and_on_drop() {
    let zk = server();
    let watcher = manager(&zk.connect_string()).await;
    let m = lingering_manager(&zk.connect_string(), Duration::from_millis(300)).await;
    let path = m.path_of("brief").unwrap();
    drop(m.lock("brief").await.unwrap());
    assert_eq!(children(&watcher, &path).await.len(), 1, "it lingers");
    // No flush: the linger's own end gives the node up.
    eventually(
        "the 300 ms linger to run out",
        Duration::from_secs(5),
        || async { children(&watcher, &path).await.is_empty() },
    )
    .await;

    // The manager's drop gives a lingering node up (no flush).
    let m = lingering_manager(&zk.connect_string(), LONG).await;
    drop(m.lock("brief").await.unwrap());
    assert_eq!(children(&watcher, &path).await.len(), 1, "it lingers");
    drop(m);
    eventually(
        "a dropped manager to give up its lingering node",
        Duration::from_secs(10),
        || async { children(&watcher, &path).await.is_empty() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_locks_and_semaphores_do_not_linger_write_locks_do() {
    let zk = server();
    let m = lingering_manager(&zk.connect_string(), LONG).await;
    let rw = m.rwlock("shelf").unwrap();
    drop(rw.read().await.unwrap());
    m.flush().await;
    assert!(
        children(&m, rw.path()).await.is_empty(),
        "a read lock lingered"
    );
    let sem = m.semaphore("pool", 2).unwrap();
    let lease = sem.acquire().await.unwrap();
    let lease_path = lease.node_path().to_string();
    drop(lease);
    m.flush().await;
    let sem_path = lease_path.rsplit_once("/leases/").unwrap().0.to_string();
    assert!(
        tree(&m, &sem_path)
            .await
            .iter()
            .all(|p| !p.contains("lease-")),
        "a lease lingered"
    );
    let w = rw.write().await.unwrap();
    let token = w.fencing_token();
    drop(w);
    let w = rw.write().await.unwrap();
    assert!(w.fencing_token() > token);
    assert_eq!(
        w.fencing_token().grant(),
        token.grant(),
        "the write node lingered"
    );
    drop(w);
    // A reader of the same lock is another contender: the writer's node goes at once.
    let started = Instant::now();
    let r = rw.read_timeout(Duration::from_secs(10)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(r);
    m.flush().await;
    assert!(children(&m, rw.path()).await.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn in_memory_a_lingering_key_is_taken_again_and_given_up_for_another_contender() {
    let m = LockManager::in_memory_with(LockManager::builder("memory").linger(LONG));
    let first = m.lock("unit").await.unwrap().fencing_token();
    let again = m.lock("unit").await.unwrap().fencing_token();
    assert!(again > first);
    assert_eq!(
        again.grant(),
        first.grant(),
        "taken again without the backend"
    );
    assert_eq!(again.local(), 1);
    // Lost while lingering (as a session expiry would): not taken again.
    m.lose("unit", zklock::LossReason::SessionExpired).unwrap();
    let fresh = m.lock("unit").await.unwrap().fencing_token();
    assert!(fresh > again);
    assert_eq!(fresh.local(), 0, "a lost lingering hold was taken again");
    // A reader of a write-locked key is another contender: it gets in at once.
    let rw = m.rwlock("unit").unwrap();
    drop(rw.write().await.unwrap());
    let r = tokio::time::timeout(Duration::from_secs(5), rw.read())
        .await
        .expect("the reader waited for the linger")
        .unwrap();
    drop(r);
    m.flush().await;
}

/// A lingering node's watcher runs on the manager's runtime, not on the one that released it:
/// a release inside a short-lived runtime (a blocking helper's own `block_on`, a test's
/// runtime) that then ends still gives the node up when another process queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_released_in_a_runtime_that_ended_is_still_given_up() {
    let zk = server();
    let m = lingering_manager(&zk.connect_string(), LONG).await;
    let path = m.path_of("short_lived").unwrap();
    // Takes and releases the key twice in a runtime of its own, which then ends: the second
    // release lingers (the first one started the listing of other contenders).
    let released = m.clone();
    std::thread::spawn(move || {
        let short = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        short.block_on(async {
            drop(released.lock("short_lived").await.unwrap());
            let g = released.lock("short_lived").await.unwrap();
            drop(g);
        });
        drop(short);
    })
    .join()
    .unwrap();
    assert_eq!(children(&m, &path).await.len(), 1, "the node lingers");
    let other = lingering_manager(&zk.connect_string(), LONG).await;
    let got = tokio::time::timeout(Duration::from_secs(10), other.lock("short_lived")).await;
    assert!(
        got.is_ok(),
        "the lingering node was not given up for another process (its watcher ended with the runtime that released it)"
    );
}
