//! [`Builder`]: the options of a manager, for every layer below it.

use std::time::Duration;

use crate::metrics::KeyLabel;
use crate::types::disconnect::DisconnectPolicy;

/// Options for a [`LockManager`](crate::LockManager), built with [`LockManager::builder`](crate::LockManager::builder).
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
    pub(crate) connect: String,
    pub(crate) namespace: String,
    pub(crate) session_timeout: Duration,
    pub(crate) connect_timeout: Option<Duration>,
    /// The lease of a Redis hold.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) lease: Duration,
    pub(crate) disconnect_policy: DisconnectPolicy,
    pub(crate) renew_session: bool,
    pub(crate) local_queue: bool,
    pub(crate) max_local_handoffs: u32,
    pub(crate) linger: Duration,
    pub(crate) fencing_tokens: bool,
    pub(crate) revocable: bool,
    pub(crate) watch_held_nodes: bool,
    pub(crate) try_timeout: Duration,
    pub(crate) identity: Option<String>,
    /// Whether the metrics carry a `key` label.
    pub(crate) metrics_key_label: KeyLabel,
    /// `user:password` for ZooKeeper's digest scheme; lock nodes are then protected by ACLs.
    pub(crate) digest: Option<String>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<zookeeper_client::TlsOptions>,
}

/// The default namespace under which lock znodes live.
pub const DEFAULT_NAMESPACE: &str = "/zklock/locks";

/// The default lease of a hold on Redis; see [`Builder::lease`](crate::Builder::lease).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

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
            fencing_tokens: true,
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
    /// [`Error::Unsupported`](crate::Error::Unsupported).
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
}
