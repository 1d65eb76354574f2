//! `LockManager`, the top layer: the configuration of every layer below, the entry points to
//! every recipe, and the global manager.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::Client;

use crate::backend::memory::MemoryBackend;
#[cfg(feature = "postgres")]
use crate::backend::postgres::{self, PostgresBackend, PostgresConfig};
#[cfg(feature = "redis")]
use crate::backend::redis::{RedisBackend, RedisConfig, MIN_LEASE};
use crate::backend::zk::{ZkBackend, ZkConfig};
use crate::backend::Backend;
use crate::guard::LockGuard;
use crate::local::{LocalConfig, LocalTable};
use crate::metrics::KeyLabel;
use crate::recipe::job::Job;
use crate::recipe::leader::LeaderLatch;
use crate::recipe::mutex::Mutex;
use crate::recipe::rwlock::RwLock;
use crate::recipe::semaphore::Semaphore;
use crate::recipe::Core;
use crate::session::{DisconnectPolicy, SessionConfig, SessionOwner};
use crate::types::error::{Error, Result};
use crate::types::key::{validate_path, Key};

/// Options for a [`LockManager`], built with [`LockManager::builder`].
///
/// The connect string picks the backend: `host:port[,host:port...][/chroot]` is ZooKeeper;
/// a URL `redis://[user:password@]host:port[/db]` (or `redis+unix:///path/to/socket`) is
/// Redis (feature `redis`); a URL `postgres://[user[:password]@]host[:port]/db` (or
/// `postgresql://`) is PostgreSQL (feature `postgres`). Most options apply to all; those that do not say so, and
/// [`connect`](Self::connect) refuses a ZooKeeper-only option that would weaken safety on
/// Redis (`digest_auth`, `tls`, `revocable`).
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
///     .session_timeout(Duration::from_secs(10))
///     .connect()
///     .await?;
///
/// // The same locks, guards and #[distributed_lock] on Redis: a holder that cannot renew
/// // its 5 s lease loses the lock.
/// let on_redis = LockManager::builder("redis://127.0.0.1:6379")
///     .lease(Duration::from_secs(5))
///     .connect()
///     .await?;
///
/// // And on PostgreSQL's advisory locks: the server ends a holding session silent for 5 s.
/// let on_postgres = LockManager::builder("postgres://app@db.internal/app")
///     .lease(Duration::from_secs(5))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    connect: String,
    namespace: String,
    session_timeout: Duration,
    connect_timeout: Option<Duration>,
    /// The lease of a Redis hold.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    lease: Duration,
    disconnect_policy: DisconnectPolicy,
    renew_session: bool,
    pub(crate) local_queue: bool,
    pub(crate) max_local_handoffs: u32,
    pub(crate) linger: Duration,
    pub(crate) revocable: bool,
    pub(crate) watch_held_nodes: bool,
    pub(crate) try_timeout: Duration,
    pub(crate) identity: Option<String>,
    /// Whether the metrics carry a `key` label.
    pub(crate) metrics_key_label: KeyLabel,
    /// `user:password` for ZooKeeper's digest scheme; lock nodes are then protected by ACLs.
    digest: Option<String>,
    #[cfg(feature = "tls")]
    tls: Option<zookeeper_client::TlsOptions>,
}

/// The default namespace under which lock znodes live.
pub const DEFAULT_NAMESPACE: &str = "/zklock/locks";

/// The default lease of a hold on Redis; see [`Builder::lease`].
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// How long opening a Redis connection may take unless
/// [`connect_timeout`](Builder::connect_timeout) says otherwise.
#[cfg(feature = "redis")]
const DEFAULT_REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long opening a PostgreSQL connection may take unless
/// [`connect_timeout`](Builder::connect_timeout) says otherwise.
#[cfg(feature = "postgres")]
const DEFAULT_POSTGRES_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`Builder::check_lease_backend`] says of one lease backend.
#[cfg(any(feature = "redis", feature = "postgres"))]
struct LeaseBackend {
    /// As messages name it.
    name: &'static str,
    /// As [`Error::Unsupported`] names it.
    id: &'static str,
    /// A URL that carries credentials.
    credentials: &'static str,
    /// What to do instead of `Builder::tls`.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    tls: &'static str,
    min_lease: Duration,
    /// What goes out every lease/3 to keep a hold.
    renewals: &'static str,
}

