//! The Lua scripts of the Redis backend: each step of the protocol is one script, so each is
//! atomic on the server. See [`super::keys`] for the keys they use.
//!
//! Every acquire is idempotent for its holder id: a retry of an attempt whose reply was lost
//! finds the hold it made and keeps it (with a fresh token), instead of waiting for itself.
//! Lease ends in the sorted set are server times in ms (`TIME`); expired members are pruned by
//! every script that counts them.
//!
//! Tokens come from the lock's fence counter: each grant's tokens are the server's time in
//! microseconds (`TIME`), or the counter's last value + 1 if that is larger (the clock went
//! back, or two grants in one µs), written with one `SET … GET` (Redis ≥ 6.2) that also reads
//! the value before. So if the counter is ever lost (a restart without persistence, a
//! failover to a replica that had not received it, an eviction), the next token still exceeds
//! every token handed out before, as long as the server's clock has not gone back; and while
//! it is kept, tokens increase whatever the clock does.
//!
//! A backend without tokens ([`Builder::fencing_tokens`](crate::Builder::fencing_tokens) off)
//! sends a mutex's first attempt as a bare `SET NX PX` instead of [`ACQUIRE_MUTEX`]: granted,
//! its hold has token 0 (none) and the fence is untouched; refused, the script runs as usual
//! (and queues the waiter). The key is free only while nobody waits (see [`ACQUIRE_MUTEX`]),
//! so the bare `SET` takes nothing from a queue.

use once_cell::sync::Lazy;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ServerErrorKind, ToRedisArgs};

/// One call of a script: `EVALSHA <sha> <n> keys… args…`, written straight into one command
/// buffer (a `ScriptInvocation` keeps each key and argument in a vector of its own, then copies
/// them into the command). Loads the script when the server does not know it yet, as
/// `ScriptInvocation` does.
pub(crate) struct Call {
    script: &'static Script,
    cmd: Cmd,
}

impl Call {
    /// A call of `script` on `keys`; add its arguments with [`arg`](Self::arg).
    pub(crate) fn new(script: &'static Script, keys: &[&str]) -> Call {
        let bytes = keys.iter().map(|k| k.len() + 16).sum::<usize>() + 160;
        let mut cmd = Cmd::with_capacity(keys.len() + 10, bytes);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        Call { script, cmd }
    }

    /// Adds an argument (`ARGV[i]`); a slice adds one per element.
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Call {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call (and, if the server has not got the script, loads it and sends it
    /// again).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut MultiplexedConnection,
    ) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            other => other,
        }
    }
}

// Lua helpers. Each script's text is the helpers it calls followed by its body, so a call
// defines no function it does not use (the server runs a script's whole text on every call).

/// The server's clock, read at most once per script run (`TIME`, on first use): `now_us()` and
/// `now_ms()` give the same instant however often a script asks.
macro_rules! clock {
    () => {
        r#"
local clock_us
local function now_us()
  if not clock_us then
    local t = redis.call('TIME')
    clock_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock_us
end
local function now_ms()
  return math.floor(now_us() / 1000)
end
"#
    };
}

/// Pruning a sorted set of leases whose ends passed (needs [`clock`]'s time as `now`).
macro_rules! prune {
    () => {
        r#"
local function prune(set, now)
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
end
"#
    };
}

/// The lock's next `n` tokens: the server time in µs, or the fence's last value + 1 when that
/// is larger; one `SET … GET` (needs [`clock`]).
macro_rules! next_tokens {
    () => {
        r#"
local function next_tokens(fence, n)
  local now = now_us()
  local last = now + n - 1
  local before = tonumber(redis.call('SET', fence, string.format('%d', last), 'GET'))
  if before and before >= now then
    last = before + n
    redis.call('SET', fence, string.format('%d', last))
  end
  return last
end
"#
    };
}

/// Keeping a sorted set's own expiry at its last lease's end.
macro_rules! expire_set {
    () => {
        r#"
local function expire_set(set, now)
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', set, math.max(1, math.ceil(tonumber(last[2]) - now)))
  end
end
"#
    };
}

