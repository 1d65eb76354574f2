//! The protocol as etcd sees it: where the keys of a lock go and what they hold ([`Layout`],
//! [`Inner::reserve`], [`Inner::owner_value`]), the transactions that put them, a transaction
//! within the reply bound ([`txn`]), and the delete of a key that is still on its lease
//! ([`undo`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::error::transient;
use super::session::Inner;
use crate::backend::backoff::Backoff;
use crate::backend::HOST_PID;
use crate::types::error::Error;
use crate::types::mode::LockMode;

/// The first pause before retrying a request that failed on the connection.
pub(super) const RETRY_MIN: std::time::Duration = crate::backend::backoff::RETRY_MIN;
/// The longest pause between retries of a request: shorter than on the other backends, since
/// a request that failed moves on to the next member, which is likely up.
pub(super) const RETRY_MAX: std::time::Duration = std::time::Duration::from_millis(500);

/// The pauses between retries of an etcd request.
pub(super) const fn backoff() -> Backoff {
    Backoff::new(RETRY_MIN, RETRY_MAX)
}

/// Which keys a contender of `mode` on lock path `path` waits for, and where its own goes.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    /// The prefix of the keys it waits for (every earlier key under it).
    pub(super) blockers: String,
}

impl Layout {
    /// The layout of `mode`: etcd's `concurrency.Mutex` and `concurrency.Election` for a
    /// mutex and a latch (`<path>/<lease id in hex>`), and etcd's read/write recipe
    /// (`<path>/read/<n>`, `<path>/write/<n>`) for read/write locks.
    pub(super) fn of(path: &str, mode: LockMode) -> Layout {
        let blockers = match mode {
            LockMode::Exclusive | LockMode::Leader | LockMode::Write => format!("{path}/"),
            LockMode::Read => format!("{path}/write/"),
        };
        Layout { blockers }
    }
}

impl Inner {
    /// A key name for a contender of this manager in `mode` on `path`, on lease `lease`.
    pub(super) fn reserve(&self, path: &str, mode: LockMode, lease: i64) -> String {
        let mut names = self.names.lock().expect("not poisoned");
        match mode {
            LockMode::Exclusive | LockMode::Leader => {
                let base = format!("{path}/{lease:x}");
                if names.insert(base.clone()) {
                    return base;
                }
                loop {
                    let n = self.next_name.fetch_add(1, Ordering::Relaxed);
                    let name = format!("{base}_{n}");
                    if names.insert(name.clone()) {
                        return name;
                    }
                }
            }
            LockMode::Read | LockMode::Write => {
                let side = if mode == LockMode::Read {
                    "read"
                } else {
                    "write"
                };
                loop {
                    let nanos = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_nanos();
                    let name = format!("{path}/{side}/{nanos}");
                    if names.insert(name.clone()) {
                        return name;
                    }
                }
            }
        }
    }

    /// Takes exactly `key` as a name, if nothing of this manager has it.
    pub(super) fn reserve_exact(&self, key: &str) -> bool {
        self.names
            .lock()
            .expect("not poisoned")
            .insert(key.to_string())
    }

    /// Frees a name once its key is deleted.
    pub(super) fn unreserve(&self, key: &str) {
        self.names.lock().expect("not poisoned").remove(key);
    }

    /// What a contender's key holds: who it is and since when (what inspection shows).
    pub(super) fn owner_value(&self) -> String {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        match &self.config.identity {
            Some(id) => format!("zklock {} at={ms} id={id}", *HOST_PID),
            None => format!("zklock {} at={ms}", *HOST_PID),
        }
    }
}

/// The put of a contender's `key` (holding `value`, on `lease`) unless it exists, with a read
/// of the first key under `blockers`; else a read of the key and of that first key.
pub(super) fn put_contender(key: &str, value: &str, lease: i64, blockers: &str) -> Txn {
    let first = TxnOp::get(
        blockers,
        Some(
            GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1)
                .with_keys_only(),
        ),
    );
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
            first.clone(),
        ])
        .or_else([TxnOp::get(key, None), first])
}

/// Every key under a path, in create order, names only.
pub(super) fn listing() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_keys_only()
}

/// The put of a semaphore's `keys` (each holding `value`, on `lease`) unless they exist, with
/// a listing of `prefix`; else a read of the first key and the listing.
pub(super) fn put_leases(keys: &[String], value: &str, lease: i64, prefix: String) -> Txn {
    let list = TxnOp::get(prefix, Some(listing()));
    let compares: Vec<_> = keys
        .iter()
        .map(|k| Compare::create_revision(k.as_str(), CompareOp::Equal, 0))
        .collect();
    let mut puts: Vec<_> = keys
        .iter()
        .map(|k| TxnOp::put(k.as_str(), value, Some(PutOptions::new().with_lease(lease))))
        .collect();
    puts.push(list.clone());
    Txn::new()
        .when(compares)
        .and_then(puts)
        .or_else([TxnOp::get(keys[0].as_str(), None), list])
}

/// The put of a read `key` (holding `value`, on `lease`) beside the write key `write` created
/// at `write_rev`, while that one is still there, with a read of the first key under `writers`
/// created after it.
pub(super) fn put_read_beside(
    key: &str,
    value: String,
    lease: i64,
    write: &str,
    write_rev: i64,
    writers: &str,
) -> Txn {
    Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, 0),
            Compare::create_revision(write, CompareOp::Equal, write_rev),
        ])
        .and_then([
            TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
            TxnOp::get(
                writers,
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(1)
                        // (A range's count is taken before this filter: read the keys.)
                        .with_min_create_revision(write_rev + 1),
                ),
            ),
        ])
}

/// The put of a job's run `record` (holding `claim`, on `lease`) unless it exists; else a read
/// of it.
pub(super) fn put_run_record(record: &str, claim: &str, lease: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(record, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            record,
            claim,
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(record, None)])
}

/// A request's error, and whether sending it again may succeed.
pub(super) struct RequestError {
    pub(super) error: Error,
    pub(super) transient: bool,
    /// Whether the request got no answer: it may still be applied later.
    pub(super) unanswered: bool,
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
pub(super) enum Settled {
    /// No answer yet.
    Pending,
    /// Answered (applied or refused): nothing of it can land later.
    Answered,
    /// No answer within the bound: it may still be applied.
    Unknown,
}

/// Sends `txn` within the reply bound.
pub(super) async fn txn(
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
pub(super) async fn undo(inner: Arc<Inner>, key: String, lease: i64) {
    delete(&inner, &key, lease, None).await;
    inner.unreserve(&key);
}

/// [`undo`] of a hold's key created at `created`: a delete that arrives late (its answer lost,
/// and the name taken again since) cannot delete a later key of the same name.
pub(super) async fn undo_created(inner: Arc<Inner>, key: String, lease: i64, created: i64) {
    delete(&inner, &key, lease, Some(created)).await;
    inner.unreserve(&key);
}

/// Deletes `key` if it is still on `lease` (and was created at `created`, when known),
/// retrying while the lease may keep it.
pub(super) async fn delete(inner: &Inner, key: &str, lease: i64, created: Option<i64>) {
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
pub(super) async fn put_tracked(
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
