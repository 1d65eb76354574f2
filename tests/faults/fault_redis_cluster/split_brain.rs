//! c. A primary frozen (SIGSTOP) past the node timeout, its replica promoted without the
//! holder's grant, then the old one woken: the overlap is bounded by the lease and the old
//! holder's writes are refused by the fence.

use super::*;

/// c. Split brain. A holds k1 and A2 holds k2, both on one primary, both replicated to its
/// replica. The primary is frozen (SIGSTOP) past the node timeout; its replica is promoted; on
/// it, k1's lock key is deleted (A's grant as a write the replica never got: A cannot know);
/// B, a manager connected after the promotion, is granted k1 at once and k2 once A2's lease
/// ran out on the promoted replica; then the old primary is woken (it turns replica of the
/// new one). Proves: the overlap of A's and B's believed holds, measured and reported, is
/// bounded by the lease; A2 is told before B gets k2 (the checker, with no fault excusing
/// A2); every write A makes through the fence once B has written is refused, and so is a
/// late one after the wake; B's token is above A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_primary_overlap_is_bounded_by_the_lease_and_stale_writes_are_fenced() {
    let _turn = TURNS.lock().await;
    const SPLIT_LEASE: Duration = Duration::from_secs(6);
    let cluster = start_cluster(1, NODE_TIMEOUT_MS);
    let (_store, fence) = fence_store().await;
    let url = cluster_url(&cluster, 0);
    let a = cluster_manager(&url, SPLIT_LEASE).await;
    let a2 = cluster_manager(&url, SPLIT_LEASE).await;
    let on = blocking(|| keys_per_primary(&cluster, &a, "sku", 2));
    let old = *on.keys().next().unwrap();
    let (k1, k2) = (on[&old][0].clone(), on[&old][1].clone());
    let (lk1, lk2) = (lock_key(&a, "lock", &k1), lock_key(&a, "lock", &k2));
    let replica = blocking(|| replica_of(&cluster, old));
    let history = History::new();
    let (rec_a, rec_a2) = (history.recorder("A"), history.recorder("A2"));
    let (rec_b, rec_b2) = (history.recorder("B"), history.recorder("B2"));
    let guard_a = hold(&a, &k1, &rec_a, PROGRESS).await;
    let token_a = guard_a.fencing_token();
    assert!(fenced_set(&fence, token_a, "A".into()).await.accepted);
    let guard_a2 = hold(&a2, &k2, &rec_a2, PROGRESS).await;
    until_replicated(&cluster, replica, &lk1, &lk2).await;

    history.silent_fault(
        "A",
        "SIGSTOP k1's primary; A's grant is then taken off the promoted replica (not replicated)",
    );
    let paused = Instant::now();
    blocking(|| cluster.pause(old)).unwrap();
    let writer = writer_until_lost(guard_a, k1.clone(), rec_a.clone(), fence.clone());
    let kept2 = kept_until_lost(guard_a2, k2.clone(), rec_a2.clone());
    until_promoted(&cluster, replica, &lk1).await;
    let promoted = paused.elapsed();
    // A's grant, as the replica would lack it had replication not carried it yet.
    assert_eq!(
        blocking(|| cluster.command(replica, &["DEL", &lk1]))
            .unwrap()
            .int(),
        Some(1)
    );
    let b = cluster_manager(&cluster_url(&cluster, 1), SPLIT_LEASE).await;
    let b_task = new_holder_writes(
        b.clone(),
        k1.clone(),
        rec_b.clone(),
        fence.clone(),
        PROGRESS,
    );
    let b2_task = holds_when_free(b.clone(), k2.clone(), rec_b2.clone());
    let holder_b = tokio::time::timeout(PROGRESS, b_task)
        .await
        .expect("B is granted k1 on the promoted replica")
        .unwrap();
    let granted_b = holder_b.granted;
    let (guard_b2, granted_b2) = tokio::time::timeout(PROGRESS, b2_task)
        .await
        .expect("B2 is granted k2 once A2's lease ran out")
        .unwrap();
    blocking(|| cluster.resume(old)).unwrap();
    let woken = paused.elapsed();
    blocking(|| cluster.wait_until_ok(PROGRESS)).expect("the woken node rejoins");
    let old_follows = blocking(|| cluster.primary_of(old)).unwrap();
    let split = SplitBrain::end(writer, holder_b, &fence, PROGRESS).await;
    let reason_a2 = tokio::time::timeout(PROGRESS, kept2)
        .await
        .expect("A2 is told of its loss")
        .unwrap();
    let token_b2 = guard_b2.fencing_token();
    release(guard_b2, &k2, &rec_b2)
        .await
        .expect("B2's hold lived");

    let report = history.check();
    report.assert_ok();
    assert!(
        report.unprotected.iter().all(|o| o.first.key == k1),
        "only A's hold, which it could not know lost, overlaps:\n{report}"
    );
    let measured = split.measure(&report);
    eprintln!(
        "fault_redis_cluster (c: primary node {old} paused): {}; replica node {replica} promoted \
         {promoted:?} after the pause; B granted k1 {:?} and k2 {:?} after the pause (A2 told \
         {reason_a2:?}); old node woken at {woken:?}, then follows {old_follows:?}; token of \
         B2 {token_b2}",
        split.describe(&measured, SPLIT_LEASE),
        granted_b - paused,
        granted_b2 - paused,
    );
    split.assert_fenced(&measured, SPLIT_LEASE, &report);
    assert_eq!(
        old_follows,
        Some(replica),
        "the woken node follows the new primary"
    );
}

/// Waits until `replica` has both lock keys: the grants replicated.
async fn until_replicated(cluster: &RedisCluster, replica: usize, lk1: &str, lk2: &str) {
    eventually(
        "the replica to have both grants",
        Duration::from_secs(10),
        || async {
            let replies = blocking(|| {
                cluster.commands(
                    replica,
                    &[&["READONLY"], &["EXISTS", lk1], &["EXISTS", lk2]],
                )
            })
            .unwrap();
            replies[1].int() == Some(1) && replies[2].int() == Some(1)
        },
    )
    .await;
}

/// Waits until `replica` serves `lock_key` (promoted) and the other nodes agree.
async fn until_promoted(cluster: &RedisCluster, replica: usize, lock_key: &str) {
    eventually("the replica to take over", PROGRESS, || async {
        blocking(|| cluster.node_for_key(lock_key)).ok() == Some(replica)
    })
    .await;
    blocking(|| cluster.wait_until_ok(PROGRESS)).expect("the others agree");
}

/// `m` locks `key` once it is free, recorded: answers the guard and when it was granted.
fn holds_when_free(m: LockManager, key: String, rec: Recorder) -> JoinHandle<(LockGuard, Instant)> {
    tokio::spawn(async move {
        let guard = hold(&m, &key, &rec, PROGRESS).await;
        (guard, Instant::now())
    })
}
