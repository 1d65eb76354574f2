//! Stock in Redis, read and written in separate commands, with a fenced write.
//!
//! Keys for a SKU `s`: `stock:s` (units left), `orders:s` (one entry per order sold) and
//! `fence:s` (the last fencing token a write was accepted with).
//!
//! The read is a plain `GET`. The write is one Lua script, atomic in Redis: when the caller
//! holds a lock, it compares the caller's fencing token with `fence:s` and refuses the write if
//! the token is older; otherwise it stores the token, sets the stock and records the order.
//! Nothing makes the read and the write one step: that is the lock's job.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, RedisResult, Script};
use zklock::FencingToken;

/// The fenced write. Tokens order by `(zxid, local)`. Lua numbers are doubles, exact only up to
/// 2^53, while a zxid is 64 bits; so the zxid travels as its high and low 32-bit halves (signed
/// epoch part, unsigned counter part), and the token compares as the triple
/// `(high, low, local)`: every part fits a double exactly, and the triple orders as the token.
///
/// KEYS: stock, orders, fence. ARGV: new stock, order record, then (only under a lock) the
/// token's high, low and local parts.
/// Returns `{1}` when written, `{0, high, low, local}` (the last accepted token) when refused.
const FENCED_WRITE: &str = r#"
if ARGV[3] then
  local last = redis.call('HMGET', KEYS[3], 'high', 'low', 'local')
  if last[1] then
    local high, low, loc = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
    local lhigh, llow, lloc = tonumber(last[1]), tonumber(last[2]), tonumber(last[3])
    if high < lhigh or (high == lhigh and (low < llow or (low == llow and loc < lloc))) then
      return {0, last[1], last[2], last[3]}
    end
  end
  redis.call('HSET', KEYS[3], 'high', ARGV[3], 'low', ARGV[4], 'local', ARGV[5])
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return {1}
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
    script: Script,
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

/// The key holding the last fencing token accepted for `sku`.
pub fn fence_key(sku: &str) -> String {
    format!("fence:{sku}")
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
            conn,
            script: Script::new(FENCED_WRITE),
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

    /// Sets the stock of `sku` to `stock` and records `order`, in one atomic step; with a
    /// token, only if it is not older than the last token accepted for `sku`.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn write(
        &self,
        sku: &str,
        stock: i64,
        order: &str,
        token: Option<FencingToken>,
    ) -> RedisResult<WriteOutcome> {
        let mut call = self.script.prepare_invoke();
        call.key(stock_key(sku))
            .key(orders_key(sku))
            .key(fence_key(sku))
            .arg(stock)
            .arg(order);
        if let Some(token) = token {
            let (high, low) = split_zxid(token.zxid());
            call.arg(high).arg(low).arg(token.local());
        }
        let reply: Vec<i64> = call.invoke_async(&mut self.conn.clone()).await?;
        match reply.as_slice() {
            [1] => Ok(WriteOutcome::Written),
            [0, high, low, local] => Ok(WriteOutcome::Stale {
                last: FencingToken::new(join_zxid(*high, *low), *local as u32),
            }),
            other => Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "unexpected reply from the fenced write script",
                format!("{other:?}"),
            ))),
        }
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
                .arg(fence_key(sku))
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
    pub async fn fence(&self, sku: &str) -> RedisResult<Option<FencingToken>> {
        let parts: Vec<Option<i64>> = redis::cmd("HMGET")
            .arg(fence_key(sku))
            .arg("high")
            .arg("low")
            .arg("local")
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(match parts.as_slice() {
            [Some(high), Some(low), Some(local)] => {
                Some(FencingToken::new(join_zxid(*high, *low), *local as u32))
            }
            _ => None,
        })
    }
}

/// A zxid as (high 32 bits, signed; low 32 bits, unsigned): each part is exact as a double.
fn split_zxid(zxid: i64) -> (i64, i64) {
    (zxid >> 32, zxid & 0xffff_ffff)
}

fn join_zxid(high: i64, low: i64) -> i64 {
    (high << 32) | (low & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zxid_halves_round_trip_and_order() {
        let zxids = [
            0,
            1,
            0xffff_ffff,
            0x1_0000_0000,
            0x7fff_ffff_ffff_ffff,
            -1,
            i64::MIN,
        ];
        for z in zxids {
            let (h, l) = split_zxid(z);
            assert_eq!(join_zxid(h, l), z);
            assert!((0..=0xffff_ffff).contains(&l));
        }
        let mut sorted = zxids;
        sorted.sort();
        let mut by_parts = zxids;
        by_parts.sort_by_key(|z| split_zxid(*z));
        assert_eq!(sorted, by_parts);
    }
}
