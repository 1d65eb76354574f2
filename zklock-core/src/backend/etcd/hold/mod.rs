//! A granted etcd hold: its key on the session's lease, its loss ([`loss`]), its release, its
//! downgrade ([`downgrade`]), and what it knows of others waiting ([`others`]).
//!
//! A hold is lost when its lease ends (see [`session`](super::session)) and when its key is
//! deleted by someone else: a watch on the key tells, started by the first interest in the
//! hold's loss, and a local handoff reads the key first ([`BackendHold::confirmed`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use etcd_client::GetOptions;
use tokio::sync::watch;

mod downgrade;
mod loss;
mod others;

use super::session::Inner;
use super::session::LeaseState;
use super::wire::undo_created;
use crate::backend::others::Others;
use crate::backend::{BackendHold, BoxFuture, Downgraded, LockTarget};
use crate::types::error::{Error, Result};
use crate::types::loss::{LossReason, LossSignal};
use crate::types::mode::LockMode;
use crate::types::token::FencingToken;
use loss::{mark_deleted, watch_key, EtcdLoss, Own};
use others::OthersWatch;

/// A hold of one key on the session's lease.
pub(super) struct EtcdHold {
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
    pub(super) fn new(
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
                if tokio::time::timeout(self.inner.config.reply_timeout, others.state.known())
                    .await
                    .is_err()
                {
                    others.state.maybe();
                }
            }
        })
    }

    fn others_waiting(&self) -> bool {
        self.others()
            .is_none_or(|o| o.state.now() != Others::Nobody)
    }

    fn others_appeared(&self) -> BoxFuture<'static, ()> {
        match self.others() {
            Some(others) => Box::pin(others.state.appeared()),
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
