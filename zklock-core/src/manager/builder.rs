//! [`Builder`]: the options of a manager, for every layer below it.

use std::time::Duration;

#[cfg(feature = "etcd")]
pub use crate::backend::etcd::EtcdOptions;
#[cfg(feature = "mysql")]
pub use crate::backend::mysql::MySqlOptions;
#[cfg(feature = "postgres")]
pub use crate::backend::postgres::PostgresOptions;
#[cfg(feature = "redis")]
pub use crate::backend::redis::RedisOptions;
#[cfg(feature = "zookeeper")]
pub use crate::backend::zk::ZooKeeperOptions;
pub use crate::backend::DEFAULT_LEASE;
use crate::metrics::KeyLabel;

/// Options for a [`LockManager`](crate::LockManager), built with [`LockManager::builder`](crate::LockManager::builder).
///
/// The connect string picks the backend: `host:port[,host:port...][/chroot]` is ZooKeeper;
/// a URL `redis://[user:password@]host:port[/db]` (or `redis+unix:///path/to/socket`) is
/// Redis (feature `redis`); a URL `postgres://[user[:password]@]host[:port]/db` (or
/// `postgresql://`) is PostgreSQL (feature `postgres`); `etcd://host:2379[,host:2379...]` is
/// etcd (feature `etcd`). The options on this type apply to
/// every backend; each backend's own settings go through its own method
/// ([`zookeeper`](Self::zookeeper), `redis`, `postgres`, `etcd`) and type, and
/// [`connect`](Self::connect) refuses those of a backend the connect string does not name.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// use std::time::Duration;
/// use zklock_core::LockManager;
///
/// let manager = LockManager::builder("zk1:2181,zk2:2181,zk3:2181")
///     .namespace("/myapp/locks")
///     .zookeeper(|zk| zk.session_timeout(Duration::from_secs(10)))
///     .connect()
///     .await?;
///
/// // The same locks, guards and #[distributed_lock] on Redis: a holder that cannot renew
/// // its 5 s lease loses the lock.
/// # #[cfg(feature = "redis")]
/// let on_redis = LockManager::builder("redis://127.0.0.1:6379")
///     .redis(|r| r.lease(Duration::from_secs(5)))
///     .connect()
///     .await?;
///
/// // And on PostgreSQL's advisory locks: the server ends a holding session silent for 5 s.
/// # #[cfg(feature = "postgres")]
/// let on_postgres = LockManager::builder("postgres://app@db.internal/app")
///     .postgres(|pg| pg.lease(Duration::from_secs(5)))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    pub(crate) connect: String,
    pub(crate) namespace: String,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) local_queue: bool,
    pub(crate) max_local_handoffs: u32,
    pub(crate) linger: Duration,
    pub(crate) fencing_tokens: bool,
    pub(crate) try_timeout: Duration,
    pub(crate) identity: Option<String>,
    /// Whether the metrics carry a `key` label.
    pub(crate) metrics_key_label: KeyLabel,
    /// Each backend's own settings, when given (refused for a connect string that names
    /// another backend).
    #[cfg(feature = "zookeeper")]
    pub(crate) zookeeper: Option<ZooKeeperOptions>,
    #[cfg(feature = "redis")]
    pub(crate) redis: Option<RedisOptions>,
    #[cfg(feature = "postgres")]
    pub(crate) postgres: Option<PostgresOptions>,
    #[cfg(feature = "etcd")]
    pub(crate) etcd: Option<EtcdOptions>,
    #[cfg(feature = "mysql")]
    pub(crate) mysql: Option<MySqlOptions>,
}

/// The default namespace under which lock znodes live.
pub const DEFAULT_NAMESPACE: &str = "/zklock/locks";

