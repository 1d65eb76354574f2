//! 3. Split brain: the primary frozen past `down-after` with a grant its replicas lack, then
//!    woken: the overlap is bounded by the lease and the old holder's writes are fenced.

use super::*;

/// 3. Split brain. A holds a key on the primary; its lease is taken off the replicas (as a
/// write not yet replicated); the primary is frozen (SIGSTOP) past `down-after`; Sentinel
/// promotes a replica, where B is granted the key; the old primary is woken and is still a
/// primary that takes writes (until Sentinel demotes it, 8 to 20 s later). A cannot know that
/// its grant was not replicated: the overlap of A's and B's believed holds is measured and
/// reported (recorded as a silent fault for the checker), and must be bounded by A's lease.
/// Every write A makes through the fence once B has written is refused: B's token is above
/// every token of the old primary, read from the woken old primary itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_brain_overlap_is_bounded_by_the_lease_and_stale_writes_are_fenced() {
    let _turn = TURNS.lock().await;
    const SPLIT_LEASE: Duration = Duration::from_secs(6);
    const KEY: &str = "sku_7";
    let redis = blocking(RedisSentinel::start).expect("start Redis with Sentinels");
    let (_store, fence) = fence_store().await;
    let url = sentinel_url(&redis);
    let (a, b) = (
        manager(&url, SPLIT_LEASE).await,
        manager(&url, SPLIT_LEASE).await,
    );
    let history = History::new();
    let (rec_a, rec_b) = (history.recorder("A"), history.recorder("B"));
    let old = redis.primary().unwrap();
    let guard = hold(&a, KEY, &rec_a, PROGRESS).await;
    let token_a = guard.fencing_token();
    assert!(fenced_set(&fence, token_a, "A".into()).await.accepted);
    let (fence_key, lock_key) = redis_keys(&a, KEY);
    unreplicate(&redis, old, &lock_key).await;

    history.silent_fault("A", "SIGSTOP the primary; A's grant is not on the replicas");
    let paused = Instant::now();
    redis.pause(old).unwrap();
    let writer = writer_until_lost(guard, KEY.into(), rec_a.clone(), fence.clone());
    let b_task = new_holder_writes(
        b.clone(),
        KEY.into(),
        rec_b.clone(),
        fence.clone(),
        PROGRESS,
    );
    let new = blocking(|| redis.wait_for_new_primary(old, PROGRESS)).unwrap();
    let promoted = paused.elapsed();
    blocking(|| redis.resume(old)).unwrap();
    let woken = paused.elapsed();
    // The woken old primary: still a primary, taking writes, with its own last token of KEY.
    let old_role = blocking(|| redis.role(old));
    let takes_writes = blocking(|| redis.command(old, &["SET", "split-brain", "1"])).is_ok();
    let old_last: i64 = blocking(|| redis.command(old, &["GET", &fence_key]))
        .unwrap()
        .text()
        .and_then(|t| t.parse().ok())
        .expect("the old primary has the key's counter");

    let holder_b = tokio::time::timeout(PROGRESS, b_task)
        .await
        .expect("B is granted the key on the new primary")
        .unwrap();
    let granted_b = holder_b.granted;
    // Then A's late write with its token (refused) and B's second write (still accepted).
    let split = SplitBrain::end(writer, holder_b, &fence, PROGRESS).await;

    let report = history.check();
    report.assert_ok();
    let measured = split.measure(&report);
    eprintln!(
        "fault_redis_sentinel (split brain): {}; B granted {:?} after the pause (promotion seen \
         at {promoted:?}, old primary woken at {woken:?}, then says {old_role:?}, takes writes: \
         {takes_writes}); old primary's last token {old_last}; node {old} -> {new}",
        split.describe(&measured, SPLIT_LEASE),
        granted_b - paused,
    );
    split.assert_fenced(&measured, SPLIT_LEASE, &report);
    let token_b = split.token_b;
    assert!(
        token_b.grant() > old_last,
        "B's token {token_b} is above the old primary's last {old_last}"
    );
    assert_eq!(old_role.as_deref(), Some("master"), "a split brain");
    assert!(takes_writes, "the woken old primary takes writes");
}
