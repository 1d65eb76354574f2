//! The Redis backend (feature `redis`): leases in one Redis server, renewed while held.
//!
//! - A mutex (or a writer) is the key `zklock:lock:<path>`, taken with `SET key id NX PX
//!   lease` in a Lua script that also `INCR`s the lock's fence counter (floored at the
//!   server's time in µs, see [`scripts`]): the fencing token.
//!   Readers and semaphore leases are members of the sorted set `zklock:shared:<path>`, scored
//!   by the end of their lease. See [`keys`] and [`scripts`].
//! - A watchdog renews each hold (compare and `PEXPIRE`) every lease/3, and makes it lost the
//!   moment a renewal fails or is refused, or when the lease could have run out: at the send
//!   time of the last confirmed renewal plus the lease less a [`margin`](Inner::margin), so
//!   before the server lets anyone else in.
//! - Waiters do not poll: they listen on the lock's pub/sub channel `zklock:wake:<path>`, which
//!   every release publishes to, and otherwise wake when the current lease could run out
//!   (its `PTTL`). See [`hub`].
//! - Releases and undos are compare-and-delete scripts: they delete only what carries the
//!   holder's id. A dropped acquire whose request may have been applied is undone in the
//!   background; [`flush`](Backend::flush) waits for it.
//!
//! No order among waiting processes is kept: a release wakes every process waiting for the
//! lock (one task each: the local queue keeps the others asleep), and the first to ask gets
//! it. A waiting writer makes new readers wait (writers are not starved by readers): it leaves
//! an intent key, renewed every lease/3 while it waits.

mod conn;
mod hold;
mod hub;
mod keys;
mod scripts;

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Backend, BackendHold, BoxFuture, LockTarget, SharedHold, HOST_PID};
use crate::types::error::{Error, Result};
use crate::types::mode::{HoldMode, Wait};
use crate::types::token::FencingToken;
use conn::{transient, Background, Conn};
use hold::{RedisHold, Side};
use hub::{Hub, Listener};
use keys::Keys;

/// The longest any single request waits for its reply (acquire attempts, releases); shorter
/// when the lease is.
const MAX_REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// The first pause before retrying an attempt that failed on the connection; doubled up to
/// [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_secs(1);
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
}

/// What the backend's holds and tasks share.
pub(crate) struct Inner {
    pub(crate) conn: Conn,
    hub: Hub,
    pub(crate) lease: Duration,
    /// Taken off every deadline; see [`margin`](Self::margin).
    margin: Duration,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) background: Arc<Background>,
    /// `host=<host> pid=<pid>[ id=<identity>]`, after each holder's uuid.
    holder_tag: String,
}