impl Builder {
    /// Starts options for the given connect string: ZooKeeper's
    /// `host:port[,host:port...][/chroot]`, a Redis URL `redis://host:port[/db]` (or
    /// `redis+sentinel://`, `redis+cluster://`; feature `redis`), a PostgreSQL URL
    /// `postgres://user@host/db` (feature `postgres`), etcd's `etcd://host:2379[,…]` (feature
    /// `etcd`) or a MySQL / MariaDB URL `mysql://user:password@host/db` (feature `mysql`). The
    /// scheme picks the backend ([`BackendKind::of`](crate::BackendKind::of)).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("127.0.0.1:2181");
    /// # let _ = b;
    /// ```
    pub fn new(connect: impl Into<String>) -> Builder {
        Builder {
            connect: connect.into(),
            namespace: DEFAULT_NAMESPACE.to_string(),
            connect_timeout: None,
            local_queue: true,
            max_local_handoffs: 32,
            linger: Duration::ZERO,
            fencing_tokens: true,
            try_timeout: Duration::from_secs(2),
            identity: None,
            metrics_key_label: KeyLabel::None,
            #[cfg(feature = "zookeeper")]
            zookeeper: None,
            #[cfg(feature = "redis")]
            redis: None,
            #[cfg(feature = "postgres")]
            postgres: None,
            #[cfg(feature = "etcd")]
            etcd: None,
            #[cfg(feature = "mysql")]
            mysql: None,
        }
    }

    /// The znode under which every lock of this manager lives (default [`DEFAULT_NAMESPACE`]).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("127.0.0.1:2181").namespace("/shop/locks");
    /// # let _ = b;
    /// ```
    pub fn namespace(mut self, namespace: impl Into<String>) -> Builder {
        self.namespace = namespace.into();
        self
    }

