//! A granted PostgreSQL hold: an advisory lock on one of the backend's connections, lost with
//! that connection, released by unlocking it there.

use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::conn::{ConnState, HoldConn, Reservation};
use super::error::PostgresError;
use super::hub::WaiterWatch;
use super::{wire, Inner};
use crate::backend::undos::Undoing;
use crate::backend::{BackendHold, BoxFuture, Downgraded, LockTarget};
use crate::types::error::{Error, Result};
use crate::types::loss::{Loss, LossReason, LossSignal};
use crate::types::token::FencingToken;

/// Whether a hold has ended, and whether it was lost by then (a loss is final; an ended hold
/// is not lost later).
#[derive(Debug, Clone, Copy, Default)]
struct Ended {
    ended: bool,
    lost: Option<LossReason>,
}

fn reason(conn: &watch::Receiver<ConnState>, ended: &watch::Receiver<Ended>) -> Option<LossReason> {
    let e = *ended.borrow();
    if e.ended {
        e.lost
    } else {
        conn.borrow().reason_at(Instant::now())
    }
}

/// The loss signal of a hold: its connection's, until the hold ends.
struct PgLoss {
    conn: watch::Receiver<ConnState>,
    ended: watch::Receiver<Ended>,
}

impl Loss for PgLoss {
    fn reason(&self) -> Option<LossReason> {
        reason(&self.conn, &self.ended)
    }

