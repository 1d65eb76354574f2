//! 5. The primary frozen past `down-after` under managers of different settings, then woken
//!    once the Sentinels name the promoted replica: nothing is granted on the woken old primary.

use super::*;
use crate::faults;

/// 5. The primary frozen (SIGSTOP) past `down-after` while managers with different leases and
/// settings contend, some of their acquires cut short by a timeout of a few hundred ms, then
/// woken as soon as the Sentinels name the promoted replica: the old primary still says
/// `master` and takes writes until the Sentinels turn it into a replica, seconds later.
/// Meanwhile, requests sent while it was frozen were opening connections to it (the Sentinels
/// named it when they were asked), and those connections come up when it wakes. Proves that a
/// manager that has acted on the failover never grants on the woken old primary, whenever its
/// connection to it was opened: no two believed holders at any moment (the checker, nothing
/// excused), every later grant's token above every earlier token of its key, any hold going on
/// at the freeze lost as `Failover` or `Disconnected`. It failed (overlaps of believed holders on every key, tokens
/// out of grant order) while a connection opened to the frozen primary before the failover was
/// taken into use once it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_woken_after_the_failover_grants_nothing() {
    let _turn = TURNS.lock().await;
    let redis = blocking(RedisSentinel::start).expect("start Redis with Sentinels");
    let mut managers = Vec::new();
    // Leases of 3, 4 and 6 s (each request's reply waited on for up to its lease, at most
    // 5 s), the last without the local queue; each lists the Sentinels from another one.
    for (i, (lease, queue)) in [(3, true), (4, true), (6, false)].into_iter().enumerate() {
        let m = LockManager::builder(sentinel_url_from(&redis, i))
            .local_queue(queue)
            .redis(|r| r.lease(Duration::from_secs(lease)))
            .connect()
            .await
            .expect("connect through the Sentinels");
        managers.push((format!("m{i}"), m));
    }
    let keys = ["a".to_string(), "b".to_string()];
    let mut contention = Contention::start(&managers, &keys, false);
    // Acquires that keep timing out, and leave their undo to the background.
    let impatient = faults::Work {
        wait: Duration::from_millis(250),
        hold: Duration::from_millis(30),
        think: Duration::from_millis(20),
    };
    contention.add(&managers, &keys, "impatient", impatient);
    contention.crew.until_grants(0, 30, PROGRESS).await;

    let old = redis.primary().unwrap();
    contention
        .history
        .fault("SIGSTOP the primary past down-after");
    let frozen_ns = now_ns();
    let frozen = Instant::now();
    redis.pause(old).unwrap();
    let new = blocking(|| redis.wait_for_new_primary(old, PROGRESS)).unwrap();
    let promoted = frozen.elapsed();
    blocking(|| redis.resume(old)).unwrap();
    contention.history.fault("SIGCONT the old primary");
    // The load goes on while the woken old primary says it is a primary, and a while after.
    let woken = Instant::now();
    let mut master_for = Duration::ZERO;
    while woken.elapsed() < Duration::from_secs(15) {
        if blocking(|| redis.role(old)).as_deref() == Some("master") {
            master_for = woken.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    contention.until_more_grants(30, PROGRESS).await;
    let history = contention.stop().await;
    let report = checked(&history);
    let across = assert_tokens_above_across(&report, frozen_ns).len();
    assert!(
        across >= 2,
        "keys granted on both sides of the freeze: {across}\n{report}"
    );
    let lost = assert_losses_across_among(
        &report,
        frozen_ns,
        &[LossReason::Failover, LossReason::Disconnected],
    );
    say(&format!(
        "fault_redis_sentinel (frozen primary woken): node {old} -> {new} promoted {promoted:?} \
         after the freeze; the woken old primary said master for {master_for:?}; holds lost \
         across the freeze {lost:?}; tokens above across it on {across} keys; {}",
        report.summary()
    ));
    assert!(
        master_for > Duration::ZERO,
        "the woken old primary was a primary for a while (else this test proves nothing)"
    );
}
