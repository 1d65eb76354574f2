//! The undo of an acquire that ends without a hold: [`Unfinished`], armed while an attempt
//! may have left something on its connection, undoes it in the background when dropped
//! (dropped or timed-out acquires included), and gives the reserved id back after; a wait in
//! the server's queue under way ([`InFlight`]) is ended first.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Statement;

use super::CANCEL_UNLESS_WITHIN;
use crate::backend::postgres::conn::{HoldConn, Reservation};
use crate::backend::postgres::error::PostgresError;
use crate::backend::postgres::{wire, Inner};
use crate::backend::BoxFuture;
use crate::types::loss::LossReason;

/// A lock id reserved for an acquire on a connection, and what the acquire may have left
/// there: undone in the background when dropped armed, and the id given back after.
pub(super) struct Unfinished {
    inner: Arc<Inner>,
    /// The lock's path: what the undo is counted under.
    path: Arc<str>,
    pub(super) reservation: Option<Reservation>,
    shared: bool,
    /// A writer's intent is held on the connection.
    pub(super) intent: bool,
    /// The lock may be held by this acquire (a statement was sent and no answer says it is not).
    pub(super) armed: bool,
    /// The connection is given to this acquire's wait in the server's queue
    /// ([`HoldConn::try_block`]).
    pub(super) blocked: bool,
    /// A wait in the server's queue that may still run.
    pub(super) in_flight: Option<InFlight>,
    /// The permit of a wait in the server's queue, given back with the connection (once a
    /// dropped wait is ended), so that no more connections wait than permits.
    pub(super) permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A wait in the server's queue under way: its statement's answer, and when its
/// `lock_timeout` ends it on the server.
pub(super) struct InFlight {
    pub(super) ends: tokio::time::Instant,
    pub(super) answer: BoxFuture<'static, Result<Vec<tokio_postgres::Row>, PostgresError>>,
}

impl Unfinished {
    pub(super) fn new(
        inner: &Arc<Inner>,
        path: &Arc<str>,
        reservation: Reservation,
        shared: bool,
        blocked: bool,
    ) -> Unfinished {
        Unfinished {
            inner: inner.clone(),
            path: path.clone(),
            reservation: Some(reservation),
            shared,
            intent: false,
            armed: false,
            blocked,
            in_flight: None,
            permit: None,
        }
    }
}

impl Unfinished {
    pub(super) fn conn(&self) -> &Arc<HoldConn> {
        &self.reservation.as_ref().expect("reserved").conn
    }

    pub(super) fn id(&self) -> i32 {
        self.reservation.as_ref().expect("reserved").id
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        if !self.armed && !self.intent && !self.blocked {
            return;
        }
        let (shared, intent, armed, blocked) = (self.shared, self.intent, self.armed, self.blocked);
        let in_flight = self.in_flight.take();
        let permit = self.permit.take();
        let undoing = self.inner.undos.start(&self.path);
        let inner = self.inner.clone();
        self.inner.background.spawn(&self.inner.runtime, async move {
            let conn = &reservation.conn;
            let id = reservation.id;
            if let Some(flight) = in_flight {
                if !ended(&inner, conn, flight).await {
                    conn.kill(LossReason::Disconnected);
                }
            }
            if conn.reason().is_none() {
                if armed || intent {
                    let sent = tokio::time::Instant::now();
                    let undone = conn
                        .run(conn.client().query_typed(
                            wire::UNDO,
                            &[(&id, Type::INT4), (&shared, Type::BOOL), (&intent, Type::BOOL)],
                        ))
                        .await;
                    match undone {
                        Ok(_) if blocked => conn.unblock(Some(sent)),
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(lock = id, error = %e, "zklock: could not undo a PostgreSQL acquire; closing its connection, which releases what it held");
                            conn.kill(LossReason::Disconnected);
                        }
                    }
                } else if blocked {
                    conn.unblock(None);
                }
            }
            drop(reservation);
            drop(permit);
            drop(undoing);
        });
    }
}

/// Ends a wait in the server's queue whose acquire was dropped: cancels it unless its
/// `lock_timeout` is about to end it, and waits for its answer. Whether the connection may be
/// used again (then the caller undoes whatever the wait got): the wait answered (granted, out
/// of time, or cancelled), and either no cancel was needed or the server confirmed that it
/// signalled the session, which it does before anything else can be sent on it (see
/// [`HoldConn::cancel`]): a signal that finds the wait over finds the session idle and is
/// ignored. When the cancel could not be confirmed, the wait may go on, or the signal arrive
/// later: the connection is closed then (`false`), which releases what the session holds.
async fn ended(inner: &Inner, conn: &HoldConn, flight: InFlight) -> bool {
    if conn.reason().is_some() {
        return false;
    }
    let cancel = flight.ends > tokio::time::Instant::now() + CANCEL_UNLESS_WITHIN;
    if cancel && !inner.cancel(conn).await {
        return false;
    }
    // Bounded: the wait's statement has its own limit.
    match flight.answer.await {
        Ok(_) => true,
        Err(e) => !e.is_transient(),
    }
}

impl Inner {
    /// Cancels the statement `conn` runs now from another connection of the pool (see
    /// [`HoldConn::cancel`]): `true` once the server has signalled `conn`'s session.
    async fn cancel(&self, conn: &HoldConn) -> bool {
        let bound = self.cc.connect_timeout + self.cc.reply_timeout;
        let signalled = tokio::time::timeout(bound, async {
            let sibling = self.pool.any().await?;
            Ok::<_, PostgresError>(sibling.cancel(conn).await)
        })
        .await;
        matches!(signalled, Ok(Ok(true)))
    }
}

impl InFlight {
    /// The wait in the server's queue for lock `id` of `path` on `conn`: `statement` with a
    /// `lock_timeout` of `limit`, sent at `sent` (when its answer is first polled), bounded by
    /// `limit` and the reply timeout. Owned, so that a dropped acquire can still wait for its
    /// answer (see `ended` in [`undo`](super::undo)).
    pub(super) fn start(
        inner: &Inner,
        conn: &Arc<HoldConn>,
        statement: &Statement,
        id: i32,
        path: &str,
        limit: Duration,
        sent: tokio::time::Instant,
    ) -> InFlight {
        let lock_timeout = format!("{}ms", limit.as_millis().max(1));
        let answer: BoxFuture<'static, _> = Box::pin({
            let (conn, statement, path) = (conn.clone(), statement.clone(), path.to_string());
            let bound = limit + inner.cc.reply_timeout;
            async move {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                    [&id, &path, &lock_timeout];
                conn.run_blocking(conn.client().query(&statement, &params), bound)
                    .await
            }
        });
        InFlight {
            ends: sent + limit,
            answer,
        }
    }
}
