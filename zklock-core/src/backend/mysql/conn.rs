//! The backend's connections and what its parts share ([`Inner`]): sessions opened with the
//! lease as their `wait_timeout`, kept idle between uses ([`Inner::take`], [`Inner::give_back`]),
//! and requests bounded by the reply timeout ([`bounded`]).
//!
//! A session serves one acquire, then the hold it became, at a time: a lock held by a session
//! is freed with it, so a lost session is a lost hold, and nothing else on it is at stake. An
//! idle session goes back to the pool, unless it may have been idle past half its
//! `wait_timeout` (the server may be ending it).

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use tokio::time::Instant;

use super::error::MySqlError;
use super::wire;
use crate::backend::undos::Undos;
use crate::backend::HOST_PID;
use crate::background::Background;
use crate::types::tls::{system_roots_pem, Tls};

/// The most idle sessions kept.
const MAX_IDLE: usize = 16;

/// How the backend connects, and its settings.
pub(super) struct Config {
    pub(super) opts: mysql_async::Opts,
    pub(super) lease: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) reply_timeout: Duration,
    pub(super) identity: Option<String>,
    pub(super) tokens: bool,
    /// TLS settings given through the options, if any (else the URL's `require_ssl`).
    pub(super) tls: Option<Tls>,
}

impl Config {
    /// The server as errors name it: `host:port`.
    pub(super) fn host(&self) -> String {
        format!("{}:{}", self.opts.ip_or_hostname(), self.opts.tcp_port())
    }

    /// The TLS settings sessions are opened with, if any: the options', or the URL's
    /// `require_ssl` with the system's roots.
    fn tls_in_use(&self) -> Option<Tls> {
        let url_asks = self.opts.ssl_opts().is_some();
        self.tls.clone().or_else(|| url_asks.then(Tls::new))
    }

    /// The TLS settings of a session opened now (the files read again), verified always: the
    /// CA given (else the system's roots, never a built-in list), the client certificate,
    /// the name to check. `None`: plaintext (neither the options nor the URL ask for TLS).
    fn ssl_opts(&self) -> Result<Option<mysql_async::SslOpts>, MySqlError> {
        let Some(tls) = self.tls_in_use() else {
            return Ok(None);
        };
        let host = self.host();
        let pem = tls
            .pem_now(&host)
            .map_err(|e| MySqlError::Tls(e.to_string()))?;
        let roots = match pem.ca {
            Some(ca) => ca,
            None => system_roots_pem().into_bytes(),
        };
        let mut ssl = mysql_async::SslOpts::default()
            .with_root_certs(vec![roots.into()])
            .with_disable_built_in_roots(true);
        if let Some((cert, key)) = pem.client {
            ssl = ssl.with_client_identity(Some(mysql_async::ClientIdentity::new(
                cert.into(),
                key.into(),
            )));
        }
        if let Some(name) = pem.server_name {
            ssl = ssl.with_danger_tls_hostname_override(Some(name));
        }
        Ok(Some(ssl))
    }
}

/// An idle session, and since when it is idle.
struct Idle {
    conn: mysql_async::Conn,
    since: Instant,
}

/// What the backend's parts share.
pub(crate) struct Inner {
    pub(super) config: Config,
    idle: StdMutex<Vec<Idle>>,
    pub(super) undos: Arc<Undos>,
    pub(super) background: Arc<Background>,
    pub(super) runtime: tokio::runtime::Handle,
    /// Requests sent, for [`BackendStats`](crate::backend::BackendStats).
    pub(super) requests: std::sync::atomic::AtomicU64,
}

