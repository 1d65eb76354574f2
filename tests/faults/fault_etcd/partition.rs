//! 3. A holder partitioned through the test kit's relay past its lease, then healed.

use super::*;
use zklock::Error;
use zklock_testkit::{HoldEnd, Relay, Report};

/// 3. A holder whose every connection goes through the relay, partitioned past its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_told_before_the_other_gets_in_and_locks_again_once_healed() {
    let etcd = blocking(EtcdServer::start).expect("start etcd");
    let relay = Relay::start(&etcd.endpoint()).unwrap();
    let history = History::new();
    let cut_off = etcd_manager(&relay.url(&etcd.url()), LEASE).await;
    let other = etcd_manager(&etcd.url(), LEASE).await;
    // Workers of both managers on other locks, so that the partition also falls on acquires
    // and releases under way.
    let (cut_crew, other_crew) = (Crew::new(), Crew::new());
    let mut tasks = contend(&[("cut-off", &cut_off)], &history, &cut_crew, &["churn"]);
    tasks.extend(contend(
        &[("other", &other)],
        &history,
        &other_crew,
        &["churn"],
    ));
    let key = "partitioned";
    let rec = history.recorder("cut-off");
    let guard = hold(&cut_off, key, &rec).await;
    let first = guard.fencing_token();
    let mut watched = Watched::start(guard, key, rec.clone());
    let queued = waiter(other.clone(), key, history.recorder("other"));
    until_contenders(&etcd, &other.path_of(key).unwrap(), 2).await;
    cut_crew.until_grants(0, 10, PROGRESS).await;

    history.fault("partition: the relay blackholes the holder's connections");
    let cut = Instant::now();
    relay.blackhole();
    let (reason, at) = watched
        .told_within(LEASE * 2)
        .await
        .expect("a partitioned holder is told its hold is lost");
    let told_after = at - cut;
    assert_eq!(reason, LossReason::LeaseExpired);
    // etcd lets the lease go a full TTL after the last keep-alive it received, which was sent
    // before the cut.
    assert!(told_after < LEASE, "told {told_after:?} after the cut");
    let second = tokio::time::timeout(PROGRESS, queued)
        .await
        .expect("the other gets in once etcd lets the lease go")
        .unwrap();
    let got_in_after = cut.elapsed();
    assert!(second > first, "{second} > {first}");
    other_crew
        .until_grants(other_crew.grants(), 10, PROGRESS)
        .await;

    relay.heal();
    let guard = watched.end().await;
    match release(guard, key, &rec).await {
        Err(Error::LockLost { .. }) => {}
        other => panic!("releasing a lost hold says so: {other:?}"),
    }
    // Healed, the manager's session has a new lease, and locks again above the other.
    let guard = hold(&cut_off, key, &rec).await;
    let third = guard.fencing_token();
    assert!(third > second, "{third} > {second}");
    release(guard, key, &rec).await.unwrap();
    cut_crew.until_grants(cut_crew.grants(), 10, PROGRESS).await;
    other_crew.stop();
    stop(&cut_crew, tasks).await;

    let report = history.check();
    say(&format!(
        "fault_etcd (partition): told after {told_after:?}, the other got in by {got_in_after:?} \
         (lease {LEASE:?}); {}",
        report.summary()
    ));
    report.assert_ok();
    assert!(report.unprotected.is_empty(), "{report}");
    // From the history: the partitioned holder's hold ended (its loss reported) before the
    // other's began.
    let lost = span(&report, "cut-off", first);
    let next = span(&report, "other", second);
    assert!(matches!(lost.end, HoldEnd::Lost(_)), "{lost}");
    let told_ns = lost.end_ns.expect("ended");
    assert!(
        told_ns < next.start_ns,
        "told {} ms after the other got in:\n{report}",
        (told_ns - next.start_ns) as f64 / 1e6
    );
    say(&format!(
        "fault_etcd (partition): told {:.1} ms before the other was granted",
        (next.start_ns - told_ns) as f64 / 1e6
    ));
    assert!(relay.stats().connections >= 1);
    assert_no_keys_left(&etcd, &[&cut_off, &other]).await;
}

/// The one hold of `worker` on `key` in the report that has `token`.
fn span<'r>(report: &'r Report, worker: &str, token: FencingToken) -> &'r zklock_testkit::HoldSpan {
    report
        .holds
        .iter()
        .find(|h| h.worker == worker && h.token == token.as_u128())
        .unwrap_or_else(|| panic!("no hold of {worker} with token {token} in\n{report}"))
}
