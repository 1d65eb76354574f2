//! The Redis backend (feature `redis`): leases in one Redis server, renewed while held.
//!
//! - A mutex (or a writer) is the key `zklock:lock:<path>`, taken with `SET key id NX PX
//!   lease` in a Lua script that also advances the lock's fence counter (to the server's
//!   time in µs, see [`scripts`]): the fencing token.
//!   Readers and semaphore leases are members of the sorted set `zklock:shared:<path>`, scored
//!   by the end of their lease. See [`keys`] and [`scripts`].
//! - One watchdog per backend renews each hold (compare and `PEXPIRE`) every lease/3, and makes it lost the
//!   moment a renewal fails or is refused, or when the lease could have run out: at the send
//!   time of the last confirmed renewal plus the lease less a [`margin`](Inner::margin), so
//!   before the server lets anyone else in. A connection break (the command connection's
//!   driver ends, a request fails, the hub's pub/sub connection breaks) makes every hold
//!   granted before it lost (on Cluster, every hold on that node; see [`breaks::Breaks`]): the
//!   server may have restarted, lost the key and let someone else in.
//! - A local handoff or a linger's re-take first confirms the key with the server (one
//!   request; see `BackendHold::confirmed`): a key deleted or lost on the server is never handed
//!   on within the process.
//! - Waiters do not poll. A mutex's waiting processes queue in `zklock:queue:<path>`; a release
//!   reserves the key for the first live one and tells only it, on that process's own channel. Readers, writers and
//!   semaphore leases listen on the lock's channel `zklock:wake:<path>`, which their releases
//!   publish to. Either way a waiter also wakes when the lease in its way could run out (its
//!   `PTTL`), and a queued one every [`waiter TTL`](waiter_ttl)/3 to stay alive in the queue.
//!   See [`hub`].
//! - Releases and undos are compare-and-delete scripts: they delete only what carries the
//!   holder's id. A dropped acquire whose request may have been applied is undone in the
//!   background; [`flush`](Backend::flush) waits for it.
//!
//! Order: a mutex (and a leader latch) goes to waiting processes first come, first served: by
//! the server time of their first refused attempt; a process that asks while others wait joins
//! the back of the queue (a release hands the key on, reserved, to the first waiter). A waiter
//! whose process died or was cut off drops out once its liveness (a [`waiter
//! TTL`](waiter_ttl), refreshed by every attempt) runs out, and a reservation for it ends after
//! one TTL, so it holds the others up for about that long at most; after a reservation ran
//! out, whoever asks first gets the key. Within a process, the
//! local queue keeps tasks in order, with one task per process waiting on Redis.
//!
//! Readers, writers and semaphore leases keep no order among processes: a release wakes every
//! process waiting for the lock, and the first to ask gets it. A waiting writer makes new
//! readers wait (writers are not starved by readers): it leaves an intent key, renewed every
//! lease/3 while it waits.

mod acquire;
mod breaks;
mod cluster;
mod conn;
mod dial;
mod hold;
mod hub;
mod inspect;
mod keys;
mod lease;
mod options;
mod role;
mod scripts;
mod sentinel;
mod servers;
mod watchdog;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::undos::Undos;
use super::{Backend, BackendHold, BoxFuture, Inspect, LockTarget, SharedHold, HOST_PID};
use crate::backend::backoff::Backoff;
use crate::types::backend_kind::BackendKind;
use crate::types::error::{Error, Result};
use crate::types::mode::{LockMode, Wait};
use acquire::Acquire;
use breaks::Breaks;
use conn::{server_error, transient, Background, Conn};
use dial::Dial;
use hub::Hub;
use keys::Keys;
pub use options::RedisOptions;
use servers::Servers;

/// The longest any single request waits for its reply (acquire attempts, releases); shorter
/// when the lease is.
const MAX_REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest lease accepted: renewals go out every lease/3.
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(100);
/// The longest a queued mutex waiter stays in the queue without refreshing its liveness.
const MAX_WAITER_TTL: Duration = Duration::from_secs(1);

