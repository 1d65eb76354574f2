//! `LockManager`: one ZooKeeper session, its health, and the entry points to every recipe.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, RwLock as StdRwLock, Weak};
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;
use zookeeper_client::{Client, SessionState};

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::key::{validate_path, Key};
use crate::recipe::mutex::Mutex;
use crate::recipe::rwlock::RwLock;
use crate::recipe::semaphore::Semaphore;
use crate::LossReason;

/// What a disconnection from ZooKeeper means for the locks a manager holds.
///
/// While disconnected, the client cannot know whether the server has expired its session and
/// let another process take its locks. Curator's advice is to treat a suspended connection as
/// a lost lock; that is the default here.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use zklock_core::DisconnectPolicy;
///
/// let strict = DisconnectPolicy::Immediate;
/// let lenient = DisconnectPolicy::Grace(Duration::from_secs(2));
/// assert_ne!(strict, lenient);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DisconnectPolicy {
    /// A hold is lost as soon as the connection is lost (Curator's SUSPENDED = lost).
    Immediate,
    /// A hold survives a disconnection shorter than this; keep it well under the session timeout.
    Grace(Duration),
    /// A hold is lost only when the session expires (unsafe: another holder may already run).
    UntilExpired,
}

/// Options for a [`LockManager`], built with [`LockManager::builder`].
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
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    connect: String,
    namespace: String,
    session_timeout: Duration,
    connect_timeout: Option<Duration>,
    disconnect_policy: DisconnectPolicy,
    renew_session: bool,
    pub(crate) local_queue: bool,
    pub(crate) max_local_handoffs: u32,
    pub(crate) revocable: bool,
    pub(crate) watch_held_nodes: bool,
    pub(crate) identity: Option<String>,
    /// `user:password` for ZooKeeper's digest scheme; lock nodes are then protected by ACLs.
    digest: Option<String>,
    #[cfg(feature = "tls")]
    tls: Option<zookeeper_client::TlsOptions>,
}

/// The default namespace under which lock znodes live.
pub const DEFAULT_NAMESPACE: &str = "/zklock/locks";

impl Builder {
    /// Starts options for the given connect string (`host:port[,host:port...][/chroot]`).
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
            disconnect_policy: DisconnectPolicy::Immediate,
            renew_session: true,
            local_queue: true,
            max_local_handoffs: 32,
            revocable: false,
            watch_held_nodes: false,
            identity: None,
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
    /// ZooKeeper for this long loses its locks.
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
    /// [`Error::Unreachable`] (default: the session timeout).
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
    /// Locks held by the expired session are reported lost either way.
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

    /// How many local handoffs one node may serve before it is released so that other
    /// processes get their turn (default 32; 0 hands nothing on locally).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("h:2181").max_local_handoffs(8);
    /// # let _ = b;
    /// ```
    pub fn max_local_handoffs(mut self, n: u32) -> Builder {
        self.max_local_handoffs = n;
        self
    }

    /// Authenticates the session with ZooKeeper's `digest` scheme. Lock paths and contender
    /// nodes are then created with the `creator_all` ACL: only sessions with the same
    /// credentials can delete, revoke or queue on them, so another tenant cannot take your
    /// locks away.
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
    /// (CA and client identity). Needs the `tls` feature.
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

    /// Makes every hold of this manager revocable (see [`OwnedLockGuard::make_revocable`](crate::OwnedLockGuard::make_revocable)).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("h:2181").revocable(true);
    /// # let _ = b;
    /// ```
    pub fn revocable(mut self, on: bool) -> Builder {
        self.revocable = on;
        self
    }

    /// Watch every held node from the moment it is granted (default `false`: the watch starts
    /// on first interest: `lost()`, `is_held()`, `loss_reason()`, `make_revocable()`, or a
    /// `with_lock` body that aborts on loss). Session loss is noticed either way; the watch adds
    /// the node's deletion by someone else. Eager watching costs a request per hold.
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("h:2181").watch_held_nodes(true);
    /// # let _ = b;
    /// ```
    pub fn watch_held_nodes(mut self, on: bool) -> Builder {
        self.watch_held_nodes = on;
        self
    }

    /// Text that identifies this process in its contender nodes, beside host and pid (shown by
    /// [`LockManager::inspect`] and `zklock ls`), e.g. an instance name or a request id.
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("h:2181").identity("checkout-7f9c");
    /// # let _ = b;
    /// ```
    pub fn identity(mut self, identity: impl Into<String>) -> Builder {
        self.identity = Some(identity.into());
        self
    }

