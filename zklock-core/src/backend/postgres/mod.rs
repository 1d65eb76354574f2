//! The PostgreSQL backend (feature `postgres`): session-level advisory locks held on
//! connections the backend owns.
//!
//! - `mod.rs`: this map, the backend's struct, its construction and its `impl Backend`.
//! - [`conn`]: the holding connections: opening, liveness, the pool, what the parts share.
//! - [`acquire`]: an acquire from start to grant or give-up, and the undo of one dropped.
//! - [`hold`]: a granted hold: release, loss, downgrade, others waiting.
//! - [`jobs`]: a scheduled job's run record (`claim_run`, the `at_least` window).
//! - [`inspect`]: what an operator sees of a lock.
//! - [`wire`]: the protocol as the server sees it: the SQL, the lock ids, the key table.
//! - [`keys`]: a lock path's id, read from the key table and cached.
//! - [`options`]: the user's settings, [`PostgresOptions`].
//! - [`error`]: the backend's errors and their mapping to zklock's [`Error`].
//! - [`hub`]: the `LISTEN`/`NOTIFY` connection that wakes waiters and tells holders of them.
//! - [`tls`]: the TLS connector, on rustls, with libpq's TLS parameters.
//!
//! ## How it works
//!
//! - A lock path gets an id from the key table `zklock_keys` (a `serial`, so no two paths share
//!   one), and its lock is the advisory lock `(LOCK_CLASS, id)`; see [`wire`].
//! - An acquire of a free key is one statement on a holding connection: `pg_try_advisory_lock` (or
//!   `_shared` for readers) and, once it got the lock, the raise of the path's `fence` under it,
//!   which is the fencing token, committed without waiting for the WAL flush when it is the
//!   server's clock reading (see [`wire`]). See [`conn`] for which connection holds what.
//! - A hold is lost the moment its connection breaks (the server ended the session:
//!   `pg_terminate_backend`, a restart) or a liveness check (every lease/3) fails, and at the
//!   latest when no check was confirmed before the server could have ended the idle session: each
//!   holding session runs with `idle_session_timeout` = the lease, so the locks of a holder that
//!   went silent (paused, partitioned) are released by the server after the lease, and this side
//!   reports the loss before that (less the same margin as Redis).
//! - An acquire that found the key taken, or of a key found contended within
//!   [`CONTENDED_FOR`](acquire::CONTENDED_FOR), waits in the server's queue instead (its statement
//!   is then its attempt): up to [`QUEUED_WAITS`] acquires of a backend wait in the server's lock
//!   queue, each blocked in `pg_advisory_lock` on a connection given to it (the connection then
//!   holds the lock once granted): the server grants in the order it queued them, inside the
//!   release. The wait ends by the statement's own `lock_timeout` at the deadline; an acquire
//!   dropped before cancels it from another session (see
//!   [`HoldConn::cancel`](conn::HoldConn::cancel): the cancel cannot reach any later statement of
//!   the waiting session) and then sends an undo, which releases a lock granted just as it was
//!   dropped (see `Unfinished` in [`acquire`]). A statement of an acquire cancelled
//!   by anyone else (`pg_cancel_backend` by an operator) is sent again, within the acquire's
//!   deadline. A waiting connection that breaks held nothing: the acquire waits again on another
//!   one, at the back of the queue.
//! - Further waiters hold no connection: they try, then sleep until a release of their lock is
//!   notified (`LISTEN`/`NOTIFY` on one listening connection per backend, see [`hub`]) or
//!   [`POLL_FALLBACK`](acquire::POLL_FALLBACK) passes (a session that ended releases without
//!   notifying), and whenever a wait in the server's queue is free they take it. The listening
//!   session has the same lease and checks as the holding ones: a process cut off for good leaves
//!   no session (and no waiter registration) on the server past the lease.
//! - A writer waiting in the server's queue makes new readers wait behind it (the server does not
//!   grant a lock that conflicts with a queued request); a writer that retries takes an intent lock
//!   that does (writers are not starved by readers). Among waits in the server's queue the order is
//!   the server's; a backend's retrying waiters take freed waits there in the order they came (one
//!   line per backend), but a retrying waiter that finds the lock free between two grants takes it,
//!   whatever came before it in other processes; the local queue keeps FIFO within a process.
//! - Semaphores and revocation do not fit advisory locks cleanly: [`Error::Unsupported`]. Job
//!   records (`claim_run`, see [`jobs`]) live in the key table (`run_after`, by the server's
//!   clock).
//!
//! ## Why `tokio-postgres`
//!
//! It is the protocol client alone: tokio, `postgres-protocol` and a few small crates, about
//! a minute of a 2-core build. `sqlx` brings its own pool, compile-time query macros, a
//! runtime abstraction and more, several times the build, for nothing this backend uses: it
//! needs to own its connections (a lock belongs to one session, so no pool may hand the
//! session to someone else), one round trip per statement (the hot path's statements are
//! prepared once per connection, the rest sent with `query_typed`, which needs no prepare), and
//! the connection's `LISTEN` messages, which `tokio-postgres` gives directly
//! (`Connection::poll_message`). TLS is zklock's own connector on rustls (`tls.rs`), with
//! libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey`.
//!
//! Advisory locks need a real session: behind PgBouncer in transaction pooling mode they do
//! not work (use session pooling or a direct connection).

