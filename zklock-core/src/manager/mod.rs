//! `LockManager`, the top layer: the configuration of every layer below, the entry points to
//! every recipe, and the global manager. One concern per file: the options ([`builder`]),
//! connecting ([`connect`]), the recipes' handles ([`handles`]), the in-memory manager
//! ([`memory`]) and the global one ([`global`](mod@global)).

mod builder;
mod connect;
mod global;
mod handles;
mod memory;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub(crate) use crate::types::error::redacted;
#[cfg(feature = "etcd")]
pub use builder::EtcdOptions;
#[cfg(feature = "mysql")]
pub use builder::MySqlOptions;
#[cfg(feature = "postgres")]
pub use builder::PostgresOptions;
#[cfg(feature = "redis")]
pub use builder::RedisOptions;
#[cfg(feature = "zookeeper")]
pub use builder::ZooKeeperOptions;
pub use builder::{Builder, DEFAULT_LEASE, DEFAULT_NAMESPACE};
pub use global::{global, set_global};

use crate::backend::Backend;
use crate::guard::LockGuard;
use crate::local::{LocalConfig, LocalTable};
use crate::recipe::{Core, OnLost};
use crate::types::error::Result;
use crate::types::inspect::LockKind;
use crate::types::key::Key;
use crate::types::layout;

/// A snapshot of a manager's counters.
///
/// # Examples
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager) {
/// let before = manager.stats();
/// // ... contention ...
/// let woken = manager.stats().predecessor_events - before.predecessor_events;
/// # let _ = woken; }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Watch events received by waiters from the contender nodes ahead of them. A ZooKeeper
    /// waiter watches the two nodes nearest below it and, behind a longer queue, lists it again
    /// once only its predecessor is left of them, so that its predecessor's deletion is its
    /// grant with no request after it: a release is seen by at most 2 waiters, however long
    /// the queue. A herd (every waiter woken by every change) shows up here.
    pub predecessor_events: u64,
    /// Requests the recipes sent to the server (counted on ZooKeeper and etcd; zero on Redis,
    /// PostgreSQL and in memory).
    pub requests: u64,
}

/// One connection to a lock service (a ZooKeeper session, Redis, PostgreSQL or etcd
/// connections, or the in-memory table) and the locks taken through it.
///
/// Create one per process (or use the [global](crate::global) one) and share it: it is a
/// cheap handle (`Clone`) to the session. On ZooKeeper locks are znodes under the manager's namespace
/// (default [`DEFAULT_NAMESPACE`]), written in Apache Curator's format so that JVM services
/// locking the same path exclude each other.
///
/// On Redis (a `redis://` connect string, feature `redis`) the same paths name leases in
/// Redis keys (`zklock:lock:<path>`), renewed while held; the guards, frames, local queue,
/// fencing tokens, loss signal and `#[distributed_lock]` work the same. See `Builder::redis`
/// and the guide's page on the Redis backend (`docs/backends/redis.md`) for what it promises.
/// On etcd (`etcd://`, feature `etcd`) the same paths are prefixes of etcd's own lock and
/// election keys (`docs/backends/etcd.md`).
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// use zklock_core::LockManager;
///
/// let manager = LockManager::connect("127.0.0.1:2181").await?;
/// let guard = manager.lock("order_42").await?;
/// println!("fencing token {}", guard.fencing_token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockManager {
    pub(crate) inner: Arc<Inner>,
}

/// What a manager shares between its handles.
pub(crate) struct Inner {
    pub(crate) core: Arc<Core>,
    pub(crate) namespace: String,
    /// Where it connects, for `Debug` and errors (`memory` for the in-memory backend).
    connect: String,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("LockManager");
        d.field("backend", &self.inner.core.backend.kind().label())
            .field("connect", &redacted(&self.inner.connect))
            .field("namespace", &self.inner.namespace);
        if let Some(session) = self.inner.core.backend.session() {
            d.field("session_id", &session.id);
        }
        d.finish()
    }
}

