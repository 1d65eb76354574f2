//! The PostgreSQL backend (feature `postgres`): session-level advisory locks held on
//! connections the backend owns.
//!
//! - A lock path gets an id from the key table `zklock_keys` (a `serial`, so no two paths
//!   share one), and its lock is the advisory lock `(LOCK_CLASS, id)`; see [`sql`].
//! - An acquire of a free key is one statement on a holding connection:
//!   `pg_try_advisory_lock` (or `_shared` for readers) and, once it got the lock, the raise of
//!   the path's `fence` under it, which is the fencing token, committed without waiting for the
//!   WAL flush when it is the server's clock reading (see [`sql`]). See [`conn`] for which
//!   connection holds what.
//! - A hold is lost the moment its connection breaks (the server ended the session:
//!   `pg_terminate_backend`, a restart) or a liveness check (every lease/3) fails, and at the
//!   latest when no check was confirmed before the server could have ended the idle session:
//!   each holding session runs with `idle_session_timeout` = the lease, so the locks of a
//!   holder that went silent (paused, partitioned) are released by the server after the
//!   lease, and this side reports the loss before that (less the same margin as Redis).
//! - An acquire that found the key taken, or of a key found contended within
//!   [`CONTENDED_FOR`], waits in the server's queue instead (its statement is then its
//!   attempt): up to [`QUEUED_WAITS`] acquires of a backend wait in the server's lock queue,
//!   each blocked in `pg_advisory_lock` on a connection given to it (the connection then holds the
//!   lock once granted): the server grants in the order it queued them, inside the release.
//!   The wait ends by the statement's own `lock_timeout` at the deadline; an acquire dropped
//!   before cancels it from another session (see [`HoldConn::cancel`]: the cancel cannot
//!   reach any later statement of the waiting session) and then sends an undo, which releases
//!   a lock granted just as it was dropped (see [`Unfinished`]). A statement of an acquire
//!   cancelled by anyone else (`pg_cancel_backend` by an operator) is sent again, within the
//!   acquire's deadline. A waiting connection that breaks held nothing: the acquire
//!   waits again on another one, at the back of the queue.
//! - Further waiters hold no connection: they try, then sleep until a release of their lock is
//!   notified (`LISTEN`/`NOTIFY` on one listening connection per backend, see [`hub`]) or
//!   [`POLL_FALLBACK`] passes (a session that ended releases without notifying), and whenever
//!   a wait in the server's queue is free they take it. The listening session has the same
//!   lease and checks as the holding ones: a process cut off for good leaves no session (and
//!   no waiter registration) on the server past the lease.
//! - A writer waiting in the server's queue makes new readers wait behind it (the server does
//!   not grant a lock that conflicts with a queued request); a writer that retries takes an
//!   intent lock that does (writers are not starved by readers). Among waits in the server's
//!   queue the order is the server's; retrying waiters keep none; the local queue keeps FIFO
//!   within a process.
//! - Semaphores and revocation do not fit advisory locks cleanly: [`Error::Unsupported`].
//!   Job records (`claim_run`) live in the key table (`run_after`, by the server's clock).
//!
//! ## Why `tokio-postgres`
//!
//! It is the protocol client alone: tokio, `postgres-protocol` and a few small crates, about
//! a minute of a 2-core build. `sqlx` brings its own pool, compile-time query macros, a
//! runtime abstraction and more, several times the build, for nothing this backend uses: it
//! needs to own its connections (a lock belongs to one session, so no pool may hand the
//! session to someone else), one round trip per statement (`query_typed`: no prepare), and
//! the connection's `LISTEN` messages, which `tokio-postgres` gives directly
//! (`Connection::poll_message`). No TLS is built in (a TLS tunnel, or a server on a private
//! network); a URL asking for `sslmode=require` fails to connect with the client's error.
//!
//! Advisory locks need a real session: behind PgBouncer in transaction pooling mode they do
//! not work (use session pooling or a direct connection).

mod conn;
mod hold;
mod hub;
mod inspect;
mod options;
mod sql;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures::FutureExt;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::undos::Undos;
use super::{Backend, BackendHold, BoxFuture, Inspect, LockTarget, SharedHold, HOST_PID};
use crate::background::Background;
use crate::types::error::{Error, PostgresError, Result};
use crate::types::loss::LossReason;
use crate::types::mode::{LockMode, Wait};
use crate::types::token::FencingToken;
use conn::{ConnConfig, HoldConn, Pool, Reservation};
use hold::PgHold;
use hub::{Hub, Listener, WaiterWatch};
pub use options::PostgresOptions;

