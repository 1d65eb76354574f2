//! A granted hold: a user lock of its session, kept by a liveness check every lease/3 (the
//! session's `wait_timeout` is the lease), lost when a check fails, the session breaks or the
//! last confirmed check is 94% of a lease old; released with `RELEASE_LOCK`, after which the
//! session goes back to the pool.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use tokio::sync::{watch, Mutex as AsyncMutex};
use tokio::time::Instant;

use super::conn::{bounded, Inner};
use super::error::MySqlError;
use super::wire;
use crate::backend::{BackendHold, BoxFuture, Downgraded, LockTarget};
use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, Result};
use crate::types::loss::{Loss, LossReason, LossSignal};
use crate::types::token::FencingToken;

/// The share of the lease after the last confirmed check at which a hold counts as lost: the
/// server ends a session idle for the whole lease, counted from later than the check's send.
const LEASE_SHARE: f64 = 0.94;

/// A hold's session as the hold knows it.
#[derive(Debug, Clone, Copy)]
struct SessionState {
    /// Past it, the server may have ended the session: the send time of the last confirmed
    /// check, plus 94% of the lease.
    deadline: Instant,
    /// Set once lost (or released: `Closed`); never cleared.
    lost: Option<LossReason>,
}

impl SessionState {
    fn reason_at(&self, now: Instant) -> Option<LossReason> {
        match self.lost {
            Some(reason) => Some(reason),
            None if now >= self.deadline => Some(LossReason::LeaseExpired),
            None => None,
        }
    }
}

/// What a hold and its liveness task share.
struct Shared {
    inner: Arc<Inner>,
    name: String,
    /// The session; `None` once released (or lost and closed).
    conn: AsyncMutex<Option<mysql_async::Conn>>,
    state: watch::Sender<SessionState>,
    /// Whether the hold ended by its own release (a loss after that is not its loss).
    released: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn reason(&self) -> Option<LossReason> {
        if self.released.load(std::sync::atomic::Ordering::SeqCst) {
            return None;
        }
        self.state.borrow().reason_at(Instant::now())
    }

    /// Makes the hold lost with `reason` unless it is (a passed deadline is the first reason).
    fn lose(&self, reason: LossReason) {
        self.state.send_if_modified(|s| {
            if s.lost.is_some() {
                return false;
            }
            s.lost = Some(s.reason_at(Instant::now()).unwrap_or(reason));
            true
        });
    }

    /// A check sent at `sent` was answered: the deadline moves on, unless the old one passed
    /// before the answer (then the hold is lost now).
    fn confirm(&self, sent: Instant) {
        let lease = self.inner.config.lease;
        self.state.send_if_modified(|s| {
            if s.lost.is_some() {
                return false;
            }
            match s.reason_at(Instant::now()) {
                Some(reason) => {
                    s.lost = Some(reason);
                    true
                }
                None => {
                    s.deadline = s.deadline.max(sent + lease.mul_f64(LEASE_SHARE));
                    false
                }
            }
        });
    }

    /// One check of the session (`DO 1`): confirms the lock, held as long as the session is.
    async fn check(&self) {
        let mut conn = self.conn.lock().await;
        let Some(c) = conn.as_mut() else {
            return;
        };
        let sent = Instant::now();
        self.inner.count();
        match bounded(self.inner.config.reply_timeout, c.query_drop("DO 1")).await {
            Ok(()) => self.confirm(sent),
            Err(e) => {
                tracing::debug!(lock = %self.name, error = %e, "zklock: a MySQL liveness check failed; the hold is lost");
                self.lose(LossReason::Disconnected);
                if let Some(c) = conn.take() {
                    self.inner.close(c);
                }
            }
        }
    }
}

/// Checks the session every lease/3 while the hold lives.
async fn keep(shared: std::sync::Weak<Shared>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.state.borrow().lost.is_some() || shared.conn.lock().await.is_none() {
            return;
        }
        shared.check().await;
    }
}

/// One user lock held by a session of the backend. Released when dropped (in the background)
/// or by [`release`](BackendHold::release).
pub(super) struct MySqlHold {
    shared: Arc<Shared>,
    key: Arc<str>,
    path: Arc<str>,
    token: FencingToken,
    location: String,
    keeper: tokio::task::AbortHandle,
}

impl MySqlHold {
    /// The hold of the lock `name` that `conn` was granted, its check sent at `sent`.
    pub(super) fn new(
        inner: &Arc<Inner>,
        target: &LockTarget,
        name: String,
        conn: mysql_async::Conn,
        sent: Instant,
        token: FencingToken,
    ) -> MySqlHold {
        let session = conn.id();
        let lease = inner.config.lease;
        let shared = Arc::new(Shared {
            inner: inner.clone(),
            name: name.clone(),
            conn: AsyncMutex::new(Some(conn)),
            state: watch::Sender::new(SessionState {
                deadline: sent + lease.mul_f64(LEASE_SHARE),
                lost: None,
            }),
            released: std::sync::atomic::AtomicBool::new(false),
        });
        let keeper = inner
            .runtime
            .spawn(keep(Arc::downgrade(&shared), lease / 3))
            .abort_handle();
        MySqlHold {
            location: format!("{} (user lock {name}, session {session})", target.path),
            shared,
            key: target.key.clone(),
            path: target.path.clone(),
            token,
            keeper,
        }
    }

