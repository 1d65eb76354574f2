//! The fence on Redis: one Lua script per write checks the token, applies the write and
//! records the token, atomically.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::{Script, ToRedisArgs, Value};

use super::encoding::SORTABLE_STRING_LEN;
use super::error::FenceError;
use super::{check_write, Fence, Outcome};
use crate::types::token::FencingToken;

/// The default prefix of the keys that hold the last accepted tokens.
pub(crate) const DEFAULT_PREFIX: &str = "zklock:accepted:";

/// The check every script starts with. KEYS[1] is the token key, ARGV[1] the token as 30
/// digits. Equal-length digit strings compare in Lua (and any collation) as the numbers they
/// spell, so no token is ever turned into a double.
const CHECK: &str = r#"
local last = redis.call('GET', KEYS[1])
if #ARGV[1] ~= 30 or not string.match(ARGV[1], '^%d+$') then
  return redis.error_reply('zklock fence: the token argument is not 30 digits')
end
if last then
  if #last ~= 30 or not string.match(last, '^%d+$') then
    return redis.error_reply('zklock fence: key ' .. KEYS[1] .. ' holds no fencing token; keep the fence keys for the fence alone')
  end
  if ARGV[1] < last then
    return {0, last}
  end
end
"#;

const SET: &str = r#"
local reply = redis.call('SET', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1])
return {1, reply}
"#;

const HSET: &str = r#"
local reply = redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[1])
return {1, reply}
"#;

/// Fenced writes on Redis: `SET`, `HSET`, or a Lua script of yours, each run in one script
/// after the token check, so the check, the write and the new token are one atomic step.
///
/// The last accepted token of a resource is kept as a string key, `prefix + resource`
/// (default prefix `zklock:accepted:`; the Redis lock backend's own keys are
/// `zklock:lock:`, `zklock:fence:`, ...), in [`FencingToken::to_sortable_string`]'s 30 digits.
/// On Redis Cluster the token key and your keys must share a slot: give a prefix and keys with
/// the same hash tag (`{sku_7}`).
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager) -> Result<(), Box<dyn std::error::Error>> {
/// use zklock_core::fence::{RedisFence, RedisWrite};
///
/// let client = zklock_core::redis::Client::open("redis://127.0.0.1:6379/")?;
/// let fence = RedisFence::new(client.get_multiplexed_async_connection().await?);
/// let guard = manager.lock("sku_7").await?;
/// let outcome = guard.fenced(&fence).write(RedisWrite::set("stock:sku_7", 41)).await?;
/// if !outcome.is_accepted() {
///     // a newer holder wrote meanwhile: this one lost its lock while paused
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisFence<C = MultiplexedConnection> {
    conn: C,
    prefix: String,
    set: Arc<Script>,
    hset: Arc<Script>,
}

impl<C> fmt::Debug for RedisFence<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisFence")
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// A Lua script of yours that a [`RedisFence`] runs only after the token check passed, in the
/// same script (so atomically). Inside it, `KEYS` and `ARGV` are yours (the fence's own key
/// and token are not among them); what it returns comes back in [`Outcome::Accepted`]. The
/// token is recorded after it returns; if it raises an error (or returns
/// `redis.error_reply(..)`, which comes back as [`FenceError::Redis`]), the token is not recorded
/// (and, as with any Redis script, what it wrote before the error stays written).
///
/// Make it once and reuse it: it is sent by SHA after the first call.
///
/// ```
/// use zklock_core::fence::{FencedScript, RedisWrite};
///
/// let sell = FencedScript::new(r#"
///     redis.call('SET', KEYS[1], ARGV[1])
///     return redis.call('RPUSH', KEYS[2], ARGV[2])
/// "#);
/// let write = RedisWrite::script(&sell, &["stock:sku_7", "orders:sku_7"], &["41", "order-9"]);
/// # let _ = write;
/// ```
#[derive(Clone)]
pub struct FencedScript {
    script: Arc<Script>,
}

impl fmt::Debug for FencedScript {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedScript")
            .field("sha", &self.script.get_hash())
            .finish()
    }
}

impl FencedScript {
    /// Wraps the Lua `body` (statements, ending with a `return` if it answers anything).
    ///
    /// ```
    /// let s = zklock_core::fence::FencedScript::new("return redis.call('INCR', KEYS[1])");
    /// # let _ = s;
    /// ```
    pub fn new(body: &str) -> FencedScript {
        let code = format!(
            "{CHECK}
local keys, argv = {{}}, {{}}
for i = 2, #KEYS do keys[i - 1] = KEYS[i] end
for i = 2, #ARGV do argv[i - 1] = ARGV[i] end
local reply = (function(KEYS, ARGV)
{body}
end)(keys, argv)
if type(reply) == 'table' and reply.err then
  return reply
end
redis.call('SET', KEYS[1], ARGV[1])
return {{1, reply}}
"
        );
        FencedScript {
            script: Arc::new(Script::new(&code)),
        }
    }
}

