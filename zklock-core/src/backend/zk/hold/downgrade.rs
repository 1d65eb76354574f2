//! Turning a write hold into a read hold of the same lock without letting another writer in:
//! a read node made on the write hold's own session, and the write node kept while a writer
//! queued between the two.

use std::sync::Arc;

use super::super::acquire::{create_node, HandedWatch};
use super::super::queue::CuratorMode;
use super::Hold;
use crate::backend::{BoxFuture, Downgraded, LockTarget};
use crate::types::error::{Error, Result};
use crate::types::mode::HoldMode;

/// Makes the read hold of `target` that continues `write`, and says whether the write node
/// must be kept until the read hold ends (a writer queued in between).
pub(super) fn downgrade(
    write: Arc<Hold>,
    target: LockTarget,
) -> BoxFuture<'static, Result<Downgraded>> {
    Box::pin(async move {
        let lost = |reason| Error::LockLost {
            key: target.key.to_string(),
            reason,
        };
        if let Some(reason) = write.loss_reason() {
            return Err(lost(reason));
        }
        let made = create_node(
            &write.inner,
            &write.session,
            &target.path,
            &target.key,
            HoldMode::Read,
        )
        .await?;
        let children = made.children;
        let read = Hold::new(
            write.inner.clone(),
            write.session.clone(),
            target.key.clone(),
            made.node,
            made.token,
            made.ticket,
            HandedWatch::NoWatch,
        );
        if let Some(reason) = write.loss_reason() {
            // Lost while the read node was made: the read node goes when `read` drops.
            return Err(lost(reason));
        }
        let read_key = HoldMode::Read
            .sort_key(read.node.rsplit('/').next().unwrap_or_default())
            .to_string();
        let write_key = HoldMode::Write
            .sort_key(write.node.rsplit('/').next().unwrap_or_default())
            .to_string();
        // A writer (zklock's, Curator's or kazoo's) queued between the two.
        let keep_write = children.iter().any(|c| {
            let k = HoldMode::Write.sort_key(c);
            HoldMode::Read.blocked_by(c) && k > write_key.as_str() && k < read_key.as_str()
        });
        Ok(Downgraded {
            read: Arc::new(read),
            keep_write,
        })
    })
}