/// Whether `connect` names a PostgreSQL server (`postgres://`, `postgresql://`).
fn is_postgres_url(connect: &str) -> bool {
    let lower = connect.trim_start().to_ascii_lowercase();
    ["postgres://", "postgresql://"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
}

/// Whether `connect` names a Redis server rather than ZooKeeper servers.
fn is_redis_url(connect: &str) -> bool {
    let lower = connect.trim_start().to_ascii_lowercase();
    ["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .any(|scheme| lower.starts_with(scheme))
}

/// The scheme of `connect` when it names one (`foo://…`) that no backend takes: a ZooKeeper
/// connect string is `host:port[,host:port…][/chroot]` with no scheme.
fn unknown_scheme(connect: &str) -> Option<&str> {
    let (scheme, _) = connect.trim_start().split_once("://")?;
    let known = is_redis_url(connect) || is_postgres_url(connect);
    (!known).then_some(scheme)
}

/// `connect` without the password a URL may carry.
fn redacted(connect: &str) -> String {
    // Any URL's user part (`scheme://user:password@host`); a ZooKeeper connect string has none.
    match (connect.find("://"), connect.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &connect[..scheme], &connect[at + 1..])
        }
        _ => connect.to_string(),
    }
}

impl Builder {
    /// Starts options for the given connect string: ZooKeeper's
    /// `host:port[,host:port...][/chroot]`, or a Redis URL `redis://host:port[/db]` (feature
    /// `redis`).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("127.0.0.1:2181");
    /// # let _ = b;
    /// ```
    pub fn new(connect: impl Into<String>) -> Builder {
        Builder {
            connect: connect.into(),
            namespace: DEFAULT_NAMESPACE.to_string(),
            session_timeout: Duration::from_secs(10),
            connect_timeout: None,
            lease: DEFAULT_LEASE,
            disconnect_policy: DisconnectPolicy::Immediate,
            renew_session: true,
            local_queue: true,
            max_local_handoffs: 32,
            linger: Duration::ZERO,
            revocable: false,
            watch_held_nodes: true,
            try_timeout: Duration::from_secs(2),
            identity: None,
            metrics_key_label: KeyLabel::None,
            digest: None,
            #[cfg(feature = "tls")]
            tls: None,
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

    /// The session timeout asked of the server (default 10 s; the server clamps it to
    /// `[2, 20] x tickTime` unless configured otherwise). A process that stops talking to
    /// ZooKeeper for this long loses its locks. ZooKeeper only: on Redis, see
    /// [`lease`](Self::lease).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("h:2181").session_timeout(Duration::from_secs(4));
    /// # let _ = b;
    /// ```
    pub fn session_timeout(mut self, timeout: Duration) -> Builder {
        self.session_timeout = timeout;
        self
    }

    /// How long [`connect`](Builder::connect) tries before giving up with
    /// [`Error::Unreachable`] (default: the session timeout). On Redis, how long opening each
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

    /// What a disconnection means for held locks (default [`DisconnectPolicy::Immediate`]).
    /// ZooKeeper only: on Redis a hold is lost as soon as a renewal fails (see
    /// [`lease`](Self::lease)).
    ///
    /// ```
    /// # use std::time::Duration;
    /// use zklock_core::DisconnectPolicy;
    /// let b = zklock_core::LockManager::builder("h:2181")
    ///     .disconnect_policy(DisconnectPolicy::Grace(Duration::from_secs(1)));
    /// # let _ = b;
    /// ```
    pub fn disconnect_policy(mut self, policy: DisconnectPolicy) -> Builder {
        self.disconnect_policy = policy;
        self
    }

    /// Whether the manager opens a new session after its session expires (default `true`).
    /// Locks held by the expired session are reported lost either way. ZooKeeper only.
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("h:2181").renew_session(false);
    /// # let _ = b;
    /// ```
    pub fn renew_session(mut self, renew: bool) -> Builder {
        self.renew_session = renew;
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
    /// clients included), when the hold is lost, and on [`LockManager::flush`] or the
    /// manager's drop. Needs the local queue ([`local_queue`](Self::local_queue)).
    ///
    /// The trade-off: a process that takes one key over and over saves a create and a delete
    /// (two commits) per cycle, and the first other process that wants the key pays about one
    /// notification more than a normal handoff. Meanwhile the node stays in the lock path: a
    /// lingering node looks held to tools in other processes (`zklock ls`), while
    /// [`LockManager::inspect`] in this process marks it [`lingering`](crate::Contender::lingering).
    /// PostgreSQL lingers too (a process that starts waiting notifies every process), and
    /// Redis for mutexes (the first process to queue for a key, or to try it, tells the
    /// holder's process; a Redis write lock, which keeps no queue, never lingers). On Redis and
    /// PostgreSQL, taking the key again, like any local handoff, costs one request that
    /// confirms the hold is still this process's (the key still names it; the holding session
    /// still answers), since a key can be deleted or lost, and a session ended, on the server
    /// without a word to its holder yet. Read
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

    /// Authenticates the session with ZooKeeper's `digest` scheme. Lock paths and contender
    /// nodes are then created with the `creator_all` ACL: only sessions with the same
    /// credentials can delete, revoke or queue on them, so another tenant cannot take your
    /// locks away. ZooKeeper only: Redis credentials go in the URL
    /// (`redis://user:password@host:6379`), and [`connect`](Self::connect) refuses this option
    /// on Redis.
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("h:2181").digest_auth("billing", "s3cret");
    /// # let _ = b;
    /// ```
    pub fn digest_auth(mut self, user: &str, password: &str) -> Builder {
        self.digest = Some(format!("{user}:{password}"));
        self
    }

    /// Connects over TLS (the servers' `secureClientPort`), with zookeeper-client's options
    /// (CA and client identity). Needs the `tls` feature. ZooKeeper only (refused on Redis).
    ///
    /// ```no_run
    /// # fn run(ca_pem: &str) -> Result<(), zookeeper_client::Error> {
    /// let tls = zookeeper_client::TlsOptions::default().with_pem_ca_certs(ca_pem)?;
    /// let b = zklock_core::LockManager::builder("zk1:2281").tls(tls);
    /// # let _ = b; Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls(mut self, options: zookeeper_client::TlsOptions) -> Builder {
        self.tls = Some(options);
        self
    }

    /// Makes every hold of this manager revocable (see [`LockGuard::make_revocable`](crate::LockGuard::make_revocable)).
    /// ZooKeeper only: [`connect`](Self::connect) on Redis refuses it with
    /// [`Error::Unsupported`].
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("h:2181").revocable(true);
    /// # let _ = b;
    /// ```
    pub fn revocable(mut self, on: bool) -> Builder {
        self.revocable = on;
        self
    }

    /// Whether every held node is watched from the moment it is granted (default `true`).
    /// ZooKeeper only: a Redis hold learns of a deleted lease at its next renewal.
    ///
    /// The watch is what tells a holder that someone else deleted its node (an operator, a
    /// revocation): with it, [`is_held`](crate::LockGuard::is_held) turns false as soon as
    /// this process has heard of the deletion. A hold granted on the listing that followed its
    /// create, with no other node in the lock path, is watched through that listing's children
    /// watch at no cost, and costs one read request (the node's data watch) only once the lock
    /// path's children change (so its own deletion shows after that read); a hold granted
    /// after waiting takes over the data watch its
    /// waiter set on its own node, also at no cost. Either way each grant starts a task that
    /// waits for the watch. Turned off, a grant starts no task and sends no watch request
    /// until first interest (`lost()`, `is_held()`, `make_revocable()`, a `with_lock` body
    /// that aborts on loss, a local handoff of the node), so the first `is_held()` after a
    /// deletion may still answer `true`. Session loss is noticed either way. (Measured on an
    /// uncontended cycle, turning it off saved no time: see BENCHMARKS.md.)
    ///
    /// ```
    /// // No watch task per grant, at the price of a later notice of a deleted node.
    /// let b = zklock_core::LockManager::builder("h:2181").watch_held_nodes(false);
    /// # let _ = b;
    /// ```
    pub fn watch_held_nodes(mut self, on: bool) -> Builder {
        self.watch_held_nodes = on;
        self
    }

    /// How long a `try_*` acquire (`try_lock`, `try_read`, `try_acquire`, ...) may take in all,
    /// when ZooKeeper is slow or unreachable (default 2 s). A try waits for no other holder,
    /// but it needs the server's answer: past this it fails with [`Error::Timeout`] and leaves
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
    /// [`LockManager::inspect`] and `zklock ls`), e.g. an instance name or a request id. On
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

    /// How long a hold on Redis lives without a renewal (default [`DEFAULT_LEASE`], 10 s; at
    /// least 100 ms). Redis and PostgreSQL only: ZooKeeper holds live as long as their session.
    ///
    /// On PostgreSQL (at least 300 ms) it is the `idle_session_timeout` of the sessions that
    /// hold advisory locks: they are checked every lease/3, a hold is reported lost at once
    /// when its connection breaks or a check fails, and at 94% of the lease after the last
    /// confirmed check otherwise, before the server ends a silent session and frees its locks.
    ///
    /// A watchdog renews every hold every lease/3 while it lives. The hold is reported lost
    /// ([`LockGuard::lost`](crate::LockGuard::lost)) the moment a renewal fails, or when the
    /// lease could have run out without a confirmed renewal: at 94% of the lease (less 2 ms)
    /// after the last confirmed renewal was sent, leaving 1% + 2 ms for clock drift and 5% for
    /// the process to notice and stop before the server lets another holder in. A
    /// shorter lease hands a crashed holder's lock on sooner; a longer one survives longer
    /// server or network stalls.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let b = zklock_core::LockManager::builder("redis://127.0.0.1:6379")
    ///     .lease(Duration::from_secs(3));
    /// # let _ = b;
    /// ```
    pub fn lease(mut self, lease: Duration) -> Builder {
        self.lease = lease;
        self
    }

    /// Opens the session (ZooKeeper) or the connection (Redis) and returns the manager.
    ///
    /// Must run inside a tokio runtime, which then serves the session.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad namespace or option (a connect string whose scheme no
    /// backend takes, a Redis URL without the `redis` feature, a ZooKeeper-only option on
    /// Redis), [`Error::Unreachable`] when no ZooKeeper
    /// server answers in time, [`Error::Redis`](Error) when the Redis server does not.
    pub async fn connect(self) -> Result<LockManager> {
        // A namespace is configuration, not an argument of a call.
        validate_path(&self.namespace, "namespace").map_err(|e| match e {
            Error::InvalidArgument(msg) => Error::Config(msg),
            e => e,
        })?;
        // It goes into every contender node: oversized node data makes the server drop the
        // connection (and every hold of the session) on each create.
        const MAX_IDENTITY_LEN: usize = 1024;
        if let Some(id) = self
            .identity
            .as_deref()
            .filter(|id| id.len() > MAX_IDENTITY_LEN)
        {
            return Err(Error::Config(format!(
                "the identity is {} bytes long; keep it under {MAX_IDENTITY_LEN} bytes",
                id.len()
            )));
        }
        if let Some(scheme) = unknown_scheme(&self.connect) {
            return Err(Error::Config(format!(
                "no backend takes the scheme {scheme:?} of the connect string {}; give ZooKeeper \
                 servers as host:port[,host:port...][/chroot], Redis as redis://host:port (or \
                 rediss://, redis+unix://, unix://), PostgreSQL as postgres://user@host/db",
                redacted(&self.connect)
            )));
        }
        if is_redis_url(&self.connect) {
            return self.connect_redis().await;
        }
        if is_postgres_url(&self.connect) {
            return self.connect_postgres().await;
        }
        let session = SessionOwner::connect(SessionConfig {
            connect: self.connect.clone(),
            session_timeout: self.session_timeout,
            connect_timeout: self.connect_timeout,
            disconnect_policy: self.disconnect_policy,
            renew_session: self.renew_session,
            digest: self.digest.clone(),
            #[cfg(feature = "tls")]
            tls: self.tls.clone(),
        })
        .await?;
        let zk = Arc::new(ZkBackend::new(
            session,
            ZkConfig {
                revocable: self.revocable,
                watch_held_nodes: self.watch_held_nodes,
                identity: self.identity.clone(),
                protected: self.digest.is_some(),
                owner: self.digest.as_deref().map(crate::backend::zk::digest_id),
            },
        ));
        Ok(LockManager::assemble(
            zk.clone() as Arc<dyn Backend>,
            Some(zk),
            &self,
        ))
    }

    /// Refuses what a lease backend (Redis, PostgreSQL) cannot do: ZooKeeper's options, and a
    /// lease too short for its renewals.
    #[cfg(any(feature = "redis", feature = "postgres"))]
    fn check_lease_backend(&self, b: &LeaseBackend) -> Result<()> {
        let zookeeper_only = |option: &str, instead: &str| {
            Error::Config(format!(
                "{option} is a ZooKeeper option and has no effect on {}; {instead}",
                b.name
            ))
        };
        if self.digest.is_some() {
            return Err(zookeeper_only(
                "digest_auth",
                &format!("put {} credentials in the URL ({})", b.name, b.credentials),
            ));
        }
        #[cfg(feature = "tls")]
        if self.tls.is_some() {
            return Err(zookeeper_only("tls", b.tls));
        }
        if self.revocable {
            return Err(Error::Unsupported {
                backend: b.id,
                feature: "revocation (Builder::revocable)",
            });
        }
        if self.lease < b.min_lease {
            return Err(Error::Config(format!(
                "the lease is {:?}; give at least {:?} ({} go out every lease/3)",
                self.lease, b.min_lease, b.renewals
            )));
        }
        Ok(())
    }

    /// Connects the Redis backend.
    #[cfg(feature = "redis")]
    async fn connect_redis(self) -> Result<LockManager> {
        self.check_lease_backend(&LeaseBackend {
            name: "Redis",
            id: "redis",
            credentials: "redis://user:password@host:6379",
            tls: "TLS to Redis (rediss://) is not built in; use a TLS tunnel",
            min_lease: MIN_LEASE,
            renewals: "renewals",
        })?;
        let backend = RedisBackend::connect(RedisConfig {
            url: self.connect.clone(),
            lease: self.lease,
            connect_timeout: self
                .connect_timeout
                .unwrap_or(DEFAULT_REDIS_CONNECT_TIMEOUT),
            identity: self.identity.clone(),
        })
        .await?;
        Ok(LockManager::assemble(Arc::new(backend), None, &self))
    }

    /// Connects the PostgreSQL backend.
    #[cfg(feature = "postgres")]
    async fn connect_postgres(self) -> Result<LockManager> {
        self.check_lease_backend(&LeaseBackend {
            name: "PostgreSQL",
            id: "postgres",
            credentials: "postgres://user:password@host/db",
            tls: "TLS to PostgreSQL is not built in; use a TLS tunnel",
            min_lease: postgres::MIN_LEASE,
            renewals: "liveness checks",
        })?;
        let backend = PostgresBackend::connect(PostgresConfig {
            url: self.connect.clone(),
            lease: self.lease,
            connect_timeout: self
                .connect_timeout
                .unwrap_or(DEFAULT_POSTGRES_CONNECT_TIMEOUT),
            identity: self.identity.clone(),
        })
        .await?;
        Ok(LockManager::assemble(Arc::new(backend), None, &self))
    }

    /// A PostgreSQL URL without the `postgres` feature.
    #[cfg(not(feature = "postgres"))]
    async fn connect_postgres(self) -> Result<LockManager> {
        Err(Error::Config(
            "the connect string is a PostgreSQL URL, but zklock was built without its \
             `postgres` feature; enable it (zklock = { version = \"...\", features = [\"postgres\"] })"
                .into(),
        ))
    }

    /// A Redis URL without the `redis` feature.
    #[cfg(not(feature = "redis"))]
    async fn connect_redis(self) -> Result<LockManager> {
        Err(Error::Config(
            "the connect string is a Redis URL, but zklock was built without its `redis` \
             feature; enable it (zklock = { version = \"...\", features = [\"redis\"] })"
                .into(),
        ))
    }
}

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
    /// waiter watches each node in its window (the nearest 8 below it), so that the last one's
    /// deletion is its grant with no request after it: a release is seen by at most 8 waiters,
    /// however long the queue. A herd (every waiter woken by every change) shows up here.
    pub predecessor_events: u64,
    /// Requests the recipes sent to ZooKeeper.
    pub requests: u64,
}

/// One ZooKeeper session (or Redis connection) and the locks taken through it.
///
/// Create one per process (or use the [global](crate::global) one) and share it: it is a
/// cheap handle (`Clone`) to the session. Locks are znodes under the manager's namespace
/// (default [`DEFAULT_NAMESPACE`]), written in Apache Curator's format so that JVM services
/// locking the same path exclude each other.
///
/// On Redis (a `redis://` connect string, feature `redis`) the same paths name leases in
/// Redis keys (`zklock:lock:<path>`), renewed while held; the guards, frames, local queue,
/// fencing tokens, loss signal and `#[distributed_lock]` work the same. See
/// [`Builder::lease`] and the README's "Redis backend" for what it promises.
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
    /// The session timeout asked for (ZooKeeper only).
    session_timeout: Duration,
    /// The ZooKeeper backend, when the manager is on ZooKeeper: inspection, revocation, the
    /// client handle.
    pub(crate) zk: Option<Arc<ZkBackend>>,
}

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("LockManager");
        d.field("backend", &self.inner.core.backend.name())
            .field("connect", &redacted(&self.inner.connect))
            .field("namespace", &self.inner.namespace);
        if let Some(zk) = &self.inner.zk {
            d.field("session_id", &zk.session().client().session_id());
        }
        d.finish()
    }
}

