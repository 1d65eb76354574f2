//! A granted etcd hold: its key on the session's lease, its loss, its release.
//!
//! A hold is lost when its lease ends (see [`session`](super::session)) and when its key is
//! deleted by someone else: a watch on the key tells, started by the first interest in the
//! hold's loss, and a local handoff reads the key first ([`BackendHold::confirmed`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::watch;
use tokio::time::Instant;

mod others;

use super::session::LeaseState;
use super::wire::{txn, undo, undo_created, Layout};
use super::Inner;
use crate::backend::{BackendHold, BoxFuture, Downgraded, LockTarget};
use crate::types::error::{Error, Result};
use crate::types::loss::{Loss, LossReason, LossSignal};
use crate::types::mode::LockMode;
use crate::types::token::FencingToken;
use others::{Others, OthersWatch};

/// A hold's own end, apart from its lease's: its key deleted by someone else, or released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Own {
    Held,
    Lost(LossReason),
    Released,
}

/// The loss signal of a hold: its lease's state and its own.
struct EtcdLoss {
    lease: watch::Receiver<LeaseState>,
    epoch: u64,
    own: watch::Receiver<Own>,
}

impl EtcdLoss {
    fn reason_now(&self) -> Option<LossReason> {
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

/// A hold of one key on the session's lease.
pub(crate) struct EtcdHold {
    inner: Arc<Inner>,
    /// The user's key, for errors.
    user_key: Arc<str>,
    /// The lock's path: a release in the background counts as an undo of it (see
    /// [`Undos`](crate::backend::undos::Undos)).
    path: Arc<str>,
    /// The key in etcd: what inspection shows as the contender's location.
    key: String,
    /// Its create revision: the fencing token.
    rev: i64,
    lease: LeaseState,
    mode: LockMode,
    own: Arc<watch::Sender<Own>>,
    /// The watch on the key, once started.
    watching: OnceLock<tokio::task::AbortHandle>,
    /// The watch for other contenders (a mutex's or a writer's), once asked.
    others: OnceLock<OthersWatch>,
    released: AtomicBool,
}

impl EtcdHold {
    pub(crate) fn new(
        inner: Arc<Inner>,
        user_key: Arc<str>,
        path: Arc<str>,
        key: String,
        rev: i64,
        lease: LeaseState,
        mode: LockMode,
    ) -> EtcdHold {
        EtcdHold {
            inner,
            user_key,
            path,
            key,
            rev,
            lease,
            mode,
            own: Arc::new(watch::channel(Own::Held).0),
            watching: OnceLock::new(),
            others: OnceLock::new(),
            released: AtomicBool::new(false),
        }
    }

    /// The watch for other contenders of a mutex or write hold, started by the first question;
    /// `None` for the other holds, which answer "maybe" always.
    fn others(&self) -> Option<&OthersWatch> {
        if !matches!(self.mode, LockMode::Exclusive | LockMode::Write) {
            return None;
        }
        let prefix = match self.key.rsplit_once('/') {
            // `<path>/<lease hex>` or `<path>/write/<n>`: the lock's prefix is `<path>/`.
            Some((dir, _)) if self.mode == LockMode::Write => {
                format!("{}/", dir.strip_suffix("/write")?)
            }
            Some((dir, _)) => format!("{dir}/"),
            None => return None,
        };
        Some(
            self.others.get_or_init(|| {
                OthersWatch::start(&self.inner, prefix, self.key.clone(), self.rev)
            }),
        )
    }

    fn signal(&self) -> EtcdLoss {
        EtcdLoss {
            lease: self.inner.session.watch(),
            epoch: self.lease.epoch,
            own: self.own.subscribe(),
        }
    }

    /// Starts watching the key for a deletion by someone else, once.
    fn watch_key(&self) {
        self.watching.get_or_init(|| {
            let inner = self.inner.clone();
            let own = self.own.clone();
            let key = self.key.clone();
            let rev = self.rev;
            let lease = self.lease.id;
            self.inner
                .runtime
                .spawn(watch_key(inner, own, key, rev, lease))
                .abort_handle()
        });
    }

    /// Notes that the key is gone (unless the hold ended first).
    fn gone(&self) {
        mark_deleted(&self.own);
    }

    /// Deletes the key once; later calls only wait for nothing. `Err` when the hold was lost
    /// before (its key is deleted all the same, if it is still there).
    async fn delete(&self) -> Result<()> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let lost = self.loss_reason();
        self.own.send_replace(Own::Released);
        if let Some(w) = self.watching.get() {
            w.abort();
        }
        // From a counted task of its own: a release dropped while it waits (cancelled) must
        // not cancel the delete, since the hold already counts as released and its drop
        // starts none.
        let undo = undo_created(
            self.inner.clone(),
            self.key.clone(),
            self.lease.id,
            self.rev,
        );
        let (done, finished) = tokio::sync::oneshot::channel();
        self.inner
            .background
            .spawn(&self.inner.runtime, async move {
                undo.await;
                let _ = done.send(());
            });
        let _ = finished.await;
        match lost {
            Some(reason) => Err(Error::LockLost {
                key: self.user_key.to_string(),
                reason,
            }),
            None => Ok(()),
        }
    }
}

/// Marks a hold lost to its key's deletion, unless it ended first.
fn mark_deleted(own: &watch::Sender<Own>) {
    own.send_if_modified(|o| {
        let held = *o == Own::Held;
        if held {
            *o = Own::Lost(LossReason::NodeDeleted);
        }
        held
    });
}

/// Watches `key` (created at `rev` on `lease`) until it is deleted, then marks the hold lost.
async fn watch_key(
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

impl BackendHold for EtcdHold {
    fn token(&self) -> FencingToken {
        if self.inner.config.tokens {
            FencingToken::new(self.rev, 0)
        } else {
            FencingToken::NONE
        }
    }

    fn location(&self) -> &str {
        &self.key
    }

    fn loss_reason(&self) -> Option<LossReason> {
        self.signal().reason_now()
    }

    fn loss(&self) -> LossSignal {
        self.watch_key();
        Arc::new(self.signal())
    }

    fn loss_unwatched(&self) -> LossSignal {
        Arc::new(self.signal())
    }

    fn confirmed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if self.loss_reason().is_some() {
                return;
            }
            self.inner.count_request();
            let mut client = self.inner.client.clone();
            let got = tokio::time::timeout(
                self.inner.config.reply_timeout,
                client.get(self.key.as_str(), Some(GetOptions::new().with_keys_only())),
            )
            .await;
            let here = match &got {
                Ok(Ok(got)) => got
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.create_revision() == self.rev),
                // No answer: not confirmed, so not handed on.
                _ => false,
            };
            if !here {
                self.gone();
            }
            // A question about other contenders asked before waits for its answer too.
            if let Some(others) = self.others.get() {
                if tokio::time::timeout(self.inner.config.reply_timeout, others.known())
                    .await
                    .is_err()
                {
                    others.state_maybe();
                }
            }
        })
    }

    fn others_waiting(&self) -> bool {
        self.others().is_none_or(|o| o.now() != Others::Nobody)
    }

    fn others_appeared(&self) -> BoxFuture<'static, ()> {
        match self.others() {
            Some(others) => Box::pin(others.appeared()),
            None => Box::pin(std::future::ready(())),
        }
    }

    fn release(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(self.delete())
    }

    fn downgrade(self: Arc<Self>, target: LockTarget) -> BoxFuture<'static, Result<Downgraded>> {
        Box::pin(async move { self.downgrade_to_read(target).await })
    }
}

