//! f. A primary frozen (SIGSTOP) past the node timeout under managers of different settings,
//! its replica promoted, then the old primary woken: no two believed holders.

use super::*;

/// f. A primary frozen (SIGSTOP) past the node timeout while three managers with different
/// settings (leases of 3, 4 and 6 s, the last without the local queue, each listing the nodes
/// from another one) contend on keys of every primary, beside workers whose acquires keep
/// timing out (250 ms) and leave their undo to the background; its replica promoted, then the
/// old primary woken at once (it answers what it was sent while frozen before it hears of the
/// promotion). Proves: no two believed holders at any moment (the checker, nothing excused:
/// every grant was replicated), every grant after the freeze above every earlier token of its
/// key, and the managers lock the frozen node's keys again on the promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_woken_after_its_replica_took_over_never_overlaps() {
    let _turn = TURNS.lock().await;
    let cluster = start_cluster(1, NODE_TIMEOUT_MS);
    let mut managers = Vec::new();
    for (i, (secs, queue)) in [(3, true), (4, true), (6, false)].into_iter().enumerate() {
        let m = LockManager::builder(cluster_url(&cluster, 2 * i))
            .local_queue(queue)
            .redis(|r| r.lease(Duration::from_secs(secs)))
            .connect()
            .await
            .expect("connect to the Cluster");
        managers.push((format!("m{i}"), m));
    }
    let spread = blocking(|| keys_per_primary(&cluster, &managers[0].1, "k", 2));
    let node = *spread.keys().next().unwrap();
    let replica = blocking(|| replica_of(&cluster, node));
    let keys: Vec<String> = spread.values().flatten().cloned().collect();
    let mut contention = Contention::start(&managers, &keys, false);
    let impatient = crate::faults::Work {
        wait: Duration::from_millis(250),
        hold: Duration::from_millis(30),
        think: Duration::from_millis(20),
    };
    contention.add(&managers, &spread[&node], "impatient", impatient);
    contention.crew.until_grants(0, 30, PROGRESS).await;

    let probe = lock_key(&managers[0].1, "lock", &spread[&node][0]);
    contention
        .history
        .fault("SIGSTOP a primary past the node timeout");
    let frozen_ns = now_ns();
    let frozen = Instant::now();
    blocking(|| cluster.pause(node)).unwrap();
    eventually("the replica to take over", PROGRESS, || async {
        blocking(|| cluster.node_for_key(&probe)).ok() == Some(replica)
    })
    .await;
    let promoted = frozen.elapsed();
    blocking(|| cluster.resume(node)).unwrap();
    contention.history.fault("SIGCONT the old primary");
    blocking(|| cluster.wait_until_ok(PROGRESS)).expect("the woken node rejoins");
    let old_follows = blocking(|| cluster.primary_of(node)).unwrap();
    for key in &spread[&node] {
        until_granted(&contention.history, key, 5, now_ns(), frozen_ns).await;
    }
    let history = contention.stop().await;
    let report = checked(&history);
    let across = assert_tokens_above_across(&report, frozen_ns).len();
    assert!(
        across >= 2,
        "keys granted on both sides of the freeze: {across}\n{report}"
    );
    say(&format!(
        "fault_redis_cluster (f: primary node {node} frozen and woken): replica {replica} \
         promoted {promoted:?} after the freeze; the woken node follows {old_follows:?}; holds \
         lost across the freeze {:?}; tokens above across it on {across} keys; {}",
        losses_across(&report, frozen_ns),
        report.summary()
    ));
}
