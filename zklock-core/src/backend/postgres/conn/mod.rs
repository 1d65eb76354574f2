//! The connections the backend holds advisory locks on.
//!
//! A session-level advisory lock belongs to the server session (the connection) that took it
//! and ends with it. So each [`HoldConn`] is the owner of everything taken on it:
//!
//! - Its state ([`ConnState`]) is what every hold on it reports: lost the moment the connection
//!   breaks (the task that drives it ends), a liveness check fails, or no check was confirmed
//!   before the server could have ended the idle session (its `idle_session_timeout`, the
//!   lease: the server side of a holder that went silent).
//! - Its set of reserved lock ids: a lock id is used by at most one acquire or hold per
//!   connection at a time, because the server lets a session re-take a lock it holds (advisory
//!   locks count per session). A reservation is given back only once the lock is known to be
//!   free on that connection, or the connection is closed.
//! - Any request whose effect on the session's locks is unknown (no reply in time, the
//!   connection failed) closes the connection ([`HoldConn::kill`]): the server then releases
//!   all it held, and its holds are lost. The connection is never used again.
//!
//! - `mod.rs`: what the connections share ([`ConnConfig`]) and one connection ([`HoldConn`]):
//!   opening its session, its requests, a wait in the server's queue on it, closing it.
//! - [`liveness`](mod@liveness): keeping a connection alive: its state, its checks, its deadline.
//! - [`pool`]: which connection an acquire, a hold or another request gets.

mod liveness;
mod pool;

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use super::error::{unusable_url, PostgresError};
use super::{tls, wire, PostgresConfig};
use crate::backend::HOST_PID;
use crate::types::error::Result;
use crate::types::loss::LossReason;
pub(super) use liveness::ConnState;
use liveness::{liveness, lose};
use pool::Uses;
pub(super) use pool::{Pool, Reservation};

/// What opening and checking connections needs.
pub(super) struct ConnConfig {
    pub(super) config: tokio_postgres::Config,
    /// The server ends a session idle this long (`idle_session_timeout`): a silent holder's
    /// locks are released after it.
    pub(super) lease: Duration,
    /// Taken off every deadline (see `Inner::margin` in the Redis backend: the same rule).
    pub(super) margin: Duration,
    /// How long opening a connection may take.
    pub(super) connect_timeout: Duration,
    /// How long one request may wait for its reply before its connection is closed.
    pub(super) reply_timeout: Duration,
    pub(super) runtime: tokio::runtime::Handle,
    /// Whether grants take a fencing token (the key row's write); see
    /// [`Builder::fencing_tokens`](crate::Builder::fencing_tokens).
    pub(super) tokens: bool,
    /// The TLS every connection uses (none unless the URL or the builder asks for it).
    pub(super) tls: tls::PgTls,
    /// The newest timeline a connection of this process reached a primary on (see
    /// `open_session`).
    pub(super) timeline: AtomicU32,
    /// Told whenever a connection's use ends (a reservation, a loan, a wait in the server's
    /// queue): what an acquire waiting for a connection of a full [`Pool`] waits for.
    pub(super) freed: tokio::sync::Notify,
}

/// The longest any single request waits for its reply; shorter when the lease is.
const MAX_REPLY_TIMEOUT: Duration = Duration::from_secs(5);

impl ConnConfig {
    /// What the backend's connections use, from what it is configured with.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for a URL the client refuses, or TLS settings
    /// it cannot use.
    pub(super) fn new(config: &PostgresConfig) -> Result<ConnConfig> {
        // The URL may carry a password: errors name the problem, not the URL.
        let (url, tls) = tls::split_url(&config.url, config.tls.as_ref())?;
        let mut pg: tokio_postgres::Config = url.parse().map_err(unusable_url)?;
        if pg.get_application_name().is_none() {
            pg.application_name(application_name(config.identity.as_deref()));
        }
        pg.connect_timeout(config.connect_timeout);
        let lease = config.lease;
        Ok(ConnConfig {
            config: pg,
            lease,
            margin: lease / 100 + Duration::from_millis(2) + lease / 20,
            connect_timeout: config.connect_timeout,
            reply_timeout: lease.min(MAX_REPLY_TIMEOUT),
            runtime: tokio::runtime::Handle::current(),
            tokens: config.tokens,
            tls,
            timeline: AtomicU32::new(0),
            freed: tokio::sync::Notify::new(),
        })
    }