impl LockManager {
    /// Options for a manager connecting to `connect` (`host:port[,host:port...]` for
    /// ZooKeeper, `redis://host:port[/db]` for Redis, `postgres://user@host/db` for PostgreSQL,
    /// `etcd://host:2379` for etcd; see [`BackendKind::of`](crate::BackendKind::of)).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("127.0.0.1:2181");
    /// # let _ = b;
    /// ```
    pub fn builder(connect: impl Into<String>) -> Builder {
        Builder::new(connect)
    }

    /// Connects with default options, to ZooKeeper, to Redis (a `redis://` URL, or
    /// `redis+sentinel://`, `redis+cluster://`; feature `redis`), to PostgreSQL (a
    /// `postgres://` URL, feature `postgres`) or to etcd (`etcd://`, feature `etcd`).
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for a connect string no backend takes;
    /// [`Error::Unreachable`](crate::Error::Unreachable) when no ZooKeeper server answers within
    /// the session timeout; [`Error::Server`](crate::Error::Server) when a Redis, PostgreSQL or
    /// etcd server does not answer; [`Error::Tls`](crate::Error::Tls) when a TLS handshake
    /// fails.
    ///
    /// ```no_run
    /// # async fn run() -> zklock_core::Result<()> {
    /// let manager = zklock_core::LockManager::connect("127.0.0.1:2181").await?;
    /// let on_redis = zklock_core::LockManager::connect("redis://127.0.0.1:6379").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(connect: impl Into<String>) -> Result<LockManager> {
        Builder::new(connect).connect().await
    }

    /// The namespace under which this manager's locks live.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) {
    /// assert_eq!(m.namespace(), "/zklock/locks");
    /// # }
    /// ```
    pub fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// How long the server keeps this manager's holds once it hears nothing from the process
    /// (a pause, a partition, a crash): the session timeout the ZooKeeper server granted to
    /// the current session (servers clamp the one asked for to `[minSessionTimeout,
    /// maxSessionTimeout]`, by default `[2, 20] x tickTime`), the lease on Redis and
    /// PostgreSQL; `None` in memory. Past it another process can be granted the key, and this
    /// process reports its holds lost before that.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) {
    /// if let Some(lease) = m.lease() {
    ///     println!("a silent holder loses its locks within {lease:?}");
    /// }
    /// # }
    /// ```
    pub fn lease(&self) -> Option<Duration> {
        self.inner.core.backend.lease()
    }

    /// The path of the lock for `key` (namespace + encoded key): a znode path on ZooKeeper, the
    /// name inside the keys on the other backends.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.path_of("a/b")?, "/zklock/locks/a%2Fb");
    /// # Ok(()) }
    /// ```
    pub fn path_of(&self, key: &str) -> Result<String> {
        let key = Key::new(key)?;
        Ok(layout::path(self.namespace(), LockKind::Mutex, &key))
    }

    /// Waits for the exclusive lock on `key` and returns its guard.
    ///
    /// # Cancel safety
    /// This method is cancel safe: dropping the future before it completes leaves no contender
    /// node behind (the node is deleted in the background; [`flush`](Self::flush) waits for it).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let guard = m.lock("user_7").await?;
    /// // critical section
    /// drop(guard);
    /// # Ok(()) }
    /// ```
    pub async fn lock(&self, key: &str) -> Result<LockGuard> {
        self.mutex(key)?.lock().await
    }

    /// Takes the lock on `key` only if nobody holds or waits for it; `Ok(None)` otherwise.
    ///
    /// A try of a key that another task of this process holds answers without a request. Like
    /// every acquire it counts against tokio's cooperative budget, so a loop of tries gives its
    /// thread back now and then and the holder gets to run and let go; a loop that polls
    /// should still wait between its tries, or use [`lock_timeout`](Self::lock_timeout).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// match m.try_lock("nightly-job").await? {
    ///     Some(guard) => { /* run the job */ drop(guard) }
    ///     None => println!("another instance runs it"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_lock(&self, key: &str) -> Result<Option<LockGuard>> {
        self.mutex(key)?.try_lock().await
    }

    /// Waits at most `timeout` for the lock on `key`.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when the wait runs out; nothing is held then and nothing is left on the server.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`lock`](Self::lock).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// use std::time::Duration;
    /// let guard = m.lock_timeout("report", Duration::from_secs(5)).await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub async fn lock_timeout(&self, key: &str, timeout: Duration) -> Result<LockGuard> {
        self.mutex(key)?.lock_timeout(timeout).await
    }

    /// Runs `body` while holding the lock on `key`, then releases it: Curator's
    /// `Locker.lock(key, command)` shape.
    ///
    /// If the hold is lost while `body` runs (see [`LockGuard::lost`](crate::LockGuard::lost)), `body` is dropped at its
    /// next await point and [`Error::LockLost`](crate::Error::LockLost) is returned.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the returned future releases the lock (or removes the waiting node).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let sold = m.with_lock("sku_7", async {
    ///     // read stock, check, write stock
    ///     1
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub fn with_lock<'a, T, F>(
        &'a self,
        key: &'a str,
        body: F,
    ) -> impl Future<Output = Result<T>> + 'a
    where
        F: Future<Output = T> + 'a,
        T: 'a,
    {
        // Boxed before any state machine holds it: nested holds then grow by a pointer, not
        // by a copy of the body per layer.
        let body = Box::pin(body);
        async move { self.mutex(key)?.run(None, OnLost::Abort, body).await }
    }

    /// Waits until every background release and cleanup of this manager has finished: call it
    /// before shutting down, or before checking from elsewhere that nothing is left behind.
    /// Lingering nodes ([`Builder::linger`](crate::Builder::linger)) are given up first.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// drop(m.lock("k").await?);   // released in the background
    /// m.flush().await;            // now the node is gone
    /// # Ok(()) }
    /// ```
    pub async fn flush(&self) {
        self.inner.core.table.end_lingering();
        self.inner.core.backend.flush().await
    }

    /// Counters of this manager's recipes (for tests and benchmarks).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) {
    /// println!("{} requests so far", m.stats().requests);
    /// # }
    /// ```
    pub fn stats(&self) -> StatsSnapshot {
        let stats = self.inner.core.backend.stats();
        StatsSnapshot {
            predecessor_events: stats.predecessor_events,
            requests: stats.requests,
        }
    }

    /// The client this manager's backend talks to its server through, for requests of your
    /// own beside the locks (inspection, a [`ZkFence`](crate::fence::ZkFence)), as the type
    /// `C` you name: on ZooKeeper, the current session's [`zookeeper_client::Client`]
    /// (a new session after an expiry, so ask again rather than keep it). `None` when the
    /// backend has no client of that type to share: the other backends keep their
    /// connections to themselves, because a request of yours on a lock's connection could
    /// change what it holds (on PostgreSQL, a session's advisory locks).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) {
    /// use zklock_core::zookeeper_client::Client;
    ///
    /// match m.client::<Client>() {
    ///     Some(zk) => {
    ///         let children = zk.list_children("/zklock/locks").await;
    ///         # let _ = children;
    ///     }
    ///     None => println!("not a ZooKeeper manager: no zookeeper-client to share"),
    /// }
    /// # }
    /// ```
    pub fn client<C: std::any::Any>(&self) -> Option<C> {
        let boxed = self.inner.core.backend.client()?;
        let any: Box<dyn std::any::Any> = boxed;
        any.downcast::<C>().ok().map(|c| *c)
    }

    fn assemble(backend: Arc<dyn Backend>, builder: &Builder) -> LockManager {
        LockManager {
            inner: Arc::new(Inner {
                core: Arc::new(Core {
                    backend,
                    table: LocalTable::default(),
                    local: LocalConfig {
                        local_queue: builder.local_queue,
                        max_local_handoffs: builder.max_local_handoffs,
                        linger: builder.linger,
                        tokens: builder.fencing_tokens,
                    },
                    try_timeout: builder.try_timeout,
                    key_label: builder.metrics_key_label,
                }),
                namespace: builder.namespace.clone(),
                connect: builder.connect.clone(),
            }),
        }
    }
}