    pub(crate) fn protected(&self) -> bool {
        self.digest.is_some()
    }

    /// Opens the session and returns the manager.
    ///
    /// Must run inside a tokio runtime, which then serves the session.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad namespace, [`Error::Unreachable`] when no server answers in time.
    pub async fn connect(self) -> Result<LockManager> {
        validate_path(&self.namespace, "namespace")?;
        if let DisconnectPolicy::Grace(grace) = self.disconnect_policy {
            // The client notices a dead connection after about 0.4 x the session timeout; a hold
            // kept past the session timeout may already belong to someone else.
            if grace.as_secs_f64() + 0.4 * self.session_timeout.as_secs_f64()
                >= self.session_timeout.as_secs_f64()
            {
                return Err(Error::Config(format!(
                    "a disconnect grace of {grace:?} with a session timeout of {:?} could keep a hold the server \
                     has already given away; keep the grace under 0.6 x the session timeout",
                    self.session_timeout
                )));
            }
        }
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
        if self.connect.trim().is_empty() {
            return Err(Error::Config(
                "the connect string is empty; give host:port[,host:port...]".into(),
            ));
        }
        let client = open_session(&self).await?;
        let (health_tx, _) = watch::channel(Health {
            epoch: 0,
            ok: true,
            reason: None,
        });
        let inner = Arc::new(Inner {
            client: StdRwLock::new(client.clone()),
            health: health_tx,
            runtime: tokio::runtime::Handle::current(),
            dirs: StdMutex::new(HashMap::new()),
            local: crate::local::LocalTable::default(),
            node_data: crate::recipe::node_data(self.identity.as_deref()),
            background: AtomicUsize::new(0),
            background_done: Notify::new(),
            stats: Stats::default(),
            monitor: StdMutex::new(None),
            config: self,
        });
        let monitor = tokio::spawn(monitor_session(Arc::downgrade(&inner), client));
        *inner.monitor.lock().unwrap() = Some(monitor.abort_handle());
        Ok(LockManager { inner })
    }
}

async fn open_session(config: &Builder) -> Result<Client> {
    let wait = config.connect_timeout.unwrap_or(config.session_timeout);
    let mut connector = Client::connector()
        .with_session_timeout(config.session_timeout)
        .with_connection_timeout(wait);
    if let Some(digest) = &config.digest {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    #[cfg(feature = "tls")]
    let connecting = match config.tls.clone() {
        Some(tls) => {
            futures::future::Either::Left(connector.with_tls(tls).secure_connect(&config.connect))
        }
        None => futures::future::Either::Right(connector.connect(&config.connect)),
    };
    #[cfg(not(feature = "tls"))]
    let connecting = connector.connect(&config.connect);
    match tokio::time::timeout(wait + Duration::from_millis(500), connecting).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(source)) => Err(Error::Unreachable {
            connect: config.connect.clone(),
            source,
        }),
        Err(_) => Err(Error::Unreachable {
            connect: config.connect.clone(),
            source: zookeeper_client::Error::Timeout,
        }),
    }
}

/// Session health as the monitor sees it: `epoch` counts losses; a hold granted in one epoch
/// is lost once the epoch moves on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Health {
    pub(crate) epoch: u64,
    pub(crate) ok: bool,
    pub(crate) reason: Option<LossReason>,
}

#[derive(Default)]
pub(crate) struct DirState {
    /// Local contenders (waiting or holding) on this lock path.
    pub(crate) contenders: usize,
    /// Sort key of the highest node of this process granted an exclusive hold on the path: every
    /// node that sorts below it was gone when it was granted, and never comes back.
    pub(crate) granted: Option<String>,
}

/// Counters that tests and benchmarks read; see [`LockManager::stats`].
#[derive(Default, Debug)]
pub(crate) struct Stats {
    pub(crate) predecessor_events: AtomicU64,
    pub(crate) requests: AtomicU64,
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
    /// Watch events received by waiters on their predecessor node (a herd shows up here).
    pub predecessor_events: u64,
    /// Requests the recipes sent to ZooKeeper.
    pub requests: u64,
}