impl Inner {
    /// A fresh holder id: `<uuid-v4> host=<host> pid=<pid>[ id=<identity>]`, what the keys
    /// hold (`GET zklock:lock:<path>` shows who holds it).
    pub(crate) fn new_id(&self) -> String {
        format!("{} {}", uuid::Uuid::new_v4(), self.holder_tag)
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

    /// Deletes what carries one of `ids` in `keys` and wakes waiters; retried on connection
    /// trouble until `until`. Whether something was deleted.
    pub(crate) async fn delete(
        &self,
        keys: &Keys,
        ids: &[String],
        until: Instant,
    ) -> redis::RedisResult<bool> {
        let mut pause = RETRY_MIN;
        loop {
            let freed = self
                .conn
                .run(Some(self.conn.reply_timeout), |mut c| {
                    let mut invocation = scripts::RELEASE.key(&keys.exclusive);
                    invocation
                        .key(&keys.shared)
                        .key(&keys.intent)
                        .arg(&keys.channel)
                        .arg(ids);
                    async move { invocation.invoke_async::<i64>(&mut c).await }
                })
                .await;
            match freed {
                Ok(n) => return Ok(n == 1),
                Err(e) if transient(&e) && Instant::now() + pause < until => {
                    crate::metrics::release_retry(crate::metrics::BackendKind::Redis);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// What an acquire asks for.
#[derive(Debug, Clone, Copy)]
enum Ask {
    /// The exclusive key; `readers_exclude` for a writer.
    Exclusive { readers_exclude: bool },
    /// A read hold.
    Read,
    /// Leases of a semaphore with `max` leases.
    Leases { max: u32 },
}

/// What an attempt found.
enum Attempt {
    /// Granted, with the last token handed out.
    Granted(i64),
    /// Taken: how long until it may be free (`None`: no expiry to wait for).
    Taken(Option<Duration>),
}

/// The ids of an acquire (or downgrade) whose request may have been applied: undone in the
/// background when dropped armed.
pub(crate) struct Pending {
    inner: Arc<Inner>,
    keys: Arc<Keys>,
    ids: Vec<String>,
    pub(crate) armed: bool,
}

impl Pending {
    pub(crate) fn new(inner: Arc<Inner>, keys: Arc<Keys>, ids: Vec<String>) -> Pending {
        Pending {
            inner,
            keys,
            ids,
            armed: false,
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let inner = self.inner.clone();
        let keys = self.keys.clone();
        let ids = std::mem::take(&mut self.ids);
        // Whatever the request left expires with its lease anyway.
        let until = Instant::now() + inner.lease;
        self.inner.background.spawn(&self.inner.runtime, async move {
            if let Err(e) = inner.delete(&keys, &ids, until).await {
                tracing::warn!(key = %keys.exclusive, error = %e, "zklock: could not undo an acquire on Redis; what it left ends when its lease runs out");
            }
        });
    }
}

/// The Redis backend; see [`LockManager::connect`](crate::LockManager::connect).
pub(crate) struct RedisBackend {
    inner: Arc<Inner>,
}

impl RedisBackend {
    /// Opens the connection and checks that the server answers.
    ///
    /// # Errors
    /// [`Error::Config`] for a URL the client refuses, [`Error::Redis`] when the server does
    /// not answer `PING` in time.
    pub(crate) async fn connect(config: RedisConfig) -> Result<RedisBackend> {
        // The URL may carry a password: errors name the problem, not the URL.
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| Error::Config(format!("the Redis URL is not usable: {e}")))?;
        let reply_timeout = config.lease.min(MAX_REPLY_TIMEOUT);
        let conn = Conn::new(client.clone(), config.connect_timeout, reply_timeout);
        conn.run(Some(config.connect_timeout), |mut c| async move {
            redis::cmd("PING").query_async::<String>(&mut c).await
        })
        .await
        .map_err(|e| Error::Redis {
            operation: "connect",
            source: e.into(),
        })?;
        let runtime = tokio::runtime::Handle::current();
        let hub = Hub::start(client, reply_timeout, &runtime);
        let mut holder_tag = HOST_PID.clone();
        if let Some(id) = &config.identity {
            holder_tag.push_str(" id=");
            holder_tag.push_str(id);
        }
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                conn,
                hub,
                lease: config.lease,
                margin: Inner::margin(config.lease),
                runtime,
                background: Arc::default(),
                holder_tag,
            }),
        })
    }

    /// One attempt of `ask` for `ids` on `keys`.
    async fn attempt(&self, keys: &Keys, ask: Ask, ids: &[String]) -> redis::RedisResult<Attempt> {
        let inner = &self.inner;
        let lease = inner.lease_ms();
        let reply: Vec<i64> = inner
            .conn
            .run(Some(inner.conn.reply_timeout), |mut c| {
                let invocation = match ask {
                    Ask::Exclusive { readers_exclude } => {
                        let mut i = scripts::ACQUIRE_EXCLUSIVE.key(&keys.exclusive);
                        i.key(&keys.shared)
                            .key(&keys.fence)
                            .key(&keys.intent)
                            .arg(&ids[0])
                            .arg(lease)
                            .arg(if readers_exclude { "1" } else { "0" });
                        i
                    }
                    Ask::Read => {
                        let mut i = scripts::ACQUIRE_READ.key(&keys.exclusive);
                        i.key(&keys.shared)
                            .key(&keys.fence)
                            .key(&keys.intent)
                            .arg(&ids[0])
                            .arg(lease);
                        i
                    }
                    Ask::Leases { max } => {
                        let mut i = scripts::ACQUIRE_LEASES.key(&keys.shared);
                        i.key(&keys.fence).arg(lease).arg(max).arg(ids);
                        i
                    }
                };
                async move { invocation.invoke_async(&mut c).await }
            })
            .await?;
        Ok(match reply.as_slice() {
            [1, token] => Attempt::Granted(*token),
            [_, ms] if *ms >= 0 => Attempt::Taken(Some(Duration::from_millis(*ms as u64))),
            _ => Attempt::Taken(None),
        })
    }

    /// Acquires `n` holds of `ask` on `target` (all or none), waiting as `wait` says.
    async fn acquire_holds(
        &self,
        target: &LockTarget,
        ask: Ask,
        n: u32,
        wait: Wait,
    ) -> Result<Option<Vec<RedisHold>>> {
        let inner = &self.inner;
        let keys = Arc::new(Keys::new(&target.path));
        let ids: Vec<String> = (0..n.max(1)).map(|_| inner.new_id()).collect();
        let mut pending = Pending::new(inner.clone(), keys.clone(), ids.clone());
        let mut listener: Option<Listener> = None;
        let mut pause = RETRY_MIN;
        loop {
            if let Some(l) = &mut listener {
                l.mark();
            }
            pending.armed = true;
            let sent = Instant::now();
            match self.attempt(&keys, ask, &ids).await {
                Ok(Attempt::Granted(last)) => {
                    pending.armed = false;
                    let first = last - i64::from(n.max(1)) + 1;
                    let side = match ask {
                        Ask::Exclusive { .. } => Side::Exclusive,
                        Ask::Read | Ask::Leases { .. } => Side::Shared,
                    };
                    let holds = ids
                        .iter()
                        .zip(first..)
                        .map(|(id, token)| {
                            RedisHold::new(
                                inner.clone(),
                                keys.clone(),
                                side,
                                id.clone(),
                                target.key.clone(),
                                FencingToken::new(token, 0),
                                sent,
                            )
                        })
                        .collect();
                    return Ok(Some(holds));
                }
                Ok(Attempt::Taken(free_in)) => {
                    pause = RETRY_MIN;
                    // Nothing of ours is left, but a waiting writer's intent.
                    pending.armed = matches!(
                        ask,
                        Ask::Exclusive {
                            readers_exclude: true
                        }
                    );
                    if matches!(wait, Wait::Never) {
                        return Ok(None);
                    }
                    let Some(listener) = &mut listener else {
                        // Listen, then try again at once: a release may have come before.
                        listener = Some(
                            inner
                                .hub
                                .listen(&keys.channel, inner.conn.reply_timeout)
                                .await,
                        );
                        continue;
                    };
                    // Woken by a release, or when the lease in the way could run out (a
                    // millisecond late, so that the server has let it go). A writer behind
                    // readers comes back every lease/3 to renew its intent.
                    let mut fallback =
                        free_in.map_or(inner.lease, |d| d + Duration::from_millis(1));
                    if let Ask::Exclusive {
                        readers_exclude: true,
                    } = ask
                    {
                        fallback = fallback.min(inner.lease / 3);
                    }
                    listener.wait(fallback).await;
                }
                Err(e) if transient(&e) => {
                    tracing::debug!(key = %target.key, error = %e, "zklock: a Redis acquire attempt failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
                Err(e) => {
                    return Err(Error::Redis {
                        operation: "acquire the lock",
                        source: e.into(),
                    })
                }
            }
        }
    }
}

impl Backend for RedisBackend {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn acquire<'a>(
        &'a self,
        target: &'a LockTarget,
        mode: HoldMode,
        wait: Wait,
    ) -> BoxFuture<'a, Result<Option<Arc<dyn BackendHold>>>> {
        Box::pin(async move {
            let ask = match mode {
                // A leader latch is exclusive; Redis keeps no participant ids.
                HoldMode::Exclusive | HoldMode::Leader => Ask::Exclusive {
                    readers_exclude: false,
                },
                HoldMode::Write => Ask::Exclusive {
                    readers_exclude: true,
                },
                HoldMode::Read => Ask::Read,
                HoldMode::Lease => {
                    return Err(Error::Unsupported {
                        backend: "redis",
                        feature: "a lease outside a semaphore",
                    })
                }
            };
            let holds = self.acquire_holds(target, ask, 1, wait).await?;
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
            let holds = self
                .acquire_holds(target, Ask::Leases { max: max_leases }, n, wait)
                .await?;
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
            let claimed = self
                .inner
                .conn
                .run(Some(self.inner.conn.reply_timeout), |mut c| {
                    let mut invocation = scripts::CLAIM_RUN.key(&keys.run);
                    invocation.arg(ms);
                    async move { invocation.invoke_async::<i64>(&mut c).await }
                })
                .await
                .map_err(|e| Error::Redis {
                    operation: "record the job's run",
                    source: e.into(),
                })?;
            Ok(claimed == 1)
        })
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.inner.background.flush())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
