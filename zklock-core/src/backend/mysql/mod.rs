//! The MySQL / MariaDB backend (feature `mysql`): session-level user locks (`GET_LOCK`) held by
//! sessions the backend owns.
//!
//! - `mod.rs`: this map, the backend's struct, its construction and its `impl Backend`.
//! - [`conn`]: the sessions: opening, the pool of idle ones, kills, what the parts share.
//! - [`acquire`]: an acquire from start to grant or give-up, and the undo of one dropped.
//! - [`hold`]: a granted hold: liveness, loss, release.
//! - [`jobs`]: a scheduled job's run record (`claim_run`, the `at_least` window).
//! - [`inspect`]: what an operator sees of a lock.
//! - [`wire`]: the protocol as the server sees it: lock names, the table, the SQL.
//! - [`options`]: the user's settings, [`MySqlOptions`].
//! - [`error`]: the backend's errors and their mapping to zklock's [`Error`].
//!
//! ## How it works
//!
//! - A lock path's lock is the user lock of its name (see [`wire::name`]): the path's tail kept
//!   readable and a hash of the whole path, within the server's 64 characters.
//! - An acquire takes a session of its own from the pool and runs `GET_LOCK` on it: with no
//!   wait for a try, else waiting in the server's queue (no polling) for a slice of one
//!   lease, then again. Granted, it raises the lock's token in the table
//!   `zklock_locks`, under the lock: the row's `fence` plus one, and at least the server's clock
//!   in µs, so that a token survives a crash that lost the last commits. The session is then
//!   the hold's, until its release (`RELEASE_LOCK`), after which it goes back to the pool.
//! - A hold is lost the moment a liveness check (every lease/3) fails or its session breaks
//!   (the server ended it: `KILL`, a restart), and at the latest when no check was confirmed
//!   before the server could have ended the idle session: each session runs with
//!   `wait_timeout` = the lease, so the locks of a holder that went silent (paused,
//!   partitioned) are freed by the server after the lease, and this side reports the loss at
//!   94% of it.
//! - An acquire dropped (or timed out) while its `GET_LOCK` may still wait or may have been
//!   granted has its session ended from a sibling session (`KILL <id>`): the session is never
//!   used again, so the kill cannot reach a later statement. The kill counts as an undo of the
//!   lock: this process's next acquire of it waits for the kill.
//! - A server with `read_only` set (a replica) is refused at connect: its user locks would
//!   exclude only its own sessions.
//! - User locks are exclusive: read/write locks, semaphores and revocation are
//!   [`Error::Unsupported`]. Mutexes, multi-locks, leader latches and scheduled jobs run.
//!   Job records (`claim_run`, see [`jobs`]) live in the lock's row (`run_until_us`, by the
//!   server's clock).
//!
//! ## Why `mysql_async`
//!
//! It is the maintained tokio-based MySQL client that speaks the protocol itself (no C
//! library), for MySQL and MariaDB alike, with the statement cache and the session options
//! (`wait_timeout`) this backend needs; sqlx's MySQL driver brings a pool and a query layer
//! that the backend would bypass (a hold owns its session), and more to compile.

mod acquire;
mod conn;
mod error;
mod hold;
mod inspect;
mod jobs;
mod options;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use super::{Acquisition, Backend, BackendStats, BoxFuture, Inspect, LockTarget, Wanted};
use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, Result};
use crate::types::mode::{LockMode, Wait};
use acquire::Acquire;
use conn::{Config, Inner};
pub use options::MySqlOptions;
pub(crate) use options::MIN_LEASE;
pub(crate) use wire::setup_sql;

/// The user-lock name (`GET_LOCK`) of the lock at `path` ([`LockManager::path_of`] gives a
/// key's path): another client that takes this name with `SELECT GET_LOCK('<name>', …)`
/// excludes zklock's holders of the lock, and is excluded by them. At most 64 characters: the
/// path's tail kept readable, then a hash of the whole path.
///
/// [`LockManager::path_of`]: crate::LockManager::path_of
///
/// ```
/// let name = zklock_core::mysql_lock_name("/zklock/locks/orders/42");
/// assert!(name.starts_with("zklock:locks/orders/42:"));
/// assert!(name.len() <= 64);
/// ```
pub fn lock_name(path: &str) -> String {
    wire::name(path)
}

