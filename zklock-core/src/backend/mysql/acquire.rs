//! An acquire on MySQL / MariaDB, for the acquire driver: a session taken from the pool
//! ([`Acquisition::enter`]), and `GET_LOCK` on it ([`Acquisition::attempt`]): a try asks with
//! no wait; a waiter waits in the server's queue for a slice of one lease (no polling), and
//! asks again when the slice ends: a waiter cut off (a partition) leaves no session on the
//! server past two leases, the slice and then the session's `wait_timeout`. Granted, the lock's token is
//! raised in the table under the lock, and the session becomes the hold's.
//!
//! What an attempt may have left (a `GET_LOCK` whose answer was not read: it may have been
//! granted, or may still wait) is undone when the acquire ends without a hold: the session is
//! ended from a sibling session (`KILL <id>`), which gives up its wait and frees what it got.
//! The killed session is never used again, so a kill that arrives late can reach no later
//! statement. The undo counts in the backend's undos: the process's next acquire of the lock
//! waits for it.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use tokio::time::Instant;

use super::conn::{bounded, Inner};
use super::error::{mysql_error, MySqlError};
use super::hold::MySqlHold;
use super::wire;
use crate::backend::backoff::Backoff;
use crate::backend::undos::Undos;
use crate::backend::{Acquisition, BoxFuture, LockTarget, SharedHold, Step};
use crate::types::error::Result;
use crate::types::mode::Wait;
use crate::types::token::FencingToken;

/// An acquire's session while it runs.
struct Entry {
    inner: Arc<Inner>,
    path: Arc<str>,
    /// The session; `None` while a statement runs on it (or once handed to a hold).
    conn: Option<mysql_async::Conn>,
    /// The session's id, for a kill.
    id: u32,
    /// A `GET_LOCK` was sent whose answer is not known, or the lock is held and not yet a
    /// hold's: the session is killed when the entry is dropped.
    armed: bool,
}

impl Drop for Entry {
    fn drop(&mut self) {
        if !self.armed {
            if let Some(conn) = self.conn.take() {
                self.inner.give_back(conn);
            }
            return;
        }
        let undoing = self.inner.undos.start(&self.path);
        let (inner, id, conn) = (self.inner.clone(), self.id, self.conn.take());
        self.inner.background.spawn(&self.inner.runtime, async move {
            if let Err(e) = inner.kill(id).await {
                tracing::warn!(session = id, error = %e, "zklock: could not end a MySQL session whose acquire was given up; the server ends it after its wait_timeout, which frees what it holds");
            }
            if let Some(conn) = conn {
                inner.close(conn);
            }
            drop(undoing);
        });
    }
}

/// One acquire of a lock, for the driver.
pub(super) struct Acquire<'a> {
    inner: &'a Arc<Inner>,
    target: &'a LockTarget,
    /// The lock's user-lock name.
    name: String,
    /// Who asks, as inspection shows a waiter.
    who: String,
    wait: Wait,
    entry: Option<Entry>,
    backoff: Backoff,
}

impl<'a> Acquire<'a> {
    pub(super) fn new(inner: &'a Arc<Inner>, target: &'a LockTarget, wait: Wait) -> Self {
        Acquire {
            inner,
            target,
            name: wire::name(&target.path),
            who: inner.holder(),
            wait,
            entry: None,
            backoff: Backoff::requests(),
        }
    }

    /// A session from the pool; a failure to get one is retried (after a pause) while the
    /// acquire waits.
    async fn session(&mut self) -> Result<mysql_async::Conn> {
        loop {
            match self.inner.take().await {
                Ok(conn) => return Ok(conn),
                Err(e) if e.is_transient() && !matches!(self.wait, Wait::Never) => {
                    tracing::debug!(key = %self.target.key, error = %e, "zklock: no MySQL session for an acquire; retrying");
                    self.backoff.wait().await;
                }
                Err(e) => return Err(e.on(self.inner.config.host(), "acquire the lock")),
            }
        }
    }

