//! The requests every part of the etcd backend sends about a contender's key: where the keys
//! of a lock go ([`Layout`]), a transaction within the reply bound ([`txn`]), and the delete of
//! a key that is still on its lease ([`undo`]).

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::error::transient;
use super::Inner;
use crate::backend::backoff::Backoff;
use crate::types::error::Error;
use crate::types::mode::LockMode;

/// The first pause before retrying a request that failed on the connection.
pub(crate) const RETRY_MIN: std::time::Duration = crate::backend::backoff::RETRY_MIN;
/// The longest pause between retries of a request: shorter than on the other backends, since
/// a request that failed moves on to the next member, which is likely up.
pub(crate) const RETRY_MAX: std::time::Duration = std::time::Duration::from_millis(500);

/// The pauses between retries of an etcd request.
pub(crate) const fn backoff() -> Backoff {
    Backoff::new(RETRY_MIN, RETRY_MAX)
}

/// Which keys a contender of `mode` on lock path `path` waits for, and where its own goes.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// The prefix of the keys it waits for (every earlier key under it).
    pub(crate) blockers: String,
}

impl Layout {
    /// The layout of `mode`: etcd's `concurrency.Mutex` and `concurrency.Election` for a
    /// mutex and a latch (`<path>/<lease id in hex>`), and etcd's read/write recipe
    /// (`<path>/read/<n>`, `<path>/write/<n>`) for read/write locks.
    pub(crate) fn of(path: &str, mode: LockMode) -> Layout {
        let blockers = match mode {
            LockMode::Exclusive | LockMode::Leader | LockMode::Write => format!("{path}/"),
            LockMode::Read => format!("{path}/write/"),
        };
        Layout { blockers }
    }
}

/// A request's error, and whether sending it again may succeed.
pub(crate) struct RequestError {
    pub(crate) error: Error,
    pub(crate) transient: bool,
    /// Whether the request got no answer: it may still be applied later.
    pub(crate) unanswered: bool,
}

impl From<Error> for RequestError {
    fn from(error: Error) -> RequestError {
        let transient = error.is_retryable();
        RequestError {
            error,
            transient,
            unanswered: false,
        }
    }
}

/// What came of a put of a contender's key that was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// No answer yet.
    Pending,
    /// Answered (applied or refused): nothing of it can land later.
    Answered,
    /// No answer within the bound: it may still be applied.
    Unknown,
}

/// Sends `txn` within the reply bound.
pub(crate) async fn txn(
    inner: &Inner,
    operation: &'static str,
    txn: Txn,
) -> std::result::Result<etcd_client::TxnResponse, RequestError> {
    inner.count_request();
    let mut client = inner.client.clone();
    match tokio::time::timeout(inner.config.reply_timeout, client.txn(txn)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(RequestError {
            transient: transient(&e),
            // A broken connection may have carried the request before it broke.
            unanswered: transient(&e),
            error: super::error::server_error(operation, e),
        }),
        Err(_) => Err(RequestError {
            error: super::error::timed_out(operation),
            transient: true,
            unanswered: true,
        }),
    }
}

/// Deletes `key` if it is still on `lease` (never a key of another lease that took the name),
/// retrying while the lease may keep it, then frees the name.
pub(crate) async fn undo(inner: Arc<Inner>, key: String, lease: i64) {
    delete(&inner, &key, lease, None).await;
    inner.unreserve(&key);
}

/// [`undo`] of a hold's key created at `created`: a delete that arrives late (its answer lost,
/// and the name taken again since) cannot delete a later key of the same name.
pub(crate) async fn undo_created(inner: Arc<Inner>, key: String, lease: i64, created: i64) {
    delete(&inner, &key, lease, Some(created)).await;
    inner.unreserve(&key);
}

/// Deletes `key` if it is still on `lease` (and was created at `created`, when known),
/// retrying while the lease may keep it.
pub(crate) async fn delete(inner: &Inner, key: &str, lease: i64, created: Option<i64>) {
    let delete = || {
        let mut when = vec![Compare::lease(key, CompareOp::Equal, lease)];
        if let Some(created) = created {
            when.push(Compare::create_revision(key, CompareOp::Equal, created));
        }
        Txn::new().when(when).and_then([TxnOp::delete(key, None)])
    };
    let mut backoff = backoff();
    loop {
        match txn(inner, "delete the contender's key", delete()).await {
            Ok(_) => break,
            Err(e) if e.transient && inner.lease_may_hold(lease) => backoff.wait().await,
            // Gone with its lease, or refused for good: the lease's end deletes it.
            Err(e) => {
                tracing::debug!(%key, error = %e.error, "could not delete an etcd key; its lease's end will");
                break;
            }
        }
    }
}

/// Sends the transaction `put` of an acquire from a task of its own, which a dropped acquire
/// does not cancel, and adds to `sent` what came of it: an undo waits for that answer first,
/// so that no put lands after its delete. A put that got no answer may still land: it arms
/// the reaper (see [`reaper`](super::reaper)).
pub(crate) async fn put_tracked(
    inner: &Arc<Inner>,
    sent: &mut Vec<tokio::sync::watch::Receiver<Settled>>,
    operation: &'static str,
    put: Txn,
) -> std::result::Result<etcd_client::TxnResponse, RequestError> {
    let (settled, rx) = tokio::sync::watch::channel(Settled::Pending);
    sent.push(rx);
    let inner = inner.clone();
    let runtime = inner.runtime.clone();
    runtime
        .spawn(async move {
            let r = txn(&inner, operation, put).await;
            settled.send_replace(match &r {
                Err(e) if e.unanswered => {
                    inner
                        .suspect
                        .store(true, std::sync::atomic::Ordering::SeqCst);
                    Settled::Unknown
                }
                _ => Settled::Answered,
            });
            r
        })
        .await
        .map_err(|_| RequestError::from(Error::Closed))?
}