    /// The loss deadline after a request sent at `sent` was answered.
    pub(super) fn deadline(&self, sent: Instant) -> Instant {
        sent + self.lease - self.margin
    }
}

/// The sessions' `application_name`: zklock, the host and pid, and the identity if any, cut
/// to the 63 bytes the server keeps.
fn application_name(identity: Option<&str>) -> String {
    let mut name = format!("zklock {}", *HOST_PID);
    if let Some(id) = identity {
        name.push_str(" id=");
        name.push_str(id);
    }
    // The server keeps 63 bytes.
    let mut end = name.len().min(63);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name
}

/// The statements of the hot path, prepared once per connection (no parsing or planning per
/// acquire and release).
pub(super) struct Statements {
    pub(super) try_exclusive: Statement,
    pub(super) try_shared: Statement,
    pub(super) release: Statement,
    pub(super) block_exclusive: Statement,
    pub(super) block_shared: Statement,
}

/// Which server session a connection is: its process id and start, as the server's activity
/// view shows them. A cancel names both, so that it can only reach this session's process, not
/// one that took over its process id after it ended (or of another server, where the URL names
/// several).
struct ServerSession {
    pid: i32,
    started: String,
}

/// One connection that holds advisory locks; see the module's docs.
pub(crate) struct HoldConn {
    client: Client,
    session: ServerSession,
    statements: tokio::sync::OnceCell<Statements>,
    state: Arc<watch::Sender<ConnState>>,
    uses: StdMutex<Uses>,
    /// The task that drives the connection (aborting it closes the socket) and the liveness
    /// checks.
    driver: AbortHandle,
    liveness: StdMutex<Option<AbortHandle>>,
    reply_timeout: Duration,
    cc: Arc<ConnConfig>,
}

/// Sets up a new session and reads who it is: each statement reads with a snapshot taken
/// when it starts, whatever the server's default (a reservation must not fail to serialize
/// with a job's record); the session's pid and start, for cancels (see `HoldConn::cancel`);
/// and whether the server is a standby, where none is taken: a standby's advisory locks
/// exclude only its own sessions, never the primary's.
async fn open_session(
    client: &Client,
    reply_timeout: Duration,
    newest: &AtomicU32,
) -> Result<ServerSession, PostgresError> {
    let messages =
        match tokio::time::timeout(reply_timeout, client.simple_query(wire::OPEN_SESSION)).await {
            Ok(Ok(messages)) => messages,
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(PostgresError::timed_out()),
        };
    let row = messages.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(row) => Some((
            ServerSession {
                pid: row.get(0)?.parse().ok()?,
                started: row.get(1)?.to_string(),
            },
            row.get(2) == Some("true"),
            row.get(3).and_then(|t| u32::from_str_radix(t, 16).ok()),
        )),
        _ => None,
    });
    match row {
        Some((session, false, timeline)) => {
            // A promotion raises the timeline: once a connection reached a primary on a later
            // one, a primary on an earlier one is one that was failed over and still runs.
            let timeline = timeline.unwrap_or(0);
            let newest = newest.fetch_max(timeline, Ordering::SeqCst).max(timeline);
            if timeline < newest {
                return Err(PostgresError::OldPrimary { timeline, newest });
            }
            Ok(session)
        }
        Some((_, true, _)) => Err(PostgresError::Standby),
        None => Err(PostgresError::timed_out()),
    }
}