    /// One `GET_LOCK` on the entry's session: a try, or a slice of a wait in the server's
    /// queue.
    async fn attempt(&mut self) -> Result<Step> {
        let seconds = match self.wait {
            Wait::Never => 0,
            Wait::Forever | Wait::Until(..) => self.inner.config.lease.as_secs(),
        };
        let within = self.inner.config.reply_timeout + Duration::from_secs(seconds);
        let entry = self.entry.as_mut().expect("entered");
        let mut conn = entry.conn.take().expect("a session");
        entry.armed = true;
        let sent = Instant::now();
        self.inner.count();
        let got: std::result::Result<Option<Option<i64>>, MySqlError> = bounded(
            within,
            conn.query_first(wire::get_lock(&self.name, seconds, &self.who)),
        )
        .await;
        let entry = self.entry.as_mut().expect("entered");
        match got.map(Option::flatten) {
            Ok(Some(1)) => {
                entry.conn = Some(conn);
                self.backoff.reset();
                self.granted(sent).await
            }
            // Not granted (a try refused, or the slice ran out): nothing held.
            Ok(Some(_)) => {
                entry.conn = Some(conn);
                entry.armed = false;
                self.backoff.reset();
                Ok(match self.wait {
                    Wait::Never => Step::Busy,
                    Wait::Forever | Wait::Until(..) => Step::Again,
                })
            }
            // NULL: the wait was interrupted (the session killed from outside): another
            // session.
            Ok(None) => {
                entry.armed = false;
                self.inner.close(conn);
                self.entry = None;
                Ok(Step::Restart)
            }
            // Armed: the session is killed when the entry goes.
            Err(e) => {
                drop(conn);
                self.failed(e).await
            }
        }
    }

    /// The lock is the session's: its token raised under it, then the hold.
    async fn granted(&mut self, sent: Instant) -> Result<Step> {
        let inner = self.inner;
        let entry = self.entry.as_mut().expect("entered");
        let token = if inner.config.tokens {
            let conn = entry.conn.as_mut().expect("a session");
            inner.count();
            let path: &str = &self.target.path;
            let raised = bounded(
                inner.config.reply_timeout,
                conn.exec_drop(wire::raise_fence(), (&self.name, path, inner.holder())),
            )
            .await;
            match raised {
                Ok(()) => FencingToken::new(conn.last_insert_id().unwrap_or(0) as i64, 0),
                // Armed: the session (and the lock with it) is ended when the entry goes.
                Err(e) => {
                    if let Some(conn) = entry.conn.take() {
                        drop(conn);
                    }
                    return self.failed(e).await;
                }
            }
        } else {
            FencingToken::NONE
        };
        let mut entry = self.entry.take().expect("entered");
        entry.armed = false;
        let conn = entry.conn.take().expect("a session");
        let hold = MySqlHold::new(inner, self.target, self.name.clone(), conn, sent, token);
        Ok(Step::Held(vec![Arc::new(hold) as SharedHold]))
    }

    /// A statement failed: a session that broke or timed out is given up (killed, as its
    /// statement may have taken the lock) and the acquire starts again on another, after a
    /// pause, while it waits; anything else is the acquire's error.
    async fn failed(&mut self, e: MySqlError) -> Result<Step> {
        // The entry goes (armed: its session is killed).
        self.entry = None;
        if e.is_transient() && !matches!(self.wait, Wait::Never) {
            tracing::debug!(key = %self.target.key, error = %e, "zklock: a MySQL acquire attempt failed; retrying");
            self.backoff.wait().await;
            return Ok(Step::Restart);
        }
        Err(mysql_error("acquire the lock")(e))
    }
}

impl Acquisition for Acquire<'_> {
    fn undos(&self) -> Option<&Undos> {
        Some(&self.inner.undos)
    }

    /// A session from the pool (the previous one, if any, given back or killed).
    fn enter(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.entry = None;
            let conn = self.session().await?;
            self.entry = Some(Entry {
                inner: self.inner.clone(),
                path: self.target.path.clone(),
                id: conn.id(),
                conn: Some(conn),
                armed: false,
            });
            Ok(())
        })
    }

    fn attempt(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(Acquire::attempt(self))
    }

    /// A waiter waits in the server's queue in its attempts: a refusal is only a try's.
    fn wait(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(async { Ok(Step::Again) })
    }
}