pub(crate) struct Inner {
    pub(crate) config: Builder,
    client: StdRwLock<Client>,
    pub(crate) health: watch::Sender<Health>,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) dirs: StdMutex<HashMap<Arc<str>, DirState>>,
    pub(crate) local: crate::local::LocalTable,
    pub(crate) node_data: Vec<u8>,
    background: AtomicUsize,
    background_done: Notify,
    pub(crate) stats: Stats,
    monitor: StdMutex<Option<AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(monitor) = self.monitor.lock().unwrap().take() {
            monitor.abort();
        }
    }
}

impl Inner {
    pub(crate) fn client(&self) -> Client {
        self.client.read().unwrap().clone()
    }

    /// The client of a live session: when the current one has expired and the manager renews
    /// sessions, waits (up to twice the session timeout) for the new one.
    pub(crate) async fn live_client(&self) -> Result<Client> {
        let mut health = self.health.subscribe();
        let deadline = tokio::time::Instant::now() + 2 * self.config.session_timeout;
        loop {
            let client = self.client();
            match client.state() {
                SessionState::Expired if self.config.renew_session => {
                    if tokio::time::timeout_at(deadline, health.changed())
                        .await
                        .is_err()
                    {
                        return Err(Error::SessionExpired);
                    }
                }
                SessionState::Expired => return Err(Error::SessionExpired),
                SessionState::Closed | SessionState::AuthFailed => return Err(Error::Closed),
                _ => return Ok(client),
            }
        }
    }

    pub(crate) fn count(&self, requests: u64) {
        self.stats.requests.fetch_add(requests, Ordering::Relaxed);
    }

    /// Runs `fut` in the background (a release or a cleanup), counted so that
    /// [`LockManager::flush`] can wait for it.
    pub(crate) fn spawn_background(
        self: &Arc<Self>,
        fut: impl Future<Output = ()> + Send + 'static,
    ) {
        self.background.fetch_add(1, Ordering::SeqCst);
        let inner = self.clone();
        self.runtime.spawn(async move {
            fut.await;
            if inner.background.fetch_sub(1, Ordering::SeqCst) == 1 {
                inner.background_done.notify_waiters();
            }
        });
    }

    /// Waits until the session is usable again, or fails when it is gone for good.
    pub(crate) async fn wait_connected(&self, operation: &'static str) -> Result<()> {
        let mut rx = self.health.subscribe();
        let mut state = self.client().state_watcher();
        for _ in 0..1000 {
            match state.peek_state() {
                SessionState::SyncConnected | SessionState::ConnectedReadOnly => return Ok(()),
                SessionState::Closed | SessionState::AuthFailed => return Err(Error::Closed),
                SessionState::Expired => {
                    // The monitor renews the session; wait for the new client.
                    if !self.config.renew_session {
                        return Err(Error::SessionExpired);
                    }
                    let _ = tokio::time::timeout(self.config.session_timeout, rx.changed()).await;
                    state = self.client().state_watcher();
                }
                SessionState::Disconnected => {
                    if tokio::time::timeout(self.config.session_timeout, state.changed())
                        .await
                        .is_err()
                    {
                        return Err(Error::ConnectionLoss { operation });
                    }
                }
            }
        }
        Err(Error::ConnectionLoss { operation })
    }

    /// Registers a local contender on `dir`; the returned token unregisters it on drop.
    pub(crate) fn enter_dir(self: &Arc<Self>, dir: &Arc<str>) -> DirTicket {
        let mut dirs = self.dirs.lock().unwrap();
        dirs.entry(dir.clone()).or_default().contenders += 1;
        DirTicket {
            inner: self.clone(),
            dir: dir.clone(),
        }
    }
}

/// Keeps a lock path's local state alive while a contender of this process uses it.
pub(crate) struct DirTicket {
    inner: Arc<Inner>,
    pub(crate) dir: Arc<str>,
}

impl DirTicket {
    pub(crate) fn granted_floor(&self) -> Option<String> {
        self.inner
            .dirs
            .lock()
            .unwrap()
            .get(&self.dir)
            .and_then(|d| d.granted.clone())
    }

    pub(crate) fn record_grant(&self, sort_key: &str) {
        let mut dirs = self.inner.dirs.lock().unwrap();
        if let Some(d) = dirs.get_mut(&self.dir) {
            if d.granted.as_deref().map_or(true, |g| g < sort_key) {
                d.granted = Some(sort_key.to_string());
            }
        }
    }
}

