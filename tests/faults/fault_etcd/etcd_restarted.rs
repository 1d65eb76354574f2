//! 7. etcd itself killed and restarted with its data.

use super::*;

/// 7. etcd killed and restarted with its data, under contention and with a hold and a waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_etcd_keeps_or_reports_holds_and_tokens_go_on_increasing() {
    let mut etcd = blocking(EtcdServer::start).expect("start etcd");
    let history = History::new();
    let (holder, other) = (
        etcd_manager(&etcd.url(), LEASE).await,
        etcd_manager(&etcd.url(), LEASE).await,
    );
    let crew = Crew::new();
    let tasks = contend(
        &[("m0", &holder), ("m1", &other)],
        &history,
        &crew,
        &["busy"],
    );
    let key = "restarted";
    let rec = history.recorder("holder");
    let guard = hold(&holder, key, &rec).await;
    let first = guard.fencing_token();
    let mut watched = Watched::start(guard, key, rec.clone());
    let queued = waiter(other.clone(), key, history.recorder("waiter"));
    until_contenders(&etcd, &holder.path_of(key).unwrap(), 2).await;
    crew.until_grants(0, 10, PROGRESS).await;

    history.fault("etcd killed");
    let killed_ns = zklock_testkit::now_ns();
    let killed = Instant::now();
    blocking(|| etcd.stop()).unwrap();
    blocking(|| etcd.restart()).expect("etcd restarts with its data");
    let restarted_ns = zklock_testkit::now_ns();
    let down = killed.elapsed();
    history.fault("etcd restarted");
    crew.until_grants(crew.grants(), 10, PROGRESS).await;

    let outcome = match watched.told_within(LEASE * 2).await {
        Some((reason, at)) => {
            let guard = watched.end().await;
            assert!(release(guard, key, &rec).await.is_err(), "a lost hold");
            format!("lost ({reason}) {:?} after the kill", at - killed)
        }
        None => {
            let guard = watched.end().await;
            assert!(
                !queued.is_finished(),
                "the waiter waits while the hold lives"
            );
            release(guard, key, &rec).await.expect("the hold survived");
            "survived".to_string()
        }
    };
    let second = tokio::time::timeout(PROGRESS, queued)
        .await
        .expect("the waiter gets in")
        .unwrap();
    assert!(second > first);
    stop(&crew, tasks).await;

    let report = history.check();
    say(&format!(
        "fault_etcd (etcd restarted): down {down:?}; the hold {outcome}; {}",
        report.summary()
    ));
    report.assert_ok();
    assert!(report.unprotected.is_empty(), "{report}");
    // Every grant after the restart is above every conflicting grant of its lock before the
    // kill: etcd's revisions went on from where they were (a waiter queued before the kill
    // keeps its key's older revision, below other locks' tokens: tokens order one lock).
    let before: Vec<_> = report
        .holds
        .iter()
        .filter(|h| h.start_ns < killed_ns)
        .collect();
    let after: Vec<_> = report
        .holds
        .iter()
        .filter(|h| h.start_ns > restarted_ns)
        .collect();
    assert!(!before.is_empty() && !after.is_empty(), "{report}");
    for a in &after {
        for b in &before {
            if a.key == b.key && a.mode.conflicts_with(b.mode) {
                assert!(
                    a.token > b.token,
                    "after the restart: {a}\nbefore the kill: {b}"
                );
            }
        }
    }
    assert_no_keys_left(&etcd, &[&holder, &other]).await;
}