/// One fenced write on Redis.
///
/// ```
/// use zklock_core::fence::RedisWrite;
///
/// let stock = RedisWrite::set("stock:sku_7", 41);
/// let field = RedisWrite::hset("sku:7", "stock", 41);
/// # let _ = (stock, field);
/// ```
#[derive(Debug, Clone)]
pub struct RedisWrite(WriteKind);

#[derive(Debug, Clone)]
enum WriteKind {
    Set {
        key: Vec<u8>,
        value: Vec<Vec<u8>>,
    },
    HSet {
        key: Vec<u8>,
        field: Vec<Vec<u8>>,
        value: Vec<Vec<u8>>,
    },
    Script {
        script: FencedScript,
        keys: Vec<Vec<u8>>,
        args: Vec<Vec<u8>>,
    },
}

impl RedisWrite {
    /// `SET key value`. The value is one Redis argument (a string, bytes, a number).
    ///
    /// ```
    /// let w = zklock_core::fence::RedisWrite::set("k", "v");
    /// # let _ = w;
    /// ```
    pub fn set(key: impl ToRedisArgs, value: impl ToRedisArgs) -> RedisWrite {
        RedisWrite(WriteKind::Set {
            key: one(key),
            value: value.to_redis_args(),
        })
    }

    /// `HSET key field value`: one field of a hash.
    ///
    /// ```
    /// let w = zklock_core::fence::RedisWrite::hset("user:9", "email", "ada@example.com");
    /// # let _ = w;
    /// ```
    pub fn hset(
        key: impl ToRedisArgs,
        field: impl ToRedisArgs,
        value: impl ToRedisArgs,
    ) -> RedisWrite {
        RedisWrite(WriteKind::HSet {
            key: one(key),
            field: field.to_redis_args(),
            value: value.to_redis_args(),
        })
    }

    /// Your script with its `KEYS` and `ARGV`.
    ///
    /// ```
    /// use zklock_core::fence::{FencedScript, RedisWrite};
    /// let incr = FencedScript::new("return redis.call('INCRBY', KEYS[1], ARGV[1])");
    /// let w = RedisWrite::script(&incr, &["visits"], &[3]);
    /// # let _ = w;
    /// ```
    pub fn script<K: ToRedisArgs, A: ToRedisArgs>(
        script: &FencedScript,
        keys: &[K],
        args: &[A],
    ) -> RedisWrite {
        RedisWrite(WriteKind::Script {
            script: script.clone(),
            keys: keys.iter().flat_map(|k| k.to_redis_args()).collect(),
            args: args.iter().flat_map(|a| a.to_redis_args()).collect(),
        })
    }
}

/// A key as one argument (a key that is several arguments is joined).
fn one(key: impl ToRedisArgs) -> Vec<u8> {
    key.to_redis_args().concat()
}

fn single(what: &str, arg: Vec<Vec<u8>>) -> Result<Vec<u8>, FenceError> {
    match <[Vec<u8>; 1]>::try_from(arg) {
        Ok([arg]) => Ok(arg),
        Err(arg) => Err(FenceError::Invalid(format!(
            "the {what} of a fenced Redis write is {} arguments; give one (a string, bytes or a number)",
            arg.len()
        ))),
    }
}