    /// How long [`connect`](Builder::connect) tries before giving up with
    /// [`Error::Unreachable`](crate::Error::Unreachable) (default: the session timeout). On Redis, how long opening each
    /// connection may take (default 5 s).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("h:2181").connect_timeout(Duration::from_secs(3));
    /// # let _ = b;
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Builder {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Whether tasks of this process queue locally behind one znode per key (default `true`).
    ///
    /// With the local queue, a release hands the lock to the next waiting task of this process
    /// without a ZooKeeper round trip (up to [`max_local_handoffs`](Self::max_local_handoffs) in
    /// a row). Turn it off for strict FIFO across processes: every acquire then queues on
    /// ZooKeeper with a node of its own.
    ///
    /// ```
    /// let strict_fifo = zklock_core::LockManager::builder("h:2181").local_queue(false);
    /// # let _ = strict_fifo;
    /// ```
    pub fn local_queue(mut self, on: bool) -> Builder {
        self.local_queue = on;
        self
    }

    /// How many local handoffs one node may serve, once another contender waits for the key,
    /// before it is released so that the other gets its turn (default 32; 0 hands nothing on
    /// locally). While no other contender waits, the node serves any number of local handoffs
    /// (ZooKeeper: a children watch on the lock path tells when one appears; any doubt, such as
    /// a watch not answered yet, counts as a contender).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("h:2181").max_local_handoffs(8);
    /// # let _ = b;
    /// ```
    pub fn max_local_handoffs(mut self, n: u32) -> Builder {
        self.max_local_handoffs = n;
        self
    }

    /// How long this process keeps the node of a mutex or write lock after its last local
    /// release, while no other contender wants the key (default zero: not at all). Taking the
    /// key again within the linger costs no request: it is a local handoff, with a fencing
    /// token above the last one. The node is given up when the linger runs out, as soon as
    /// another contender appears (on ZooKeeper a children watch on the lock path tells; Curator
    /// clients included), when the hold is lost, and on [`LockManager::flush`](crate::LockManager::flush) or the
    /// manager's drop. Needs the local queue ([`local_queue`](Self::local_queue)).
    ///
    /// The trade-off: a process that takes one key over and over saves a create and a delete
    /// (two commits) per cycle, and the first other process that wants the key pays about one
    /// notification more than a normal handoff. Meanwhile the node stays in the lock path: a
    /// lingering node looks held to tools in other processes (`zklock ls`), while
    /// [`LockManager::inspect`](crate::LockManager::inspect) in this process marks it [`lingering`](crate::Contender::lingering).
    /// PostgreSQL lingers too (a process that starts waiting notifies every process), and
    /// Redis for mutexes (the first process to queue for a key, or to try it, tells the
    /// holder's process; a Redis write lock, which keeps no queue, never lingers), and etcd for
    /// mutexes and write locks (the holder watches its lock's keys for a later contender). On
    /// Redis, PostgreSQL and etcd, taking the key again, like any local handoff, costs one
    /// request that confirms the hold is still this process's (the key still names it; the
    /// holding session still answers), since a key can be deleted or lost, and a session ended,
    /// on the server without a word to its holder yet. Read
    /// locks, semaphores and leader latches do not linger.
    ///
    /// ```no_run
    /// # async fn run() -> zklock_core::Result<()> {
    /// use std::time::Duration;
    ///
    /// let m = zklock_core::LockManager::builder("127.0.0.1:2181")
    ///     .linger(Duration::from_millis(200))
    ///     .connect()
    ///     .await?;
    /// let first = m.lock("report").await?;
    /// let token = first.fencing_token();
    /// drop(first); // the node lingers
    /// let again = m.lock("report").await?; // no request to ZooKeeper
    /// assert!(again.fencing_token() > token);
    /// # Ok(()) }
    /// ```
    pub fn linger(mut self, linger: Duration) -> Builder {
        self.linger = linger;
        self
    }

    /// Whether holds carry fencing tokens (default `true`).
    ///
    /// A fencing token is what a store checks to refuse a paused holder's late writes (see
    /// [`fence`](crate::fence)). ZooKeeper's come free with each contender node, but on Redis
    /// a grant takes its token from the server's clock and the lock's fence counter (a script,
    /// where a bare `SET NX PX` would do), and on PostgreSQL it writes the key's row (a
    /// transaction id and a commit per grant). If nothing you protect checks tokens, turn them
    /// off: an uncontended acquire on Redis is then a bare `SET NX PX`, and a grant on
    /// PostgreSQL writes nothing. See BENCHMARKS.md for what each costs.
    ///
    /// Without tokens, every hold of this manager, on every backend, reports
    /// [`FencingToken::NONE`](crate::FencingToken::NONE), and a fenced write through one
    /// ([`LockGuard::fenced`](crate::LockGuard::fenced)) fails with
    /// [`FenceError::NoToken`](crate::fence::FenceError::NoToken) without reaching the store.
    /// Exclusion is the same either way, and processes with and without tokens can share a
    /// key: the holds of those with tokens still get increasing tokens in grant order.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use zklock_core::fence::{FenceError, MemoryFence};
    /// use zklock_core::{FencingToken, LockManager};
    ///
    /// // On Redis or PostgreSQL this spares each grant its token's work.
    /// let manager = LockManager::in_memory_with(LockManager::builder("memory").fencing_tokens(false));
    /// let guard = manager.lock("report").await?;
    /// assert_eq!(guard.fencing_token(), FencingToken::NONE);
    /// let store = MemoryFence::new();
    /// assert!(matches!(guard.fenced(&store).write(1).await, Err(FenceError::NoToken { .. })));
    /// # Ok(()) }
    /// ```
    pub fn fencing_tokens(mut self, on: bool) -> Builder {
        self.fencing_tokens = on;
        self
    }

    /// How long a `try_*` acquire (`try_lock`, `try_read`, `try_acquire`, ...) may take in all,
    /// when ZooKeeper is slow or unreachable (default 2 s). A try waits for no other holder,
    /// but it needs the server's answer: past this it fails with [`Error::Timeout`](crate::Error::Timeout) and leaves
    /// nothing behind, instead of waiting for the connection to come back.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("h:2181").try_timeout(Duration::from_millis(500));
    /// # let _ = b;
    /// ```
    pub fn try_timeout(mut self, timeout: Duration) -> Builder {
        self.try_timeout = timeout;
        self
    }

    /// Text that identifies this process in its contender nodes, beside host and pid (shown by
    /// [`LockManager::inspect`](crate::LockManager::inspect) and `zklock ls`), e.g. an instance name or a request id. On
    /// Redis it follows the holder's uuid in the lock's value (`GET zklock:lock:<path>`).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("h:2181").identity("checkout-7f9c");
    /// # let _ = b;
    /// ```
    pub fn identity(mut self, identity: impl Into<String>) -> Builder {
        self.identity = Some(identity.into());
        self
    }

    /// Adds a `key` label to the per-lock metrics (see [`metrics`](crate::metrics)): none by
    /// default ([`KeyLabel::None`]), the first N characters of the key
    /// ([`KeyLabel::Prefix`]), or the whole key ([`KeyLabel::Full`]).
    ///
    /// Keys often come from requests (`user_{id}`): a label per key grows without bound and
    /// can overwhelm a metrics store. Prefer a prefix that groups keys by kind, and keep
    /// `Full` for a small, fixed set of keys. With a key label each emission builds its label
    /// set (an allocation); without, the label sets are static.
    ///
    /// ```
    /// use zklock_core::KeyLabel;
    /// // "user_42" and "user_7" both count under key="user_"; "sku_9" under key="sku_9".
    /// let b = zklock_core::LockManager::builder("h:2181").metrics_key_label(KeyLabel::Prefix(5));
    /// # let _ = b;
    /// ```
    pub fn metrics_key_label(mut self, label: KeyLabel) -> Builder {
        self.metrics_key_label = label;
        self
    }

    /// The ZooKeeper backend's own settings (session, credentials, TLS, revocation, watches):
    /// `options` gets the settings given so far (the defaults at first) and returns them
    /// changed. [`connect`](Self::connect) refuses them with [`Error::Config`](crate::Error::Config)
    /// when the connect string names another backend.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("zk1:2181,zk2:2181")
    ///     .zookeeper(|zk| zk.session_timeout(Duration::from_secs(6)))
    ///     .zookeeper(|zk| zk.revocable(true)); // adds to the settings before
    /// # let _ = b;
    /// ```
    #[cfg(feature = "zookeeper")]
    pub fn zookeeper(
        mut self,
        options: impl FnOnce(ZooKeeperOptions) -> ZooKeeperOptions,
    ) -> Builder {
        self.zookeeper = Some(options(self.zookeeper.take().unwrap_or_default()));
        self
    }

    /// The Redis backend's own settings (the lease): `options` gets the settings given so far
    /// (the defaults at first) and returns them changed. [`connect`](Self::connect) refuses
    /// them with [`Error::Config`](crate::Error::Config) when the connect string names
    /// another backend.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("redis://127.0.0.1:6379")
    ///     .redis(|r| r.lease(Duration::from_secs(3)));
    /// # let _ = b;
    /// ```
    #[cfg(feature = "redis")]
    pub fn redis(mut self, options: impl FnOnce(RedisOptions) -> RedisOptions) -> Builder {
        self.redis = Some(options(self.redis.take().unwrap_or_default()));
        self
    }

    /// The PostgreSQL backend's own settings (the lease): `options` gets the settings given
    /// so far (the defaults at first) and returns them changed. [`connect`](Self::connect)
    /// refuses them with [`Error::Config`](crate::Error::Config) when the connect string
    /// names another backend.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("postgres://app@db.internal/app")
    ///     .postgres(|pg| pg.lease(Duration::from_secs(3)));
    /// # let _ = b;
    /// ```
    #[cfg(feature = "postgres")]
    pub fn postgres(mut self, options: impl FnOnce(PostgresOptions) -> PostgresOptions) -> Builder {
        self.postgres = Some(options(self.postgres.take().unwrap_or_default()));
        self
    }

    /// The etcd backend's own settings (the lease, the user): `options` gets the settings
    /// given so far (the defaults at first) and returns them changed.
    /// [`connect`](Self::connect) refuses them with [`Error::Config`](crate::Error::Config)
    /// when the connect string names another backend.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("etcd://127.0.0.1:2379")
    ///     .etcd(|e| e.lease(Duration::from_secs(5)));
    /// # let _ = b;
    /// ```
    #[cfg(feature = "etcd")]
    pub fn etcd(mut self, options: impl FnOnce(EtcdOptions) -> EtcdOptions) -> Builder {
        self.etcd = Some(options(self.etcd.take().unwrap_or_default()));
        self
    }

    /// The MySQL / MariaDB backend's own settings (the lease): `options` gets the settings
    /// given so far (the defaults at first) and returns them changed.
    /// [`connect`](Self::connect) refuses them with [`Error::Config`](crate::Error::Config)
    /// when the connect string names another backend.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("mysql://app:secret@db.internal/app")
    ///     .mysql(|my| my.lease(Duration::from_secs(5)));
    /// # let _ = b;
    /// ```
    #[cfg(feature = "mysql")]
    pub fn mysql(mut self, options: impl FnOnce(MySqlOptions) -> MySqlOptions) -> Builder {
        self.mysql = Some(options(self.mysql.take().unwrap_or_default()));
        self
    }
}