    fn lost(&self) -> BoxFuture<'static, LossReason> {
        let (mut conn, mut ended) = (self.conn.clone(), self.ended.clone());
        Box::pin(async move {
            loop {
                let deadline = {
                    let e = *ended.borrow_and_update();
                    let c = *conn.borrow_and_update();
                    if e.ended {
                        match e.lost {
                            Some(reason) => return reason,
                            None => None,
                        }
                    } else if let Some(reason) = c.reason_at(Instant::now()) {
                        return reason;
                    } else {
                        Some(c.deadline)
                    }
                };
                match deadline {
                    Some(deadline) => {
                        tokio::select! {
                            changed = conn.changed() => if changed.is_err() { return LossReason::Closed },
                            changed = ended.changed() => if changed.is_err() { return LossReason::Closed },
                            _ = tokio::time::sleep_until(deadline) => {}
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            }
        })
    }
}

/// Unlocks `id` (`shared`: a read hold) on `conn`, and wakes waiters if any: whether it was
/// held.
async fn release(conn: &HoldConn, id: i32, shared: bool) -> Result<bool, PostgresError> {
    let statements = conn.statements().await?;
    let rows = conn
        .run(conn.client().query(&statements.release, &[&id, &shared]))
        .await?;
    Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
}

/// Unlocks the id of `reservation` on its connection (unless the connection is lost: then the
/// server released it). Whether the lock was held; an error closes the connection, which
/// releases it. The caller gives the reservation back after.
async fn unlock_on(reservation: &Reservation, shared: bool) -> Result<bool, PostgresError> {
    let conn = &reservation.conn;
    let id = reservation.id;
    if conn.reason().is_some() {
        // The session is gone, or may be: the server released what it held.
        conn.kill(LossReason::Disconnected);
        return Ok(true);
    }
    let r = release(conn, id, shared).await;
    if let Err(e) = &r {
        tracing::warn!(lock = id, error = %e, "zklock: could not release a PostgreSQL advisory lock; closing its connection, which releases it");
        conn.kill(LossReason::Disconnected);
    }
    r
}

/// An unlock not yet known to be done. Dropped before it finished (a hold dropped, or the
/// caller's release future dropped), it unlocks in the background and only then gives the
/// reservation back: an unlock begun in the caller's task may not have been sent, and unlocking
/// a lock the session no longer holds only draws a warning from the server. The reservation
/// keeps any other acquire of the id off the connection meanwhile, and the unlock counts as an
/// undo of the id until it is done: the process's next acquire of the lock waits for it, and
/// never finds the lock held by the hold it let go of.
struct Unlocking {
    reservation: Option<Reservation>,
    shared: bool,
    inner: Arc<Inner>,
    undoing: Option<Undoing>,
}

impl Unlocking {
    fn new(
        inner: &Arc<Inner>,
        path: &Arc<str>,
        reservation: Reservation,
        shared: bool,
    ) -> Unlocking {
        let undoing = inner.undos.start(path);
        Unlocking {
            reservation: Some(reservation),
            shared,
            inner: inner.clone(),
            undoing: Some(undoing),
        }
    }
}

impl Drop for Unlocking {
    fn drop(&mut self) {
        if let Some(reservation) = self.reservation.take() {
            let shared = self.shared;
            let undoing = self.undoing.take();
            self.inner
                .background
                .spawn(&self.inner.runtime, async move {
                    let _ = unlock_on(&reservation, shared).await;
                    drop(reservation);
                    drop(undoing);
                });
        }
    }
}

/// One advisory lock held on a connection of the backend. Released when dropped (in the
/// background) or by [`release`](BackendHold::release).
pub(super) struct PgHold {
    inner: Arc<Inner>,
    /// The user's key, for errors.
    key: Arc<str>,
    /// The lock path and id, and `<path> (advisory lock <class>,<id>)` made of them once
    /// asked for (most holds are never asked).
    path: Arc<str>,
    id: i32,
    location: std::sync::OnceLock<String>,
    shared: bool,
    token: FencingToken,
    /// The lock id on its connection; `None` once released or downgraded.
    reservation: Arc<StdMutex<Option<Reservation>>>,
    conn_state: watch::Receiver<ConnState>,
    ended: watch::Sender<Ended>,
    /// Whether a waiter was registered at the grant, and the watch for waiters registering
    /// since (none: unknown, so others may be waiting).
    waiters: Option<(bool, WaiterWatch)>,
}

impl PgHold {
    pub(super) fn new(
        inner: Arc<Inner>,
        target: &LockTarget,
        reservation: Reservation,
        shared: bool,
        token: FencingToken,
    ) -> PgHold {
        let id = reservation.id;
        let conn_state = reservation.conn.subscribe();
        PgHold {
            inner,
            key: target.key.clone(),
            path: target.path.clone(),
            id,
            location: std::sync::OnceLock::new(),
            shared,
            token,
            reservation: Arc::new(StdMutex::new(Some(reservation))),
            conn_state,
            ended: watch::channel(Ended::default()).0,
            waiters: None,
        }
    }

    /// Sets what the hold knows of other contenders: whether one waited at the grant, and the
    /// watch started before it.
    pub(super) fn watching(mut self, waiting: bool, waiters: WaiterWatch) -> PgHold {
        self.waiters = Some((waiting, waiters));
        self
    }

    fn loss_reason(&self) -> Option<LossReason> {
        reason(&self.conn_state, &self.ended.subscribe())
    }

    /// Ends the hold: whatever happens to its connection from now on is not its loss.
    fn end(&self, lost: Option<LossReason>) {
        self.ended.send_modify(|e| {
            if !e.ended {
                *e = Ended { ended: true, lost };
            }
        });
    }

    fn lost_error(&self, reason: LossReason) -> Error {
        Error::LockLost {
            key: self.key.to_string(),
            reason,
        }
    }

    /// Unlocks on the hold's connection and gives the reservation back, in a task of its own
    /// (the hold is dropped). Whether the lock was held; an error closes the connection.
    fn unlock(&self) -> bool {
        let Some(reservation) = self.reservation.lock().expect("not poisoned").take() else {
            return false;
        };
        // Dropped unfinished: the unlock goes to the background.
        drop(Unlocking::new(
            &self.inner,
            &self.path,
            reservation,
            self.shared,
        ));
        true
    }

    async fn release(&self) -> Result<()> {
        let lost_before = self.loss_reason();
        let Some(reservation) = self.reservation.lock().expect("not poisoned").take() else {
            return Ok(());
        };
        // In the caller's task (no hop to another); if this is dropped half way, the rest is
        // left to the background.
        let mut unlocking = Unlocking::new(&self.inner, &self.path, reservation, self.shared);
        let result = unlock_on(unlocking.reservation.as_ref().expect("set"), self.shared).await;
        // Done: the reservation goes back, then the undo ends (with `unlocking`).
        unlocking.reservation = None;
        let lost_now = self.loss_reason();
        self.end(lost_before);
        match (lost_before, result) {
            (Some(reason), _) => Err(self.lost_error(reason)),
            (None, Ok(true)) => Ok(()),
            // Not held by the session: someone unlocked it (pg_advisory_unlock_all on our
            // session is the only way).
            (None, Ok(false)) => Err(self.lost_error(LossReason::NodeDeleted)),
            (None, Err(e)) => Err(match lost_now {
                Some(reason) => self.lost_error(reason),
                None => e.during("release the lock"),
            }),
        }
    }
}

impl Drop for PgHold {
    fn drop(&mut self) {
        let lost = self.loss_reason();
        if self.unlock() {
            self.end(lost);
        }
    }
}

impl BackendHold for PgHold {
    fn token(&self) -> FencingToken {
        self.token
    }

    /// The lock path and the advisory lock (`pg_locks`: `classid`, `objid`) behind the hold.
    fn location(&self) -> &str {
        self.location
            .get_or_init(|| super::inspect::location(&self.path, self.id))
    }

    fn loss_reason(&self) -> Option<LossReason> {
        PgHold::loss_reason(self)
    }

    fn loss(&self) -> LossSignal {
        Arc::new(PgLoss {
            conn: self.conn_state.clone(),
            ended: self.ended.subscribe(),
        })
    }

    /// Whether another process registered as a waiter for the lock since before the grant
    /// (or the listening connection missed some: in doubt, yes).
    fn others_waiting(&self) -> bool {
        self.waiters
            .as_ref()
            .is_none_or(|(at_grant, watch)| *at_grant || watch.appeared())
    }

    /// Completes when another process registers as a waiter (see
    /// [`others_waiting`](Self::others_waiting)), or at once if one may have.
    fn others_appeared(&self) -> BoxFuture<'static, ()> {
        match &self.waiters {
            Some((false, watch)) => watch.wait(),
            _ => Box::pin(std::future::ready(())),
        }
    }

    /// Nothing to wait for: the hold's state is its connection's, known here.
    /// Asks the holding session whether it is still there, one round trip, before a local
    /// handoff or a linger re-take hands the lock on: the session may have been ended
    /// (`pg_terminate_backend`, a restart) with its locks, and another process granted the key,
    /// before this process's connection noticed. An answer confirms the lock as of its sending
    /// (a session-level advisory lock lasts as long as its session); a failure makes the hold
    /// lost, and the local task then acquires from the server.
    fn confirmed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if self.loss_reason().is_some() {
                return;
            }
            let conn = match self.reservation.lock().unwrap().as_ref() {
                Some(r) => r.conn.clone(),
                None => return,
            };
            conn.confirm().await;
        })
    }

    fn release(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(PgHold::release(self))
    }

    /// Revocation is ZooKeeper's (Curator's `__REVOKE__`); nothing asks an advisory lock to let go.
    /// One statement takes the shared lock on the same session and unlocks the exclusive one,
    /// so no writer gets in between and the write hold need not be kept.
    fn downgrade(self: Arc<Self>, target: LockTarget) -> BoxFuture<'static, Result<Downgraded>> {
        Box::pin(async move {
            if let Some(reason) = self.loss_reason() {
                return Err(self.lost_error(reason));
            }
            let Some(reservation) = self.reservation.lock().expect("not poisoned").take() else {
                return Err(self.lost_error(LossReason::Closed));
            };
            // In a task of its own: the reservation must not be given back while the
            // statement may still run.
            let (tx, rx) = oneshot::channel();
            self.inner
                .background
                .spawn(&self.inner.runtime, async move {
                    let conn = reservation.conn.clone();
                    let id = reservation.id;
                    let r = conn
                        .run(conn.client().query_typed(
                            wire::DOWNGRADE,
                            &[(&id, tokio_postgres::types::Type::INT4)],
                        ))
                        .await
                        .map(|rows| rows.first().is_some_and(|r| r.get::<_, bool>(0)));
                    match r {
                        Ok(true) => {
                            if let Err(Ok(reservation)) = tx.send(Ok(reservation)) {
                                // The downgrade was dropped: nobody holds the read lock.
                                let conn = &reservation.conn;
                                let undone = release(conn, id, true).await;
                                if undone.is_err() {
                                    conn.kill(LossReason::Disconnected);
                                }
                            }
                        }
                        other => {
                            // Unknown or odd state: close the session, which frees the lock.
                            conn.kill(LossReason::Disconnected);
                            drop(reservation);
                            let _ = tx.send(Err(other.err()));
                        }
                    }
                });
            match rx.await {
                Ok(Ok(reservation)) => {
                    self.end(None);
                    let read =
                        PgHold::new(self.inner.clone(), &target, reservation, true, self.token);
                    Ok(Downgraded {
                        read: Arc::new(read),
                        keep_write: false,
                    })
                }
                Ok(Err(Some(e))) => {
                    let reason = self.loss_reason();
                    self.end(reason.or(Some(LossReason::Disconnected)));
                    Err(match reason {
                        Some(reason) => self.lost_error(reason),
                        None => e.during("downgrade the write lock"),
                    })
                }
                _ => {
                    self.end(Some(LossReason::Disconnected));
                    Err(self.lost_error(LossReason::Disconnected))
                }
            }
        })
    }
}
