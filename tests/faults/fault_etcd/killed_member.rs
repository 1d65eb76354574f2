//! 1 and 2. A follower, then the leader, of a 3-member cluster killed under contention.

use super::*;

/// 1. A follower killed and restarted while managers connected to every member contend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_killed_and_restarted_under_contention_never_grants_a_lock_twice() {
    let mut cluster = blocking(|| EtcdCluster::start(3)).expect("start 3 etcd members");
    let history = History::new();
    let mut managers = Vec::new();
    for _ in 0..3 {
        managers.push(etcd_manager(&cluster.url(), LEASE).await);
    }
    let crew = Crew::new();
    let named = [
        ("m0", &managers[0]),
        ("m1", &managers[1]),
        ("m2", &managers[2]),
    ];
    let tasks = contend(&named, &history, &crew, &["a", "b"]);
    crew.until_grants(0, 20, PROGRESS).await;

    let leader = cluster.leader().expect("a leader");
    let follower = (leader + 1) % cluster.len();
    history.fault(&format!("killed follower {follower}"));
    blocking(|| cluster.kill(follower)).unwrap();
    crew.until_grants(crew.grants(), 30, PROGRESS).await;
    history.fault(&format!("restarting follower {follower}"));
    blocking(|| cluster.restart(follower)).unwrap();
    blocking(|| cluster.wait_for_leader(PROGRESS)).unwrap();
    crew.until_grants(crew.grants(), 20, PROGRESS).await;

    stop(&crew, tasks).await;
    let report = history.check();
    say(&format!(
        "fault_etcd (follower killed): {}",
        report.summary()
    ));
    report.assert_ok();
    assert!(report.unprotected.is_empty(), "{report}");
    let refs: Vec<&LockManager> = managers.iter().collect();
    assert_no_keys_left(&cluster, &refs).await;
}

/// 2. The leader killed while a lock is held and a waiter of another manager queued, beside
/// contending workers; then restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_mid_hold_keeps_the_hold_or_reports_it_and_never_overlaps() {
    let mut cluster = blocking(|| EtcdCluster::start(3)).expect("start 3 etcd members");
    let history = History::new();
    let url = cluster.url();
    let (holder, other) = (
        etcd_manager(&url, LEASE).await,
        etcd_manager(&url, LEASE).await,
    );
    let crew = Crew::new();
    let tasks = contend(
        &[("m0", &holder), ("m1", &other)],
        &history,
        &crew,
        &["busy"],
    );

    let key = "ledger";
    let rec = history.recorder("holder");
    let guard = hold(&holder, key, &rec).await;
    let held_token = guard.fencing_token();
    let held_key = guard.node_path().to_string();
    let mut watched = Watched::start(guard, key, rec.clone());
    let queued = waiter(other.clone(), key, history.recorder("waiter"));
    until_contenders(&cluster, &holder.path_of(key).unwrap(), 2).await;
    crew.until_grants(0, 10, PROGRESS).await;

    let leader = cluster.leader().expect("a leader");
    history.fault(&format!("killed the leader (member {leader})"));
    let killed = Instant::now();
    blocking(|| cluster.kill(leader)).unwrap();
    let next = blocking(|| cluster.wait_for_leader(PROGRESS)).unwrap();
    assert_ne!(next, leader);
    let elected = killed.elapsed();

    // Twice the lease after the kill: a lease whose keep-alives did not get through is gone
    // by then, on etcd and (earlier) for the holder.
    let outcome = match watched
        .told_within((LEASE * 2).saturating_sub(elected).max(LEASE / 10))
        .await
    {
        Some((reason, at)) => {
            assert!(
                matches!(reason, LossReason::LeaseExpired | LossReason::NodeDeleted),
                "{reason:?}"
            );
            let guard = watched.end().await;
            assert!(release(guard, key, &rec).await.is_err(), "a lost hold");
            format!("lost ({reason}) {:?} after the kill", at - killed)
        }
        None => {
            let guard = watched.end().await;
            assert!(guard.is_held());
            assert_eq!(
                create_revision(&cluster, &held_key),
                Some(held_token.grant()),
                "the holder's key is still on etcd, on its live lease"
            );
            assert!(
                !queued.is_finished(),
                "the waiter waits while the hold lives"
            );
            release(guard, key, &rec).await.expect("the hold survived");
            "survived".to_string()
        }
    };
    let waiter_token = tokio::time::timeout(PROGRESS, queued)
        .await
        .expect("the waiter gets in")
        .unwrap();
    assert!(waiter_token > held_token, "{waiter_token} > {held_token}");
    crew.until_grants(crew.grants(), 10, PROGRESS).await;

    history.fault(&format!("restarting member {leader}"));
    blocking(|| cluster.restart(leader)).unwrap();
    blocking(|| cluster.wait_for_leader(PROGRESS)).unwrap();
    crew.until_grants(crew.grants(), 10, PROGRESS).await;
    // Both managers lock the key again, above every earlier token.
    for (m, name) in [(&holder, "holder"), (&other, "waiter")] {
        let rec = history.recorder(name);
        let guard = hold(m, key, &rec).await;
        assert!(guard.fencing_token() > waiter_token);
        release(guard, key, &rec).await.unwrap();
    }

    stop(&crew, tasks).await;
    let report = history.check();
    say(&format!(
        "fault_etcd (leader killed): new leader after {elected:?}; the hold {outcome}; {}",
        report.summary()
    ));
    report.assert_ok();
    assert!(report.unprotected.is_empty(), "{report}");
    assert_no_keys_left(&cluster, &[&holder, &other]).await;
}

/// The create revision of `key` on etcd, `None` when it is gone.
fn create_revision(etcd: &impl Etcdctl, key: &str) -> Option<i64> {
    let out = blocking(|| etcd.ctl(&["get", key, "-w", "json"])).expect("etcdctl get");
    let at = out.find("\"create_revision\":")? + "\"create_revision\":".len();
    let digits: String = out[at..]
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}
