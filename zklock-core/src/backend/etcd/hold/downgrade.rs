//! A write hold's downgrade to a read hold: a read key put beside the write key, which goes
//! at once unless a writer queued between the two.

use std::sync::Arc;

use etcd_client::TxnOpResponse;

use super::super::wire::{put_read_beside, txn, undo, Layout};
use super::EtcdHold;
use crate::backend::{BackendHold, Downgraded, LockTarget};
use crate::types::error::{Error, Result};
use crate::types::loss::LossReason;
use crate::types::mode::LockMode;

impl EtcdHold {
    /// Puts a read key beside this write key. If a writer queued between the two, the write
    /// key must stay until the read hold ends (that writer waits for it); otherwise it goes at
    /// once, and every writer that comes later waits for the read key.
    pub(super) async fn downgrade_to_read(
        self: Arc<Self>,
        target: LockTarget,
    ) -> Result<Downgraded> {
        if self.mode != LockMode::Write {
            return Err(Error::InvalidArgument(
                "only a write hold can be downgraded".into(),
            ));
        }
        if let Some(reason) = self.loss_reason() {
            return Err(Error::LockLost {
                key: target.key.to_string(),
                reason,
            });
        }
        let inner = self.inner.clone();
        let key = inner.reserve(&target.path, LockMode::Read, self.lease.id);
        let writers = Layout::of(&target.path, LockMode::Read).blockers;
        let put = put_read_beside(
            &key,
            inner.owner_value(),
            self.lease.id,
            &self.key,
            self.rev,
            &writers,
        );
        let resp = match txn(&inner, "downgrade to a read hold", put).await {
            Ok(resp) if resp.succeeded() => resp,
            Ok(_) => {
                inner.unreserve(&key);
                self.gone();
                return Err(Error::LockLost {
                    key: target.key.to_string(),
                    reason: LossReason::NodeDeleted,
                });
            }
            Err(e) => {
                // The read key may exist: delete it in the background.
                let undo = undo(inner.clone(), key, self.lease.id);
                inner.background.spawn(&inner.runtime, undo);
                return Err(e.error);
            }
        };
        let rev = resp.header().map(|h| h.revision()).unwrap_or_default();
        let queued_writers = resp
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g.kvs().len()),
                _ => None,
            })
            .unwrap_or(1);
        let read = Arc::new(EtcdHold::new(
            inner,
            target.key.clone(),
            target.path.clone(),
            key,
            rev,
            self.lease.clone(),
            LockMode::Read,
        ));
        // Writers created after the read key wait for it; only those between count.
        let keep_write = queued_writers > 0;
        if !keep_write {
            self.delete().await?;
        }
        Ok(Downgraded { read, keep_write })
    }
}
