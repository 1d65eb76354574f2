//! One acquire on the PostgreSQL backend, top-down: [`Acquire::run`] reserves the lock id on
//! a connection, decides whether the attempt waits in the server's queue (a permit, taken in
//! the order the backend's waiters came), sends the attempt ([`attempt`]: a try; [`block`]: a
//! wait in the server's queue), and turns its answer into a hold, a retry, or a wait for a
//! notified release. What an attempt may have left on its connection is undone by
//! [`Unfinished`] when the acquire ends without a hold.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Statement;

use super::conn::{HoldConn, Reservation};
use super::error::{is_cancelled, is_undefined_table, pg_error, row_keeps_changing, PostgresError};
use super::hold::PgHold;
use super::hub::{Listener, Queued, WaiterWatch};
use super::wire::{self, STALE_ID_RETRIES};
use super::Inner;
use crate::backend::backoff::Backoff;
use crate::backend::{BoxFuture, LockTarget};
use crate::types::error::Result;
use crate::types::loss::LossReason;
use crate::types::mode::Wait;
use crate::types::token::FencingToken;

/// How long a waiter sleeps without a notified release before it tries again: a holder whose
/// session ended (killed, crashed, partitioned past the lease) released without notifying.
const POLL_FALLBACK: Duration = Duration::from_millis(500);
/// How many acquires of one backend wait in the server's lock queue at a time, each on a
/// connection of its own; the others wait by retrying on notified releases.
pub(super) const QUEUED_WAITS: usize = 4;
/// The longest one wait in the server's queue lasts before it is sent again (its
/// `lock_timeout`): what bounds how long a waiter whose connection went silent without
/// breaking (a partition) keeps waiting for an answer that cannot come.
const QUEUE_SLICE: Duration = Duration::from_secs(30);
/// A wait in the server's queue whose `lock_timeout` ends within this of its acquire being
/// dropped is left to end by itself; a longer one is cancelled.
const CANCEL_UNLESS_WITHIN: Duration = Duration::from_millis(50);
/// How long a wait in the server's queue lasts before it is registered (see
/// [`Hub::queued`](super::hub::Hub::queued)): a grant within this is taken as one of a free lock.
const QUEUE_NOTICE: Duration = Duration::from_millis(5);
/// How long a lock id counts as contended in this process after an attempt found it taken or
/// a grant found a waiter: meanwhile an acquire of it waits in the server's queue at once,
/// where a try would most likely be refused first (a round trip lost); afterwards it tries
/// first, which costs the server less than a wait's statement.
pub(super) const CONTENDED_FOR: Duration = Duration::from_secs(1);
/// Past this many lock ids counted as contended, those that no longer are are forgotten.
const CONTENDED_PRUNE: usize = 256;