impl LockManager {
    /// Options for a manager connecting to `connect` (`host:port[,host:port...]` for
    /// ZooKeeper, `redis://host:port[/db]` for Redis).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("127.0.0.1:2181");
    /// # let _ = b;
    /// ```
    pub fn builder(connect: impl Into<String>) -> Builder {
        Builder::new(connect)
    }

    /// Connects with default options, to ZooKeeper, to Redis (a `redis://` URL, feature
    /// `redis`) or to PostgreSQL (a `postgres://` URL, feature `postgres`).
    ///
    /// # Errors
    /// [`Error::Unreachable`] when no ZooKeeper server answers within the session timeout;
    /// [`Error::Redis`](Error) when the Redis server does not answer.
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

    /// The session timeout that was asked for.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) {
    /// println!("{:?}", m.session_timeout());
    /// # }
    /// ```
    pub fn session_timeout(&self) -> Duration {
        self.inner.session_timeout
    }

    /// The session timeout the server granted to the current session: servers clamp the one
    /// asked for to `[minSessionTimeout, maxSessionTimeout]` (by default `[2, 20] x tickTime`).
    /// A process that stops talking to ZooKeeper this long loses its locks.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) {
    /// if m.negotiated_session_timeout() < m.session_timeout() {
    ///     eprintln!("the server shortened the session timeout");
    /// }
    /// # }
    /// ```
    pub fn negotiated_session_timeout(&self) -> Duration {
        self.inner
            .zk
            .as_ref()
            .map_or(Duration::ZERO, |zk| zk.session().client().session_timeout())
    }