/// How long a queued mutex waiter stays alive in the queue without an attempt: lease/3, at
/// most [`MAX_WAITER_TTL`]. A waiter attempts again every third of it, so a crashed or cut-off
/// waiter holds up the processes behind it for at most about 4/3 of it.
pub(crate) fn waiter_ttl(lease: Duration) -> Duration {
    (lease / 3).min(MAX_WAITER_TTL)
}

/// What a release or an undo deletes.
#[derive(Debug, Clone)]
pub(crate) enum Undo {
    /// A mutex hold of `id`, and (unless empty) the queue `member` of a waiter.
    Mutex { id: String, member: String },
    /// Whatever carries one of these ids: the exclusive key (a writer's), a writer's intent,
    /// shared-set members.
    Any(Vec<String>),
}

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

/// What the backend's holds and tasks share.
pub(crate) struct Inner {
    pub(crate) conn: Conn,
    /// The epoch of this backend's connections: a hold is held only while no connection broke
    /// since its last confirmation (see [`Breaks`]).
    pub(crate) breaks: Breaks,
    hub: Hub,
    pub(crate) lease: Duration,
    /// See [`RedisConfig::tokens`].
    tokens: bool,
    /// See [`RedisConfig::acks`].
    acks: Option<options::Acks>,
    /// Taken off every deadline; see [`margin`](Self::margin).
    margin: Duration,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) background: Arc<Background>,
    /// Holder ids: `<uuid> host=<host> pid=<pid> hub=<hub id>[ id=<identity>]`.
    ids: keys::HolderIds,
    /// The keys of the paths acquired lately.
    keys: keys::KeysCache,
    /// See [`waiter_ttl`].
    waiter_ttl: Duration,
    /// Renews every hold's lease.
    watchdog: watchdog::Watchdog,
    /// Undos of dropped acquires under way, per lock (its exclusive key's name): a later
    /// acquire of the lock in this process waits for them, so that it never finds what an
    /// acquire it gave up on left (a place in a mutex's queue, a hand-over to it, an intent).
    undos: Arc<Undos<String>>,
    /// Ends the Sentinel watch (see [`sentinel::watch`]) when the backend goes: dropped with
    /// it.
    _sentinel_stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Inner {
    /// A fresh holder id: `<uuid-v4> host=<host> pid=<pid> hub=<hub id>[ id=<identity>]`,
    /// what the keys hold (`GET zklock:lock:<path>` shows who holds it). The hub id names the
    /// channel on which a first waiter tells the holder's process it wants the lock.
    pub(crate) fn new_id(&self) -> String {
        self.ids.next()
    }

    /// Whether the mutex of `keys` has a live waiter in its queue (see
    /// [`scripts::OTHERS_QUEUED`]).
    pub(crate) async fn others_queued(&self, keys: &Keys) -> redis::RedisResult<bool> {
        let n = self
            .conn
            .run(&keys.queue, Some(self.conn.reply_timeout), |mut c| {
                let mut invocation = scripts::OTHERS_QUEUED.key(&keys.queue);
                invocation.key(&keys.alive);
                async move { invocation.invoke_async::<i64>(&mut c).await }
            })
            .await?;
        Ok(n == 1)
    }

    /// Whether the writes sent so far on `c` are on enough replicas: always without
    /// [`RedisOptions::replica_acks`]; else `WAIT replicas timeout` on the same connection.
    /// `Ok(false)` with how many acknowledged in time.
    pub(crate) async fn acked(
        acks: Option<options::Acks>,
        c: &mut redis::aio::MultiplexedConnection,
    ) -> redis::RedisResult<std::result::Result<(), i64>> {
        let Some(acks) = acks else { return Ok(Ok(())) };
        let n: i64 = redis::cmd("WAIT")
            .arg(acks.replicas)
            .arg(acks.timeout.as_millis().max(1) as u64)
            .query_async(c)
            .await?;
        Ok(if n >= i64::from(acks.replicas) {
            Ok(())
        } else {
            Err(n)
        })
    }

    /// How long a request that may wait for replicas' acknowledgements may take.
    pub(crate) fn write_timeout(&self) -> Duration {
        self.conn.reply_timeout + self.acks.map_or(Duration::ZERO, |a| a.timeout)
    }

    pub(crate) fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }

    /// How long before the lease could run out on the server a hold is reported lost: 1% of
    /// the lease + 2 ms for clock drift between this host and the server (Redlock's
    /// allowance), and 5% for this process to notice the loss and stop its critical section
    /// before the next holder starts (timers fire late on a busy machine).
    pub(crate) fn margin(lease: Duration) -> Duration {
        lease / 100 + Duration::from_millis(2) + lease / 20
    }

    /// When a lease granted or renewed by a request sent at `sent` is reported lost unless
    /// renewed again: the server lets it go at `sent + lease` at the earliest.
    pub(crate) fn deadline(&self, sent: Instant) -> Instant {
        sent + self.lease - self.margin
    }

    /// [`deadline`](Self::deadline) for a lease of `lease` (a hand-over's short first lease).
    pub(crate) fn deadline_for(sent: Instant, lease: Duration) -> Instant {
        sent + lease - Self::margin(lease)
    }

    /// Deletes what `undo` names in `keys` and wakes waiters; retried on connection trouble
    /// until `until`. Whether something was deleted.
    pub(crate) async fn delete(
        &self,
        keys: &Keys,
        undo: &Undo,
        until: Instant,
    ) -> redis::RedisResult<bool> {
        let mut backoff = Backoff::requests();
        loop {
            let freed = self
                .conn
                .run(&keys.exclusive, Some(self.conn.reply_timeout), |mut c| {
                    let call = match undo {
                        Undo::Mutex { id, member } => {
                            let mut call = scripts::Call::new(
                                &scripts::RELEASE_MUTEX,
                                &[&keys.exclusive, &keys.queue, &keys.alive, &keys.fence],
                            );
                            call.arg(id)
                                .arg(member)
                                .arg(keys::NOTIFY_PREFIX)
                                .arg(&keys.channel);
                            call
                        }
                        Undo::Any(ids) => {
                            let mut call = scripts::Call::new(
                                &scripts::RELEASE,
                                &[&keys.exclusive, &keys.shared, &keys.intent],
                            );
                            call.arg(&keys.channel).arg(ids);
                            call
                        }
                    };
                    async move { call.invoke::<i64>(&mut c).await }
                })
                .await;
            match freed {
                Ok(n) => return Ok(n == 1),
                Err(e) if transient(&e) && Instant::now() + backoff.peek() < until => {
                    crate::metrics::release_retry(BackendKind::Redis);
                    backoff.wait().await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The error of a grant that too few replicas acknowledged in time: `acked` of them did.
fn unacked(acks: Option<options::Acks>, acked: i64, what: &'static str) -> Error {
    let (replicas, timeout) = acks.map_or((0, Duration::ZERO), |a| (a.replicas, a.timeout));
    let message = format!(
        "the primary {what}, but only {acked} of the {replicas} replicas that replica_acks \
         asks for acknowledged it within {timeout:?}"
    );
    let e = redis::RedisError::from(std::io::Error::other(message.clone()));
    Error::Server {
        backend: BackendKind::Redis.label(),
        operation: "acquire the lock",
        source: crate::types::error::ServerError::new(
            Arc::new(e),
            message,
            true,
            "check that the replicas run and keep up (INFO replication on the primary), or \
             lower replica_acks or raise its timeout; then retry",
        ),
    }
}

/// Which of this backend's acquire scripts an acquire runs (see [`scripts`]), and with what:
/// the Redis form of what the seam asks ([`LockMode`], converted below, or a semaphore's
/// leases). Which key a granted hold then lives in is its [`Side`](lease::Side).
#[derive(Debug, Clone, Copy)]
enum Ask {
    /// The exclusive key, for a mutex or a leader latch: queued first come, first served.
    Mutex,
    /// The exclusive key, for a writer: readers exclude it too.
    Write,
    /// A read hold.
    Read,
    /// Leases of a semaphore with `max` leases.
    Leases { max: u32 },
}

impl From<LockMode> for Ask {
    fn from(mode: LockMode) -> Ask {
        match mode {
            // A leader latch is exclusive; Redis keeps no participant ids.
            LockMode::Exclusive | LockMode::Leader => Ask::Mutex,
            LockMode::Write => Ask::Write,
            LockMode::Read => Ask::Read,
        }
    }
}

/// What an attempt found.
enum Attempt {
    /// Granted, with the last token handed out.
    Granted(i64),
    /// Taken: how long until it may be free (`None`: no expiry to wait for), and (a mutex) the
    /// lock's last token when the attempt was refused: a hand-over announced with a token no
    /// larger was made before the refusal, and is void.
    Taken(Option<Duration>, i64),
    /// Granted, but fewer replicas than [`RedisOptions::replica_acks`] asks acknowledged it
    /// in time (how many did): it does not count, and is undone.
    Unacked(i64),
}

impl Attempt {
    /// What an acquire script's reply says: `{1, token}` granted; else `{0, ms}` taken, `ms`
    /// how long until it may be free (negative: no expiry to wait for), with the lock's last
    /// token third for a mutex (0 when absent).
    fn of_reply(reply: &[i64]) -> Attempt {
        let fence = reply.get(2).copied().unwrap_or(0);
        match reply {
            [1, token, ..] => Attempt::Granted(*token),
            [_, ms, ..] if *ms >= 0 => {
                Attempt::Taken(Some(Duration::from_millis(*ms as u64)), fence)
            }
            _ => Attempt::Taken(None, fence),
        }
    }
}

/// The ids of an acquire (or downgrade) whose request may have been applied: undone in the
/// background when dropped armed.
pub(crate) struct Unfinished {
    inner: Arc<Inner>,
    keys: Arc<Keys>,
    undo: Option<Undo>,
    pub(crate) armed: bool,
}

impl Unfinished {
    pub(crate) fn new(inner: Arc<Inner>, keys: Arc<Keys>, undo: Undo) -> Unfinished {
        Unfinished {
            inner,
            keys,
            undo: Some(undo),
            armed: false,
        }
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Some(undo) = self.undo.take() else { return };
        let inner = self.inner.clone();
        let keys = self.keys.clone();
        // Whatever the request left expires with its lease anyway.
        let until = Instant::now() + inner.lease;
        let undoing = inner.undos.start(&keys.exclusive);
        self.inner.background.spawn(&self.inner.runtime, async move {
            if let Err(e) = inner.delete(&keys, &undo, until).await {
                tracing::warn!(key = %keys.exclusive, error = %e, "zklock: could not undo an acquire on Redis; what it left ends when its lease runs out");
            }
            drop(undoing);
        });
    }
}

/// The Redis backend; see [`LockManager::connect`](crate::LockManager::connect).
pub(crate) struct RedisBackend {
    inner: Arc<Inner>,
}

impl RedisBackend {
    /// Opens the connection and checks that the server answers and is a standalone primary.
    ///
    /// # Errors
    /// [`Error::Config`] for a URL the client refuses or a server that is no primary (a
    /// replica, a Sentinel, a Cluster node), [`Error::Server`] when the server does not answer
    /// `INFO` in time.
    pub(crate) async fn connect(config: RedisConfig) -> Result<RedisBackend> {
        let servers = RedisBackend::servers(&config).await?;
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
        // A Cluster's nodes were asked for its slots already; other servers must be a
        // primary.
        let info = match servers {
            Servers::Cluster(_) => Ok(String::new()),
            _ => {
                conn.run("", Some(config.connect_timeout), |mut c| async move {
                    redis::cmd("INFO").query_async::<String>(&mut c).await
                })
                .await
            }
        };
        match info {
            Ok(info) => role::Role::of_info(&info).required_primary()?,
            // A server that refuses INFO (renamed, disabled or denied by its operator) is taken
            // as a primary: its first write tells otherwise.
            Err(e)
                if matches!(
                    e.kind(),
                    redis::ErrorKind::Server(
                        redis::ServerErrorKind::ResponseError | redis::ServerErrorKind::NoPerm
                    )
                ) => {}
            Err(e) => return Err(server_error("connect", e)),
        }
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

    /// Where the URL's connections go: its one server, the primary the Sentinels name
    /// (`redis+sentinel://`), or a Cluster's primaries (`redis+cluster://`), asked once here
    /// so that a wrong master name, no Sentinel or node answering, or a Cluster with slots
    /// uncovered is a clear error at connect.
    async fn servers(config: &RedisConfig) -> Result<Servers> {
        let (url, dial) = Dial::of(&config.url, config.tls.as_ref(), config.connect_timeout);
        let url = url.as_str();
        let scheme = url.trim().to_ascii_lowercase();
        if scheme.starts_with(sentinel::SCHEME) {
            let sentinels = sentinel::Sentinels::parse(url, config.sentinel_auth.as_ref(), dial)?;
            let named = sentinels
                .primary(config.connect_timeout)
                .await
                .map_err(|asked| sentinels.connect_error(asked, &config.url))?;
            sentinels.trust(&named);
            return Ok(Servers::Sentinel(Arc::new(sentinels)));
        }
        if config.sentinel_auth.is_some() {
            return Err(Error::Config(
                "sentinel_password and sentinel_user are for redis+sentinel:// URLs: this URL \
                 names no Sentinel; give the server's password in the URL instead"
                    .to_string(),
            ));
        }
        if scheme.starts_with(cluster::SCHEME) {
            let cluster = cluster::Cluster::parse(url, dial)?;
            cluster
                .refresh(config.connect_timeout)
                .await
                .map_err(|asked| cluster.connect_error(asked, &config.url))?;
            return Ok(Servers::Cluster(Arc::new(cluster)));
        }
        // The URL may carry a password: errors name the problem, not the URL.
        let client = redis::Client::open(url)
            .map_err(|e| Error::Config(format!("the Redis URL is not usable: {e}")))?;
        Ok(Servers::One(Box::new(client), dial))
    }

    /// One attempt of `ask` for `ids` on `keys`; a mutex waiter queues as `member` unless
    /// `queue` is false (a try).
    async fn attempt(
        &self,
        keys: &Keys,
        ask: Ask,
        ids: &[String],
        member: &str,
        queue: bool,
        queued: bool,
    ) -> redis::RedisResult<Attempt> {
        let inner = &self.inner;
        // Without tokens, a mutex's first attempt is the floor's bare `SET NX PX`: granted, it
        // is the whole acquire (token 0: none). Refused (or the key already names this holder:
        // a retry whose reply was lost), the script below decides, queueing the waiter.
        if matches!(ask, Ask::Mutex)
            && !inner.tokens
            && !queued
            && inner.acks.is_none()
            && self.set_nx(keys, &ids[0]).await?
        {
            return Ok(Attempt::Granted(0));
        }
        let acks = inner.acks;
        let (reply, acked) = inner
            .conn
            .run(&keys.exclusive, Some(inner.write_timeout()), |mut c| {
                let call = self.acquire_call(keys, ask, ids, member, queue, queued);
                async move {
                    let reply: Vec<i64> = call.invoke(&mut c).await?;
                    // A grant counts once enough replicas have it (asked on the same
                    // connection, right after).
                    let acked = match reply.first() {
                        Some(1) => Inner::acked(acks, &mut c).await?,
                        _ => Ok(()),
                    };
                    Ok((reply, acked))
                }
            })
            .await?;
        Ok(match acked {
            Ok(()) => Attempt::of_reply(&reply),
            Err(n) => Attempt::Unacked(n),
        })
    }

    /// The floor's bare `SET <exclusive key> id NX PX lease` (one request): whether it took
    /// the key.
    async fn set_nx(&self, keys: &Keys, id: &str) -> redis::RedisResult<bool> {
        let inner = &self.inner;
        let set: Option<String> = inner
            .conn
            .run(&keys.exclusive, Some(inner.conn.reply_timeout), |mut c| {
                let mut set = redis::cmd("SET");
                set.arg(&keys.exclusive)
                    .arg(id)
                    .arg("NX")
                    .arg("PX")
                    .arg(inner.lease_ms());
                async move { set.query_async(&mut c).await }
            })
            .await?;
        Ok(set.is_some())
    }

    /// The script call of one attempt of `ask` (see [`attempt`](Self::attempt)): the
    /// acquire script of its kind on the lock's keys, with the lease and the holder ids.
    fn acquire_call(
        &self,
        keys: &Keys,
        ask: Ask,
        ids: &[String],
        member: &str,
        queue: bool,
        queued: bool,
    ) -> scripts::Call {
        let lease = self.inner.lease_ms();
        match ask {
            Ask::Mutex => {
                let mut call = scripts::Call::new(
                    &scripts::ACQUIRE_MUTEX,
                    &[&keys.exclusive, &keys.fence, &keys.queue, &keys.alive],
                );
                call.arg(&ids[0])
                    .arg(lease)
                    .arg(member)
                    .arg(if queue {
                        self.inner.waiter_ttl.as_millis() as u64
                    } else {
                        0
                    })
                    .arg(if queued { "1" } else { "0" })
                    .arg(keys::NOTIFY_PREFIX);
                call
            }
            Ask::Write => {
                let mut call = scripts::Call::new(
                    &scripts::ACQUIRE_EXCLUSIVE,
                    &[&keys.exclusive, &keys.shared, &keys.fence, &keys.intent],
                );
                call.arg(&ids[0]).arg(lease).arg("1");
                call
            }
            Ask::Read => {
                let mut call = scripts::Call::new(
                    &scripts::ACQUIRE_READ,
                    &[&keys.exclusive, &keys.shared, &keys.fence, &keys.intent],
                );
                call.arg(&ids[0]).arg(lease);
                call
            }
            Ask::Leases { max } => {
                let mut call =
                    scripts::Call::new(&scripts::ACQUIRE_LEASES, &[&keys.shared, &keys.fence]);
                call.arg(lease).arg(max).arg(ids);
                call
            }
        }
    }
}

impl Backend for RedisBackend {
    fn lease(&self) -> Option<Duration> {
        Some(self.inner.lease)
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Redis
    }

    fn acquire<'a>(
        &'a self,
        target: &'a LockTarget,
        mode: LockMode,
        wait: Wait,
    ) -> BoxFuture<'a, Result<Option<Arc<dyn BackendHold>>>> {
        Box::pin(async move {
            let holds = Acquire::new(self, target, Ask::from(mode), 1, wait)
                .run()
                .await?;
            Ok(holds
                .and_then(|h| h.into_iter().next())
                .map(|h| Arc::new(h) as _))
        })
    }

    fn acquire_leases<'a>(
        &'a self,
        target: &'a LockTarget,
        max_leases: u32,
        n: u32,
        wait: Wait,
    ) -> BoxFuture<'a, Result<Option<Vec<SharedHold>>>> {
        Box::pin(async move {
            let ask = Ask::Leases { max: max_leases };
            let holds = Acquire::new(self, target, ask, n, wait).run().await?;
            Ok(holds.map(|h| h.into_iter().map(|h| Arc::new(h) as _).collect()))
        })
    }

    fn claim_run<'a>(
        &'a self,
        target: &'a LockTarget,
        at_least: std::time::Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let keys = Keys::new(&target.path);
            let ms = at_least.as_millis() as u64;
            let acks = self.inner.acks;
            let (claimed, acked) = self
                .inner
                .conn
                .run(&keys.run, Some(self.inner.write_timeout()), |mut c| {
                    let mut invocation = scripts::CLAIM_RUN.key(&keys.run);
                    invocation.arg(ms);
                    async move {
                        let claimed = invocation.invoke_async::<i64>(&mut c).await?;
                        let acked = match claimed {
                            1 => Inner::acked(acks, &mut c).await?,
                            _ => Ok(()),
                        };
                        Ok((claimed, acked))
                    }
                })
                .await
                .map_err(|e| server_error("record the job's run", e))?;
            // A run record that too few replicas have could be lost to a failover, and the job
            // run again inside its window: the run does not start.
            if let Err(n) = acked {
                return Err(unacked(
                    self.inner.acks,
                    n,
                    "recorded the job's run (the job does not start)",
                ));
            }
            Ok(claimed == 1)
        })
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.inner.background.flush())
    }

    fn inspector(&self) -> std::result::Result<&dyn Inspect, &'static str> {
        Ok(self)
    }

    fn revoker(&self) -> std::result::Result<&dyn crate::backend::Revoke, &'static str> {
        Err("revocation (a Redis holder hears nothing from the server that a revoke request could travel by; end the holder's process, or let its lease run out)")
    }
}