    fn lost_error(&self, reason: LossReason) -> Error {
        Error::LockLost {
            key: self.key.to_string(),
            reason,
        }
    }

    /// `RELEASE_LOCK` on the hold's session, and the session back to the pool: whether the
    /// session held the lock. An error closes the session, which frees the lock.
    async fn unlock(shared: &Shared) -> std::result::Result<bool, MySqlError> {
        let Some(mut conn) = shared.conn.lock().await.take() else {
            return Ok(false);
        };
        shared.inner.count();
        let released: std::result::Result<Option<Option<i64>>, _> = bounded(
            shared.inner.config.reply_timeout,
            conn.query_first(wire::release_lock(&shared.name)),
        )
        .await;
        match released {
            Ok(got) => {
                shared.inner.give_back(conn);
                Ok(got.flatten() == Some(1))
            }
            Err(e) => {
                shared.inner.close(conn);
                Err(e)
            }
        }
    }

    async fn release(&self) -> Result<()> {
        let lost_before = self.shared.reason();
        self.keeper.abort();
        if self.shared.conn.lock().await.is_none() {
            return match lost_before {
                Some(reason) => Err(self.lost_error(reason)),
                None => Ok(()),
            };
        }
        // Dropped half way: the rest of the release is the drop's (in the background).
        let result = Self::unlock(&self.shared).await;
        self.shared
            .released
            .store(true, std::sync::atomic::Ordering::SeqCst);
        match (lost_before, result) {
            (Some(reason), _) => Err(self.lost_error(reason)),
            (None, Ok(true)) => Ok(()),
            // Not held by the session: it was ended and the lock freed (and maybe taken).
            (None, Ok(false)) => Err(self.lost_error(LossReason::Disconnected)),
            (None, Err(e)) => Err(e.during("release the lock")),
        }
    }
}

impl Drop for MySqlHold {
    fn drop(&mut self) {
        self.keeper.abort();
        if self
            .shared
            .released
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            // Released: its session went back to the pool (or was closed); nothing to undo,
            // and no task to start for every hold a release ended.
            return;
        }
        let undoing = self.shared.inner.undos.start(&self.path);
        let shared = self.shared.clone();
        let inner = shared.inner.clone();
        inner.background.spawn(&inner.runtime, async move {
            let _ = MySqlHold::unlock(&shared).await;
            drop(undoing);
        });
    }
}

/// A hold's loss, apart from the hold.
struct MySqlLoss {
    shared: Arc<Shared>,
}

impl Loss for MySqlLoss {
    fn reason(&self) -> Option<LossReason> {
        self.shared.reason()
    }

    fn lost(&self) -> BoxFuture<'static, LossReason> {
        let shared = self.shared.clone();
        let mut state = shared.state.subscribe();
        Box::pin(async move {
            loop {
                let deadline = {
                    let s = *state.borrow_and_update();
                    if let Some(reason) = s.reason_at(Instant::now()) {
                        return reason;
                    }
                    s.deadline
                };
                tokio::select! {
                    changed = state.changed() => if changed.is_err() { return LossReason::Closed },
                    () = tokio::time::sleep_until(deadline) => {}
                }
            }
        })
    }
}

impl BackendHold for MySqlHold {
    fn token(&self) -> FencingToken {
        self.token
    }

    /// The lock path, its user-lock name and the holding session's id.
    fn location(&self) -> &str {
        &self.location
    }

    fn loss_reason(&self) -> Option<LossReason> {
        self.shared.reason()
    }

    fn loss(&self) -> LossSignal {
        Arc::new(MySqlLoss {
            shared: self.shared.clone(),
        })
    }

    /// Asks the holding session whether it is still there, one round trip, before a local
    /// handoff or a linger re-take hands the lock on: the session may have been ended (`KILL`,
    /// a restart) with its locks, and another process granted the key, before the next
    /// liveness check. A user lock lasts as long as its session.
    fn confirmed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if self.shared.reason().is_none() {
                self.shared.check().await;
            }
        })
    }

    fn release(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(MySqlHold::release(self))
    }

    /// Read/write locks are refused on this backend, so no write hold exists to downgrade.
    fn downgrade(self: Arc<Self>, _target: LockTarget) -> BoxFuture<'static, Result<Downgraded>> {
        Box::pin(async {
            Err(Error::Unsupported {
                backend: BackendKind::MySql.label(),
                feature: "read/write locks",
            })
        })
    }
}