    /// The znode path of the lock for `key` (namespace + encoded key).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.path_of("a/b")?, "/zklock/locks/a%2Fb");
    /// # Ok(()) }
    /// ```
    pub fn path_of(&self, key: &str) -> Result<String> {
        let key = Key::new(key)?;
        Ok(format!("{}/{}", self.namespace(), key.encoded()))
    }

    /// The exclusive lock (mutex) for `key`: a cheap handle to lock and unlock it.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the key is refused (see [`Key`]).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let mutex = m.mutex("inventory:sku-7")?;
    /// let guard = mutex.lock().await?;
    /// # drop(guard); Ok(()) }
    /// ```
    pub fn mutex(&self, key: &str) -> Result<Mutex> {
        let key = Key::new(key)?;
        let path = format!("{}/{}", self.namespace(), key.encoded());
        Ok(Mutex::new(
            self.inner.core.clone(),
            path.into(),
            key.as_str().into(),
        ))
    }

    /// The exclusive lock on a raw znode path, outside the namespace: for locks shared with
    /// other clients (Curator's `InterProcessMutex` on the same path excludes it).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the path is not a usable znode path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let shared_with_jvm = m.mutex_at_path("/billing/locks/nightly")?;
    /// # Ok(()) }
    /// ```
    pub fn mutex_at_path(&self, path: &str) -> Result<Mutex> {
        validate_path(path, "lock path")?;
        Ok(Mutex::new(
            self.inner.core.clone(),
            path.into(),
            path.into(),
        ))
    }

