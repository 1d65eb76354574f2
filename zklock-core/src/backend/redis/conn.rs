//! The Redis backend's command connection: one multiplexed connection, replaced when it
//! breaks; and the backend's [`Breaks`], the count of connection breaks that holds are
//! confirmed against.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, RedisError, RedisResult};
use tokio::sync::{watch, Mutex as AsyncMutex};

use crate::types::error::{Error, ServerError};
use crate::types::loss::LossReason;

use super::sentinel::Servers;

pub(crate) use crate::background::Background;

/// The epoch of a backend's connections: bumped whenever one of them (the command connection,
/// the hub's pub/sub connection) breaks or is given up as silent. The server may have restarted
/// then and lost every key (or a proxy may have cut us off while someone else got in): a hold
/// is held only while the epoch it was granted in (its grant's request sent in it, and answered
/// before the next break) is the current one; a break is a loss of every hold granted before.
///
/// A failover (a Sentinel announced a new primary, or the server turned replica) is a break
/// too, remembered as such so that the holds it ends say why ([`LossReason::Failover`]).
#[derive(Clone)]
pub(crate) struct Breaks(Arc<watch::Sender<u64>>, Arc<AtomicU64>);

impl Breaks {
    pub(crate) fn new() -> Breaks {
        Breaks(Arc::new(watch::channel(0).0), Arc::default())
    }

    /// The current epoch: read it before sending a request whose answer confirms a hold.
    pub(crate) fn epoch(&self) -> u64 {
        *self.0.borrow()
    }

    /// A connection broke: every hold confirmed before is unconfirmed from now on.
    pub(crate) fn broke(&self) {
        self.0.send_modify(|n| *n += 1);
    }

    /// The primary changed: every hold confirmed before is unconfirmed from now on, lost to a
    /// failover.
    pub(crate) fn failed_over(&self) {
        self.0.send_modify(|n| {
            *n += 1;
            self.1.fetch_max(*n, Ordering::SeqCst);
        });
    }

    /// Why a hold confirmed in epoch `since` is no longer held, now that a later epoch is
    /// current: a failover came since, or only a break.
    pub(crate) fn why(&self, since: u64) -> LossReason {
        if self.1.load(Ordering::SeqCst) > since {
            LossReason::Failover
        } else {
            LossReason::Disconnected
        }
    }

    /// Wakes on every break.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

/// A multiplexed connection and the generation it belongs to.
struct Current {
    generation: u64,
    connection: Option<MultiplexedConnection>,
}

/// The connection commands go through. Requests are pipelined on one TCP connection; when it
/// breaks, the next request opens a new one.
pub(crate) struct Conn {
    /// Where connections go: the one server, or the primary the Sentinels name.
    servers: Servers,
    connect_timeout: Duration,
    config: AsyncConnectionConfig,
    /// How long one request may wait for its reply before the connection is taken for broken.
    pub(crate) reply_timeout: Duration,
    current: AsyncMutex<Current>,
    /// Bumped once per connection generation that breaks.
    breaks: Breaks,
    /// The last generation whose break was counted in `breaks`.
    counted: Arc<AtomicU64>,
    /// Where the connections' drivers run (the manager's runtime).
    runtime: tokio::runtime::Handle,
}

/// Whether a failed request may succeed on a new connection. A `-READONLY` reply is one: the
/// server turned replica (a failover), and a new connection finds the primary (through the
/// Sentinels) or fails again.
pub(crate) fn transient(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_unrecoverable_error()
        || read_only(err)
}

/// Why a hold is lost when a request confirming it failed with `err`: the server turned
/// replica (a failover), or the request failed on the connection.
pub(crate) fn loss_of(err: &RedisError) -> LossReason {
    if read_only(err) {
        LossReason::Failover
    } else {
        LossReason::Disconnected
    }
}

/// Whether `err` is a replica's refusal to write (`-READONLY`, also from inside a script).
pub(crate) fn read_only(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
    ) || err.to_string().contains("READONLY")
}

/// A client error during `operation`, as zklock's [`Error`].
pub(crate) fn server_error(operation: &'static str, err: RedisError) -> Error {
    Error::Server {
        backend: "redis",
        operation,
        source: ServerError::new(
            Arc::new(err.clone()),
            err.to_string(),
            transient(&err),
            "check the URL, that the server is up and that it allows EVAL and PUBLISH, then retry",
        ),
    }
}

/// The error of a request that got no reply in time.
pub(crate) fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no reply from Redis in time",
    ))
}

impl Conn {
    pub(crate) fn new(
        servers: Servers,
        connect_timeout: Duration,
        reply_timeout: Duration,
        breaks: Breaks,
        runtime: tokio::runtime::Handle,
    ) -> Conn {
        // Replies are bounded here, per request (`run`), not by the client: a renewal's bound
        // is its lease, not a fixed timeout.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None);
        Conn {
            servers,
            connect_timeout,
            config,
            reply_timeout,
            current: AsyncMutex::new(Current {
                generation: 0,
                connection: None,
            }),
            breaks,
            counted: Arc::new(AtomicU64::new(0)),
            runtime,
        }
    }