impl Drop for DirTicket {
    fn drop(&mut self) {
        let mut dirs = self.inner.dirs.lock().unwrap();
        if let Some(d) = dirs.get_mut(&self.dir) {
            d.contenders -= 1;
            if d.contenders == 0 {
                dirs.remove(&self.dir);
            }
        }
    }
}

/// Follows the session's state, turns it into lock health, and renews an expired session.
async fn monitor_session(inner: Weak<Inner>, client: Client) {
    let mut watcher = client.state_watcher();
    drop(client);
    let mut grace_deadline: Option<tokio::time::Instant> = None;
    loop {
        let state = tokio::select! {
            state = watcher.changed() => state,
            _ = async { tokio::time::sleep_until(grace_deadline.unwrap()).await }, if grace_deadline.is_some() => {
                grace_deadline = None;
                let Some(inner) = inner.upgrade() else { return };
                lose(&inner, LossReason::Disconnected);
                continue;
            }
        };
        let Some(manager) = inner.upgrade() else {
            return;
        };
        tracing::debug!(?state, "zookeeper session state");
        match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                grace_deadline = None;
                manager.health.send_modify(|h| h.ok = true);
            }
            SessionState::Disconnected => match manager.config.disconnect_policy {
                DisconnectPolicy::Immediate => lose(&manager, LossReason::Disconnected),
                DisconnectPolicy::Grace(grace) => {
                    grace_deadline = Some(tokio::time::Instant::now() + grace)
                }
                DisconnectPolicy::UntilExpired => {}
            },
            SessionState::Expired => {
                grace_deadline = None;
                lose(&manager, LossReason::SessionExpired);
                if !manager.config.renew_session {
                    return;
                }
                let config = manager.config.clone();
                drop(manager);
                // Open a new session, retrying while the servers are unreachable.
                let mut backoff = Duration::from_millis(100);
                let client = loop {
                    match open_session(&config).await {
                        Ok(client) => break client,
                        Err(err) => {
                            tracing::warn!(%err, "could not renew the expired ZooKeeper session; retrying");
                            if inner.strong_count() == 0 {
                                return;
                            }
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(Duration::from_secs(5));
                        }
                    }
                };
                let Some(manager) = inner.upgrade() else {
                    return;
                };
                watcher = client.state_watcher();
                *manager.client.write().unwrap() = client;
                manager.health.send_modify(|h| h.ok = true);
                tracing::info!("opened a new ZooKeeper session after expiry");
            }
            SessionState::Closed | SessionState::AuthFailed => {
                lose(&manager, LossReason::Closed);
                return;
            }
        }
    }
}

fn lose(inner: &Inner, reason: LossReason) {
    tracing::warn!(%reason, "ZooKeeper session trouble: holds of this manager are no longer certain");
    inner.health.send_modify(|h| {
        h.epoch += 1;
        h.ok = false;
        h.reason = Some(reason);
    });
}

/// One ZooKeeper session and the locks taken through it.
///
/// Create one per process (or use the [global](crate::global) one) and share it: it is a
/// cheap handle (`Clone`) to the session. Locks are znodes under the manager's namespace
/// (default [`DEFAULT_NAMESPACE`]), written in Apache Curator's format so that JVM services
/// locking the same path exclude each other.
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

impl std::fmt::Debug for LockManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockManager")
            .field("connect", &self.inner.config.connect)
            .field("namespace", &self.inner.config.namespace)
            .field("session_id", &self.inner.client().session_id())
            .finish()
    }
}

impl LockManager {
    /// Options for a manager connecting to `connect` (`host:port[,host:port...]`).
    ///
    /// ```
    /// let b = zklock_core::LockManager::builder("127.0.0.1:2181");
    /// # let _ = b;
    /// ```
    pub fn builder(connect: impl Into<String>) -> Builder {
        Builder::new(connect)
    }