/// The first waiter of a mutex's queue still alive, pruning dead ones (needs [`clock`]).
macro_rules! live_head {
    () => {
        r#"
local function live_head(queue, alive)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if not head then
    return nil
  end
  local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now_ms())
  if #dead > 0 then
    redis.call('ZREM', queue, unpack(dead))
    redis.call('ZREM', alive, unpack(dead))
    head = redis.call('ZRANGE', queue, 0, 0)[1]
  end
  return head
end
"#
    };
}

/// Handing a freed mutex key to its first live waiter, or deleting it when nobody waits
/// (needs [`clock`], [`next_tokens`], [`live_head`]).
macro_rules! hand_on {
    () => {
        r#"
local function hand_on(key, queue, alive, fence, prefix, channel)
  local head = live_head(queue, alive)
  if not head then
    redis.call('DEL', key)
    return
  end
  local space = string.find(head, ' ', 1, true)
  local id = string.sub(head, space + 1)
  local ends = tonumber(redis.call('ZSCORE', alive, head))
  redis.call('SET', key, id, 'PX', math.max(1, math.floor(ends - now_ms())))
  redis.call('ZREM', queue, head)
  redis.call('ZREM', alive, head)
  local token = next_tokens(fence, 1)
  redis.call('PUBLISH', prefix .. string.sub(head, 1, space - 1),
    channel .. '\n' .. string.format('%d', token) .. '\n' .. id)
end
"#
    };
}

/// Takes a mutex (or a leader latch's key), first come first served among the processes
/// that wait.
///
/// KEYS: exclusive, fence, queue, alive. ARGV: holder id, lease ms, the waiter's queue member
/// (`<hub id> <holder id>`), waiter TTL ms (`0`: a try, which never queues), `1` if an
/// earlier attempt of this acquire queued it (else `0`: nothing to take out of the queue),
/// notify prefix. Returns `{1, token}` when granted, else `{0, ms, last token}`: the key's
/// `PTTL` and the fence's value, which a hand-over to this waiter made after this refusal
/// exceeds.
///
/// A release that finds live waiters does not free the key: it hands it to the first of them
/// (see [`RELEASE_MUTEX`]). So the key is free only while nobody waits, and a process that
/// asks while others wait is refused and joins the back of the queue (keeping its place if
/// already in it, and refreshing its liveness for one waiter TTL). An attempt that finds the
/// key already its own (a hand-over whose message it missed, a retry whose reply was lost)
/// renews it for a whole lease with a fresh token. Members whose liveness ran out are pruned
/// when the queue is looked at. Both sets expire with their newest waiter's liveness.
/// Uncontended, this is `SET NX` and the token: no queue is looked at. The key is free while
/// others wait only after a holder (or a waiter it was handed to) died and its lease ran out:
/// then whoever asks first gets it.
///
/// A refused attempt that leaves the queue holding no other member (the first waiter to
/// queue, or a try while nobody queues) tells the holder's process that someone wants the
/// lock: the queue key's name, published on the hub channel named in the holder's id
/// (` hub=<hub id>`). That is what ends a lingering hold at once (see [`OTHERS_QUEUED`]);
/// later waiters find the queue already holding someone, which the holder was told of, or
/// has seen.
pub(crate) static ACQUIRE_MUTEX: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        clock!(),
        next_tokens!(),
        r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[5] == '1' then
    redis.call('ZREM', KEYS[3], ARGV[3])
    redis.call('ZREM', KEYS[4], ARGV[3])
  end
  return {1, next_tokens(KEYS[2], 1)}
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[3])
  return {1, next_tokens(KEYS[2], 1)}
end
local alone
if ARGV[4] ~= '0' then
  local added = redis.call('ZADD', KEYS[3], 'NX', now_us(), ARGV[3])
  redis.call('ZADD', KEYS[4], now_ms() + tonumber(ARGV[4]), ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
  alone = added == 1 and redis.call('ZCARD', KEYS[3]) == 1
else
  alone = redis.call('ZCARD', KEYS[3]) == 0
end
if alone and holder then
  local hub = string.match(holder, ' hub=(%S+)')
  if hub then
    redis.call('PUBLISH', ARGV[6] .. hub, KEYS[3])
  end
end
return {0, redis.call('PTTL', KEYS[1]), tonumber(redis.call('GET', KEYS[2])) or 0}
"#
    ))
});

