//! b. A manual failover (`CLUSTER FAILOVER` on the replica): no two believed holders, and the
//! old holders are told `Failover` (the old primary answers `-MOVED`).

use super::*;

/// b. A manual failover (`CLUSTER FAILOVER` on the replica of a primary) under the same load.
/// Proves: no two believed holders (nothing excused); every hold on the old primary is told
/// `Failover` (its next request is answered `-MOVED`); every later grant's token is above every
/// earlier token of its key; the managers lock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_tells_the_old_holders_failover_and_never_overlaps() {
    let _turn = TURNS.lock().await;
    let cluster = start_cluster(1, NODE_TIMEOUT_MS);
    let Load {
        managers: _managers,
        spread,
        node: old,
        other,
        replica,
        contention,
        on_node: on_old,
        elsewhere,
    } = Load::start(&cluster).await;
    let history = &contention.history;

    history.fault(&format!(
        "CLUSTER FAILOVER on node {replica} (replica of {old})"
    ));
    let failover_ns = now_ns();
    let started = Instant::now();
    blocking(|| cluster.failover(replica)).expect("a manual failover");
    let switched = started.elapsed();
    let told = outcomes(on_old, PROGRESS).await;
    let far = outcomes(elsewhere, Duration::ZERO).await;
    let old_role = blocking(|| cluster.role(old));
    let since_ns = now_ns();
    for key in &spread[&old] {
        until_granted(history, key, 3, since_ns, failover_ns).await;
    }
    let recovered = started.elapsed();
    let history = contention.stop().await;

    let report = checked(&history);
    for reason in &told {
        assert_eq!(
            *reason,
            Some(LossReason::Failover),
            "a hold on the old primary"
        );
    }
    let across = assert_tokens_above_across(&report, failover_ns);
    for key in &spread[&old] {
        assert!(
            across.contains(key),
            "{key} granted on both sides: {across:?}"
        );
    }
    let lost = losses_across(&report, failover_ns);
    let told_after = told_after(&report, "own", failover_ns);
    assert_eq!(
        old_role.as_deref(),
        Some("slave"),
        "the old primary follows"
    );
    say(&format!(
        "fault_redis_cluster (b: CLUSTER FAILOVER node {old} -> {replica}): switched in \
         {switched:?}; holds on the old primary told {told:?} after {told_after:?}; holds on node \
         {other} (not failed over): {far:?}; the failed-over keys granted again by \
         {recovered:?}; holds lost across it {lost:?}; tokens above across it on {} keys; {}",
        across.len(),
        report.summary()
    ));
}
