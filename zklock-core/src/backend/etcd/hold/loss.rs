//! A hold's loss: its own end beside its lease's ([`Own`], [`EtcdLoss`]), and the watch of its
//! key that marks it lost when someone else deletes the key.

use std::sync::Arc;

use etcd_client::{EventType, WatchOptions};
use tokio::sync::watch;
use tokio::time::Instant;

use super::super::session::{Inner, LeaseState};
use crate::backend::BoxFuture;
use crate::types::loss::{Loss, LossReason};

/// A hold's own end, apart from its lease's: its key deleted by someone else, or released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Own {
    Held,
    Lost(LossReason),
    Released,
}

/// The loss signal of a hold: its lease's state and its own.
pub(super) struct EtcdLoss {
    pub(super) lease: watch::Receiver<LeaseState>,
    pub(super) epoch: u64,
    pub(super) own: watch::Receiver<Own>,
}

impl EtcdLoss {
    pub(super) fn reason_now(&self) -> Option<LossReason> {
        match *self.own.borrow() {
            Own::Lost(reason) => return Some(reason),
            Own::Released => return None,
            Own::Held => {}
        }
        self.lease.borrow().reason_for(self.epoch, Instant::now())
    }
}

impl Loss for EtcdLoss {
    fn reason(&self) -> Option<LossReason> {
        self.reason_now()
    }

    fn lost(&self) -> BoxFuture<'static, LossReason> {
        let mut lease = self.lease.clone();
        let mut own = self.own.clone();
        let epoch = self.epoch;
        Box::pin(async move {
            loop {
                let own_now = *own.borrow_and_update();
                match own_now {
                    Own::Lost(reason) => return reason,
                    // An ended hold is never lost.
                    Own::Released => return std::future::pending().await,
                    Own::Held => {}
                }
                let deadline = {
                    let s = lease.borrow_and_update();
                    if let Some(reason) = s.reason_for(epoch, Instant::now()) {
                        return reason;
                    }
                    s.deadline
                };
                tokio::select! {
                    changed = lease.changed() => if changed.is_err() { return LossReason::Closed },
                    changed = own.changed() => if changed.is_err() { return LossReason::Closed },
                    _ = tokio::time::sleep_until(deadline) => {}
                }
            }
        })
    }
}

/// Marks a hold lost to its key's deletion, unless it ended first.
pub(super) fn mark_deleted(own: &watch::Sender<Own>) {
    own.send_if_modified(|o| {
        let held = *o == Own::Held;
        if held {
            *o = Own::Lost(LossReason::NodeDeleted);
        }
        held
    });
}

/// Watches `key` (created at `rev` on `lease`) until it is deleted, then marks the hold lost.
pub(super) async fn watch_key(
    inner: Arc<Inner>,
    own: Arc<watch::Sender<Own>>,
    key: String,
    rev: i64,
    lease: i64,
) {
    let mut from = rev + 1;
    loop {
        if *own.borrow() != Own::Held {
            return;
        }
        let mut client = inner.client.clone();
        let options = WatchOptions::new().with_start_revision(from);
        if let Ok(Ok(mut stream)) = tokio::time::timeout(
            inner.config.reply_timeout,
            client.watch(key.as_str(), Some(options)),
        )
        .await
        {
            while let Ok(Some(resp)) = stream.message().await {
                // Any event on the key is a deletion or a new incarnation: not this hold's.
                if resp.events().iter().any(|e| {
                    e.event_type() == EventType::Delete
                        || e.kv().is_some_and(|kv| kv.create_revision() != rev)
                }) {
                    return mark_deleted(&own);
                }
                if let Some(last) = resp
                    .events()
                    .iter()
                    .filter_map(|e| e.kv())
                    .map(|kv| kv.mod_revision())
                    .max()
                {
                    from = from.max(last + 1);
                }
                // Compacted past `from`, or cancelled: read the key instead.
                if resp.canceled() {
                    break;
                }
            }
        }
        // The watch ended without a word on the key: read it, then watch again from the read.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let mut client = inner.client.clone();
        if let Ok(Ok(got)) =
            tokio::time::timeout(inner.config.reply_timeout, client.get(key.as_str(), None)).await
        {
            let here = got
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() == rev && kv.lease() == lease);
            if !here {
                return mark_deleted(&own);
            }
            if let Some(h) = got.header() {
                from = h.revision() + 1;
            }
        }
    }
}