/// The longest any single request waits for its reply; shorter when the lease is.
const MAX_REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// The first pause before retrying an attempt that failed on the connection; doubled up to
/// [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// How long a waiter sleeps without a notified release before it tries again: a holder whose
/// session ended (killed, crashed, partitioned past the lease) released without notifying.
pub(crate) const POLL_FALLBACK: Duration = Duration::from_millis(500);
/// The shortest lease accepted: liveness checks go out every lease/3, and the server counts
/// `idle_session_timeout` in milliseconds.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(300);
/// How many times an acquire looks a path's id up again after finding it stale before giving
/// up (someone keeps dropping the key table).
const STALE_ID_RETRIES: u32 = 3;
/// How many acquires of one backend wait in the server's lock queue at a time, each on a
/// connection of its own; the others wait by retrying on notified releases.
pub(crate) const QUEUED_WAITS: usize = 4;
/// The longest one wait in the server's queue lasts before it is sent again (its
/// `lock_timeout`): what bounds how long a waiter whose connection went silent without
/// breaking (a partition) keeps waiting for an answer that cannot come.
const QUEUE_SLICE: Duration = Duration::from_secs(30);
/// A wait in the server's queue whose `lock_timeout` ends within this of its acquire being
/// dropped is left to end by itself; a longer one is cancelled.
const CANCEL_UNLESS_WITHIN: Duration = Duration::from_millis(50);
/// How long a wait in the server's queue lasts before it is registered (see
/// [`Hub::queued`]): a grant within this is taken as one of a free lock.
const QUEUE_NOTICE: Duration = Duration::from_millis(5);
/// How long a lock id counts as contended in this process after an attempt found it taken or
/// a grant found a waiter: meanwhile an acquire of it waits in the server's queue at once,
/// where a try would most likely be refused first (a round trip lost); afterwards it tries
/// first, which costs the server less than a wait's statement.
const CONTENDED_FOR: Duration = Duration::from_secs(1);
/// Past this many lock ids counted as contended, those that no longer are are forgotten.
const CONTENDED_PRUNE: usize = 256;

/// What the PostgreSQL backend is configured with (its part of [`Builder`](crate::Builder)).
#[derive(Debug, Clone)]
pub(crate) struct PostgresConfig {
    /// `postgres://[user[:password]@]host[:port][/database][?options]`, or the key=value form.
    pub(crate) url: String,
    /// The server ends a holding session idle this long, and a hold is reported lost before.
    pub(crate) lease: Duration,
    /// How long opening a connection may take.
    pub(crate) connect_timeout: Duration,
    /// Shown in the sessions' `application_name` beside host and pid.
    pub(crate) identity: Option<String>,
    /// Whether grants take fencing tokens (a write of the key's row each).
    pub(crate) tokens: bool,
}

/// What the backend's holds and tasks share.
pub(crate) struct Inner {
    pool: Pool,
    cc: Arc<ConnConfig>,
    /// One permit per acquire that waits in the server's lock queue ([`QUEUED_WAITS`]).
    queued: Arc<tokio::sync::Semaphore>,
    hub: Hub,
    /// Lock path -> id, as read from the key table; checked by every acquire.
    ids: StdMutex<HashMap<Arc<str>, i32>>,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) background: Arc<Background>,
    /// Undos of dropped acquires under way, per lock id: a later acquire of the id in this
    /// process waits for them, so that it never finds the lock held by a wait it gave up on
    /// (granted just as it was dropped, and not released yet).
    undos: Arc<Undos<i32>>,
    /// Lock id -> when an attempt last found it taken or a grant found a waiter (see
    /// [`CONTENDED_FOR`]).
    contended: StdMutex<HashMap<i32, std::time::Instant>>,
}

/// A postgres error during `operation`.
fn pg_error(operation: &'static str) -> impl FnOnce(PostgresError) -> Error {
    move |source| Error::Postgres { operation, source }
}