    /// Connects with default options.
    ///
    /// # Errors
    /// [`Error::Unreachable`] when no server answers within the session timeout.
    ///
    /// ```no_run
    /// # async fn run() -> zklock_core::Result<()> {
    /// let manager = zklock_core::LockManager::connect("127.0.0.1:2181").await?;
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
        &self.inner.config.namespace
    }

    /// The session timeout that was asked for.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) {
    /// println!("{:?}", m.session_timeout());
    /// # }
    /// ```
    pub fn session_timeout(&self) -> Duration {
        self.inner.config.session_timeout
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
        Ok(Mutex::new(self.clone(), path.into(), key.as_str().into()))
    }

    /// The exclusive lock on a raw znode path, outside the namespace: for locks shared with
    /// other clients (Curator's `InterProcessMutex` on the same path excludes it).
    ///
    /// # Errors
    /// [`Error::Config`] when the path is not a usable znode path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let shared_with_jvm = m.mutex_at_path("/billing/locks/nightly")?;
    /// # Ok(()) }
    /// ```
    pub fn mutex_at_path(&self, path: &str) -> Result<Mutex> {
        validate_path(path, "lock path")?;
        Ok(Mutex::new(self.clone(), path.into(), path.into()))
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
        Ok(RwLock::new(self.clone(), path.into(), key.as_str().into()))
    }

    /// The read/write lock on a raw znode path: Curator's `InterProcessReadWriteLock` on the
    /// same path shares and excludes with it.
    ///
    /// # Errors
    /// [`Error::Config`] when the path is not a usable znode path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let rw = m.rwlock_at_path("/shared/config-lock")?;
    /// # Ok(()) }
    /// ```
    pub fn rwlock_at_path(&self, path: &str) -> Result<RwLock> {
        validate_path(path, "lock path")?;
        Ok(RwLock::new(self.clone(), path.into(), path.into()))
    }

    /// The semaphore for `key` with `max_leases` leases. Its znode path is
    /// `<namespace>/%SEM/<encoded key>`.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for a refused key; [`Error::Config`] for zero leases.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let lease = m.semaphore("exports", 3)?.acquire().await?;
    /// # drop(lease); Ok(()) }
    /// ```
    pub fn semaphore(&self, key: &str, max_leases: u32) -> Result<Semaphore> {
        let key = Key::new(key)?;
        let path = format!("{}/%SEM/{}", self.namespace(), key.encoded());
        Semaphore::new(self.clone(), &path, key.as_str().into(), max_leases)
    }

    /// The semaphore on a raw znode path: Curator's `InterProcessSemaphoreV2` on the same path
    /// (with the same number of leases) shares the count.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad path or zero leases.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let s = m.semaphore_at_path("/shared/export-slots", 3)?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore_at_path(&self, path: &str, max_leases: u32) -> Result<Semaphore> {
        validate_path(path, "semaphore path")?;
        Semaphore::new(self.clone(), path, path.into(), max_leases)
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
    pub async fn lock(&self, key: &str) -> Result<LockGuard<'static>> {
        self.mutex(key)?
            .lock_owned()
            .await
            .map(LockGuard::from_owned)
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
    pub async fn try_lock(&self, key: &str) -> Result<Option<LockGuard<'static>>> {
        Ok(self
            .mutex(key)?
            .try_lock_owned()
            .await?
            .map(LockGuard::from_owned))
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
    pub async fn lock_timeout(&self, key: &str, timeout: Duration) -> Result<LockGuard<'static>> {
        self.mutex(key)?
            .lock_timeout_owned(timeout)
            .await
            .map(LockGuard::from_owned)
    }

    /// Runs `body` while holding the lock on `key`, then releases it: Curator's
    /// `Locker.lock(key, command)` shape.
    ///
    /// If the hold is lost while `body` runs (see [`OwnedLockGuard::lost`](crate::OwnedLockGuard::lost)), `body` is dropped at its
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
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// drop(m.lock("k").await?);   // released in the background
    /// m.flush().await;            // now the node is gone
    /// # Ok(()) }
    /// ```
    pub async fn flush(&self) {
        loop {
            let notified = self.inner.background_done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.background.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Counters of this manager's recipes (for tests and benchmarks).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) {
    /// println!("{} requests so far", m.stats().requests);
    /// # }
    /// ```
    pub fn stats(&self) -> StatsSnapshot {
        StatsSnapshot {
            predecessor_events: self.inner.stats.predecessor_events.load(Ordering::Relaxed),
            requests: self.inner.stats.requests.load(Ordering::Relaxed),
        }
    }

    /// The underlying zookeeper-client handle of the current session (for inspection and tests).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) {
    /// let children = m.zk_client().list_children("/zklock/locks").await;
    /// # let _ = children; }
    /// ```
    pub fn zk_client(&self) -> Client {
        self.inner.client()
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
/// first use to `ZKLOCK_CONNECT` (namespace from `ZKLOCK_NAMESPACE` if set).
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
