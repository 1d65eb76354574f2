//! One attempt of an acquire on its reserved connection: a try ([`attempt`]) or a wait in the
//! server's queue ([`block`]), and what its answer says ([`grant_of`]).

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};

use super::undo::{InFlight, Unfinished};
use super::{Attempt, QUEUE_NOTICE, QUEUE_SLICE};
use crate::backend::postgres::conn::HoldConn;
use crate::backend::postgres::error::PostgresError;
use crate::backend::postgres::hub::{Queued, WaiterWatch};
use crate::backend::postgres::{wire, Inner};
use crate::types::mode::Wait;

/// One attempt on `unfinished`'s connection: one statement that tries the lock and, if it
/// got it, takes the grant's token from the key row (see "Tokens" in the module docs of
/// [`wire`]).
pub(super) async fn attempt(
    inner: &Inner,
    unfinished: &mut Unfinished,
    path: &str,
    shared: bool,
) -> Result<Attempt, PostgresError> {
    let id = unfinished.id();
    let conn = unfinished.conn().clone();
    let statements = conn.statements().await?;
    // Before the attempt: a waiter registering after it is not missed.
    let waiters = inner.hub.watch_waiters(id);
    unfinished.armed = true;
    let attempt = if shared {
        &statements.try_shared
    } else {
        &statements.try_exclusive
    };
    let rows = conn
        .run(conn.client().query(attempt, &[&id, &path]))
        .await?;
    let row = rows.first();
    if !row.is_some_and(|r| r.get::<_, bool>(0)) {
        unfinished.armed = false;
        return Ok(Attempt::Taken);
    }
    // No token: the row no longer names the path, and nothing was written.
    Ok(grant_of(&rows, waiters))
}

/// One wait in the server's lock queue on `unfinished`'s connection, given to it: one
/// statement that blocks in `pg_advisory_lock` (or `_shared`) until the server grants the
/// lock, then takes the grant's token as [`attempt`] does. The wait lasts
/// until the caller's deadline or [`QUEUE_SLICE`] (the statement's `lock_timeout`); then
/// `Taken`, with whatever the statement may have got undone, and the connection still
/// given to the acquire for its next wait.
pub(super) async fn block(
    inner: &Inner,
    unfinished: &mut Unfinished,
    path: &str,
    shared: bool,
    wait: Wait,
) -> Result<Attempt, PostgresError> {
    let id = unfinished.id();
    let conn = unfinished.conn().clone();
    let statements = conn.statements().await?;
    let limit = queue_limit(wait);
    let statement = if shared {
        &statements.block_shared
    } else {
        &statements.block_exclusive
    };
    // Before the wait: a waiter registering after the grant is not missed.
    let waiters = inner.hub.watch_waiters(id);
    unfinished.armed = true;
    let sent = tokio::time::Instant::now();
    let flight = unfinished.in_flight.insert(InFlight::start(
        inner, &conn, statement, id, path, limit, sent,
    ));
    // The registration, if any, is kept until the answer has been dealt with.
    let (rows, _queued) = answer(inner, flight, id).await;
    unfinished.in_flight = None;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) if e.get_ref().and_then(|e| e.code()) == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
            undo_ran_out(&conn, id, shared).await?;
            unfinished.armed = false;
            return Ok(Attempt::Taken);
        }
        Err(e) => return Err(e),
    };
    let answered = last_heard(inner, &conn, sent).await?;
    conn.unblock(Some(answered));
    unfinished.blocked = false;
    Ok(grant_of(&rows, waiters))
}

/// How long one wait in the server's queue may last (its `lock_timeout`): until `wait`'s
/// deadline, at most [`QUEUE_SLICE`], at least 1 ms.
fn queue_limit(wait: Wait) -> Duration {
    let now = tokio::time::Instant::now();
    match wait {
        Wait::Until(deadline, _) => deadline.saturating_duration_since(now),
        _ => QUEUE_SLICE,
    }
    .clamp(Duration::from_millis(1), QUEUE_SLICE)
}

/// Waits for the answer of `flight`, the wait in the server's queue for lock `id`, and returns
/// it with the wait's registration, if it was made.
///
/// A wait not granted at once is registered, so that holders learn of it (see the
/// module docs of `wire`); one granted at once is not (a process that takes a free key
/// again and again would find its own registration, and believe someone waits).
/// Cancelled, the registration ends, and `flight` is left to its owner.
async fn answer(
    inner: &Inner,
    flight: &mut InFlight,
    id: i32,
) -> (
    Result<Vec<tokio_postgres::Row>, PostgresError>,
    Option<Queued>,
) {
    let mut queued = None;
    let rows = tokio::select! {
        biased;
        rows = &mut flight.answer => rows,
        _ = tokio::time::sleep(QUEUE_NOTICE) => {
            queued = Some(inner.hub.queued(id));
            (&mut flight.answer).await
        }
    };
    (rows, queued)
}

/// The wait ran out, perhaps after the lock was got (in the row's update): undoes on `conn`
/// whatever it got of lock `id` (one request).
async fn undo_ran_out(conn: &HoldConn, id: i32, shared: bool) -> Result<(), PostgresError> {
    let undo: [(&(dyn ToSql + Sync), Type); 3] = [
        (&id, Type::INT4),
        (&shared, Type::BOOL),
        (&false, Type::BOOL),
    ];
    conn.run(conn.client().query_typed(wire::UNDO, &undo))
        .await?;
    Ok(())
}

/// When the server last heard from `conn`'s session, for a wait sent at `sent` that was
/// granted: the session answered after the wait ended, and the server counts its idle
/// timeout from then, no earlier than the statement's sending; after a long wait, it is
/// asked again (one ping), and that ping's sending counts.
async fn last_heard(
    inner: &Inner,
    conn: &HoldConn,
    sent: tokio::time::Instant,
) -> Result<tokio::time::Instant, PostgresError> {
    if inner.cc.deadline(sent) >= tokio::time::Instant::now() + inner.cc.lease / 3 {
        return Ok(sent);
    }
    let ping = tokio::time::Instant::now();
    conn.run(conn.client().simple_query(wire::PING)).await?;
    Ok(ping)
}

/// What the answer of an attempt that got the lock says: the grant's token and whether a
/// waiter was registered then, or (no token) that the key table's row no longer names the
/// path.
fn grant_of(rows: &[tokio_postgres::Row], waiters: WaiterWatch) -> Attempt {
    let row = rows.first();
    let waiting = row.is_none_or(|r| r.get::<_, Option<bool>>(2) != Some(false));
    match row.and_then(|r| r.get::<_, Option<i64>>(1)) {
        Some(token) => Attempt::Granted(token, waiting, waiters),
        None => Attempt::Stale,
    }
}