impl EtcdHold {
    /// Puts a read key beside this write key. If a writer queued between the two, the write
    /// key must stay until the read hold ends (that writer waits for it); otherwise it goes at
    /// once, and every writer that comes later waits for the read key.
    async fn downgrade_to_read(self: Arc<Self>, target: LockTarget) -> Result<Downgraded> {
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
        let put = Txn::new()
            .when([
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                Compare::create_revision(self.key.as_str(), CompareOp::Equal, self.rev),
            ])
            .and_then([
                TxnOp::put(
                    key.as_str(),
                    inner.owner_value(),
                    Some(PutOptions::new().with_lease(self.lease.id)),
                ),
                TxnOp::get(
                    writers.as_str(),
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_limit(1)
                            // (A range's count is taken before this filter: read the keys.)
                            .with_min_create_revision(self.rev + 1),
                    ),
                ),
            ]);
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

impl Drop for EtcdHold {
    fn drop(&mut self) {
        if let Some(w) = self.watching.get() {
            w.abort();
        }
        if !self.released.swap(true, Ordering::SeqCst) {
            // The process's next acquire of the lock waits for the delete: it never finds
            // the lock held by this dropped hold.
            let undoing = self.inner.undos.start(&self.path);
            let undo = undo_created(
                self.inner.clone(),
                std::mem::take(&mut self.key),
                self.lease.id,
                self.rev,
            );
            self.inner
                .background
                .spawn(&self.inner.runtime, async move {
                    undo.await;
                    drop(undoing);
                });
        }
    }
}
