//! The Redis backend's command connection: one multiplexed connection, replaced when it
//! breaks.

use std::future::Future;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisError, RedisResult};
use tokio::sync::Mutex as AsyncMutex;

pub(crate) use crate::session::background::Background;

/// A multiplexed connection and the generation it belongs to.
struct Current {
    generation: u64,
    connection: Option<MultiplexedConnection>,
}

/// The connection commands go through. Requests are pipelined on one TCP connection; when it
/// breaks, the next request opens a new one.
pub(crate) struct Conn {
    client: Client,
    config: AsyncConnectionConfig,
    /// How long one request may wait for its reply before the connection is taken for broken.
    pub(crate) reply_timeout: Duration,
    current: AsyncMutex<Current>,
}

/// Whether a failed request may succeed on a new connection.
pub(crate) fn transient(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_unrecoverable_error()
}

/// The error of a request that got no reply in time.
pub(crate) fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no reply from Redis in time",
    ))
}

impl Conn {
    pub(crate) fn new(client: Client, connect_timeout: Duration, reply_timeout: Duration) -> Conn {
        // Replies are bounded here, per request (`run`), not by the client: a renewal's bound
        // is its lease, not a fixed timeout.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None);
        Conn {
            client,
            config,
            reply_timeout,
            current: AsyncMutex::new(Current {
                generation: 0,
                connection: None,
            }),
        }
    }

    /// The current connection (opening one if there is none) and its generation.
    pub(crate) async fn get(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let mut current = self.current.lock().await;
        if let Some(c) = &current.connection {
            return Ok((current.generation, c.clone()));
        }
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        current.generation += 1;
        current.connection = Some(c.clone());
        Ok((current.generation, c))
    }

    /// Forgets the connection of `generation` (it broke); the next request opens a new one.
    pub(crate) async fn broken(&self, generation: u64) {
        let mut current = self.current.lock().await;
        if current.generation == generation {
            current.connection = None;
        }
    }

    /// Runs one request on the current connection, bounded by `timeout` when given; a
    /// connection that fails or stays silent is replaced for the next request.
    pub(crate) async fn run<T, F, Fut>(
        &self,
        timeout: Option<Duration>,
        request: F,
    ) -> RedisResult<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let (generation, connection) = match timeout {
            Some(t) => tokio::time::timeout(t, self.get())
                .await
                .map_err(|_| timed_out())??,
            None => self.get().await?,
        };
        let result = match timeout {
            Some(t) => tokio::time::timeout(t, request(connection))
                .await
                .unwrap_or_else(|_| Err(timed_out())),
            None => request(connection).await,
        };
        if let Err(e) = &result {
            if transient(e) {
                self.broken(generation).await;
            }
        }
        result
    }
}