fn is_undefined_table(e: &PostgresError) -> bool {
    e.get_ref().and_then(|e| e.code()) == Some(&SqlState::UNDEFINED_TABLE)
}

/// A statement cancelled by someone else: this backend's own cancels end only waits whose
/// acquire was dropped, so an acquire that meets one (an operator's `pg_cancel_backend`) sends
/// its statement again.
fn is_cancelled(e: &PostgresError) -> bool {
    e.get_ref().and_then(|e| e.code()) == Some(&SqlState::QUERY_CANCELED)
}

impl Inner {
    /// Creates the key table unless it is there.
    async fn ensure_schema(&self, conn: &HoldConn) -> Result<(), PostgresError> {
        let exists = conn
            .run(conn.client().query_typed(sql::SCHEMA_EXISTS, &[]))
            .await?;
        if exists.first().is_some_and(|r| r.get::<_, bool>(0)) {
            return Ok(());
        }
        conn.run(conn.client().batch_execute(sql::CREATE_SCHEMA))
            .await
    }

    /// The lock id of `path`: from the cache, else from the key table (adding the path).
    async fn id_of(&self, path: &Arc<str>) -> Result<i32, PostgresError> {
        if let Some(id) = self.ids.lock().expect("not poisoned").get(path) {
            return Ok(*id);
        }
        let conn = self.pool.any().await?;
        let find = || async {
            conn.run(
                conn.client()
                    .query_typed(sql::FIND_ID, &[(&&**path, Type::TEXT)]),
            )
            .await
            .map(|rows| rows.first().map(|r| r.get::<_, i32>(0)))
        };
        let mut created = false;
        loop {
            let found = match find().await {
                Ok(Some(id)) => Some(id),
                Ok(None) => {
                    conn.run(
                        conn.client()
                            .query_typed(sql::ADD_PATH, &[(&&**path, Type::TEXT)]),
                    )
                    .await?;
                    find().await?
                }
                // The table was dropped since this backend started: make it again, once.
                Err(e) if is_undefined_table(&e) && !created => {
                    created = true;
                    self.ensure_schema(&conn).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(id) = found {
                self.ids
                    .lock()
                    .expect("not poisoned")
                    .insert(path.clone(), id);
                return Ok(id);
            }
        }
    }

    /// Forgets the id of `path` (its row no longer names it).
    fn forget(&self, path: &str) {
        self.ids.lock().expect("not poisoned").remove(path);
    }

    /// Whether `id` was found contended within [`CONTENDED_FOR`]: an acquire of it then
    /// waits in the server's queue at once instead of trying first.
    fn contended(&self, id: i32) -> bool {
        self.contended
            .lock()
            .expect("not poisoned")
            .get(&id)
            .is_some_and(|at| at.elapsed() < CONTENDED_FOR)
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

    /// Notes that an attempt found `id` taken, or a grant found a waiter.
    fn mark_contended(&self, id: i32) {
        let mut contended = self.contended.lock().expect("not poisoned");
        let now = std::time::Instant::now();
        if contended.len() >= CONTENDED_PRUNE {
            contended.retain(|_, at| now.duration_since(*at) < CONTENDED_FOR);
        }
        contended.insert(id, now);
    }
}

/// A lock id reserved for an acquire on a connection, and what the acquire may have left
/// there: undone in the background when dropped armed, and the id given back after.
struct Unfinished {
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
                            sql::UNDO,
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

/// What an attempt found.
enum Attempt {
    /// Granted, with the token, whether a waiter was registered then, and the watch for
    /// waiters registering since.
    Granted(i64, bool, WaiterWatch),
    /// The lock is held on the session, but the key table's row no longer names the path.
    Stale,
    Taken,
}

/// The PostgreSQL backend; see [`LockManager::connect`](crate::LockManager::connect).
pub(crate) struct PostgresBackend {
    inner: Arc<Inner>,
}

impl PostgresBackend {
    /// Opens a first connection, creates the key table unless it is there, and starts
    /// listening for releases.
    ///
    /// # Errors
    /// [`Error::Config`] for a URL the client refuses, [`Error::Postgres`] when the server
    /// does not answer or refuses the schema.
    pub(crate) async fn connect(config: PostgresConfig) -> Result<PostgresBackend> {
        // The URL may carry a password: errors name the problem, not the URL.
        let mut pg: tokio_postgres::Config = config
            .url
            .parse()
            .map_err(|e| Error::Config(format!("the PostgreSQL URL is not usable: {e}")))?;
        if pg.get_application_name().is_none() {
            let mut name = format!("zklock {}", *HOST_PID);
            if let Some(id) = &config.identity {
                name.push_str(" id=");
                name.push_str(id);
            }
            // The server keeps 63 bytes.
            let mut end = name.len().min(63);
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            name.truncate(end);
            pg.application_name(&name);
        }
        pg.connect_timeout(config.connect_timeout);
        let lease = config.lease;
        let cc = Arc::new(ConnConfig {
            config: pg,
            lease,
            margin: lease / 100 + Duration::from_millis(2) + lease / 20,
            connect_timeout: config.connect_timeout,
            reply_timeout: lease.min(MAX_REPLY_TIMEOUT),
            runtime: tokio::runtime::Handle::current(),
            tokens: config.tokens,
            freed: tokio::sync::Notify::new(),
        });
        let pool = Pool::new(cc.clone());
        let inner = Arc::new(Inner {
            hub: Hub::start(cc.clone()),
            pool,
            cc,
            queued: Arc::new(tokio::sync::Semaphore::new(QUEUED_WAITS)),
            ids: StdMutex::default(),
            runtime: tokio::runtime::Handle::current(),
            background: Arc::default(),
            undos: Arc::default(),
            contended: StdMutex::default(),
        });
        let conn = inner.pool.any().await.map_err(pg_error("connect"))?;
        inner
            .ensure_schema(&conn)
            .await
            .map_err(pg_error("create the table zklock_keys"))?;
        Ok(PostgresBackend { inner })
    }

    /// One attempt on `unfinished`'s connection: one statement that tries the lock and, if it
    /// got it, takes the grant's token from the key row (see "Tokens" in the module docs of
    /// [`sql`]).
    async fn attempt(
        &self,
        unfinished: &mut Unfinished,
        path: &str,
        shared: bool,
    ) -> Result<Attempt, PostgresError> {
        let id = unfinished.id();
        let conn = unfinished.conn().clone();
        let statements = conn.statements().await?;
        // Before the attempt: a waiter registering after it is not missed.
        let waiters = self.inner.hub.watch_waiters(id);
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
        let waiting = row.is_none_or(|r| r.get::<_, Option<bool>>(2) != Some(false));
        Ok(match row.and_then(|r| r.get::<_, Option<i64>>(1)) {
            Some(token) => Attempt::Granted(token, waiting, waiters),
            // The row no longer names the path: nothing was written.
            None => Attempt::Stale,
        })
    }

    /// One wait in the server's lock queue on `unfinished`'s connection, given to it: one
    /// statement that blocks in `pg_advisory_lock` (or `_shared`) until the server grants the
    /// lock, then takes the grant's token as [`attempt`](Self::attempt) does. The wait lasts
    /// until the caller's deadline or [`QUEUE_SLICE`] (the statement's `lock_timeout`); then
    /// `Taken`, with whatever the statement may have got undone, and the connection still
    /// given to the acquire for its next wait.
    async fn block(
        &self,
        unfinished: &mut Unfinished,
        path: &str,
        shared: bool,
        wait: Wait,
    ) -> Result<Attempt, PostgresError> {
        let inner = &self.inner;
        let id = unfinished.id();
        let conn = unfinished.conn().clone();
        let statements = conn.statements().await?;
        let now = tokio::time::Instant::now();
        let limit = match wait {
            Wait::Until(deadline, _) => deadline.saturating_duration_since(now),
            _ => QUEUE_SLICE,
        }
        .clamp(Duration::from_millis(1), QUEUE_SLICE);
        let lock_timeout = format!("{}ms", limit.as_millis().max(1));
        let statement = if shared {
            &statements.block_shared
        } else {
            &statements.block_exclusive
        };
        // Before the wait: a waiter registering after the grant is not missed.
        let waiters = inner.hub.watch_waiters(id);
        unfinished.armed = true;
        let sent = tokio::time::Instant::now();
        // Owned, so that a dropped acquire can still wait for its answer (see `ended`).
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
        let flight = unfinished.in_flight.insert(InFlight {
            ends: sent + limit,
            answer,
        });
        // A wait not granted at once is registered, so that holders learn of it (see the
        // module docs of `sql`); one granted at once is not (a process that takes a free key
        // again and again would find its own registration, and believe someone waits).
        let mut _queued = None;
        let rows = tokio::select! {
            biased;
            rows = &mut flight.answer => rows,
            _ = tokio::time::sleep(QUEUE_NOTICE) => {
                _queued = Some(inner.hub.queued(id));
                (&mut flight.answer).await
            }
        };
        unfinished.in_flight = None;
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) if e.get_ref().and_then(|e| e.code()) == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                // The wait ran out, perhaps after the lock was got (in the row's update).
                conn.run(conn.client().query_typed(
                    sql::UNDO,
                    &[
                        (&id, Type::INT4),
                        (&shared, Type::BOOL),
                        (&false, Type::BOOL),
                    ],
                ))
                .await?;
                unfinished.armed = false;
                return Ok(Attempt::Taken);
            }
            Err(e) => return Err(e),
        };
        // The session answered after the wait ended: the server counts its idle timeout from
        // then, no earlier than the statement's sending; after a long wait, ask it again.
        let answered = if inner.cc.deadline(sent) < tokio::time::Instant::now() + inner.cc.lease / 3
        {
            let ping = tokio::time::Instant::now();
            conn.run(conn.client().simple_query(sql::PING)).await?;
            ping
        } else {
            sent
        };
        conn.unblock(Some(answered));
        unfinished.blocked = false;
        let row = rows.first();
        let waiting = row.is_none_or(|r| r.get::<_, Option<bool>>(2) != Some(false));
        Ok(match row.and_then(|r| r.get::<_, Option<i64>>(1)) {
            Some(token) => Attempt::Granted(token, waiting, waiters),
            None => Attempt::Stale,
        })
    }

    /// Acquires a hold of `target` (`shared` for a reader; `writer` takes an intent while it
    /// waits), waiting as `wait` says: in the server's lock queue while fewer than
    /// [`QUEUED_WAITS`] acquires of this backend do, else by retrying on notified releases.
    async fn acquire_hold(
        &self,
        target: &LockTarget,
        shared: bool,
        writer: bool,
        wait: Wait,
    ) -> Result<Option<PgHold>> {
        let inner = &self.inner;
        let mut unfinished: Option<Unfinished> = None;
        let mut listener: Option<Listener> = None;
        let mut pause = RETRY_MIN;
        let mut stale = 0;
        // A permit to wait in the server's queue, and whether a try found the lock taken.
        let mut permit: Option<tokio::sync::OwnedSemaphorePermit> = None;
        let mut taken_once = false;
        // This acquire's place in the line for a permit, once it waits by retrying: the
        // backend's waiters take freed waits in the server's queue in the order they came.
        let mut turn: Option<BoxFuture<'static, Option<tokio::sync::OwnedSemaphorePermit>>> = None;
        loop {
            // A connection that was lost with our reservation on it: start again elsewhere.
            if unfinished
                .as_ref()
                .is_some_and(|p| p.conn().reason().is_some())
            {
                unfinished = None;
            }
            let p = match &mut unfinished {
                Some(p) => p,
                None => {
                    let reserved = async {
                        let id = inner.id_of(&target.path).await?;
                        inner.undos.finished(&id).await;
                        inner.pool.reserve(id).await
                    };
                    match reserved.await {
                        Ok(reservation) => {
                            unfinished.insert(Unfinished::new(inner, reservation, shared, false))
                        }
                        Err(e) if e.is_transient() => {
                            tracing::debug!(key = %target.key, error = %e, "zklock: no PostgreSQL connection for an acquire; retrying");
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(RETRY_MAX);
                            continue;
                        }
                        Err(e) => return Err(pg_error("acquire the lock")(e)),
                    }
                }
            };
            // Wait in the server's queue when a permit is free, once a try found the lock
            // taken or it was found contended lately (a free key is taken by a try, which
            // costs the server less): on this connection if nothing else uses it (then the
            // wait is the attempt), else, once a try found the lock taken, on one of its own.
            if !matches!(wait, Wait::Never) && !p.blocked && (taken_once || inner.contended(p.id()))
            {
                if permit.is_none() {
                    permit = match &mut turn {
                        Some(t) => t.now_or_never().flatten(),
                        None => inner.queued.clone().try_acquire_owned().ok(),
                    };
                    if permit.is_some() {
                        turn = None;
                    }
                }
                if permit.is_some() {
                    if !p.intent && p.conn().try_block(p.id()) {
                        p.blocked = true;
                        p.permit = permit.take();
                    } else if taken_once {
                        let id = p.id();
                        match inner.pool.reserve_blocked(id).await {
                            Ok(Some(reservation)) => {
                                let mut p = Unfinished::new(inner, reservation, shared, true);
                                p.permit = permit.take();
                                // Nothing armed on the one before: given back at once (a
                                // writer's intent undone).
                                unfinished = Some(p);
                            }
                            // Every connection the backend may open is in use: this acquire
                            // waits by retrying, as those beyond the bound on waits do.
                            Ok(None) => permit = None,
                            Err(e) if e.is_transient() => {
                                unfinished = None;
                                tracing::debug!(key = %target.key, error = %e, "zklock: no PostgreSQL connection for an acquire; retrying");
                                tokio::time::sleep(pause).await;
                                pause = (pause * 2).min(RETRY_MAX);
                                continue;
                            }
                            Err(e) => return Err(pg_error("acquire the lock")(e)),
                        }
                    } else {
                        permit = None;
                    }
                }
            }
            let p = unfinished.as_mut().expect("reserved");
            let blocked = p.blocked;
            if blocked {
                listener = None;
            }
            if listener.as_ref().is_some_and(|l| l.id() != p.id()) {
                listener = None;
            }
            if let Some(l) = &mut listener {
                l.mark();
            }
            let attempt = if blocked {
                self.block(p, &target.path, shared, wait).await
            } else {
                self.attempt(p, &target.path, shared).await
            };
            match attempt {
                Ok(Attempt::Granted(token, waiting, waiters)) => {
                    let mut p = unfinished.take().expect("reserved");
                    if waiting {
                        inner.mark_contended(p.id());
                    }
                    if p.intent {
                        let conn = p.conn().clone();
                        let id = p.id();
                        // Failing closes the connection: the hold is then lost, and says so.
                        let _ = conn
                            .run(
                                conn.client()
                                    .query_typed(sql::DROP_INTENT, &[(&id, Type::INT4)]),
                            )
                            .await;
                        p.intent = false;
                    }
                    p.armed = false;
                    let reservation = p.reservation.take().expect("reserved");
                    return Ok(Some(
                        PgHold::new(
                            inner.clone(),
                            target,
                            reservation,
                            shared,
                            FencingToken::new(token, 0),
                        )
                        .watching(waiting, waiters),
                    ));
                }
                Ok(Attempt::Stale) => {
                    // Undone and given back in the background; look the id up again.
                    inner.forget(&target.path);
                    unfinished = None;
                    stale += 1;
                    if stale > STALE_ID_RETRIES {
                        return Err(Error::Config(format!(
                            "the row of {} in the table zklock_keys keeps changing; do not delete rows of zklock_keys while zklock runs",
                            target.key
                        )));
                    }
                }
                Ok(Attempt::Taken) => {
                    pause = RETRY_MIN;
                    inner.mark_contended(p.id());
                    if matches!(wait, Wait::Never) {
                        return Ok(None);
                    }
                    if blocked {
                        // The wait's slice ran out: wait again.
                        continue;
                    }
                    taken_once = true;
                    if turn.is_none() {
                        if inner.queued.available_permits() > 0 {
                            // A permit is free (nobody is in line): wait in the server's queue.
                            continue;
                        }
                        // In line for a permit, behind the backend's waiters that came before.
                        let queued = inner.queued.clone();
                        turn = Some(Box::pin(async move { queued.acquire_owned().await.ok() }));
                    }
                    if writer && !p.intent {
                        let conn = p.conn().clone();
                        let id = p.id();
                        // Set before the answer: if this is dropped, the undo drops it.
                        p.intent = true;
                        match conn
                            .run(
                                conn.client()
                                    .query_typed(sql::TAKE_INTENT, &[(&id, Type::INT4)]),
                            )
                            .await
                        {
                            Ok(rows) => p.intent = rows.first().is_some_and(|r| r.get(0)),
                            Err(e) if e.is_transient() => continue,
                            // Whether the intent is held is unknown: undone in the background.
                            Err(e) if is_cancelled(&e) => {
                                unfinished = None;
                                continue;
                            }
                            Err(e) => return Err(pg_error("acquire the lock")(e)),
                        }
                    }
                    let Some(l) = &mut listener else {
                        // Register as a waiter (so the next release notifies), then try
                        // again at once: a release may have come before.
                        let mut l = inner.hub.listen(p.id());
                        l.registered(POLL_FALLBACK).await;
                        listener = Some(l);
                        continue;
                    };
                    match &mut turn {
                        Some(t) => tokio::select! {
                            got = t => {
                                permit = got;
                                turn = None;
                            }
                            _ = l.wait(POLL_FALLBACK) => {}
                        },
                        None => l.wait(POLL_FALLBACK).await,
                    }
                }
                Err(e) if is_undefined_table(&e) => {
                    // Undone in the background; the next lookup makes the table again.
                    inner.forget(&target.path);
                    unfinished = None;
                    stale += 1;
                    if stale > STALE_ID_RETRIES {
                        return Err(pg_error("acquire the lock")(e));
                    }
                }
                Err(e) if e.is_transient() || is_cancelled(&e) => {
                    tracing::debug!(key = %target.key, error = %e, "zklock: a PostgreSQL acquire attempt failed; retrying");
                    unfinished = None;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
                Err(e) => return Err(pg_error("acquire the lock")(e)),
            }
        }
    }
}

impl Backend for PostgresBackend {
    fn lease(&self) -> Option<Duration> {
        Some(self.inner.cc.lease)
    }

    fn name(&self) -> &'static str {
        "postgres"
    }

    fn acquire<'a>(
        &'a self,
        target: &'a LockTarget,
        mode: LockMode,
        wait: Wait,
    ) -> BoxFuture<'a, Result<Option<Arc<dyn BackendHold>>>> {
        Box::pin(async move {
            let (shared, writer) = match mode {
                // A leader latch is exclusive; advisory locks keep no participant ids.
                LockMode::Exclusive | LockMode::Leader => (false, false),
                LockMode::Write => (false, true),
                LockMode::Read => (true, false),
            };
            let hold = self.acquire_hold(target, shared, writer, wait).await?;
            Ok(hold.map(|h| Arc::new(h) as _))
        })
    }

    fn acquire_leases<'a>(
        &'a self,
        _target: &'a LockTarget,
        _max_leases: u32,
        _n: u32,
        _wait: Wait,
    ) -> BoxFuture<'a, Result<Option<Vec<SharedHold>>>> {
        Box::pin(async {
            Err(Error::Unsupported {
                backend: "postgres",
                feature: "semaphores",
            })
        })
    }

    fn claim_run<'a>(
        &'a self,
        target: &'a LockTarget,
        at_least: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let inner = &self.inner;
            let ms = at_least.as_millis().min(i64::MAX as u128) as i64;
            let path: &str = &target.path;
            for _ in 0..=STALE_ID_RETRIES {
                let claimed = async {
                    let id = inner.id_of(&target.path).await?;
                    let conn = inner.pool.any().await?;
                    let claimed = conn
                        .run(conn.client().query_typed(
                            sql::CLAIM_RUN,
                            &[(&id, Type::INT4), (&path, Type::TEXT), (&ms, Type::INT8)],
                        ))
                        .await?;
                    Ok(claimed.first().map(|r| r.get::<_, bool>(0)))
                };
                match claimed.await.map_err(pg_error("record the job's run"))? {
                    Some(run) => return Ok(run),
                    None => inner.forget(path),
                }
            }
            Err(Error::Config(format!(
                "the row of {} in the table zklock_keys keeps changing; do not delete rows of zklock_keys while zklock runs",
                target.key
            )))
        })
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            self.inner.background.flush().await;
            // The undos may have ended the last waits of some ids: their registrations too.
            self.inner.hub.flush().await;
        })
    }

    fn inspector(&self) -> std::result::Result<&dyn Inspect, &'static str> {
        Ok(self)
    }

    fn revoker(&self) -> std::result::Result<&dyn crate::backend::Revoke, &'static str> {
        Err("revocation (a PostgreSQL holder is not told of a revoke request; end its session with pg_terminate_backend(pid), which `zklock status` shows)")
    }
}