/// A lock id reserved for an acquire on a connection, and what the acquire may have left
/// there: undone in the background when dropped armed, and the id given back after.
pub(super) struct Unfinished {
    inner: Arc<Inner>,
    reservation: Option<Reservation>,
    shared: bool,
    /// A writer's intent is held on the connection.
    intent: bool,
    /// The lock may be held by this acquire (a statement was sent and no answer says it is not).
    armed: bool,
    /// The connection is given to this acquire's wait in the server's queue
    /// ([`HoldConn::try_block`]).
    blocked: bool,
    /// A wait in the server's queue that may still run.
    in_flight: Option<InFlight>,
    /// The permit of a wait in the server's queue, given back with the connection (once a
    /// dropped wait is ended), so that no more connections wait than permits.
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// A wait in the server's queue under way: its statement's answer, and when its
/// `lock_timeout` ends it on the server.
struct InFlight {
    ends: tokio::time::Instant,
    answer: BoxFuture<'static, Result<Vec<tokio_postgres::Row>, PostgresError>>,
}

impl Unfinished {
    fn new(
        inner: &Arc<Inner>,
        reservation: Reservation,
        shared: bool,
        blocked: bool,
    ) -> Unfinished {
        Unfinished {
            inner: inner.clone(),
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
    fn conn(&self) -> &Arc<HoldConn> {
        &self.reservation.as_ref().expect("reserved").conn
    }

    fn id(&self) -> i32 {
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
        let undoing = self.inner.undos.start(&reservation.id);
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
    /// Whether `id` was found contended within [`CONTENDED_FOR`]: an acquire of it then
    /// waits in the server's queue at once instead of trying first.
    fn contended(&self, id: i32) -> bool {
        self.contended
            .lock()
            .expect("not poisoned")
            .get(&id)
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR)
    }

    /// Notes that an attempt found `id` taken, or a grant found a waiter.
    fn mark_contended(&self, id: i32) {
        let mut contended = self.contended.lock().expect("not poisoned");
        let now = std::time::Instant::now();
        if contended.len() >= CONTENDED_PRUNE {
            contended.retain(|_, at| now.duration_since(*at) < CONTENDED_FOR);
        }
        contended.insert(id, now);
    }

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

/// What an attempt found.
enum Attempt {
    /// Granted, with the token, whether a waiter was registered then, and the watch for
    /// waiters registering since.
    Granted(i64, bool, WaiterWatch),
    /// The lock is held on the session, but the key table's row no longer names the path.
    Stale,
    Taken,
}

/// One acquire of a lock on this backend, between its attempts: the lock id reserved on a
/// connection and what the attempts left there, how it waits, and its retry state.
pub(super) struct Acquire<'a> {
    inner: &'a Arc<Inner>,
    target: &'a LockTarget,
    /// A reader's acquire.
    shared: bool,
    /// A writer's acquire: takes an intent while it retries (new readers queue behind it).
    writer: bool,
    wait: Wait,
    unfinished: Option<Unfinished>,
    /// Releases of the lock notified to this backend, once the acquire waits by retrying.
    listener: Option<Listener>,
    /// The pause before retrying after a failure on a connection.
    backoff: Backoff,
    /// How often the key table's row was found not to name the path.
    stale: u32,
    /// A permit to wait in the server's queue.
    permit: Option<OwnedSemaphorePermit>,
    /// An attempt found the lock taken.
    taken_once: bool,
    /// This acquire's place in the line for a permit, once it waits by retrying: the
    /// backend's waiters take freed waits in the server's queue in the order they came.
    turn: Option<BoxFuture<'static, Option<OwnedSemaphorePermit>>>,
}

impl<'a> Acquire<'a> {
    pub(super) fn new(
        inner: &'a Arc<Inner>,
        target: &'a LockTarget,
        shared: bool,
        writer: bool,
        wait: Wait,
    ) -> Acquire<'a> {
        Acquire {
            inner,
            target,
            shared,
            writer,
            wait,
            unfinished: None,
            listener: None,
            backoff: Backoff::requests(),
            stale: 0,
            permit: None,
            taken_once: false,
            turn: None,
        }
    }

    /// Acquires the hold, waiting as `wait` says: in the server's lock queue while a permit
    /// is free, else by retrying on notified releases. `None`: a try found the lock taken.
    pub(super) async fn run(mut self) -> Result<Option<PgHold>> {
        loop {
            if !self.reserve().await? || !self.queue_wait().await? {
                continue;
            }
            let blocked = self.unfinished.as_ref().expect("reserved").blocked;
            match self.attempt(blocked).await {
                Ok(Attempt::Granted(token, waiting, waiters)) => {
                    return Ok(Some(self.granted(token, waiting, waiters).await));
                }
                Ok(Attempt::Stale) => self.stale_id(None)?,
                Ok(Attempt::Taken) if matches!(self.wait, Wait::Never) => {
                    self.inner.mark_contended(self.id());
                    return Ok(None);
                }
                Ok(Attempt::Taken) => self.taken(blocked).await?,
                Err(e) => self.failed(e).await?,
            }
        }
    }

    fn id(&self) -> i32 {
        self.unfinished.as_ref().expect("reserved").id()
    }

    /// Backs off after a failure on a connection.
    async fn back_off(&mut self, e: &PostgresError, what: &str) {
        tracing::debug!(key = %self.target.key, error = %e, "zklock: {what}; retrying");
        self.backoff.wait().await;
    }

    /// Reserves the lock id on a connection, unless the acquire has one that is not lost
    /// (then it starts again elsewhere). `false`: none now, retry.
    async fn reserve(&mut self) -> Result<bool> {
        if (self.unfinished.as_ref()).is_some_and(|p| p.conn().reason().is_some()) {
            self.unfinished = None;
        }
        if self.unfinished.is_some() {
            return Ok(true);
        }
        let inner = self.inner;
        let reserved = async {
            let id = inner.id_of(&self.target.path).await?;
            inner.undos.finished(&id).await;
            inner.pool.reserve(id).await
        };
        match reserved.await {
            Ok(reservation) => {
                let p = Unfinished::new(inner, reservation, self.shared, false);
                self.unfinished = Some(p);
                Ok(true)
            }
            Err(e) if e.is_transient() => {
                self.back_off(&e, "no PostgreSQL connection for an acquire")
                    .await;
                Ok(false)
            }
            Err(e) => Err(pg_error("acquire the lock")(e)),
        }
    }

    /// Gives the attempt a wait in the server's queue when a permit is free, once a try found
    /// the lock taken or it was found contended lately (a free key is taken by a try, which
    /// costs the server less): on this connection if nothing else uses it (then the wait is
    /// the attempt), else, once a try found the lock taken, on one of its own. `false`: no
    /// connection now, retry.
    async fn queue_wait(&mut self) -> Result<bool> {
        let inner = self.inner;
        let p = self.unfinished.as_mut().expect("reserved");
        if matches!(self.wait, Wait::Never)
            || p.blocked
            || !(self.taken_once || inner.contended(p.id()))
        {
            return Ok(true);
        }
        if self.permit.is_none() {
            self.permit = match &mut self.turn {
                Some(t) => t.now_or_never().flatten(),
                None => inner.queued.clone().try_acquire_owned().ok(),
            };
            if self.permit.is_some() {
                self.turn = None;
            }
        }
        if self.permit.is_none() {
            return Ok(true);
        }
        if !p.intent && p.conn().try_block(p.id()) {
            p.blocked = true;
            p.permit = self.permit.take();
            return Ok(true);
        }
        if !self.taken_once {
            self.permit = None;
            return Ok(true);
        }
        match inner.pool.reserve_blocked(p.id()).await {
            Ok(Some(reservation)) => {
                let mut p = Unfinished::new(inner, reservation, self.shared, true);
                p.permit = self.permit.take();
                // Nothing armed on the one before: given back at once (a writer's intent
                // undone).
                self.unfinished = Some(p);
                Ok(true)
            }
            // Every connection the backend may open is in use: this acquire waits by
            // retrying, as those beyond the bound on waits do.
            Ok(None) => {
                self.permit = None;
                Ok(true)
            }
            Err(e) if e.is_transient() => {
                self.unfinished = None;
                self.back_off(&e, "no PostgreSQL connection for an acquire")
                    .await;
                Ok(false)
            }
            Err(e) => Err(pg_error("acquire the lock")(e)),
        }
    }

    /// Sends the attempt: a wait in the server's queue on a connection given to it
    /// (`blocked`), else a try.
    async fn attempt(&mut self, blocked: bool) -> Result<Attempt, PostgresError> {
        let p = self.unfinished.as_mut().expect("reserved");
        if blocked || self.listener.as_ref().is_some_and(|l| l.id() != p.id()) {
            self.listener = None;
        }
        if let Some(l) = &mut self.listener {
            l.mark();
        }
        if blocked {
            block(self.inner, p, &self.target.path, self.shared, self.wait).await
        } else {
            attempt(self.inner, p, &self.target.path, self.shared).await
        }
    }

    /// The hold of a granted attempt (a writer's intent dropped first).
    async fn granted(&mut self, token: i64, waiting: bool, waiters: WaiterWatch) -> PgHold {
        let mut p = self.unfinished.take().expect("reserved");
        if waiting {
            self.inner.mark_contended(p.id());
        }
        if p.intent {
            let conn = p.conn().clone();
            let id = p.id();
            // Failing closes the connection: the hold is then lost, and says so.
            let _ = conn
                .run(
                    conn.client()
                        .query_typed(wire::DROP_INTENT, &[(&id, Type::INT4)]),
                )
                .await;
            p.intent = false;
        }
        p.armed = false;
        let reservation = p.reservation.take().expect("reserved");
        let token = FencingToken::new(token, 0);
        PgHold::new(
            self.inner.clone(),
            self.target,
            reservation,
            self.shared,
            token,
        )
        .watching(waiting, waiters)
    }

    /// The key table's row no longer names the path (or the table is gone: `e`): what was
    /// reserved is undone and given back in the background, and the id looked up again, a
    /// few times at most.
    fn stale_id(&mut self, e: Option<PostgresError>) -> Result<()> {
        self.inner.forget(&self.target.path);
        self.unfinished = None;
        self.stale += 1;
        if self.stale <= STALE_ID_RETRIES {
            return Ok(());
        }
        Err(match e {
            Some(e) => pg_error("acquire the lock")(e),
            None => row_keeps_changing(&self.target.key),
        })
    }

    /// The attempt found the lock taken: a wait in the server's queue whose slice ran out
    /// waits again; otherwise the acquire gets in line for a wait there, and meanwhile waits
    /// for a notified release (a writer behind its intent).
    async fn taken(&mut self, blocked: bool) -> Result<()> {
        self.backoff.reset();
        self.inner.mark_contended(self.id());
        if blocked {
            return Ok(());
        }
        self.taken_once = true;
        if self.turn.is_none() {
            if self.inner.queued.available_permits() > 0 {
                // A permit is free (nobody is in line): wait in the server's queue.
                return Ok(());
            }
            // In line for a permit, behind the backend's waiters that came before.
            let queued = self.inner.queued.clone();
            self.turn = Some(Box::pin(async move { queued.acquire_owned().await.ok() }));
        }
        if self.writer && !self.take_intent().await? {
            return Ok(());
        }
        let Some(l) = &mut self.listener else {
            // Register as a waiter (so the next release notifies), then try again at once:
            // a release may have come before.
            let mut l = self.inner.hub.listen(self.id());
            l.registered(POLL_FALLBACK).await;
            self.listener = Some(l);
            return Ok(());
        };
        match &mut self.turn {
            Some(t) => tokio::select! {
                got = t => {
                    self.permit = got;
                    self.turn = None;
                }
                _ = l.wait(POLL_FALLBACK) => {}
            },
            None => l.wait(POLL_FALLBACK).await,
        }
        Ok(())
    }

    /// Takes a retrying writer's intent, unless it holds it. `false`: the connection failed
    /// or the request was cancelled, try again at once.
    async fn take_intent(&mut self) -> Result<bool> {
        let p = self.unfinished.as_mut().expect("reserved");
        if p.intent {
            return Ok(true);
        }
        let conn = p.conn().clone();
        let id = p.id();
        // Set before the answer: if this is dropped, the undo drops it.
        p.intent = true;
        let taken = conn
            .run(
                conn.client()
                    .query_typed(wire::TAKE_INTENT, &[(&id, Type::INT4)]),
            )
            .await;
        match taken {
            Ok(rows) => {
                p.intent = rows.first().is_some_and(|r| r.get(0));
                Ok(true)
            }
            Err(e) if e.is_transient() => Ok(false),
            // Whether the intent is held is unknown: undone in the background.
            Err(e) if is_cancelled(&e) => {
                self.unfinished = None;
                Ok(false)
            }
            Err(e) => Err(pg_error("acquire the lock")(e)),
        }
    }

    /// The attempt failed: a table dropped meanwhile is made again, a failure on the
    /// connection or a cancel that this acquire did not ask for (an operator's) is retried,
    /// anything else is the acquire's error.
    async fn failed(&mut self, e: PostgresError) -> Result<()> {
        if is_undefined_table(&e) {
            // Undone in the background; the next lookup makes the table again.
            return self.stale_id(Some(e));
        }
        if e.is_transient() || is_cancelled(&e) {
            self.unfinished = None;
            self.back_off(&e, "a PostgreSQL acquire attempt failed")
                .await;
            return Ok(());
        }
        Err(pg_error("acquire the lock")(e))
    }
}

/// One attempt on `unfinished`'s connection: one statement that tries the lock and, if it
/// got it, takes the grant's token from the key row (see "Tokens" in the module docs of
/// [`wire`]).
async fn attempt(
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
async fn block(
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

impl InFlight {
    /// The wait in the server's queue for lock `id` of `path` on `conn`: `statement` with a
    /// `lock_timeout` of `limit`, sent at `sent` (when its answer is first polled), bounded by
    /// `limit` and the reply timeout. Owned, so that a dropped acquire can still wait for its
    /// answer (see [`ended`]).
    fn start(
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