/// Whether a mutex's queue holds a live waiter (pruning dead ones): what a hold that may
/// linger asks once, after its process listens for the word [`ACQUIRE_MUTEX`] sends when
/// the first waiter queues. Between the two, no waiter goes unseen.
///
/// KEYS: queue, alive. Returns 1 or 0.
pub(crate) static OTHERS_QUEUED: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        clock!(),
        live_head!(),
        r#"
if live_head(KEYS[1], KEYS[2]) then
  return 1
end
return 0
"#
    ))
});

/// Releases a mutex hold, or undoes a mutex acquire (its hold, its place in the queue):
/// touches only what carries the given holder id or queue member. With nobody waiting, the
/// key is deleted. Otherwise it is handed to the first live waiter: set to that waiter's
/// holder id, with a fresh token, until the end of the waiter's liveness (the server time of
/// its last attempt plus the waiter TTL it asked for, whatever the releaser's own lease), and
/// only that process is told, on its hub's channel (`<notify prefix><hub id>`), with the
/// message `<wake channel>\n<token>\n<holder id>`. So the waiter, which counts that first
/// lease from the send time of its last attempt with its own waiter TTL, never believes it
/// longer than the server keeps it. The waiter holds the lock from there without another
/// request (its watchdog renews the short first lease to a whole one). If it has died, the
/// key is free again when its liveness ends, and the waiters behind it get in on their next
/// refresh.
///
/// KEYS: exclusive, queue, alive, fence. ARGV: holder id, queue member (`''`: none), notify
/// prefix, wake channel. Returns 1 when something was freed, else 0.
pub(crate) static RELEASE_MUTEX: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        clock!(),
        next_tokens!(),
        live_head!(),
        hand_on!(),
        r#"
local freed = 0
if ARGV[2] ~= '' and redis.call('ZREM', KEYS[2], ARGV[2]) == 1 then
  redis.call('ZREM', KEYS[3], ARGV[2])
  freed = 1
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  hand_on(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[3], ARGV[4])
  freed = 1
end
return freed
"#
    ))
});

/// Takes the exclusive key (a mutex or a writer).
///
/// KEYS: exclusive, shared, fence, intent. ARGV: holder id, lease ms, `1` when shared holders
/// (readers) exclude it too. Returns `{1, token}` when granted, else `{0, ms}`: how long until
/// the lock may be free (-1: the key has no expiry). Tokens: see the module's docs.
///
/// A writer that finds readers leaves an intent (its id, for one lease), which makes new
/// readers queue behind it; it takes its intent away when it gets in.
pub(crate) static ACQUIRE_EXCLUSIVE: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        clock!(),
        prune!(),
        next_tokens!(),
        r#"
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, next_tokens(KEYS[3], 1)}
end
if held then
  return {0, redis.call('PTTL', KEYS[1])}
end
if ARGV[3] == '1' then
  local now = now_ms()
  prune(KEYS[2], now)
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if first[2] then
    redis.call('SET', KEYS[4], ARGV[1], 'PX', ARGV[2])
    return {0, math.ceil(tonumber(first[2]) - now)}
  end
  if redis.call('GET', KEYS[4]) == ARGV[1] then
    redis.call('DEL', KEYS[4])
  end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, next_tokens(KEYS[3], 1)}
end
return {0, redis.call('PTTL', KEYS[1])}
"#
    ))
});

/// Takes a read hold: a member of the shared set, unless a writer holds or waits.
///
/// KEYS: exclusive, shared, fence, intent. ARGV: holder id, lease ms. Returns as
/// [`ACQUIRE_EXCLUSIVE`].
pub(crate) static ACQUIRE_READ: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        clock!(),
        prune!(),
        next_tokens!(),
        expire_set!(),
        r#"
local now = now_ms()
prune(KEYS[2], now)
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl ~= -2 then
    return {0, ttl}
  end
  ttl = redis.call('PTTL', KEYS[4])
  if ttl ~= -2 then
    return {0, ttl}
  end
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
expire_set(KEYS[2], now)
return {1, next_tokens(KEYS[3], 1)}
"#
    ))
});