mod acquire;
mod conn;
mod error;
mod hold;
mod hub;
mod inspect;
mod jobs;
mod keys;
mod options;
mod tls;
mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::undos::Undos;
use super::{Acquisition, Backend, BoxFuture, Inspect, LockTarget, Wanted};
use crate::background::Background;
use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, Result};
use crate::types::mode::{LockMode, Wait};
use acquire::{Acquire, QUEUED_WAITS};
use conn::{ConnConfig, Pool};
use error::{pg_error, schema_refused};
use hub::Hub;
pub use options::PostgresOptions;
pub(crate) use options::MIN_LEASE;
pub(crate) use wire::setup_sql;

/// What the PostgreSQL backend is configured with (its part of [`Builder`](crate::Builder)).
#[derive(Debug, Clone)]
pub(crate) struct PostgresConfig {
    /// `postgres://[user[:password]@]host[:port][/database][?options]`, or the key=value form.
    pub(crate) url: String,
    /// The builder's TLS settings (the URL's `sslmode` and files complete them).
    pub(crate) tls: Option<crate::types::tls::Tls>,
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
    undos: Arc<Undos>,
    /// Lock id -> when an attempt last found it taken or a grant found a waiter (see
    /// [`CONTENDED_FOR`](acquire::CONTENDED_FOR)).
    contended: StdMutex<HashMap<i32, std::time::Instant>>,
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
    /// [`Error::Config`] for a URL the client refuses, [`Error::Server`] when the server
    /// does not answer or refuses the schema.
    pub(crate) async fn connect(config: PostgresConfig) -> Result<PostgresBackend> {
        let cc = Arc::new(ConnConfig::new(&config)?);
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
        inner.ensure_schema(&conn).await.map_err(schema_refused)?;
        Ok(PostgresBackend { inner })
    }
}

impl Backend for PostgresBackend {
    fn lease(&self) -> Option<Duration> {
        Some(self.inner.cc.lease)
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Postgres
    }

    fn acquisition<'a>(
        &'a self,
        target: &'a LockTarget,
        wanted: Wanted,
        wait: Wait,
    ) -> Result<Box<dyn Acquisition + 'a>> {
        let (shared, writer) = match wanted {
            // A leader latch is exclusive; advisory locks keep no participant ids.
            Wanted::Hold(LockMode::Exclusive | LockMode::Leader) => (false, false),
            Wanted::Hold(LockMode::Write) => (false, true),
            Wanted::Hold(LockMode::Read) => (true, false),
            Wanted::Leases { .. } => {
                return Err(Error::Unsupported {
                    backend: BackendKind::Postgres.label(),
                    feature: "semaphores",
                })
            }
        };
        Ok(Box::new(Acquire::new(
            &self.inner,
            target,
            shared,
            writer,
            wait,
        )))
    }

    fn claim_run<'a>(
        &'a self,
        target: &'a LockTarget,
        at_least: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(jobs::claim_run(&self.inner, target, at_least))
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