impl HoldConn {
    /// Opens a connection, asks the server to end it when idle past the lease, and starts its
    /// liveness checks.
    async fn open(cc: &Arc<ConnConfig>) -> Result<Arc<HoldConn>, PostgresError> {
        let (client, connection) =
            tokio::time::timeout(cc.connect_timeout, cc.config.connect(cc.tls.clone()))
                .await
                .map_err(|_| PostgresError::timed_out())??;
        let sent = Instant::now();
        let (state, _) = watch::channel(ConnState {
            deadline: cc.deadline(sent),
            lost: None,
            blocked: false,
        });
        let state = Arc::new(state);
        let on_end = state.clone();
        let driver = cc
            .runtime
            .spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "zklock: a PostgreSQL holding connection ended");
                }
                lose(&on_end, LossReason::Disconnected);
            })
            .abort_handle();
        let session = match open_session(&client, cc.reply_timeout, &cc.timeline).await {
            Ok(session) => session,
            Err(e) => {
                driver.abort();
                return Err(e);
            }
        };
        let conn = Arc::new(HoldConn {
            client,
            session,
            statements: tokio::sync::OnceCell::new(),
            state,
            uses: StdMutex::default(),
            driver,
            liveness: StdMutex::default(),
            reply_timeout: cc.reply_timeout,
            cc: cc.clone(),
        });
        let set = wire::set_idle_session_timeout(cc.lease);
        match conn.run(conn.client.batch_execute(&set)).await {
            Ok(()) => {}
            // Before PostgreSQL 14: no server side lease. A silent holder keeps its locks until
            // its connection breaks; loss is still reported on this side at the deadline.
            Err(e) if e.get_ref().and_then(|e| e.code()) == Some(&SqlState::UNDEFINED_OBJECT) => {
                tracing::warn!("zklock: this PostgreSQL has no idle_session_timeout (before 14): a holder that stops answering keeps its locks until its connection breaks");
            }
            Err(e) => {
                conn.kill(LossReason::Disconnected);
                return Err(e);
            }
        }
        let liveness = cc
            .runtime
            .spawn(liveness(Arc::downgrade(&conn), cc.clone(), sent))
            .abort_handle();
        *conn.liveness.lock().expect("not poisoned") = Some(liveness);
        Ok(conn)
    }

    /// The client, for requests that go through [`run`](Self::run).
    pub(super) fn client(&self) -> &Client {
        &self.client
    }

    /// The prepared statements, prepared on first use.
    pub(super) async fn statements(&self) -> Result<&Statements, PostgresError> {
        self.statements
            .get_or_try_init(|| {
                let c = &self.client;
                self.run(async move {
                    let both = [Type::INT4, Type::TEXT];
                    let block = [Type::INT4, Type::TEXT, Type::TEXT];
                    let texts = if self.cc.tokens {
                        [
                            wire::TRY_EXCLUSIVE,
                            wire::TRY_SHARED,
                            wire::BLOCK_EXCLUSIVE,
                            wire::BLOCK_SHARED,
                        ]
                    } else {
                        [
                            wire::TRY_EXCLUSIVE_UNFENCED,
                            wire::TRY_SHARED_UNFENCED,
                            wire::BLOCK_EXCLUSIVE_UNFENCED,
                            wire::BLOCK_SHARED_UNFENCED,
                        ]
                    };
                    let (try_exclusive, try_shared, release, block_exclusive, block_shared) = futures::try_join!(
                        c.prepare_typed(texts[0], &both),
                        c.prepare_typed(texts[1], &both),
                        c.prepare_typed(wire::RELEASE, &[Type::INT4, Type::BOOL]),
                        c.prepare_typed(texts[2], &block),
                        c.prepare_typed(texts[3], &block),
                    )?;
                    Ok(Statements {
                        try_exclusive,
                        try_shared,
                        release,
                        block_exclusive,
                        block_shared,
                    })
                })
            })
            .await
    }

    /// Closes the connection: the server releases every lock of the session, and every hold
    /// on it is lost with `reason`.
    pub(super) fn kill(&self, reason: LossReason) {
        lose(&self.state, reason);
        self.driver.abort();
        if let Some(l) = self.liveness.lock().expect("not poisoned").take() {
            l.abort();
        }
    }

    /// Gives the connection to a wait in the server's queue for `id`, if nothing else can use
    /// it: `id` is the only id reserved on it (by the caller), no other request is under way,
    /// and no other wait runs on it. From then on the pool hands it to nobody, its liveness
    /// checks pause (they would wait behind the wait) and its deadline does not apply, until
    /// [`unblock`](Self::unblock).
    pub(super) fn try_block(&self, id: i32) -> bool {
        let mut uses = self.uses.lock().expect("not poisoned");
        if uses.blocked || uses.lent > 0 || uses.ids.len() != 1 || !uses.ids.contains(&id) {
            return false;
        }
        uses.blocked = true;
        self.state.send_modify(|s| s.blocked = true);
        true
    }

    /// Ends the connection's wait in the server's queue: `answered` is the send time of a
    /// request the session answered after the wait ended (the wait's own statement, or one
    /// sent after it), from which the server counts its idle timeout no earlier; its deadline
    /// runs from there (`None`: no such answer, the old deadline stands). The connection is
    /// lost if its deadline has passed.
    pub(super) fn unblock(&self, answered: Option<Instant>) {
        let mut uses = self.uses.lock().expect("not poisoned");
        uses.blocked = false;
        self.cc.freed.notify_waiters();
        let deadline = answered.map(|sent| self.cc.deadline(sent));
        self.state.send_modify(|s| {
            s.blocked = false;
            if let Some(deadline) = deadline {
                s.deadline = s.deadline.max(deadline);
            }
            if s.lost.is_none() {
                s.lost = s.reason_at(Instant::now());
            }
        });
    }

    /// Cancels the statement that `target`'s session runs now (a wait in the lock queue), by a
    /// statement on this connection: `true` once the server has signalled that session's
    /// process, `false` when it could not be told (`target`'s session is gone, or no answer).
    ///
    /// `pg_cancel_backend` signals the process once and returns after the signal was sent, so
    /// the signal is pending on `target`'s process before anything else is sent on `target`:
    /// it ends the running statement, or, arriving at an idle session, is ignored, and can
    /// never reach a later statement. A cancel request on a connection of its own (the
    /// protocol's, which `tokio-postgres`'s `cancel_query` sends) gives no such bound: the
    /// server answers it by signalling twice, and returns to the client before it has, so
    /// the second signal can land on whatever the session runs next.
    pub(super) async fn cancel(&self, target: &HoldConn) -> bool {
        let session = &target.session;
        let signalled = self
            .run(self.client.query_typed(
                wire::CANCEL,
                &[(&session.pid, Type::INT4), (&session.started, Type::TEXT)],
            ))
            .await;
        matches!(signalled, Ok(rows) if rows.first().is_some_and(|r| r.get::<_, bool>(0)))
    }

    /// Runs a wait in the server's queue (the connection given to it by
    /// [`try_block`](Self::try_block)), bounded by `limit` instead of the reply timeout. As
    /// [`run`](Self::run), a request that times out or fails on the connection closes it.
    pub(super) async fn run_blocking<T, Fut>(
        &self,
        request: Fut,
        limit: Duration,
    ) -> Result<T, PostgresError>
    where
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let result = match tokio::time::timeout(limit, request).await {
            Ok(r) => r.map_err(PostgresError::from),
            Err(_) => Err(PostgresError::timed_out()),
        };
        if let Err(e) = &result {
            if e.is_transient() {
                self.kill(LossReason::Disconnected);
            }
        }
        result
    }

    /// Runs one request, bounded by the reply timeout. A request that times out or fails on
    /// the connection closes it: what it did to the session's locks is unknown.
    pub(super) async fn run<T, Fut>(&self, request: Fut) -> Result<T, PostgresError>
    where
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let result = match tokio::time::timeout(self.reply_timeout, request).await {
            Ok(r) => r.map_err(PostgresError::from),
            Err(_) => Err(PostgresError::timed_out()),
        };
        if let Err(e) = &result {
            if e.is_transient() {
                self.kill(LossReason::Disconnected);
            }
        }
        result
    }
}

impl Drop for HoldConn {
    fn drop(&mut self) {
        self.kill(LossReason::Closed);
    }
}