/// How the manager's builder configures the backend.
pub(crate) struct MySqlConfig {
    /// `mysql://` or `mariadb://`.
    pub(crate) url: String,
    pub(crate) options: MySqlOptions,
    pub(crate) connect_timeout: Duration,
    pub(crate) identity: Option<String>,
    pub(crate) tokens: bool,
}

/// The MySQL / MariaDB backend.
pub(crate) struct MySqlBackend {
    inner: Arc<Inner>,
}

impl MySqlBackend {
    /// Opens a first session (checking the server takes writes and making the table) and
    /// returns the backend.
    ///
    /// # Errors
    /// [`Error::Config`] for a URL the client cannot use, a replica, or a table the account may
    /// not make; [`Error::Server`] when the server does not answer.
    pub(crate) async fn connect(config: MySqlConfig) -> Result<MySqlBackend> {
        let url = match config.url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("mariadb") => {
                format!("mysql://{rest}")
            }
            _ => config.url.clone(),
        };
        let opts = mysql_async::Opts::from_url(&url).map_err(error::unusable_url)?;
        if opts
            .ssl_opts()
            .is_some_and(|s| s.skip_domain_validation() || s.accept_invalid_certs())
        {
            return Err(Error::Config(
                "the MySQL URL turns the server's certificate check off (verify_ca=false or \
                 verify_identity=false): zklock always verifies the server; give a private CA \
                 with .mysql(|my| my.tls(Tls::new().ca_file(..))) instead"
                    .into(),
            ));
        }
        if config.options.lease.subsec_nanos() != 0 {
            return Err(Error::Config(format!(
                "the MySQL lease is {:?}; give whole seconds (the server counts wait_timeout in \
                 seconds)",
                config.options.lease
            )));
        }
        let inner = Arc::new(Inner::new(Config {
            opts,
            lease: config.options.lease,
            connect_timeout: config.connect_timeout,
            // A request's answer is due well within a liveness period.
            reply_timeout: (config.options.lease / 3).max(Duration::from_millis(500)),
            identity: config.identity,
            tokens: config.tokens,
            tls: config.options.tls.clone(),
        }));
        inner.check_server().await?;
        Ok(MySqlBackend { inner })
    }
}

impl Backend for MySqlBackend {
    fn lease(&self) -> Option<Duration> {
        Some(self.inner.config.lease)
    }

    fn kind(&self) -> BackendKind {
        BackendKind::MySql
    }

    fn acquisition<'a>(
        &'a self,
        target: &'a LockTarget,
        wanted: Wanted,
        wait: Wait,
    ) -> Result<Box<dyn Acquisition + 'a>> {
        let unsupported = |feature| Error::Unsupported {
            backend: BackendKind::MySql.label(),
            feature,
        };
        match wanted {
            // A leader latch is exclusive; user locks keep no participant ids.
            Wanted::Hold(LockMode::Exclusive | LockMode::Leader) => {
                Ok(Box::new(Acquire::new(&self.inner, target, wait)))
            }
            Wanted::Hold(LockMode::Read | LockMode::Write) => Err(unsupported("read/write locks")),
            Wanted::Leases { .. } => Err(unsupported("semaphores")),
        }
    }

    fn claim_run<'a>(
        &'a self,
        target: &'a LockTarget,
        at_least: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(jobs::claim_run(&self.inner, target, at_least))
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.inner.background.flush())
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            requests: self
                .inner
                .requests
                .load(std::sync::atomic::Ordering::Relaxed),
            ..BackendStats::default()
        }
    }

    fn inspector(&self) -> std::result::Result<&dyn Inspect, &'static str> {
        Ok(self)
    }

    fn revoker(&self) -> std::result::Result<&dyn crate::backend::Revoke, &'static str> {
        Err("revocation (a MySQL holder is not told of a revoke request; end its session with KILL <id>, which `zklock status` shows)")
    }
}