    /// The read/write lock for `key`. Its znode path is `<namespace>/%RW/<encoded key>`, apart
    /// from the mutexes' (a recipe owns its path, as in Curator).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the key is refused (see [`Key`]).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock("catalog")?;
    /// let reading = rw.read().await?;
    /// # drop(reading); Ok(()) }
    /// ```
    pub fn rwlock(&self, key: &str) -> Result<RwLock> {
        let key = Key::new(key)?;
        let path = format!("{}/%RW/{}", self.namespace(), key.encoded());
        Ok(RwLock::new(
            self.inner.core.clone(),
            path.into(),
            key.as_str().into(),
        ))
    }

    /// The read/write lock on a raw znode path: Curator's `InterProcessReadWriteLock` on the
    /// same path shares and excludes with it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the path is not a usable znode path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock_at_path("/shared/config-lock")?;
    /// # Ok(()) }
    /// ```
    pub fn rwlock_at_path(&self, path: &str) -> Result<RwLock> {
        validate_path(path, "lock path")?;
        Ok(RwLock::new(
            self.inner.core.clone(),
            path.into(),
            path.into(),
        ))
    }

    /// The semaphore for `key` with `max_leases` leases. Its znode path is
    /// `<namespace>/%SEM/<encoded key>`.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a refused key; [`Error::InvalidArgument`] for zero leases.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let lease = m.semaphore("exports", 3)?.acquire().await?;
    /// # drop(lease); Ok(()) }
    /// ```
    pub fn semaphore(&self, key: &str, max_leases: u32) -> Result<Semaphore> {
        let key = Key::new(key)?;
        let path = format!("{}/%SEM/{}", self.namespace(), key.encoded());
        Semaphore::new(
            self.inner.core.clone(),
            &path,
            key.as_str().into(),
            max_leases,
        )
    }

