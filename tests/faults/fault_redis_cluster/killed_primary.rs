//! a. A slot's primary killed (SIGKILL) mid-hold: its replica takes over after the node
//! timeout; no two believed holders; every later grant's token is above; the holds on the
//! killed node are reported lost; the running managers lock its keys again.

use super::*;

/// a. The primary of some slots killed (SIGKILL) while three managers contend on keys spread
/// over every primary (two per primary, and a read/write lock), each manager also holding a key
/// on the killed primary and one on another. Proves: the replica's promotion never gives two
/// believed holders (the checker, nothing excused); every hold on the killed node is reported
/// lost (`Failover` or `Disconnected`); every grant after the kill has a token above every
/// earlier token of its key, on the killed node's keys too (granted by the promoted replica);
/// the managers lock again.
///
/// Here the keys of the killed node's slots are granted again to a manager connected after
/// the promotion (the contending managers keep theirs going on the other primaries): see
/// test a2 for why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slots_primary_killed_mid_hold_loses_its_holds_and_tokens_stay_above() {
    killed_mid_hold(false).await;
}

/// a2. The same kill; proves that the managers that were running at the kill are granted the
/// killed node's keys again once its replica serves them. It failed (acquires timed out after
/// 20 s, again and again) while a refused connection to a slot's node was not taken as a node
/// failure: a manager whose map was asked for again before the promotion (the Cluster still
/// named the dead node) kept sending those keys to the dead node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slots_primary_killed_the_running_managers_lock_its_keys_again() {
    killed_mid_hold(true).await;
}

async fn killed_mid_hold(running_managers_recover: bool) {
    let _turn = TURNS.lock().await;
    let mut cluster = start_cluster(1, NODE_TIMEOUT_MS);
    let Load {
        managers,
        spread,
        node: victim,
        other,
        replica,
        contention,
        on_node: on_victim,
        elsewhere,
    } = Load::start(&cluster).await;
    let history = &contention.history;
    let m0 = &managers[0].1;

    history.fault(&format!("SIGKILL primary node {victim}"));
    let killed_ns = now_ns();
    let killed = Instant::now();
    blocking(|| cluster.kill(victim)).unwrap();
    let told = outcomes(on_victim, PROGRESS).await;
    blocking(|| cluster.wait_until_ok(PROGRESS)).expect("the replica takes over");
    let promoted = killed.elapsed();
    let victim_key = lock_key(m0, "lock", &spread[&victim][0]);
    assert_eq!(
        blocking(|| cluster.node_for_key(&victim_key)).unwrap(),
        replica,
        "the replica serves the killed primary's slots"
    );
    let far = outcomes(elsewhere, Duration::ZERO).await;
    let since_ns = now_ns();
    if running_managers_recover {
        for key in &spread[&victim] {
            until_granted(history, key, 3, since_ns, killed_ns).await;
        }
    } else {
        let late = cluster_manager(&cluster_url(&cluster, 1), LEASE).await;
        let rec = history.recorder("late");
        for key in &spread[&victim] {
            let guard = hold(&late, key, &rec, PROGRESS).await;
            release(guard, key, &rec).await.unwrap();
        }
        for key in &spread[&other] {
            until_granted(history, key, 3, since_ns, killed_ns).await;
        }
    }
    let recovered = killed.elapsed();
    let history = contention.stop().await;

    let report = checked(&history);
    for reason in &told {
        assert!(
            matches!(
                reason,
                Some(LossReason::Failover | LossReason::Disconnected)
            ),
            "a hold on the killed node: {reason:?}"
        );
    }
    let across = assert_tokens_above_across(&report, killed_ns);
    for key in &spread[&victim] {
        assert!(
            across.contains(key),
            "{key} granted on both sides of the kill: {across:?}"
        );
    }
    // The holds on the other primary: their renewals meet `-CLUSTERDOWN` until the replica
    // is promoted, and are tried again until their deadline; no break reaches them.
    for reason in &far {
        assert!(
            matches!(reason, None | Some(LossReason::LeaseExpired)),
            "a hold on node {other}, which was not killed: {reason:?}"
        );
    }
    // Lost across the kill: the killed node's holds, at the break or the failover; others only
    // if the Cluster refused their renewals past their deadline.
    let lost = assert_losses_across_among(
        &report,
        killed_ns,
        &[
            LossReason::Failover,
            LossReason::Disconnected,
            LossReason::LeaseExpired,
        ],
    );
    let told_after = told_after(&report, "own", killed_ns);
    say(&format!(
        "fault_redis_cluster (a: primary node {victim} killed, {}): holds on it told {told:?} after \
         {told_after:?}; holds on node {other} (not killed): {far:?}; replica node {replica} \
         serving by {promoted:?}; the killed node's keys granted again by {recovered:?}; holds \
         lost across the kill {lost:?}; tokens above across it on {} keys; {}",
        if running_managers_recover {
            "the running managers lock its keys again"
        } else {
            "a manager connected after the promotion locks its keys"
        },
        across.len(),
        report.summary()
    ));
}
