//! 1. The primary killed (SIGKILL) while managers contend: every hold of the killed primary
//!    is reported lost, and every later grant's token is above every earlier one of its key.

use super::*;

/// 1. The primary killed with SIGKILL while three managers contend on a few keys (mutexes and
/// a read/write lock) and each also holds a key of its own. Proves: Sentinel's promotion of a
/// replica never gives two believed holders at once (the checker, with no window excused);
/// every hold of the killed primary is reported lost, as `Failover` or `Disconnected`; every
/// grant after the kill has a token above every earlier token of its key; and the managers
/// lock again on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_killed_mid_hold_loses_every_hold_and_tokens_stay_above() {
    let _turn = TURNS.lock().await;
    let mut redis = blocking(RedisSentinel::start).expect("start Redis with Sentinels");
    let mut load = Load::start([0, 0, 0].map(|first| sentinel_url_from(&redis, first))).await;

    load.contention.history.fault("SIGKILL the primary");
    let killed_ns = now_ns();
    let killed = Instant::now();
    let old = blocking(|| redis.kill_primary()).unwrap();
    let new = blocking(|| redis.wait_for_new_primary(old, PROGRESS)).unwrap();
    let promoted = killed.elapsed();
    let mut told = Vec::new();
    for k in std::mem::take(&mut load.kept) {
        let reason = tokio::time::timeout(PROGRESS, k)
            .await
            .expect("the hold of the killed primary is reported lost")
            .unwrap();
        assert!(
            matches!(reason, LossReason::Failover | LossReason::Disconnected),
            "{reason:?}"
        );
        told.push(reason);
    }
    load.contention.until_more_grants(30, PROGRESS).await;
    let recovered = killed.elapsed();
    let (report, across, lost) = load.finish(killed_ns, " of the kill").await;
    say(&format!(
        "fault_redis_sentinel (primary killed): node {old} -> {new} promoted {promoted:?} after \
         the kill, progress again by {recovered:?}; own holds told {told:?}; {lost} holds lost \
         across the kill; tokens above across it on {across} keys; {}",
        report.summary()
    ));
}