    /// The semaphore on a raw znode path: Curator's `InterProcessSemaphoreV2` on the same path
    /// (with the same number of leases) shares the count.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad path or zero leases.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let s = m.semaphore_at_path("/shared/export-slots", 3)?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore_at_path(&self, path: &str, max_leases: u32) -> Result<Semaphore> {
        validate_path(path, "semaphore path")?;
        Semaphore::new(self.inner.core.clone(), path, path.into(), max_leases)
    }

    /// The scheduled job `name`: one instance runs it at a time, the others skip it (see
    /// [`Job`]). Its lock is the key's own lock, the one [`lock`](Self::lock) and
    /// [`mutex`](Self::mutex) take (`<namespace>/<encoded name>`): one name is one lock, so a
    /// job and a plain holder of the same key exclude each other. Its run record (the
    /// `at_least` window) sits beside that lock (`<namespace>/<encoded name>%RUN`, a name no
    /// key encodes to).
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a refused name.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let outcome = m.job("nightly")?.run(async { /* the job */ }).await?;
    /// # Ok(()) }
    /// ```
    pub fn job(&self, name: &str) -> Result<Job> {
        let key = Key::new(name)?;
        let path = format!("{}/{}", self.namespace(), key.encoded());
        Ok(Job::new(
            self.inner.core.clone(),
            path.into(),
            key.as_str().into(),
        ))
    }

    /// The scheduled job whose lock is the raw path `path` (its run record is the sibling
    /// `<path>%RUN`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let job = m.job_at_path("/billing/jobs/invoices")?;
    /// # Ok(()) }
    /// ```
    pub fn job_at_path(&self, path: &str) -> Result<Job> {
        validate_path(path, "job path")?;
        Ok(Job::new(self.inner.core.clone(), path.into(), path.into()))
    }

    /// A participant `participant` (any text up to 1024 bytes, e.g. an instance name) of the
    /// leader election `name`. Its path is `<namespace>/%LATCH/<encoded name>`.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a refused name; [`Error::InvalidArgument`] for an empty or
    /// oversized participant id.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let leadership = m.leader_latch("scheduler", "web-3")?.lead().await?;
    /// # drop(leadership); Ok(()) }
    /// ```
    pub fn leader_latch(&self, name: &str, participant: &str) -> Result<LeaderLatch> {
        let key = Key::new(name)?;
        let path = format!("{}/%LATCH/{}", self.namespace(), key.encoded());
        self.latch(path.into(), key.as_str().into(), participant)
    }

    /// The leader election on a raw path: Curator's `LeaderLatch` on the same path takes part
    /// in the same election.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a bad path or participant id.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let latch = m.leader_latch_at_path("/services/billing/leader", "rust-1")?;
    /// # Ok(()) }
    /// ```
    pub fn leader_latch_at_path(&self, path: &str, participant: &str) -> Result<LeaderLatch> {
        validate_path(path, "election path")?;
        self.latch(path.into(), path.into(), participant)
    }

    fn latch(&self, path: Arc<str>, key: Arc<str>, participant: &str) -> Result<LeaderLatch> {
        // The id is the node's data: an oversized one would make the server drop the
        // connection on every create.
        const MAX_PARTICIPANT_LEN: usize = 1024;
        if participant.is_empty() || participant.len() > MAX_PARTICIPANT_LEN {
            return Err(Error::InvalidArgument(format!(
                "the participant id of the election {key} is {} bytes long; give 1 to \
                 {MAX_PARTICIPANT_LEN} bytes",
                participant.len()
            )));
        }
        Ok(LeaderLatch::new(
            self.inner.core.clone(),
            path,
            key,
            participant.into(),
        ))
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
    /// [`Error::Timeout`] when the wait runs out; nothing is held then and no node is left.
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
    /// next await point and [`Error::LockLost`] is returned.
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
        async move {
            self.mutex(key)?
                .run(None, crate::private::OnLost::Abort, body)
                .await
        }
    }

    /// Runs `body` under the lock on `key` with the options of `#[distributed_lock]`.
    pub(crate) async fn run_locked<T, F: Future<Output = T>>(
        &self,
        key: &str,
        options: crate::private::Options,
        body: F,
    ) -> Result<T> {
        use crate::private::Mode;
        match options.mode {
            Mode::Exclusive => {
                self.mutex(key)?
                    .run(options.timeout, options.on_lost, body)
                    .await
            }
            Mode::Read | Mode::Write => {
                let write = options.mode == Mode::Write;
                self.rwlock(key)?
                    .run(write, options.timeout, options.on_lost, body)
                    .await
            }
        }
    }

    /// Waits until every background release and cleanup of this manager has finished: call it
    /// before shutting down, or before checking from elsewhere that nothing is left behind.
    /// Lingering nodes ([`Builder::linger`]) are given up first.
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
        match &self.inner.zk {
            Some(zk) => StatsSnapshot {
                predecessor_events: zk.inner.stats.predecessor_events.load(Ordering::Relaxed),
                requests: zk.inner.stats.requests.load(Ordering::Relaxed),
            },
            None => StatsSnapshot::default(),
        }
    }

    /// The underlying zookeeper-client handle of the current session (for inspection and tests).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) {
    /// let children = m.zk_client().list_children("/zklock/locks").await;
    /// # let _ = children; }
    /// ```
    ///
    /// # Panics
    /// On a manager that is not on ZooKeeper ([`LockManager::in_memory`], Redis).
    pub fn zk_client(&self) -> Client {
        self.zk()
            .expect("zk_client() needs a LockManager on ZooKeeper; this one is on another backend")
            .session()
            .client()
    }

    /// The ZooKeeper backend, or [`Error::Unsupported`] for `feature` on another backend.
    pub(crate) fn zk_backend(&self, feature: &'static str) -> Result<&Arc<ZkBackend>> {
        self.zk().ok_or(Error::Unsupported {
            backend: self.inner.core.backend.name(),
            feature,
        })
    }

    fn zk(&self) -> Option<&Arc<ZkBackend>> {
        self.inner.zk.as_ref()
    }

    /// A manager whose locks live in this process only: the same API, guards, frames, local
    /// queue, fencing tokens and loss signal as on ZooKeeper, with real exclusion between the
    /// tasks of this process. For your unit tests: no server to start. Every manager made by
    /// one call shares one lock table; clones of it share it too, separate calls do not.
    ///
    /// What only ZooKeeper has (inspection, revocation by other processes, the ZooKeeper
    /// client) fails with [`Error::Unsupported`]. [`lose`](Self::lose) makes a hold lost, as a
    /// session expiry would.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> zklock_core::Result<()> {
    /// use zklock_core::LockManager;
    ///
    /// let manager = LockManager::in_memory();
    /// let first = manager.lock("sku_7").await?;
    /// assert!(manager.try_lock("sku_7").await?.is_none()); // held: no second holder
    /// let token = first.fencing_token();
    /// drop(first);
    /// let second = manager.lock("sku_7").await?;
    /// assert!(second.fencing_token() > token);              // tokens increase
    /// # Ok(()) }
    /// ```
    pub fn in_memory() -> LockManager {
        LockManager::in_memory_with(Builder::new("memory"))
    }

    /// [`in_memory`](Self::in_memory) with the local options of `builder` (local queue,
    /// handoffs, `try_timeout`, namespace); its ZooKeeper options are ignored.
    ///
    /// ```
    /// let strict = zklock_core::LockManager::in_memory_with(
    ///     zklock_core::LockManager::builder("memory").local_queue(false),
    /// );
    /// # drop(strict);
    /// ```
    pub fn in_memory_with(builder: Builder) -> LockManager {
        LockManager::assemble(Arc::new(MemoryBackend::new()), None, &builder)
    }

    /// Makes every hold of `key` (any recipe) that this manager's backend granted lost with
    /// `reason`, as a session expiry or a deleted node would, so that tests can see what their
    /// code does then. In memory only.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on ZooKeeper (expire the session or delete the node there).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> zklock_core::Result<()> {
    /// use zklock_core::{LockManager, LossReason};
    ///
    /// let manager = LockManager::in_memory();
    /// let guard = manager.lock("job").await?;
    /// manager.lose("job", LossReason::SessionExpired)?;
    /// assert_eq!(guard.lost().await, LossReason::SessionExpired);
    /// # Ok(()) }
    /// ```
    pub fn lose(&self, key: &str, reason: crate::LossReason) -> Result<()> {
        let memory = self
            .inner
            .core
            .backend
            .as_any()
            .downcast_ref::<MemoryBackend>()
            .ok_or(Error::Unsupported {
                backend: self.inner.core.backend.name(),
                feature: "lose() (a test hook of the in-memory backend)",
            })?;
        let key = Key::new(key)?;
        let ns = self.namespace();
        let enc = key.encoded();
        for path in [
            format!("{ns}/{enc}"),
            format!("{ns}/%RW/{enc}"),
            format!("{ns}/%SEM/{enc}"),
        ] {
            memory.lose(&path, reason);
        }
        Ok(())
    }

    fn assemble(
        backend: Arc<dyn Backend>,
        zk: Option<Arc<ZkBackend>>,
        builder: &Builder,
    ) -> LockManager {
        LockManager {
            inner: Arc::new(Inner {
                core: Arc::new(Core {
                    backend,
                    table: LocalTable::default(),
                    local: LocalConfig {
                        local_queue: builder.local_queue,
                        max_local_handoffs: builder.max_local_handoffs,
                        linger: builder.linger,
                    },
                    try_timeout: builder.try_timeout,
                    key_label: builder.metrics_key_label,
                }),
                namespace: builder.namespace.clone(),
                connect: builder.connect.clone(),
                session_timeout: builder.session_timeout,
                zk,
            }),
        }
    }
}

