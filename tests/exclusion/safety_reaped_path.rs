//! Safety when a lock path is reaped and re-created under a holder whose session expired.
//!
//! Lock paths are CONTAINER nodes: once the last contender is gone the server deletes the path, and
//! the next contender re-creates it with sequence numbers starting again at 0 (the test kit's servers
//! reap every 100 ms; production ones about every minute). A manager that remembers something about
//! the old path — such as the sort key of the highest node it was granted there (its "granted
//! floor") — must not apply it to the new one: a kept guard of an expired session must not let its
//! manager, on its renewed session, prune the new holder's node (sequence 0) as "below the floor".
//!
//! Every case: churn so that the kept guard's node has a sequence above 0, keep that guard, expire
//! its session from the server side, wait (polling the server) until the path is reaped and then
//! re-created by another manager that holds the lock, and acquire again from the first manager with
//! a bounded wait. The server's children and their ephemeral owners say who holds; two holders at
//! once fail the test.
//!
//! With the local queue on (the default), a second acquire of the same mutex key in the same
//! process queues locally behind the kept guard, lost or not, so the floor is reached another way:
//! by a reader (readers bypass the local queue) under another session's writer, and by a local
//! waiter that the release of the kept guard hands the duty to acquire a node. The semaphore's gate
//! (`<path>/locks`) is a mutex path reaped and re-created the same way.

use crate::common;

use std::time::Duration;

use common::*;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use zklock::{Error, Lease, LockGuard, LockManager, LossReason, Semaphore};
use zookeeper_client::SessionState;

const KEY: &str = "reaped";
/// Every wait for the server to reach a state.
const WITHIN: Duration = Duration::from_secs(30);
/// How long the first manager's second acquire may wait while the other manager holds.
const SECOND_ACQUIRE: Duration = Duration::from_secs(3);

async fn manager_local_queue(connect: &str, local_queue: bool) -> LockManager {
    LockManager::builder(connect)
        .zookeeper(|zk| zk.session_timeout(Duration::from_secs(4)))
        .local_queue(local_queue)
        .connect()
        .await
        .expect("connect to the test server")
}

/// The `%010d` sequence at the end of a contender node's name.
fn seq(node: &str) -> i64 {
    let digits = &node[node.len().saturating_sub(10)..];
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no sequence in {node}"))
}

/// The czxid of `path` (its incarnation), `None` when it does not exist.
async fn incarnation(direct: &LockManager, path: &str) -> Option<i64> {
    direct
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .check_stat(path)
        .await
        .unwrap_or_else(|e| panic!("stat {path}: {e}"))
        .map(|s| s.czxid)
}

/// The children of `path` in sequence order, each with its owner's name among `who`
/// (`"?"` for a session not listed, `"gone"` when the node vanished meanwhile).
async fn owners(direct: &LockManager, path: &str, who: &[(&str, &LockManager)]) -> Vec<String> {
    let mut kids = children(direct, path).await;
    kids.sort_by_key(|k| seq(k));
    let mut out = Vec::new();
    for k in kids {
        let stat = direct
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .check_stat(&format!("{path}/{k}"))
            .await
            .unwrap_or_else(|e| panic!("stat {path}/{k}: {e}"));
        let owner = match stat {
            None => "gone",
            Some(s) => who
                .iter()
                .find(|(_, m)| {
                    m.client::<zookeeper_client::Client>()
                        .expect("a ZooKeeper manager")
                        .session_id()
                        .0
                        == s.ephemeral_owner
                })
                .map_or("?", |(name, _)| *name),
        };
        out.push(format!("{k} (owner {owner})"));
    }
    out
}

