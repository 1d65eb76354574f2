//! 2. A manual failover (`SENTINEL FAILOVER`) under load, whichever Sentinel each manager
//!    listens to: no two believed holders, and the old holders are told `Failover`.

use super::*;

/// 2. A manual failover (`SENTINEL FAILOVER`) under the same contended load, every manager
/// listing the Sentinels in the same order (so all listen to the same one). Proves: no two
/// believed holders at any moment (the checker, nothing excused), although the old primary
/// stays a primary for a while after the switch; every hold going on at the failover is
/// reported lost, the held keys' as `Failover`; every later grant's token is above every
/// earlier token of its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_under_load_says_failover_and_never_overlaps() {
    manual_failover_under_load(false).await;
}

/// 2b. The same manual failover, each manager listing the Sentinels from another one (as
/// services configured each in its own way do), so each listens to another Sentinel. The
/// Sentinel that runs the failover announces `+switch-master` only once it has reconfigured
/// the replicas (a second or more after the promotion), the others as soon as they hear of
/// the new primary: a manager listening to the first keeps granting on the old primary, still
/// a primary, while the others grant on the new one. Proves the same as 2; it failed (7 to 13
/// pairs of believed holders per run) while a manager listened to one Sentinel at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_never_overlaps_whichever_sentinel_each_manager_listens_to() {
    manual_failover_under_load(true).await;
}

async fn manual_failover_under_load(each_its_own_sentinel: bool) {
    let _turn = TURNS.lock().await;
    let redis = blocking(RedisSentinel::start).expect("start Redis with Sentinels");
    let mut load = Load::start((0..3).map(|i| {
        let first = if each_its_own_sentinel { i } else { 0 };
        sentinel_url_from(&redis, first)
    }))
    .await;

    let old = redis.primary().unwrap();
    load.contention.history.fault("SENTINEL FAILOVER");
    let failover_ns = now_ns();
    let started = Instant::now();
    let new = blocking(|| redis.failover()).expect("a manual failover");
    let switched = started.elapsed();
    for k in std::mem::take(&mut load.kept) {
        let reason = tokio::time::timeout(PROGRESS, k)
            .await
            .expect("the old holder is told")
            .unwrap();
        assert_eq!(reason, LossReason::Failover);
    }
    let told = started.elapsed();
    let old_role = blocking(|| redis.role(old));
    load.contention.until_more_grants(30, PROGRESS).await;
    let recovered = started.elapsed();
    let (report, across, lost) = load.finish(failover_ns, "").await;
    say(&format!(
        "fault_redis_sentinel (manual failover{}): node {old} -> {new} in {switched:?}, old \
         holders told by {told:?} (the old node then says it is {old_role:?}), progress again \
         by {recovered:?}; {lost} holds lost across it; tokens above across it on {across} \
         keys; {}",
        if each_its_own_sentinel {
            ", each manager its own Sentinel"
        } else {
            ""
        },
        report.summary()
    ));
}
