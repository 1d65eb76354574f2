//! 5. The holder's lease revoked from outside (`etcdctl lease revoke`).

use super::*;

/// 5. The holder's lease revoked from outside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_revoked_from_outside_is_reported_and_the_manager_recovers_on_a_new_one() {
    let etcd = blocking(EtcdServer::start).expect("start etcd");
    let history = History::new();
    let (holder, other) = (
        etcd_manager(&etcd.url(), LEASE).await,
        etcd_manager(&etcd.url(), LEASE).await,
    );
    let key = "revoked";
    let rec = history.recorder("holder");
    let guard = hold(&holder, key, &rec).await;
    let first = guard.fencing_token();
    let lease = lease_of(&guard);
    let mut watched = Watched::start(guard, key, rec.clone());
    let queued = waiter(other.clone(), key, history.recorder("other"));
    until_contenders(&etcd, &holder.path_of(key).unwrap(), 2).await;

    // etcd deletes the key with the lease at once: the other may be granted before the
    // holder hears, which no client can prevent.
    history.silent_fault("holder", "its lease revoked from outside");
    let revoked = Instant::now();
    blocking(|| etcd.etcdctl(&["lease", "revoke", &lease])).expect("etcdctl lease revoke");
    let (reason, at) = watched
        .told_within(LEASE)
        .await
        .expect("the holder is told its lease was revoked");
    let told_after = at - revoked;
    assert!(
        matches!(reason, LossReason::NodeDeleted | LossReason::LeaseExpired),
        "{reason:?}"
    );
    assert!(
        told_after < LEASE / 3 + Duration::from_millis(500),
        "told {told_after:?} after the revoke"
    );
    let second = tokio::time::timeout(PROGRESS, queued)
        .await
        .expect("the other gets in")
        .unwrap();
    assert!(second > first);
    let guard = watched.end().await;
    assert!(release(guard, key, &rec).await.is_err(), "a lost hold");

    // The manager recovers: a new lease, a larger token.
    let guard = hold(&holder, key, &rec).await;
    let third = guard.fencing_token();
    let new_lease = lease_of(&guard);
    assert_ne!(new_lease, lease, "a new lease");
    assert!(third > second, "{third} > {second}");
    release(guard, key, &rec).await.unwrap();

    let report = history.check();
    say(&format!(
        "fault_etcd (lease revoked): told ({reason}) {told_after:?} after the revoke (lease \
         {LEASE:?}); lease {lease} -> {new_lease}; {}",
        report.summary()
    ));
    report.assert_ok();
    assert_eq!(report.losses, 1);
    assert!(report.unprotected.len() <= 1, "{report}");
    assert_no_keys_left(&etcd, &[&holder, &other]).await;
}

/// The lease (hex) a hold's key is attached to: its key is `<lock path>/<lease in hex>`.
fn lease_of(guard: &LockGuard) -> String {
    let name = guard.node_path().rsplit('/').next().expect("a key name");
    name.split('_').next().expect("a lease id").to_string()
}
