//! 6. The holder's key deleted from outside (`etcdctl del`).

use super::*;
use zklock_testkit::Op;

/// 6. The holder's key deleted from outside, with a waiter of another manager and a task of
/// the holder's own process queued behind it locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_from_outside_is_reported_at_once_and_the_next_gets_in() {
    let etcd = blocking(EtcdServer::start).expect("start etcd");
    let history = History::new();
    let (holder, other) = (
        etcd_manager(&etcd.url(), LEASE).await,
        etcd_manager(&etcd.url(), LEASE).await,
    );
    let key = "deleted";
    let rec = history.recorder("holder");
    let guard = hold(&holder, key, &rec).await;
    let first = guard.fencing_token();
    let node = guard.node_path().to_string();
    let mut watched = Watched::start(guard, key, rec.clone());
    let remote = waiter(other.clone(), key, history.recorder("other"));
    until_contenders(&etcd, &holder.path_of(key).unwrap(), 2).await;
    // Queued in the holder's process, behind the hold, without a key of its own yet (its
    // admission to the local queue follows its recorded invocation at once; were it later,
    // it would queue on etcd behind the others: the checker judges either order).
    let local = waiter(holder.clone(), key, history.recorder("local"));
    eventually(
        "the local waiter to ask",
        Duration::from_secs(5),
        || async {
            history
                .events()
                .iter()
                .any(|e| e.worker == "local" && e.op == Op::AcquireInvoked)
        },
    )
    .await;

    history.silent_fault("holder", "its key deleted from outside");
    let deleted = Instant::now();
    blocking(|| etcd.etcdctl(&["del", &node])).expect("etcdctl del");
    let (reason, at) = watched
        .told_within(LEASE)
        .await
        .expect("a watching holder is told its key was deleted");
    let told_after = at - deleted;
    assert_eq!(reason, LossReason::NodeDeleted);
    assert!(
        told_after < Duration::from_secs(1),
        "told {told_after:?} after the delete"
    );
    let remote_token = tokio::time::timeout(PROGRESS, remote)
        .await
        .expect("the other manager's waiter gets in")
        .unwrap();
    let local_token = tokio::time::timeout(PROGRESS, local)
        .await
        .expect("the local waiter gets in, on a key of its own")
        .unwrap();
    assert!(remote_token > first && local_token > first);
    let guard = watched.end().await;
    assert!(!guard.is_held());
    assert!(release(guard, key, &rec).await.is_err(), "a lost hold");

    let report = history.check();
    say(&format!(
        "fault_etcd (key deleted): told {told_after:?} after the delete; tokens {first} then \
         {remote_token} (other) and {local_token} (local); {}",
        report.summary()
    ));
    report.assert_ok();
    assert_eq!(report.losses, 1);
    assert!(report.unprotected.len() <= 1, "{report}");
    for o in &report.unprotected {
        assert_eq!(o.first.worker, "holder", "{report}");
    }
    assert_no_keys_left(&etcd, &[&holder, &other]).await;
}