    /// Counts the break of `generation` in the epoch, once.
    fn count_break(breaks: &Breaks, counted: &AtomicU64, generation: u64) {
        if counted.fetch_max(generation, Ordering::SeqCst) < generation {
            breaks.broke();
        }
    }

    /// Opens connection `generation`. Over TCP or a Unix socket the connection is driven by a
    /// task of this backend, so its end (the server closed it, restarted, or the socket failed)
    /// counts as a break at once, not at the next request; other addresses open through the
    /// client, and their breaks show at the next request.
    async fn open(&self, generation: u64) -> RedisResult<MultiplexedConnection> {
        let client = self.servers.client(self.connect_timeout).await?;
        let info = client.get_connection_info();
        let (mut connection, driver) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                let (c, d) = MultiplexedConnection::new_with_config(
                    info.redis_settings(),
                    stream,
                    self.config.clone(),
                )
                .await?;
                (c, futures::FutureExt::boxed(d))
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path).await?;
                let (c, d) = MultiplexedConnection::new_with_config(
                    info.redis_settings(),
                    stream,
                    self.config.clone(),
                )
                .await?;
                (c, futures::FutureExt::boxed(d))
            }
            _ => {
                return client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await
            }
        };
        let (breaks, counted) = (self.breaks.clone(), self.counted.clone());
        self.runtime.spawn(async move {
            driver.await;
            Conn::count_break(&breaks, &counted, generation);
        });
        // Under Sentinel, only a server that says it is the primary is used (asked once the
        // driver runs: it carries the reply).
        let checked = if self.servers.checks_role() {
            tokio::time::timeout(
                self.connect_timeout,
                super::sentinel::check_primary(&mut connection),
            )
            .await
            .unwrap_or_else(|_| Err(timed_out()))
        } else {
            Ok(())
        };
        checked?;
        Ok(connection)
    }

    /// The current connection (opening one if there is none) and its generation.
    pub(crate) async fn get(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let mut current = self.current.lock().await;
        if let Some(c) = &current.connection {
            // A connection whose driver ended is not handed out again.
            if self.counted.load(Ordering::SeqCst) < current.generation {
                return Ok((current.generation, c.clone()));
            }
            current.connection = None;
        }
        // Each opening gets a generation of its own, even one that fails after its driver
        // started (a server that is not the primary): that driver's end counts for it alone.
        let generation = current.generation + 1;
        current.generation = generation;
        let c = self.open(generation).await?;
        current.connection = Some(c.clone());
        Ok((current.generation, c))
    }

    /// Forgets the connection of `generation` (it broke, or stayed silent); the next request
    /// opens a new one. Counted as a break.
    pub(crate) async fn broken(&self, generation: u64) {
        let mut current = self.current.lock().await;
        if current.generation == generation {
            current.connection = None;
        }
        Conn::count_break(&self.breaks, &self.counted, generation);
    }

    /// The connection of `generation` reached a server that is no longer the primary (or a
    /// Sentinel said the primary changed, `None`: whatever connection is current): it is
    /// forgotten, and every hold confirmed before is lost to a failover.
    pub(crate) async fn failed_over_at(&self, generation: Option<u64>) {
        let mut current = self.current.lock().await;
        let announced = generation.is_none();
        let generation = generation.unwrap_or(current.generation);
        if current.generation == generation {
            current.connection = None;
        }
        // A connection's `-READONLY` replies count once, like its break; a Sentinel's
        // announcement always does (the current connection may be to the new primary already).
        let first = self.counted.fetch_max(generation, Ordering::SeqCst) < generation;
        if first || announced {
            self.breaks.failed_over();
            crate::metrics::failover(crate::metrics::BackendLabel::Redis);
        }
    }

    async fn failed_over(&self, generation: u64) {
        self.failed_over_at(Some(generation)).await;
    }

    /// The current connection if one is open and its driver has not ended, without waiting
    /// (another task may be opening one: then `None`).
    fn current_now(&self) -> Option<(u64, MultiplexedConnection)> {
        let current = self.current.try_lock().ok()?;
        let c = current.connection.as_ref()?;
        (self.counted.load(Ordering::SeqCst) < current.generation)
            .then(|| (current.generation, c.clone()))
    }

    /// Runs one request on the current connection, bounded by `timeout` when given; a
    /// connection that fails or stays silent is replaced for the next request. Getting a
    /// connection has a timeout of its own only when one must be waited for (opened, or
    /// another request is opening it).
    pub(crate) async fn run<T, F, Fut>(
        &self,
        timeout: Option<Duration>,
        request: F,
    ) -> RedisResult<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let (generation, connection) = match (self.current_now(), timeout) {
            (Some(current), _) => current,
            (None, Some(t)) => tokio::time::timeout(t, self.get())
                .await
                .map_err(|_| timed_out())??,
            (None, None) => self.get().await?,
        };
        let result = match timeout {
            Some(t) => tokio::time::timeout(t, request(connection))
                .await
                .unwrap_or_else(|_| Err(timed_out())),
            None => request(connection).await,
        };
        if let Err(e) = &result {
            if read_only(e) {
                // The server turned replica under us: a failover, whether or not a Sentinel
                // told us yet.
                self.failed_over(generation).await;
            } else if transient(e) {
                self.broken(generation).await;
            }
        }
        result
    }
}