impl RedisFence<MultiplexedConnection> {
    /// A fence on `conn` with the default key prefix.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = zklock_core::redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let fence = zklock_core::fence::RedisFence::new(client.get_multiplexed_async_connection().await?);
    /// # let _ = fence; Ok(()) }
    /// ```
    pub fn new(conn: MultiplexedConnection) -> Self {
        RedisFence::on(conn)
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> RedisFence<C> {
    /// A fence on any async Redis connection that can be cloned (a `ConnectionManager`, ...).
    ///
    /// ```no_run
    /// # async fn run(client: zklock_core::redis::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let conn = client.get_multiplexed_async_connection().await?;
    /// let fence = zklock_core::fence::RedisFence::on(conn);
    /// # let _ = fence; Ok(()) }
    /// ```
    pub fn on(conn: C) -> Self {
        RedisFence {
            conn,
            prefix: DEFAULT_PREFIX.to_string(),
            set: Arc::new(Script::new(&format!("{CHECK}{SET}"))),
            hset: Arc::new(Script::new(&format!("{CHECK}{HSET}"))),
        }
    }

    /// Keeps the tokens under `prefix + resource` instead (e.g. with a hash tag for Redis
    /// Cluster).
    ///
    /// ```no_run
    /// # fn run(conn: zklock_core::redis::aio::MultiplexedConnection) {
    /// let fence = zklock_core::fence::RedisFence::new(conn).with_prefix("shop:fence:");
    /// assert_eq!(fence.key_of("sku_7"), "shop:fence:sku_7");
    /// # }
    /// ```
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The key holding the last accepted token of `resource`.
    ///
    /// ```no_run
    /// # fn run(conn: zklock_core::redis::aio::MultiplexedConnection) {
    /// let fence = zklock_core::fence::RedisFence::new(conn);
    /// assert_eq!(fence.key_of("sku_7"), "zklock:accepted:sku_7");
    /// # }
    /// ```
    pub fn key_of(&self, resource: &str) -> String {
        format!("{}{resource}", self.prefix)
    }

    async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        write: RedisWrite,
    ) -> Result<Outcome<Value>, FenceError> {
        check_write(resource, token)?;
        let fence_key = self.key_of(resource);
        let token_arg = token.to_sortable_string();
        let reply: ::redis::RedisResult<Value> = match write.0 {
            WriteKind::Set { key, value } => {
                let value = single("value", value)?;
                let mut call = self.set.prepare_invoke();
                call.key(&fence_key).key(key).arg(&token_arg).arg(value);
                call.invoke_async(&mut self.conn.clone()).await
            }
            WriteKind::HSet { key, field, value } => {
                let field = single("field", field)?;
                let value = single("value", value)?;
                let mut call = self.hset.prepare_invoke();
                call.key(&fence_key)
                    .key(key)
                    .arg(&token_arg)
                    .arg(field)
                    .arg(value);
                call.invoke_async(&mut self.conn.clone()).await
            }
            WriteKind::Script { script, keys, args } => {
                let mut call = script.script.prepare_invoke();
                call.key(&fence_key).arg(&token_arg);
                for k in keys {
                    call.key(k);
                }
                for a in args {
                    call.arg(a);
                }
                call.invoke_async(&mut self.conn.clone()).await
            }
        };
        let reply = reply.map_err(|e| {
            if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::CrossSlot) {
                FenceError::Invalid(format!(
                    "the fence's token key {fence_key} and the write's keys are in different \
                     Redis Cluster slots (nothing was written): give the fence a prefix with \
                     your keys' hash tag, e.g. .with_prefix(\"zklock:accepted:{{sku_7}}\") for \
                     stock:{{sku_7}}"
                ))
            } else {
                FenceError::from(e)
            }
        })?;
        outcome(reply)
    }
}

/// `{1, reply}` (or `{1}` for a nil reply) when applied, `{0, last}` when refused.
fn outcome(reply: Value) -> Result<Outcome<Value>, FenceError> {
    let unexpected = |reply: &Value| FenceError::Encoding {
        found: format!("{reply:?}"),
        expected: "the fence script's reply {1, reply} or {0, last token}",
    };
    let Value::Array(mut parts) = reply else {
        return Err(unexpected(&reply));
    };
    match parts.first() {
        Some(Value::Int(1)) => Ok(Outcome::Accepted(if parts.len() > 1 {
            parts.swap_remove(1)
        } else {
            Value::Nil
        })),
        Some(Value::Int(0)) => match parts.get(1) {
            Some(Value::BulkString(last)) => {
                let last = std::str::from_utf8(last).unwrap_or_default();
                Ok(Outcome::Stale {
                    last: FencingToken::parse_sortable(last)?,
                })
            }
            _ => Err(unexpected(&Value::Array(parts))),
        },
        _ => Err(unexpected(&Value::Array(parts))),
    }
}

impl<C: ConnectionLike + Clone + Send + Sync> Fence for RedisFence<C> {
    type Write = RedisWrite;
    /// What the write answered: `SET`'s status, `HSET`'s count, your script's reply.
    type Applied = Value;

    fn fenced_write(
        &self,
        resource: &str,
        token: FencingToken,
        write: RedisWrite,
    ) -> impl Future<Output = Result<Outcome<Value>, FenceError>> + Send {
        self.write(resource, token, write)
    }

    fn last_token(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<FencingToken>, FenceError>> + Send {
        let key = self.key_of(resource);
        let mut conn = self.conn.clone();
        async move {
            let last: Option<String> = ::redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
            match last {
                Some(s) if s.len() == SORTABLE_STRING_LEN => {
                    Ok(Some(FencingToken::parse_sortable(&s)?))
                }
                Some(s) => Err(FenceError::Encoding {
                    found: format!("{s:?} in {key}"),
                    expected: "30 decimal digits (FencingToken::to_sortable_string)",
                }),
                None => Ok(None),
            }
        }
    }
}
