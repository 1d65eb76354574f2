//! One acquire on the PostgreSQL backend, top-down, as the acquire driver runs it:
//! [`Acquire::attempt_once`] reserves the lock id on a connection, decides whether the attempt
//! waits in the server's queue (a permit, taken in the order the backend's waiters came), sends
//! the attempt ([`attempt`](fn@attempt): a try; [`block`]: a wait in the server's queue), and
//! turns its answer into a hold, a retry, or a wait for a notified release
//! ([`Acquire::taken`]). What an attempt may have left on its connection is undone by [`Unfinished`]
//! when the acquire ends without a hold.
//!
//! - `mod.rs`: the acquire from start to grant or give-up ([`Acquire`]), and its waits.
//! - [`attempt`](mod@attempt): one attempt on the reserved connection, a try or a wait in the
//!   server's queue, and what its answer says.
//! - [`undo`]: the undo of a dropped or timed-out acquire ([`Unfinished`]).

mod attempt;
mod undo;

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio_postgres::types::Type;

use super::error::{is_cancelled, is_undefined_table, pg_error, row_keeps_changing, PostgresError};
use super::hold::PgHold;
use super::hub::{Listener, WaiterWatch};
use super::keys::STALE_ID_RETRIES;
use super::wire;
use super::Inner;
use crate::backend::backoff::Backoff;
use crate::backend::undos::Undos;
use crate::backend::{Acquisition, BoxFuture, LockTarget, Step};
use crate::types::error::Result;
use crate::types::mode::Wait;
use crate::types::token::FencingToken;
use attempt::{attempt, block};
use undo::Unfinished;

/// How long a waiter sleeps without a notified release before it tries again: a holder whose
/// session ended (killed, crashed, partitioned past the lease) released without notifying.
pub(super) const POLL_FALLBACK: Duration = Duration::from_millis(500);
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
    /// The last attempt that found the lock taken was a wait in the server's queue.
    blocked: bool,
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
            blocked: false,
        }
    }

    /// One attempt, on the lock id reserved on a connection (and a wait in the server's
    /// queue when a permit is free): held, taken (the wait follows, see [`taken`](Self::taken)),
    /// or again (the key table's row went stale, or the attempt failed and is retried).
    async fn attempt_once(&mut self) -> Result<Step> {
        while !self.reserve().await? || !self.queue_wait().await? {}
        let blocked = self.unfinished.as_ref().expect("reserved").blocked;
        match self.attempt(blocked).await {
            Ok(Attempt::Granted(token, waiting, waiters)) => {
                let hold = self.granted(token, waiting, waiters).await;
                Ok(Step::Held(vec![Arc::new(hold)]))
            }
            Ok(Attempt::Stale) => self.stale_id(None).map(|()| Step::Again),
            Ok(Attempt::Taken) => {
                self.backoff.reset();
                self.inner.mark_contended(self.id());
                self.blocked = blocked;
                Ok(Step::Busy)
            }
            Err(e) => self.failed(e).await.map(|()| Step::Again),
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
            // This acquire's own undo of an earlier attempt too.
            inner.undos.finished(&self.target.path).await;
            inner.pool.reserve(id).await
        };
        match reserved.await {
            Ok(reservation) => {
                let p = Unfinished::new(inner, &self.target.path, reservation, self.shared, false);
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
                let mut p =
                    Unfinished::new(inner, &self.target.path, reservation, self.shared, true);
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
    async fn taken(&mut self) -> Result<()> {
        if self.blocked {
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

impl Acquisition for Acquire<'_> {
    fn undos(&self) -> Option<&Undos> {
        Some(&self.inner.undos)
    }

    /// The entry is the lock id reserved on a connection, which each attempt makes sure of
    /// (a lost connection: reserved again elsewhere).
    fn enter(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn attempt(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(self.attempt_once())
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(async move { self.taken().await.map(|()| Step::Again) })
    }
}