static GLOBAL: once_cell::sync::OnceCell<LockManager> = once_cell::sync::OnceCell::new();
static GLOBAL_INIT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sets the process-wide default manager (used by `#[distributed_lock]` and [`global`]).
///
/// # Errors
/// [`Error::Config`] when a global manager is already set.
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// let manager = zklock_core::LockManager::connect("127.0.0.1:2181").await?;
/// zklock_core::set_global(manager)?;
/// # Ok(()) }
/// ```
pub fn set_global(manager: LockManager) -> Result<()> {
    GLOBAL
        .set(manager)
        .map_err(|_| Error::Config("the global LockManager is already set".into()))
}

/// The process-wide default manager: the one given to [`set_global`], or else one connected on
/// first use to `ZKLOCK_CONNECT` (ZooKeeper's `host:port,...`, `redis://host:port` with the
/// `redis` feature, or `postgres://user@host/db` with the `postgres` feature; namespace from `ZKLOCK_NAMESPACE` if set).
///
/// # Errors
/// [`Error::NoGlobalManager`] when neither is available; connection errors as
/// [`LockManager::connect`].
///
/// ```no_run
/// # async fn run() -> zklock_core::Result<()> {
/// std::env::set_var("ZKLOCK_CONNECT", "127.0.0.1:2181");
/// let guard = zklock_core::global().await?.lock("k").await?;
/// # drop(guard); Ok(()) }
/// ```
pub async fn global() -> Result<LockManager> {
    if let Some(m) = GLOBAL.get() {
        return Ok(m.clone());
    }
    let _init = GLOBAL_INIT.lock().await;
    if let Some(m) = GLOBAL.get() {
        return Ok(m.clone());
    }
    let connect = std::env::var("ZKLOCK_CONNECT").map_err(|_| Error::NoGlobalManager)?;
    let mut builder = Builder::new(connect);
    if let Ok(ns) = std::env::var("ZKLOCK_NAMESPACE") {
        builder = builder.namespace(ns);
    }
    let manager = builder.connect().await?;
    let _ = GLOBAL.set(manager.clone());
    Ok(GLOBAL.get().cloned().unwrap_or(manager))
}