/// Expires `m`'s session from the server side, waits until `m` has a new, connected session, and
/// checks that `kept` (a guard's loss reason, of the old session) reports it lost.
async fn expire_and_renew(m: &LockManager, connect: &str, kept: impl Fn() -> Option<LossReason>) {
    expire_until_renewed(m, connect).await;
    // Still lost on the renewed session. The reason depends on timing: the session's expiry, or
    // the deletion of the node (seen when the old handle got back onto the session before the
    // server closed it), or the disconnection that came first.
    assert!(
        matches!(
            kept(),
            Some(LossReason::SessionExpired | LossReason::NodeDeleted | LossReason::Disconnected)
        ),
        "the kept guard must stay lost on the renewed session: {:?}",
        kept()
    );
}

/// Expires `m`'s session from the server side and waits until `m` has a new, connected session.
///
/// The second handle of [`expire_session`] sometimes loses the connection back to the original
/// one before its close reaches the server, and the session lives on: then it tries again.
async fn expire_until_renewed(m: &LockManager, connect: &str) {
    let old = m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .session_id();
    let started = Instant::now();
    for attempt in 1..=5 {
        expire_session(m, connect).await;
        let deadline = Instant::now() + Duration::from_secs(6);
        while Instant::now() < deadline {
            let client = m
                .client::<zookeeper_client::Client>()
                .expect("a ZooKeeper manager");
            if client.session_id() != old && client.state() == SessionState::SyncConnected {
                eprintln!(
                    "session expired and renewed after {:?} ({attempt} attempts)",
                    started.elapsed()
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    panic!("the manager's session was not expired and renewed after 5 attempts");
}

/// Waits until `path` (of incarnation `old`) has been deleted by the server's container reaper.
async fn until_reaped(direct: &LockManager, path: &str, old: i64) {
    let deadline = Instant::now() + WITHIN;
    loop {
        let stat = direct
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .check_stat(path)
            .await
            .unwrap_or_else(|e| panic!("stat {path}: {e}"));
        let Some(stat) = stat else { return };
        if Instant::now() >= deadline {
            let mut kids = vec![];
            for k in children(direct, path).await {
                let s = direct
                    .client::<zookeeper_client::Client>()
                    .expect("a ZooKeeper manager")
                    .check_stat(&format!("{path}/{k}"))
                    .await;
                kids.push(format!("{k} {:?}", s.map(|s| s.map(|s| s.ephemeral_owner))));
            }
            panic!(
                "{path} (czxid {old}) was not reaped within {WITHIN:?}: {stat:?}; children {kids:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Checks that `path` is a new incarnation whose first child is `node`, the other manager's.
async fn assert_recreated(direct: &LockManager, path: &str, old: i64, node: &str) {
    let now = incarnation(direct, path)
        .await
        .unwrap_or_else(|| panic!("{path} was not re-created"));
    assert_ne!(now, old, "{path} must be a new incarnation");
    assert_eq!(
        seq(node),
        0,
        "the other manager's node {node} must be the first of the new {path}"
    );
}

/// Builds `m1`'s kept exclusive guard on `path` with a sequence above 0: `m2` holds, `m1` makes
/// some failed tries (`try_once`), then queues (`queue`) and is granted when `m2` lets go.
async fn churned_guard<TryOnce, TryFut, Queue>(
    direct: &LockManager,
    path: &str,
    m2_hold: LockGuard,
    mut try_once: TryOnce,
    queue: Queue,
) -> LockGuard
where
    TryOnce: FnMut() -> TryFut,
    TryFut: std::future::Future<Output = bool>,
    Queue: std::future::Future<Output = zklock::Result<LockGuard>> + Send + 'static,
{
    for _ in 0..4 {
        assert!(!try_once().await, "m2 holds: m1's try must fail");
    }
    let waiting = tokio::spawn(queue);
    until_children(direct, path, 2).await;
    m2_hold.release().await.expect("m2 releases");
    let kept = tokio::time::timeout(WITHIN, waiting)
        .await
        .expect("m1 is granted once m2 released")
        .unwrap()
        .expect("m1 is granted");
    let node = kept.node_path().rsplit('/').next().unwrap().to_string();
    assert!(
        seq(&node) > 0,
        "the kept guard's node {node} must sort above a fresh path's first node"
    );
    assert!(kept.is_held());
    kept
}

/// The verdict on `m1`'s second acquire while `m2` holds `m2_node`: it must time out; a grant is
/// two holders, reported with the server's view.
async fn assert_second_acquire_times_out(
    result: zklock::Result<LockGuard>,
    direct: &LockManager,
    path: &str,
    m2_node: &str,
    who: &[(&str, &LockManager)],
) {
    match result {
        Err(Error::Timeout { .. }) => {}
        Ok(second) => {
            let m2_alive = incarnation(direct, &format!("{path}/{m2_node}"))
                .await
                .is_some();
            panic!(
                "two holders at once: m1 was granted {} (is_held = {}) while m2 holds {m2_node} \
                 (alive on the server: {m2_alive}); children of {path}: {:?}",
                second.node_path(),
                second.is_held(),
                owners(direct, path, who).await
            );
        }
        Err(e) => panic!("m1's second acquire must time out while m2 holds, not fail with: {e}"),
    }
}

/// The mutex case, with or without the local queue: `mutex_case` returns after the safety verdict
/// on the second acquire, with the kept guard still alive and `m2` still holding.
struct MutexCase {
    direct: LockManager,
    m1: LockManager,
    m2: LockManager,
    path: String,
    kept: LockGuard,
    m2_hold: LockGuard,
}

async fn mutex_case(connect: &str, local_queue: bool, key: &str) -> MutexCase {
    let direct = manager(connect).await;
    let m1 = manager_local_queue(connect, local_queue).await;
    let m2 = manager_local_queue(connect, local_queue).await;
    let path = m1.path_of(key).unwrap();

    let m2_first = m2.mutex(key).unwrap().lock().await.unwrap();
    let m1r = &m1;
    let kept = churned_guard(
        &direct,
        &path,
        m2_first,
        move || async move { m1r.mutex(key).unwrap().try_lock().await.unwrap().is_some() },
        {
            let mutex = m1.mutex(key).unwrap();
            async move { mutex.lock().await }
        },
    )
    .await;
    let old = incarnation(&direct, &path)
        .await
        .expect("the lock path exists");

    expire_and_renew(&m1, connect, || kept.loss_reason()).await;
    until_reaped(&direct, &path, old).await;
    let m2_hold = tokio::time::timeout(WITHIN, m2.mutex(key).unwrap().lock())
        .await
        .expect("m2 locks the free key")
        .expect("m2 locks the free key");
    let m2_node = m2_hold.node_path().rsplit('/').next().unwrap().to_string();
    assert_recreated(&direct, &path, old, &m2_node).await;

    let second = m1.mutex(key).unwrap().lock_timeout(SECOND_ACQUIRE).await;
    let who = [("m1", &m1), ("m2", &m2)];
    assert_second_acquire_times_out(second, &direct, &path, &m2_node, &who).await;
    assert!(
        !kept.is_held() && m2_hold.is_held(),
        "the kept guard stays lost, m2 still holds"
    );
    MutexCase {
        direct,
        m1,
        m2,
        path,
        kept,
        m2_hold,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_without_local_queue_never_grants_over_the_holder_of_a_recreated_path() {
    let zk = server();
    let connect = zk.connect_string();
    let case = mutex_case(&connect, false, KEY).await;

    // Once the live holder lets go, the renewed session gets the lock (the kept, lost guard of
    // the expired session does not block it: it has no node any more).
    case.m2_hold.release().await.unwrap();
    let third = case
        .m1
        .mutex(KEY)
        .unwrap()
        .lock_timeout(WITHIN)
        .await
        .expect("m1 locks once m2 released");
    let who = [("m1", &case.m1), ("m2", &case.m2)];
    assert_eq!(
        owners(&case.direct, &case.path, &who).await.len(),
        1,
        "only m1's node"
    );
    assert!(third.is_held() && !case.kept.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_with_local_queue_never_grants_over_the_holder_of_a_recreated_path() {
    let zk = server();
    let connect = zk.connect_string();
    let case = mutex_case(&connect, true, KEY).await;
    assert!(!case.kept.is_held());
}

/// With the local queue on, the process's next acquire of the key queues behind its kept guard,
/// even though that guard is lost and has no node: while user code keeps it, can that acquire
/// get in once the key is free on the server?
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_with_local_queue_lets_the_next_acquire_in_while_a_lost_guard_is_kept() {
    let zk = server();
    let connect = zk.connect_string();
    let case = mutex_case(&connect, true, KEY).await;

    case.m2_hold.release().await.unwrap();
    let (direct, path) = (&case.direct, &case.path);
    eventually("m2's node to be gone", WITHIN, move || async move {
        children(direct, path).await.is_empty()
    })
    .await;
    let third = case
        .m1
        .mutex(KEY)
        .unwrap()
        .lock_timeout(Duration::from_secs(10))
        .await;
    match third {
        Ok(third) => assert!(third.is_held() && !case.kept.is_held()),
        Err(e) => panic!(
            "with the key free on the server (children of {}: {:?}), m1's acquire did not get in \
             while its lost guard {} (loss: {:?}) is kept: {e}",
            case.path,
            children(&case.direct, &case.path).await,
            case.kept.node_path(),
            case.kept.loss_reason()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_never_joins_another_sessions_writer_on_a_recreated_path() {
    let zk = server();
    let connect = zk.connect_string();
    let direct = manager(&connect).await;
    // The local queue is on (the default): readers bypass it, so the floor is reached.
    let m1 = manager(&connect).await;
    let m2 = manager(&connect).await;
    let (rw1, rw2) = (m1.rwlock(KEY).unwrap(), m2.rwlock(KEY).unwrap());
    let path = rw1.path().to_string();

    let m2_first = rw2.write().await.unwrap();
    let queue = {
        let rw1 = rw1.clone();
        async move { rw1.write().await }
    };
    let rw1r = &rw1;
    let kept = churned_guard(
        &direct,
        &path,
        m2_first,
        move || async move { rw1r.try_write().await.unwrap().is_some() },
        queue,
    )
    .await;
    let old = incarnation(&direct, &path)
        .await
        .expect("the lock path exists");

    expire_and_renew(&m1, &connect, || kept.loss_reason()).await;
    until_reaped(&direct, &path, old).await;
    let m2_write = tokio::time::timeout(WITHIN, rw2.write())
        .await
        .expect("m2 write-locks the free key")
        .expect("m2 write-locks the free key");
    let m2_node = m2_write.node_path().rsplit('/').next().unwrap().to_string();
    assert_recreated(&direct, &path, old, &m2_node).await;

    let read = rw1.read_timeout(SECOND_ACQUIRE).await;
    let who = [("m1", &m1), ("m2", &m2)];
    assert_second_acquire_times_out(read, &direct, &path, &m2_node, &who).await;
    assert!(!kept.is_held() && m2_write.is_held());

    m2_write.release().await.unwrap();
    let read = rw1
        .read_timeout(WITHIN)
        .await
        .expect("m1 reads once m2's writer is gone");
    assert!(read.is_held() && !kept.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_gate_and_leases_never_double_grant_on_a_recreated_path() {
    let zk = server();
    let connect = zk.connect_string();
    let direct = manager(&connect).await;
    let m1 = manager(&connect).await;
    let m2 = manager(&connect).await;
    let (s1, s2) = (m1.semaphore(KEY, 1).unwrap(), m2.semaphore(KEY, 1).unwrap());
    let path = format!("{}/%SEM/{KEY}", m1.namespace());
    let (locks, leases) = (format!("{path}/locks"), format!("{path}/leases"));
    let who = [("m1", &m1), ("m2", &m2)];

    // Churn: m2 holds the only lease and a second m2 acquire waits holding the gate, so the gate
    // path stays; m1's tries and its queued acquire raise the gate's sequence.
    let m2_lease = s2.acquire().await.unwrap();
    // The gate's node of that acquire is deleted in the background: wait for it, so that the
    // counts below see the nodes of the acquires that follow.
    m2.flush().await;
    let m2_next = queued_acquire(&s2);
    until_children(&direct, &locks, 1).await;
    for _ in 0..4 {
        assert!(s1.try_acquire().await.unwrap().is_none());
    }
    m1.flush().await; // the tries' nodes are deleted in the background
    let m1_queued = queued_acquire(&s1);
    until_children(&direct, &locks, 2).await;
    let m1_gate_seq = m1_gate_seq(&direct, &locks, &who).await;
    m2_lease.release().await.unwrap();
    let m2_next = tokio::time::timeout(WITHIN, m2_next)
        .await
        .expect("m2's second acquire gets the lease")
        .unwrap()
        .unwrap();
    m2_next.release().await.unwrap();
    let kept = tokio::time::timeout(WITHIN, m1_queued)
        .await
        .expect("m1 gets the lease")
        .unwrap()
        .unwrap();
    assert!(seq(kept.node_path()) > 0, "{}", kept.node_path());
    assert!(kept.is_held());
    let old = incarnation(&direct, &path)
        .await
        .expect("the semaphore path exists");
    let old_locks = incarnation(&direct, &locks).await;

    // Expire m1; the semaphore's paths empty and are reaped.
    expire_until_renewed(&m1, &connect).await;
    assert!(!kept.is_held(), "the kept lease must report itself lost");
    until_reaped(&direct, &path, old).await;

    // m2 re-creates it: one lease held, and a second m2 acquire waiting while it holds the gate,
    // whose node sorts below the one m1 held before.
    let m2_lease = tokio::time::timeout(WITHIN, s2.acquire())
        .await
        .expect("m2 gets the free lease")
        .unwrap();
    let m2_waiter = queued_acquire(&s2);
    until_gate_below(&direct, &path, m1_gate_seq).await;
    assert_ne!(incarnation(&direct, &locks).await, old_locks);

    // m1 acquires with a bounded wait: it must neither pass m2's gate holder (a lease node of
    // m1 appears only past the gate) nor get a second lease.
    let second = tokio::spawn({
        let s1 = s1.clone();
        async move { s1.acquire_timeout(SECOND_ACQUIRE).await }
    });
    let passed_gate = m1_past_the_gate(&second, &direct, &m1, &path, &who).await;
    let second = tokio::time::timeout(WITHIN, second).await.unwrap().unwrap();
    if let Ok(lease) = &second {
        panic!(
            "two holders at once: m1 got lease {} of a 1-lease semaphore while m2 holds one; \
             leases: {:?}",
            lease.node_path(),
            owners(&direct, &leases, &who).await
        );
    }
    if let Some((gate, leases)) = passed_gate {
        panic!(
            "two gate holders at once: m1 created a lease while m2's waiter held the gate; \
             gate: {gate:?}, leases: {leases:?}"
        );
    }
    assert!(
        matches!(second, Err(Error::Timeout { .. })),
        "m1's acquire must time out: {second:?}"
    );
    assert!(!kept.is_held());

    drop(m2_lease);
    let m2_waiter = tokio::time::timeout(WITHIN, m2_waiter)
        .await
        .expect("m2's waiter gets the lease")
        .unwrap()
        .unwrap();
    assert!(m2_waiter.is_held() && !kept.is_held());
}

/// The sequence of the last node in the semaphore's gate `locks`, which must be m1's.
async fn m1_gate_seq(direct: &LockManager, locks: &str, who: &[(&str, &LockManager)]) -> i64 {
    let m1_gate = owners(direct, locks, who).await.pop().unwrap();
    let m1_gate_seq = seq(m1_gate.split(' ').next().unwrap());
    assert!(
        m1_gate.ends_with("(owner m1)") && m1_gate_seq > 0,
        "{m1_gate}"
    );
    m1_gate_seq
}

/// Waits until one node holds the gate of the semaphore at `path`, sorting below
/// `m1_gate_seq`, with two lease nodes: m2's waiter holds the gate of the new path.
async fn until_gate_below(direct: &LockManager, path: &str, m1_gate_seq: i64) {
    let (locks, leases) = (format!("{path}/locks"), format!("{path}/leases"));
    let (d, l, ls) = (direct, &locks, &leases);
    eventually(
        "m2's waiter to hold the gate of the new path",
        WITHIN,
        move || async move {
            let gate = children(d, l).await;
            gate.len() == 1 && seq(&gate[0]) < m1_gate_seq && children(d, ls).await.len() == 2
        },
    )
    .await;
}

/// A task of `semaphore`'s that acquires one lease, queued.
fn queued_acquire(semaphore: &Semaphore) -> JoinHandle<zklock::Result<Lease>> {
    let semaphore = semaphore.clone();
    tokio::spawn(async move { semaphore.acquire().await })
}

/// Watches the leases of the semaphore at `path` until `acquire` ends: answers the gate's and
/// the leases' owners if a lease node of `m1` appeared (m1 passed the gate).
async fn m1_past_the_gate<T>(
    acquire: &JoinHandle<T>,
    direct: &LockManager,
    m1: &LockManager,
    path: &str,
    who: &[(&str, &LockManager)],
) -> Option<(Vec<String>, Vec<String>)> {
    let (locks, leases) = (format!("{path}/locks"), format!("{path}/leases"));
    let m1_id = m1
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .session_id()
        .0;
    let mut passed_gate = None;
    while !acquire.is_finished() {
        for lease in children(direct, &leases).await {
            let stat = direct
                .client::<zookeeper_client::Client>()
                .expect("a ZooKeeper manager")
                .check_stat(&format!("{leases}/{lease}"))
                .await
                .unwrap();
            if stat.is_some_and(|s| s.ephemeral_owner == m1_id) {
                passed_gate = Some((
                    owners(direct, &locks, who).await,
                    owners(direct, &leases, who).await,
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    passed_gate
}

/// With the local queue on, a task of the first manager wants the key while user code keeps the
/// lost guard: the lost guard does not hold the local queue up, so the task acquires a node of its
/// own, and must queue behind the other manager's holder like any contender, before and after
/// user code finally releases the kept guard.
///
/// Whether the released guard's knowledge of the old path is still around when the task starts is
/// a race between the two, so the case is played several times, on fresh keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_with_local_queue_waiter_behind_a_released_lost_guard_never_joins_the_holder() {
    let zk = server();
    let connect = zk.connect_string();
    for round in 0..5 {
        let key = format!("{KEY}-{round}");
        let case = mutex_case(&connect, true, &key).await;
        let m2_node = case
            .m2_hold
            .node_path()
            .rsplit('/')
            .next()
            .unwrap()
            .to_string();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let waiter = tokio::spawn({
            let (m1, key) = (case.m1.clone(), key.clone());
            async move {
                let _ = started_tx.send(());
                m1.mutex(&key).unwrap().lock_timeout(SECOND_ACQUIRE).await
            }
        });
        started.await.unwrap();
        // The kept guard is lost, so it holds the local queue up no more: the waiter takes a
        // node of its own on the renewed session, which queues behind m2's holder.
        let (direct, path) = (&case.direct, &case.path);
        eventually(
            "the waiter's node behind m2's",
            WITHIN,
            move || async move { children(direct, path).await.len() == 2 },
        )
        .await;
        assert!(
            !waiter.is_finished(),
            "the waiter must not be granted while m2 holds"
        );
        let released = case.kept.release().await;
        assert!(
            matches!(released, Err(Error::LockLost { .. })),
            "releasing the lost guard says it was lost: {released:?}"
        );
        let result = tokio::time::timeout(WITHIN, waiter)
            .await
            .expect("the waiter's bounded acquire ends")
            .unwrap();
        let who = [("m1", &case.m1), ("m2", &case.m2)];
        assert_second_acquire_times_out(result, &case.direct, &case.path, &m2_node, &who).await;
        case.m2_hold.release().await.unwrap();
    }
}
