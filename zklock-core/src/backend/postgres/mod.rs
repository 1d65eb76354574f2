//! The PostgreSQL backend (feature `postgres`): session-level advisory locks held on
//! connections the backend owns.
//!
//! - A lock path gets an id from the key table `zklock_keys` (a `serial`, so no two paths
//!   share one), and its lock is the advisory lock `(LOCK_CLASS, id)`; see [`wire`].
//! - An acquire of a free key is one statement on a holding connection:
//!   `pg_try_advisory_lock` (or `_shared` for readers) and, once it got the lock, the raise of
//!   the path's `fence` under it, which is the fencing token, committed without waiting for the
//!   WAL flush when it is the server's clock reading (see [`wire`]). See [`conn`] for which
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
//!   a lock granted just as it was dropped (see [`Unfinished`](acquire::Unfinished)). A statement of an acquire
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
//!   queue the order is the server's; a backend's retrying waiters take freed waits there in
//!   the order they came (one line per backend), but a retrying waiter that finds the lock
//!   free between two grants takes it, whatever came before it in other processes; the local
//!   queue keeps FIFO within a process.
//! - Semaphores and revocation do not fit advisory locks cleanly: [`Error::Unsupported`].
//!   Job records (`claim_run`) live in the key table (`run_after`, by the server's clock).
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
mod options;
mod wire;
mod tls;

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use super::undos::Undos;
use super::{Backend, BackendHold, BoxFuture, Inspect, LockTarget, SharedHold, HOST_PID};
use crate::background::Background;
use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, Result};
use crate::types::mode::{LockMode, Wait};
use acquire::Acquire;
use conn::{ConnConfig, HoldConn, Pool};
use error::PostgresError;
use hub::Hub;
pub use options::PostgresOptions;

/// The longest any single request waits for its reply; shorter when the lease is.
const MAX_REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a waiter sleeps without a notified release before it tries again: a holder whose
/// session ended (killed, crashed, partitioned past the lease) released without notifying.
pub(crate) const POLL_FALLBACK: Duration = Duration::from_millis(500);
/// The shortest lease accepted: liveness checks go out every lease/3, and the server counts
/// `idle_session_timeout` in milliseconds.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(300);

/// The SQL that creates zklock's table and, with `grant_to`, grants that role what zklock uses
/// of it: reading and writing its rows (never deleting them) and taking ids from its sequence.
/// Advisory locks, `LISTEN`/`NOTIFY`, `idle_session_timeout` and cancelling a statement of
/// another session of the same role need no grant.
pub(crate) fn setup_sql(grant_to: Option<&str>) -> Result<String> {
    let mut sql = wire::CREATE_SCHEMA.to_string();
    if let Some(role) = grant_to {
        if role.contains('\0') {
            return Err(Error::InvalidArgument(
                "a role name cannot hold a NUL byte".to_string(),
            ));
        }
        let role = format!("\"{}\"", role.replace('"', "\"\""));
        sql.push_str(&format!(
            "\nGRANT SELECT, INSERT, UPDATE ON TABLE zklock_keys TO {role};\
             \nGRANT USAGE ON SEQUENCE zklock_keys_id_seq TO {role};"
        ));
    }
    sql.push('\n');
    Ok(sql)
}
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
    undos: Arc<Undos<i32>>,
    /// Lock id -> when an attempt last found it taken or a grant found a waiter (see
    /// [`CONTENDED_FOR`]).
    contended: StdMutex<HashMap<i32, std::time::Instant>>,
}

/// A postgres error during `operation`.
fn pg_error(operation: &'static str) -> impl FnOnce(PostgresError) -> Error {
    move |source| source.during(operation)
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
            .run(conn.client().query_typed(wire::SCHEMA_EXISTS, &[]))
            .await?;
        if exists.first().is_some_and(|r| r.get::<_, bool>(0)) {
            return Ok(());
        }
        conn.run(conn.client().batch_execute(wire::CREATE_SCHEMA))
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
                    .query_typed(wire::FIND_ID, &[(&&**path, Type::TEXT)]),
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
                            .query_typed(wire::ADD_PATH, &[(&&**path, Type::TEXT)]),
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
        // The URL may carry a password: errors name the problem, not the URL.
        let (url, tls) = tls::split_url(&config.url, config.tls.as_ref())?;
        let mut pg: tokio_postgres::Config = url
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
            tls,
            timeline: AtomicU32::new(0),
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
        inner.ensure_schema(&conn).await.map_err(|e| {
            if e.get_ref().and_then(|e| e.code()) == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
                return Error::Config(
                    "zklock's table zklock_keys is not in this database, and this role may not \
                     create it: have an administrator run, once, the SQL that `zklock --connect \
                     <URL> setup --grant-to <role>` prints (see the security guide)"
                        .to_string(),
                );
            }
            e.during("create the table zklock_keys")
        })?;
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
            let hold = Acquire::new(&self.inner, target, shared, writer, wait)
                .run()
                .await?;
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
                backend: BackendKind::Postgres.label(),
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
                            wire::CLAIM_RUN,
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