/// Takes `n` leases of a semaphore, all or none.
///
/// KEYS: shared, fence. ARGV: lease ms, max leases, then one holder id per lease. Returns
/// `{1, last token}` (the leases get the `n` tokens up to it) or `{0, ms}` until the first
/// lease held now runs out.
pub(crate) static ACQUIRE_LEASES: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        clock!(),
        prune!(),
        next_tokens!(),
        expire_set!(),
        r#"
local now = now_ms()
prune(KEYS[1], now)
local n = #ARGV - 2
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  if redis.call('ZCARD', KEYS[1]) + n > tonumber(ARGV[2]) then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    if first[2] then
      return {0, math.ceil(tonumber(first[2]) - now)}
    end
    return {0, 0}
  end
end
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
end
expire_set(KEYS[1], now)
return {1, next_tokens(KEYS[2], n)}
"#
    ))
});

/// Renews an exclusive hold: compare and `PEXPIRE`.
///
/// KEYS: exclusive. ARGV: holder id, lease ms. Returns 1 when renewed, 0 when the key is not
/// the holder's any more.
pub(crate) static RENEW_EXCLUSIVE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#,
    )
});

/// Confirms an exclusive hold before its process relies on it again (a local handoff, a
/// linger's re-take): the key carries the holder's id and the lock's fence is not past the
/// hold's token (no grant of the lock since this hold's), and renews it.
///
/// KEYS: exclusive, fence. ARGV: holder id, lease ms, the hold's token (`0`: the hold has
/// none, granted by a bare `SET NX PX` of a backend without tokens; then only the key is
/// checked). Returns 1 when confirmed and renewed, else 0.
pub(crate) static CONFIRM_EXCLUSIVE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local fence = tonumber(redis.call('GET', KEYS[2]))
local token = tonumber(ARGV[3])
if fence and token > 0 and fence > token then
  return 0
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"#,
    )
});

/// Renews a shared hold (reader, lease) that has not run out.
///
/// KEYS: shared. ARGV: holder id, lease ms. Returns 1 or 0 as [`RENEW_EXCLUSIVE`].
pub(crate) static RENEW_SHARED: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        clock!(),
        expire_set!(),
        r#"
local now = now_ms()
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if ends and tonumber(ends) > now then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  expire_set(KEYS[1], now)
  return 1
end
return 0
"#
    ))
});

/// Releases holds, or undoes an acquire that may have taken them: deletes only what carries
/// one of the given holder ids, and tells waiters when something was freed.
///
/// KEYS: exclusive, shared, intent. ARGV: channel, then holder ids. Returns 1 when something
/// was freed, else 0.
pub(crate) static RELEASE: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r#"
local freed = 0
for i = 2, #ARGV do
  if redis.call('GET', KEYS[1]) == ARGV[i] then
    redis.call('DEL', KEYS[1])
    freed = 1
  end
  if redis.call('ZREM', KEYS[2], ARGV[i]) == 1 then
    freed = 1
  end
  if redis.call('GET', KEYS[3]) == ARGV[i] then
    redis.call('DEL', KEYS[3])
    freed = 1
  end
end
if freed == 1 then
  redis.call('PUBLISH', ARGV[1], 'free')
end
return freed
"#,
    )
});

/// Turns a write hold into a read hold in one step: no writer can get in between.
///
/// KEYS: exclusive, shared. ARGV: writer id, reader id, lease ms, channel. Returns 1, or 0
/// when the write hold is not the writer's any more.
pub(crate) static DOWNGRADE: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        clock!(),
        prune!(),
        expire_set!(),
        r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local now = now_ms()
prune(KEYS[2], now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
expire_set(KEYS[2], now)
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[4], 'free')
return 1
"#
    ))
});

/// Claims a job's run (see `Backend::claim_run`), by the server's clock.
///
/// KEYS: run. ARGV: at_least ms. Returns 1 (run: no run may start before now + at_least) or 0
/// (an earlier run's window covers now).
pub(crate) static CLAIM_RUN: Lazy<Script> = Lazy::new(|| {
    Script::new(concat!(
        clock!(),
        r#"
local now = now_ms()
local before = tonumber(redis.call('GET', KEYS[1]))
if before and before > now then return 0 end
redis.call('SET', KEYS[1], now + tonumber(ARGV[1]))
return 1
"#
    ))
});
