//! The confirm-free handoff: a ZooKeeper waiter watches its predecessor and the node before it,
//! and behind a longer queue lists it again once that node goes (while its predecessor holds),
//! so the predecessor's deletion is its grant, with no request after it. These tests make the
//! nodes ahead go in the ways that are not a grant (a waiter that gives up, a session that
//! dies, a Curator client in the queue) and check that the waiter behind still waits for the
//! holder, then gets the lock with a larger token.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::task::JoinHandle;
use zklock::{FencingToken, LockManager};

/// How long any step may take on a loaded machine.
const LONG: Duration = Duration::from_secs(30);

/// A waiter on `key` in its own task: once it holds, it records when (`granted`, epoch ms),
/// keeps the guard until `release` fires, and returns its token.
struct Waiter {
    manager: LockManager,
    granted: Arc<AtomicU64>,
    task: JoinHandle<zklock::Result<FencingToken>>,
    release: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Waiter {
    async fn queue(connect: &str, key: &'static str) -> Waiter {
        let manager = manager(connect).await;
        let granted = Arc::new(AtomicU64::new(0));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let task = {
            let (manager, granted) = (manager.clone(), granted.clone());
            tokio::spawn(async move {
                let guard = manager.lock(key).await?;
                granted.store(zklock_testkit::now_epoch_ms(), Ordering::SeqCst);
                let token = guard.fencing_token();
                let _ = released.await;
                guard.release().await?;
                Ok(token)
            })
        };
        Waiter {
            manager,
            granted,
            task,
            release: Some(release),
        }
    }

    /// Waits (bounded) until the server holds exactly `n` watches of this waiter's session on
    /// nodes under `path` (the lock path's contenders), as its `wchc` answer lists them: so a
    /// step that follows cannot race the waiter's watch requests.
    async fn until_watching(&self, zk: &ZkServer, path: &str, n: usize) {
        let session = self
            .manager
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .session()
            .id()
            .to_string();
        let prefix = format!("{path}/");
        let what = format!("{n} watches of session {session} under {path}");
        eventually(&what, LONG, || {
            let listed = zk.four_letter("wchc").unwrap_or_default();
            let (session, prefix) = (&session, &prefix);
            async move {
                let mut lines = listed.lines().skip_while(|l| l.trim() != session.as_str());
                lines.next();
                let watched = lines
                    .take_while(|l| l.starts_with(char::is_whitespace))
                    .filter(|l| l.trim().starts_with(prefix.as_str()))
                    .count();
                watched == n
            }
        })
        .await;
    }

    /// Waits (bounded) until this waiter has received `n` watch events from the nodes ahead.
    async fn until_events(&self, n: u64) {
        let what = format!("the waiter to get {n} events from the nodes ahead");
        eventually(&what, LONG, || async {
            self.manager.stats().predecessor_events >= n
        })
        .await;
    }

    fn granted(&self) -> bool {
        self.granted.load(Ordering::SeqCst) != 0
    }

    /// Waits (bounded) for the grant and returns when it was (epoch ms).
    async fn until_granted(&self) -> u64 {
        eventually("the waiter's grant", LONG, || async {
            assert!(
                self.granted() || !self.task.is_finished(),
                "the waiter's acquire ended without a grant"
            );
            self.granted()
        })
        .await;
        self.granted.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until the acquire fails or is granted; a grant fails the test, else the
    /// acquire's error is returned.
    async fn outcome(self) -> zklock::Result<FencingToken> {
        eventually("the waiter to fail or be granted", LONG, || async {
            self.granted() || self.task.is_finished()
        })
        .await;
        assert!(!self.granted(), "granted: its node was deleted");
        self.task.await.unwrap()
    }

    async fn release(mut self) -> FencingToken {
        let _ = self.release.take().unwrap().send(());
        self.task.await.unwrap().unwrap()
    }
}

/// Gives the waiter time to act wrongly on what it just learned: it would be granted within a
/// few milliseconds of its event. (A wrong grant can only be missed on a stalled machine, never
/// reported when there is none.)
async fn still_waiting(w: &Waiter, why: &str) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!w.granted(), "granted while the holder holds: {why}");
    assert!(!w.task.is_finished(), "the acquire ended: {why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_ahead_that_gives_up_does_not_hand_the_lock_on() {
    let zk = server();
    let connect = zk.connect_string();
    let holder = manager(&connect).await;
    let path = holder.path_of("gives-up").unwrap();
    let held = holder.lock("gives-up").await.unwrap();

    let ahead = Waiter::queue(&connect, "gives-up").await;
    until_children(&holder, &path, 2).await;
    let behind = Waiter::queue(&connect, "gives-up").await;
    until_children(&holder, &path, 3).await;
    // A watch on each of the two nodes ahead and one on its own node, set on the server.
    behind.until_watching(&zk, &path, 3).await;

    // The waiter ahead gives up (its acquire is cancelled): its node goes, and the waiter
    // behind sees that deletion. It must go on waiting for the holder.
    ahead.task.abort();
    until_children(&holder, &path, 2).await;
    behind.until_events(1).await;
    still_waiting(&behind, "the waiter ahead gave up").await;

    let first = held.fencing_token();
    held.release().await.unwrap();
    behind.until_granted().await;
    let token = behind.release().await;
    assert!(token > first, "{token} after {first}");
    holder.flush().await;
    assert!(children(&holder, &path).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_ahead_whose_session_dies_does_not_hand_the_lock_on() {
    let zk = server();
    let connect = zk.connect_string();
    let holder = manager(&connect).await;
    let path = holder.path_of("dies").unwrap();
    let held = holder.lock("dies").await.unwrap();

    let ahead = Waiter::queue(&connect, "dies").await;
    until_children(&holder, &path, 2).await;
    let behind = Waiter::queue(&connect, "dies").await;
    until_children(&holder, &path, 3).await;
    behind.until_watching(&zk, &path, 3).await;

    // The session of the waiter ahead expires: the server deletes its node.
    expire_session(&ahead.manager, &connect).await;
    until_children(&holder, &path, 2).await;
    behind.until_events(1).await;
    still_waiting(&behind, "the session of the waiter ahead died").await;
    // Told by its session's end, or (when the session was closed while its connection was
    // still attached, which is how the test expires it) by its node's deletion first.
    match ahead.task.await.unwrap() {
        Err(zklock::Error::SessionExpired | zklock::Error::Dequeued { .. }) => {}
        other => panic!("the waiter whose session expired: {other:?}"),
    }

    let first = held.fencing_token();
    held.release().await.unwrap();
    behind.until_granted().await;
    let token = behind.release().await;
    assert!(token > first, "{token} after {first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_session_dies_hands_the_lock_to_the_first_waiter_only() {
    let zk = server();
    let connect = zk.connect_string();
    let holder = manager(&connect).await;
    let observer = manager(&connect).await;
    let path = holder.path_of("holder-dies").unwrap();
    let held = holder.lock("holder-dies").await.unwrap();
    let first_token = held.fencing_token();

    let first = Waiter::queue(&connect, "holder-dies").await;
    until_children(&observer, &path, 2).await;
    let second = Waiter::queue(&connect, "holder-dies").await;
    until_children(&observer, &path, 3).await;
    second.until_watching(&zk, &path, 3).await;

    expire_session(&holder, &connect).await;
    drop(held);
    first.until_granted().await;
    // The second waiter saw the holder's node go too; the first waiter's is still there.
    second.until_events(1).await;
    still_waiting(&second, "the first waiter holds").await;

    let token = first.release().await;
    assert!(token > first_token);
    second.until_granted().await;
    assert!(second.release().await > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_after_the_nodes_ahead_went_in_order_sends_no_request() {
    let zk = server();
    let connect = zk.connect_string();
    let holder = manager(&connect).await;
    let path = holder.path_of("in-order").unwrap();
    let held = holder.lock("in-order").await.unwrap();

    let mut ahead = vec![];
    for i in 0..3 {
        ahead.push(Waiter::queue(&connect, "in-order").await);
        until_children(&holder, &path, i + 2).await;
    }
    let last = Waiter::queue(&connect, "in-order").await;
    until_children(&holder, &path, 5).await;
    // Four nodes ahead: a watch on the nearest two and one on its own node, set on the server.
    last.until_watching(&zk, &path, 3).await;
    let watching = last.manager.stats().requests;

    held.release().await.unwrap();
    let mut token = FencingToken::new(0, 0);
    let predecessor = ahead.len() - 1;
    for (i, w) in ahead.into_iter().enumerate() {
        w.until_granted().await;
        assert!(!last.granted());
        if i == predecessor {
            // The node before its predecessor went: it listed the queue once, while its
            // predecessor holds, and found it alone in front.
            eventually("the listing behind the new holder", LONG, || async {
                last.manager.stats().requests == watching + 1
            })
            .await;
            last.until_watching(&zk, &path, 2).await;
        }
        let next = w.release().await;
        assert!(next > token);
        token = next;
    }
    last.until_granted().await;
    // The grant itself cost nothing: no request since that listing (the hold's node watch is
    // the one the waiter set on its own node).
    let sent = last.manager.stats().requests - watching;
    assert_eq!(sent, 1, "{sent} requests between the watches and the grant");
    assert_eq!(last.manager.stats().predecessor_events, 2);
    assert!(last.release().await > token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_waiter_in_the_queue_is_waited_for() {
    let zk = server();
    let connect = zk.connect_string();
    let holder = manager(&connect).await;
    let path = holder.path_of("curator").unwrap();
    let held = holder.lock("curator").await.unwrap();

    // Curator queues behind the holder and, once it has the lock, holds it for 400 ms.
    let mut curator = zklock_testkit::CuratorHold::spawn(&connect, &path, "mutex", 400, 1).unwrap();
    // The JVM may take minutes to start on a first run (Curator may be installed then).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while children(&holder, &path).await.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Curator never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let behind = Waiter::queue(&connect, "curator").await;
    until_children(&holder, &path, 3).await;
    behind.until_watching(&zk, &path, 3).await;

    held.release().await.unwrap();
    let (curator, acquired, released) = tokio::task::spawn_blocking(move || {
        let acquired = curator.next_event(Duration::from_secs(30)).unwrap();
        let released = curator.next_event(Duration::from_secs(30)).unwrap();
        (curator, acquired, released)
    })
    .await
    .unwrap();
    assert_eq!(acquired.0, "acquired");
    assert_eq!(released.0, "released");
    let granted_at = behind.until_granted().await;
    assert!(
        granted_at >= released.1,
        "zklock granted at {granted_at}, Curator released at {}",
        released.1
    );
    // Both of the nodes ahead (the holder's, Curator's) were seen going.
    assert_eq!(behind.manager.stats().predecessor_events, 2);
    behind.release().await;
    assert!(tokio::task::spawn_blocking(move || curator.wait())
        .await
        .unwrap()
        .unwrap()
        .success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_long_queue_whose_nearest_gives_up_keeps_waiting() {
    let zk = server();
    let connect = zk.connect_string();
    let holder = manager(&connect).await;
    let path = holder.path_of("long").unwrap();
    let held = holder.lock("long").await.unwrap();

    // Nine waiters, each in a process (manager) of its own, then the one under test: ten nodes
    // ahead of it. It watches its nearest two (and its own node).
    let mut ahead = vec![];
    for i in 0..9 {
        ahead.push(Waiter::queue(&connect, "long").await);
        until_children(&holder, &path, i + 2).await;
    }
    let behind = Waiter::queue(&connect, "long").await;
    until_children(&holder, &path, 11).await;
    behind.until_watching(&zk, &path, 3).await;
    let watching = behind.manager.stats().requests;

    // Its nearest gives up: only one node of its window is left while others are ahead, so it
    // lists the queue again, watches the new nearest two (one of them already watched), and
    // waits on.
    ahead.pop().unwrap().task.abort();
    until_children(&holder, &path, 10).await;
    behind.until_events(1).await;
    still_waiting(&behind, "its nearest gave up, nine nodes are still ahead").await;
    behind.until_watching(&zk, &path, 3).await;
    eventually("one listing and one watch more", LONG, || async {
        behind.manager.stats().requests == watching + 2
    })
    .await;

    let mut token = held.fencing_token();
    held.release().await.unwrap();
    for w in ahead {
        w.until_granted().await;
        assert!(!behind.granted(), "granted while a waiter ahead holds");
        let next = w.release().await;
        assert!(next > token);
        token = next;
    }
    behind.until_granted().await;
    assert!(behind.release().await > token);
    holder.flush().await;
    assert!(children(&holder, &path).await.is_empty());
}

/// A holder of `key`, and one waiter queued behind it in a process of its own, watching the
/// holder's node and its own (as the server shows).
struct OneWaiter {
    holder: LockManager,
    path: String,
    held: zklock::LockGuard,
    waiter: Waiter,
    /// The full path of the waiter's node.
    waiting_node: String,
}

impl OneWaiter {
    async fn queue(zk: &ZkServer, key: &'static str) -> OneWaiter {
        let connect = zk.connect_string();
        let holder = manager(&connect).await;
        let path = holder.path_of(key).unwrap();
        let held = holder.lock(key).await.unwrap();
        let waiter = Waiter::queue(&connect, key).await;
        until_children(&holder, &path, 2).await;
        // A watch on the holder's node, and one on its own node.
        waiter.until_watching(zk, &path, 2).await;
        let own = children(&holder, &path)
            .await
            .into_iter()
            .find(|c| !held.node_path().ends_with(c.as_str()))
            .unwrap();
        OneWaiter {
            waiting_node: format!("{path}/{own}"),
            holder,
            path,
            held,
            waiter,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_node_is_deleted_while_it_waits_is_told_and_never_granted() {
    let zk = server();
    let q = OneWaiter::queue(&zk, "deleted").await;

    // Someone else (an operator) deletes the waiting node.
    q.holder
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .delete(&q.waiting_node, None)
        .await
        .unwrap();
    // And the holder lets go: a waiter that did not see its own node go would now be granted.
    q.held.release().await.unwrap();
    match q.waiter.outcome().await {
        Err(zklock::Error::Dequeued { key }) => assert_eq!(key, "deleted"),
        other => panic!("a waiter whose node was deleted: {other:?}"),
    }
    q.holder.flush().await;
    assert!(children(&q.holder, &q.path).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deleted_just_before_its_grant_is_never_granted() {
    let zk = server();
    let q = OneWaiter::queue(&zk, "just-before").await;

    // The waiting node and then the holder's go in one transaction: the waiter hears of both
    // at once, its own node's deletion first. It must not take the lock.
    let client = q
        .holder
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
    let mut multi = client.new_multi_writer();
    multi.add_delete(&q.waiting_node, None).unwrap();
    multi.add_delete(q.held.node_path(), None).unwrap();
    multi.commit().await.unwrap();
    match q.waiter.outcome().await {
        Err(zklock::Error::Dequeued { key }) => assert_eq!(key, "just-before"),
        other => panic!("a waiter whose node was deleted: {other:?}"),
    }
    drop(q.held);
    q.holder.flush().await;
}
