//! Stock in Redis, read and written in separate commands, with a fenced write.
//!
//! Keys for a SKU `s`: `stock:s` (units left) and `orders:s` (one entry per order sold); the
//! last fencing token a write was accepted with is zklock's: [`zklock::fence::RedisFence`]
//! keeps it under `zklock:accepted:<lock path>`.
//!
//! The read is a plain `GET`. The write is one script, atomic in Redis: under a lock it goes
//! through zklock's fence, which runs it only if the writer's token is not older than the last
//! one accepted for the SKU's lock (and then records the token); without a lock (the demo's
//! no-lock mode) it runs as is. Nothing makes the read and the write one step: that is the
//! lock's job.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisResult};
use zklock::fence::{Fence, FenceError, Fenced, FencedScript, Outcome, RedisFence, RedisWrite};
use zklock::{FencingToken, Key, DEFAULT_NAMESPACE};

/// The write of an order: KEYS stock and orders, ARGV the new stock and the order record.
/// Under a lock, zklock's fence runs it only after the token check.
const SELL: &str = r#"
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
"#;

/// How long a Redis command may take before it fails (the client's default, 500 ms, is too
/// short for a loaded two-core machine running several instances).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The outcome of a fenced write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The stock was written and the order recorded.
    Written,
    /// The token was older than `last`, the last one accepted for this SKU: nothing was written.
    Stale {
        /// The newest token the store has accepted for the SKU.
        last: FencingToken,
    },
}

/// The inventory in one Redis database; cheap to clone (one multiplexed connection).
#[derive(Clone)]
pub struct Store {
    client: Client,
    conn: MultiplexedConnection,
    fence: RedisFence,
    sell: FencedScript,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field(
                "redis",
                &self.client.get_connection_info().addr().to_string(),
            )
            .finish()
    }
}

/// The key holding the units left of `sku`.
pub fn stock_key(sku: &str) -> String {
    format!("stock:{sku}")
}

/// The key listing the orders sold for `sku`.
pub fn orders_key(sku: &str) -> String {
    format!("orders:{sku}")
}

/// The lock an order for `sku` runs under (`#[distributed_lock("sku_{sku}")]`).
pub fn lock_key(sku: &str) -> String {
    format!("sku_{sku}")
}

/// The fence's resource name for `sku`: the path of its lock (what `LockManager::path_of`
/// gives for [`lock_key`] on the demo's managers, which keep the default namespace), the name
/// `zklock::fence::current` fences with inside the lock.
pub fn lock_resource(sku: &str) -> String {
    let key = Key::new(lock_key(sku)).expect("a SKU of at most 64 bytes makes a valid key");
    format!("{DEFAULT_NAMESPACE}/{}", key.encoded())
}

impl Store {
    /// Connects to the Redis server at `url` (`redis://host:port/`).
    ///
    /// # Errors
    /// When the URL is invalid or the server does not answer.
    pub async fn connect(url: &str) -> RedisResult<Store> {
        let client = Client::open(url)?;
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(RESPONSE_TIMEOUT));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(Store {
            client,
            fence: RedisFence::new(conn.clone()),
            conn,
            sell: FencedScript::new(SELL),
        })
    }

    /// A new connection of its own, without a response timeout: for blocking commands
    /// (`BLPOP`), which would stall every other command on a shared connection.
    ///
    /// # Errors
    /// When the server does not answer.
    pub async fn dedicated_connection(&self) -> RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(Some(RESPONSE_TIMEOUT));
        self.client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// zklock's fence on this Redis: under a lock, `zklock::fence::current(store.fence())`
    /// gives the writer that [`write`](Self::write) takes.
    pub fn fence(&self) -> &RedisFence {
        &self.fence
    }

    /// The shared connection, for commands of the caller's own.
    pub fn connection(&self) -> MultiplexedConnection {
        self.conn.clone()
    }

    /// Units left of `sku`; `None` when the SKU is not stocked at all.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn stock(&self, sku: &str) -> RedisResult<Option<i64>> {
        redis::cmd("GET")
            .arg(stock_key(sku))
            .query_async(&mut self.conn.clone())
            .await
    }

    /// Sets the stock of `sku` to `stock` and records `order`, in one atomic step; through a
    /// fenced writer (one made inside the SKU's lock), only if its token is not older than the
    /// last one accepted for the SKU's lock.
    ///
    /// # Errors
    /// Redis errors; a writer fenced on another resource than `sku`'s lock.
    pub async fn write(
        &self,
        sku: &str,
        stock: i64,
        order: &str,
        writer: Option<&Fenced<'_, RedisFence>>,
    ) -> Result<WriteOutcome, FenceError> {
        let keys = [stock_key(sku), orders_key(sku)];
        let args = [stock.to_string(), order.to_string()];
        let Some(writer) = writer else {
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("SET")
                .arg(&keys[0])
                .arg(stock)
                .ignore()
                .cmd("RPUSH")
                .arg(&keys[1])
                .arg(order)
                .ignore();
            pipe.query_async::<()>(&mut self.conn.clone()).await?;
            return Ok(WriteOutcome::Written);
        };
        if writer.resource() != lock_resource(sku) {
            return Err(FenceError::Invalid(format!(
                "a write for SKU {sku} fenced with the token of {}; fence it with its own lock, {}",
                writer.resource(),
                lock_resource(sku)
            )));
        }
        Ok(
            match writer
                .write(RedisWrite::script(&self.sell, &keys, &args))
                .await?
            {
                Outcome::Accepted(_) => WriteOutcome::Written,
                Outcome::Stale { last } => WriteOutcome::Stale { last },
            },
        )
    }

    /// Empties the database and stocks each `(sku, units)`.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn reset(&self, stock: &[(String, i64)]) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        redis::cmd("FLUSHDB").query_async::<()>(&mut conn).await?;
        self.add(stock).await
    }

    /// Stocks each `(sku, units)` (overwriting) and forgets its orders and fence.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn add(&self, stock: &[(String, i64)]) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        for (sku, units) in stock {
            pipe.cmd("DEL")
                .arg(orders_key(sku))
                .arg(self.fence.key_of(&lock_resource(sku)))
                .ignore();
            pipe.cmd("SET").arg(stock_key(sku)).arg(*units).ignore();
        }
        pipe.query_async::<()>(&mut conn).await
    }

    /// How many orders were recorded as sold for `sku`.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn sold(&self, sku: &str) -> RedisResult<i64> {
        redis::cmd("LLEN")
            .arg(orders_key(sku))
            .query_async(&mut self.conn.clone())
            .await
    }

    /// The last fencing token accepted for `sku`, if any.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn last_token(&self, sku: &str) -> Result<Option<FencingToken>, FenceError> {
        self.fence.last_token(&lock_resource(sku)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_fence_resource_is_the_locks_path() {
        let manager = zklock::LockManager::in_memory();
        for sku in ["7", "a/b", "ü"] {
            assert_eq!(lock_resource(sku), manager.path_of(&lock_key(sku)).unwrap());
        }
    }
}
