//! The Redis backend (feature `redis`): leases in one Redis server (or the primary the
//! Sentinels name, or a Cluster's primaries), renewed while held.
//!
//! The folder's map:
//! - `mod.rs`: the backend ([`RedisBackend`]), its [`connect`](RedisBackend::connect), and
//!   its [`Backend`] face, which hands each call to the files below.
//! - `conn/`: the connections (to one server, the Sentinels' primary or a Cluster's nodes),
//!   the pub/sub hub, the watchdog, and what the backend's parts share ([`Inner`]).
//! - `acquire.rs`: one acquire from its first attempt to a grant or a give-up; the order in
//!   which waiters get the lock.
//! - `hold.rs`: a granted hold (release, loss, renewal, downgrade, others waiting), and the
//!   undo of what an unfinished acquire or downgrade may have left
//!   ([`Unfinished`](hold::Unfinished)).
//! - `jobs.rs`: a scheduled job's run record.
//! - `inspect.rs`: what an operator sees of a lock.
//! - `wire/`: the protocol as the server sees it: the scripts and the key layout.
//! - `options.rs`: the user's settings ([`RedisOptions`]).
//! - `error.rs`: the backend's errors and their mapping to zklock's [`Error`](crate::Error).

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

use super::{Acquisition, Backend, BoxFuture, Inspect, LockTarget, Wanted, HOST_PID};
use crate::types::backend_kind::BackendKind;
use crate::types::error::Result;
use crate::types::mode::Wait;
use acquire::{Acquire, Ask};
use conn::breaks::Breaks;
use conn::hub::Hub;
use conn::servers::Servers;
use conn::{role, sentinel, waiter_ttl, watchdog, Conn, Inner};
pub use options::RedisOptions;
use wire::keys;

/// The longest any single request waits for its reply (acquire attempts, releases); shorter
/// when the lease is.
const MAX_REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest lease accepted: renewals go out every lease/3.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(100);

/// What the Redis backend is configured with (its part of [`Builder`](crate::Builder)).
#[derive(Debug, Clone)]
pub(crate) struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` (or `redis+unix://`, `unix://`).
    pub(crate) url: String,
    /// How long a hold lives without a renewal.
    pub(crate) lease: Duration,
    /// How long opening a connection may take.
    pub(crate) connect_timeout: Duration,
    /// Shown in holders' ids beside host and pid.
    pub(crate) identity: Option<String>,
    /// Whether grants take fencing tokens; without, an uncontended mutex acquire is a bare
    /// `SET NX PX`.
    pub(crate) tokens: bool,
    /// Replicas that must acknowledge a write before it counts (`WAIT`), if any.
    pub(crate) acks: Option<options::Acks>,
    /// The Sentinels' own credentials (`redis+sentinel://` only).
    pub(crate) sentinel_auth: Option<options::SentinelAuth>,
    /// The options' TLS settings (a `rediss` scheme asks for TLS too).
    pub(crate) tls: Option<crate::types::tls::Tls>,
}

/// The Redis backend; see [`LockManager::connect`](crate::LockManager::connect).
pub(crate) struct RedisBackend {
    inner: Arc<Inner>,
}

impl RedisBackend {
    /// Opens the connection and checks that the server answers and is a standalone primary.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for a URL the client refuses or a server that
    /// is no primary (a replica, a Sentinel, a Cluster node),
    /// [`Error::Server`](crate::Error::Server) when the server does not answer `INFO` in time.
    pub(crate) async fn connect(config: RedisConfig) -> Result<RedisBackend> {
        let servers = Servers::of(
            &config.url,
            config.tls.as_ref(),
            config.sentinel_auth.as_ref(),
            config.connect_timeout,
        )
        .await?;
        let reply_timeout = config.lease.min(MAX_REPLY_TIMEOUT);
        let runtime = tokio::runtime::Handle::current();
        let breaks = match &servers {
            Servers::Cluster(c) => c.breaks(),
            _ => Breaks::new(),
        };
        let conn = Conn::new(
            servers.clone(),
            config.connect_timeout,
            reply_timeout,
            breaks.clone(),
            runtime.clone(),
        );
        role::require_primary(&conn, &servers, config.connect_timeout).await?;
        let hub = Hub::start(servers.clone(), reply_timeout, &runtime, breaks.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let mut holder_tag = format!("{} hub={}", *HOST_PID, hub.id);
        if let Some(id) = &config.identity {
            holder_tag.push_str(" id=");
            holder_tag.push_str(id);
        }
        let inner = Arc::new(Inner {
            conn,
            breaks,
            hub,
            lease: config.lease,
            tokens: config.tokens,
            acks: config.acks,
            margin: Inner::margin(config.lease),
            runtime,
            background: Arc::default(),
            ids: keys::HolderIds::new(holder_tag),
            keys: keys::KeysCache::new(match servers {
                Servers::Cluster(_) => keys::Layout::Tagged,
                _ => keys::Layout::Plain,
            }),
            waiter_ttl: waiter_ttl(config.lease),
            watchdog: watchdog::Watchdog::default(),
            undos: Arc::default(),
            _sentinel_stop: matches!(servers, Servers::Sentinel(_)).then_some(stop),
        });
        inner.runtime.spawn(watchdog::run(
            Arc::downgrade(&inner),
            watchdog::Watchdog::tick(config.lease),
        ));
        if let Servers::Sentinel(sentinels) = servers {
            inner.runtime.spawn(sentinel::watch(
                sentinels,
                Arc::downgrade(&inner),
                config.connect_timeout,
                stopped,
            ));
        }
        Ok(RedisBackend { inner })
    }
}

impl Backend for RedisBackend {
    fn lease(&self) -> Option<Duration> {
        Some(self.inner.lease)
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Redis
    }

    fn acquisition<'a>(
        &'a self,
        target: &'a LockTarget,
        wanted: Wanted,
        wait: Wait,
    ) -> Result<Box<dyn Acquisition + 'a>> {
        let (ask, n) = match wanted {
            Wanted::Hold(mode) => (Ask::from(mode), 1),
            Wanted::Leases { max, n } => (Ask::Leases { max }, n),
        };
        Ok(Box::new(Acquire::new(&self.inner, target, ask, n, wait)))
    }

    fn claim_run<'a>(
        &'a self,
        target: &'a LockTarget,
        at_least: std::time::Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(jobs::claim_run(&self.inner, target, at_least))
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.inner.background.flush())
    }

    fn inspector(&self) -> std::result::Result<&dyn Inspect, &'static str> {
        Ok(&*self.inner)
    }

    fn revoker(&self) -> std::result::Result<&dyn crate::backend::Revoke, &'static str> {
        Err("revocation (a Redis holder hears nothing from the server that a revoke request could travel by; end the holder's process, or let its lease run out)")
    }
}