impl Inner {
    pub(super) fn new(config: Config) -> Inner {
        Inner {
            config,
            idle: StdMutex::default(),
            undos: Arc::default(),
            background: Arc::default(),
            runtime: tokio::runtime::Handle::current(),
            requests: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Counts a request to the server.
    pub(super) fn count(&self) {
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// A session for an acquire: an idle one that is safely within its `wait_timeout`, else a
    /// new one.
    pub(super) async fn take(&self) -> Result<mysql_async::Conn, MySqlError> {
        let fresh = self.config.lease / 2;
        loop {
            let idle = self.idle.lock().expect("not poisoned").pop();
            match idle {
                Some(idle) if idle.since.elapsed() < fresh => return Ok(idle.conn),
                // May be ended by the server any moment: closed (in the background).
                Some(idle) => self.close(idle.conn),
                None => return self.open().await,
            }
        }
    }

    /// Keeps `conn`, idle and holding nothing, for the next acquire.
    pub(super) fn give_back(&self, conn: mysql_async::Conn) {
        let mut idle = self.idle.lock().expect("not poisoned");
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        } else {
            drop(idle);
            self.close(conn);
        }
    }

    /// Closes `conn` in the background (what it held is freed by the server).
    pub(super) fn close(&self, conn: mysql_async::Conn) {
        let timeout = self.config.reply_timeout;
        self.background.spawn(&self.runtime, async move {
            let _ = tokio::time::timeout(timeout, conn.disconnect()).await;
        });
    }

    /// Opens a session: its `wait_timeout` is the lease (whole seconds), its `program_name`
    /// names zklock, the host, the pid and the identity.
    pub(super) async fn open(&self) -> Result<mysql_async::Conn, MySqlError> {
        self.count();
        // The server ends a session idle this long, which frees its locks: the lease. (The
        // client's own `wait_timeout` option only tells the client; the server's is set here.)
        let lease = self.config.lease.as_secs();
        let ssl = self.config.ssl_opts()?;
        let opts = mysql_async::OptsBuilder::from_opts(self.config.opts.clone())
            .ssl_opts(ssl)
            .wait_timeout(Some(lease as usize))
            .init(vec![format!(
                "SET SESSION wait_timeout = {lease}, SESSION interactive_timeout = {lease}"
            )])
            .prefer_socket(false)
            .tcp_nodelay(true)
            .stmt_cache_size(32)
            .conn_ttl(None::<Duration>);
        match tokio::time::timeout(self.config.connect_timeout, mysql_async::Conn::new(opts)).await
        {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(MySqlError::of_connect(e, self.config.tls_in_use().as_ref())),
            Err(_) => Err(MySqlError::TimedOut),
        }
    }

    /// Ends the session `id` from a sibling session (`KILL <id>`): what it waits for is given
    /// up and what it holds freed. The killed session is never used again.
    pub(super) async fn kill(&self, id: u32) -> Result<(), MySqlError> {
        let mut conn = self.take().await?;
        self.count();
        bounded(
            self.config.reply_timeout,
            conn.query_drop(format!("KILL {id}")),
        )
        .await?;
        self.give_back(conn);
        Ok(())
    }

    /// Refuses a replica (`read_only`), and makes the table unless it is there.
    pub(super) async fn check_server(&self) -> crate::types::error::Result<()> {
        let mut conn = self
            .take()
            .await
            .map_err(|e| e.on(self.config.host(), "connect"))?;
        let within = self.config.reply_timeout;
        let read_only: Option<i64> = bounded(within, conn.query_first(wire::READ_ONLY))
            .await
            .map_err(super::error::mysql_error("connect"))?;
        if read_only.unwrap_or(0) != 0 {
            return Err(super::error::replica());
        }
        if let Err(e) = bounded(within, conn.query_drop(wire::CREATE_TABLE)).await {
            let exists: Option<i64> = bounded(within, conn.query_first(wire::TABLE_EXISTS))
                .await
                .map_err(super::error::mysql_error("connect"))?;
            if exists.unwrap_or(0) == 0 {
                return Err(super::error::schema_refused(e));
            }
        }
        self.give_back(conn);
        Ok(())
    }

    /// Who holds a lock, as the table keeps it: `zklock host=… pid=… at=… [id=…]`.
    pub(super) fn holder(&self) -> String {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        match &self.config.identity {
            Some(id) => format!("zklock {} at={ms} id={id}", *HOST_PID),
            None => format!("zklock {} at={ms}", *HOST_PID),
        }
    }
}

/// `request` within `within`: no reply in time is [`MySqlError::TimedOut`] (the caller closes
/// the session: what it held is freed by the server).
pub(super) async fn bounded<T>(
    within: Duration,
    request: impl std::future::Future<Output = Result<T, mysql_async::Error>>,
) -> Result<T, MySqlError> {
    match tokio::time::timeout(within, request).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(e.into()),
        Err(_) => Err(MySqlError::TimedOut),
    }
}
