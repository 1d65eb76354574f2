//! The reaper: deletes keys on the manager's lease that no acquire or hold of the manager owns.
//!
//! A put that got no answer may still reach etcd later, for as long as the network held it:
//! after its acquire was retried on another connection, was granted and released, or gave up.
//! Its condition (the key does not exist) is then true again, and it makes a key on the live
//! lease that nobody will delete: every other contender of the lock waits behind it for as long
//! as the manager lives. Once any put of the lease went unanswered, the reaper reads the keys
//! attached to the lease every TTL (etcd's lease time-to-live with its keys) and deletes those
//! whose names no acquire or hold of this manager has taken, taking each name for the delete so
//! that no acquire of this manager can put it meanwhile.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use etcd_client::LeaseTimeToLiveOptions;

use super::session::Inner;
use super::wire::delete;

/// Starts the reaper of `inner`'s lease; it ends with the backend.
pub(super) fn start(inner: &Arc<Inner>) -> tokio::task::AbortHandle {
    let weak = Arc::downgrade(inner);
    let period = inner.config.ttl;
    inner.runtime.spawn(run(weak, period)).abort_handle()
}

async fn run(inner: Weak<Inner>, period: std::time::Duration) {
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if inner.suspect.load(Ordering::SeqCst) {
            reap(&inner).await;
        }
    }
}

/// Deletes the keys on the live lease that no acquire or hold of this manager owns; answers
/// how many.
async fn reap(inner: &Inner) -> usize {
    let lease = {
        let state = inner.session.watch();
        let s = state.borrow();
        if !s.live(tokio::time::Instant::now()) {
            return 0;
        }
        s.id
    };
    let mut client = inner.client.clone();
    inner.count_request();
    let Ok(Ok(listed)) = tokio::time::timeout(
        inner.config.reply_timeout,
        client.lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys())),
    )
    .await
    else {
        return 0;
    };
    let mut reaped = 0;
    for key in listed.keys() {
        let key = String::from_utf8_lossy(key).into_owned();
        // Taken for the delete: no acquire of this manager puts it meanwhile.
        if inner.reserve_exact(&key) {
            tracing::warn!(%key, "deleting a key on this manager's etcd lease that nothing of it owns (a put that arrived late)");
            delete(inner, &key, lease, None).await;
            inner.unreserve(&key);
            reaped += 1;
        }
    }
    reaped
}
