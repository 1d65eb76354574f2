//! Fencing that the store enforces: writes that carry a lock's [`FencingToken`] and are applied
//! only if no newer token was accepted for the same resource.
//!
//! A lock alone cannot stop a holder that was paused (a GC pause, a frozen VM, SIGSTOP) past
//! its session or lease: the next holder gets in, and when the paused one wakes up it still
//! believes it holds the lock and writes what it computed from a stale read. The token tells
//! them apart: every holder of one lock gets a larger token than the holders before it, so the
//! store keeps the last token it accepted for the resource and refuses an older one.
//!
//! # The rule
//!
//! For each resource name the store keeps the last token it accepted. A write with token `t`
//! is applied, and `t` recorded, if and only if no token greater than `t` was accepted before
//! (`t >= last`, in [`FencingToken`]'s order: by zxid, then by local handoff count). Equal
//! is accepted: a holder may write many times with its own token. An older token gets
//! [`Outcome::Stale`] with the newest token the store had, and nothing of the write is applied.
//! The check and the write are one atomic step on the store.
//!
//! # One resource, one lock
//!
//! Tokens order the holders of *one* lock. Tokens of two different locks, or of the same key
//! on two backends (a ZooKeeper czxid against a Redis counter), are unrelated numbers:
//! comparing them fences nothing and may refuse every write of one side. Use one resource
//! name per lock, and fence it only with that lock's tokens.
//! [`LockGuard::fenced`](crate::LockGuard::fenced) and [`current`] make that the default: their resource name is
//! the lock's own path (`LockManager::path_of(key)`), so two locks never share a resource.
//!
//! # Stores
//!
//! | store | type | what it fences | feature |
//! | --- | --- | --- | --- |
//! | in memory (for tests) | [`MemoryFence`] | a value per resource | |
//! | etcd | `EtcdFence` | your puts, deletes and other operations, in one transaction | `etcd` |
//! | PostgreSQL | `PgFence` | your statement, in one statement or in your transaction; SQL text for sqlx | `postgres` |
//! | Redis | `RedisFence` | `SET`, `HSET`, or your Lua script, in one script | `redis` |
//! | ZooKeeper | [`ZkFence`] | your multi (create, set, delete, check) | |
//!
//! Each keeps the token in an encoding the store compares in the token's order
//! ([`FencingToken::to_sortable_bytes`], [`FencingToken::to_sortable_string`]).
//!
//! # Examples
//!
//! With a guard, the token and the resource come from the hold:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use zklock_core::fence::{MemoryFence, Outcome};
//! use zklock_core::LockManager;
//!
//! let manager = LockManager::in_memory();
//! let stock = MemoryFence::new();
//!
//! let guard = manager.lock("sku_7").await?;
//! assert_eq!(guard.fenced(&stock).write(9).await?, Outcome::Accepted(()));
//! let resource = manager.path_of("sku_7")?;
//! assert_eq!(stock.value(&resource), Some(9));
//! # Ok(()) }
//! ```
//!
//! Inside `with_lock` or `#[distributed_lock]`, [`current`] gives the same writer:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use zklock_core::fence::{self, MemoryFence};
//!
//! let manager = zklock_core::LockManager::in_memory();
//! let stock = MemoryFence::new();
//! let outcome = manager
//!     .with_lock("sku_7", async {
//!         let writer = fence::current(&stock).expect("inside with_lock");
//!         writer.write(41).await
//!     })
//!     .await??;
//! assert!(outcome.is_accepted());
//! # Ok(()) }
//! ```
//!
//! A stale token is refused:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), zklock_core::fence::FenceError> {
//! use zklock_core::fence::{Fence, MemoryFence, Outcome};
//! use zklock_core::FencingToken;
//!
//! let store = MemoryFence::new();
//! let (paused, next) = (FencingToken::new(100, 0), FencingToken::new(107, 0));
//! store.fenced_write("sku_7", next, "sold by the next holder").await?;
//! let late = store.fenced_write("sku_7", paused, "oversold").await?;
//! assert_eq!(late, Outcome::Stale { last: next });
//! assert_eq!(store.value("sku_7"), Some("sold by the next holder"));
//! # Ok(()) }
//! ```

use std::future::Future;

use crate::types::token::FencingToken;

mod encoding;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod memory;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;
mod writer;
#[cfg(feature = "zookeeper")]
mod zookeeper;

#[cfg(feature = "etcd")]
pub use self::etcd::{EtcdFence, EtcdWrite};
#[cfg(feature = "mysql")]
pub use self::mysql::{MySqlFence, MySqlFenceOn, MySqlWrite};
#[cfg(feature = "postgres")]
pub use self::postgres::{PgFence, PgFenceOn, PgWrite, ACCEPTED};
#[cfg(feature = "redis")]
pub use self::redis::{FencedScript, RedisFence, RedisWrite};
pub use encoding::{SORTABLE_BYTES_LEN, SORTABLE_STRING_LEN};
pub use error::FenceError;
pub use memory::MemoryFence;
pub use writer::{current, Fenced};
#[cfg(feature = "zookeeper")]
pub use zookeeper::{ZkFence, ZkWrite};

/// What a fenced write did.
///
/// ```
/// use zklock_core::fence::Outcome;
/// use zklock_core::FencingToken;
///
/// let refused: Outcome<u64> = Outcome::Stale { last: FencingToken::new(9, 0) };
/// assert!(!refused.is_accepted());
/// assert_eq!(Outcome::Accepted(3u64).accepted(), Some(3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a stale write was refused: check the outcome"]
pub enum Outcome<T = ()> {
    /// The token was not older than the last accepted one: the write was applied, with what
    /// the store answered (rows changed, the script's reply, ...), and the token recorded.
    Accepted(T),
    /// The token was older than `last`, a token the store had accepted for the resource:
    /// nothing was written. The holder lost its lock meanwhile; stop, and do not retry the
    /// same write with the same token.
    Stale {
        /// The newest token the store had for the resource when it refused.
        last: FencingToken,
    },
}

impl<T> Outcome<T> {
    /// Whether the write was applied.
    ///
    /// ```
    /// assert!(zklock_core::fence::Outcome::Accepted(()).is_accepted());
    /// ```
    pub fn is_accepted(&self) -> bool {
        matches!(self, Outcome::Accepted(_))
    }

    /// What the store answered to an applied write, `None` when it was refused.
    ///
    /// ```
    /// use zklock_core::fence::Outcome;
    /// let stale: Outcome<u64> = Outcome::Stale { last: zklock_core::FencingToken::new(1, 0) };
    /// assert_eq!(stale.accepted(), None);
    /// ```
    pub fn accepted(self) -> Option<T> {
        match self {
            Outcome::Accepted(t) => Some(t),
            Outcome::Stale { .. } => None,
        }
    }

    /// The outcome with `f` applied to what an accepted write gave.
    ///
    /// ```
    /// use zklock_core::fence::Outcome;
    /// assert_eq!(Outcome::Accepted(2u64).map(|rows| rows > 0), Outcome::Accepted(true));
    /// ```
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Accepted(t) => Outcome::Accepted(f(t)),
            Outcome::Stale { last } => Outcome::Stale { last },
        }
    }
}

/// A store that applies a write only if its fencing token is not older than the last token it
/// accepted for the resource (see the [module docs](self) for the rule), atomically.
///
/// Implemented by [`MemoryFence`], `EtcdFence`, `PgFenceOn` (PostgreSQL), `RedisFence` and
/// [`ZkFence`]; implement it for your own store with the same rule. Call it through a
/// [`Fenced`] writer ([`LockGuard::fenced`](crate::LockGuard::fenced), [`current`]) so that the
/// token and resource are the lock's own.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), zklock_core::fence::FenceError> {
/// use zklock_core::fence::{Fence, MemoryFence};
/// use zklock_core::FencingToken;
///
/// let store = MemoryFence::new();
/// let t = FencingToken::new(5, 0);
/// assert!(store.fenced_write("r", t, 1).await?.is_accepted());
/// assert!(store.fenced_write("r", t, 2).await?.is_accepted()); // the same holder again
/// assert_eq!(store.last_token("r").await?, Some(t));
/// # Ok(()) }
/// ```
pub trait Fence: Sync {
    /// One write (a value, a statement, operations), applied only if the token passes.
    type Write: Send;
    /// What the store answers to an applied write.
    type Applied: Send;

    /// Applies `write` if `token` is not older than the last token accepted for `resource`,
    /// and records `token`; otherwise applies nothing and says which token was newer.
    ///
    /// # Errors
    /// [`FenceError`] when the store fails or the arguments are refused (an empty resource,
    /// [`FencingToken::NONE`]: [`FenceError::NoToken`]); the write's effect is then as the
    /// store's error says (none, for a refused argument).
    fn fenced_write(
        &self,
        resource: &str,
        token: FencingToken,
        write: Self::Write,
    ) -> impl Future<Output = Result<Outcome<Self::Applied>, FenceError>> + Send;

    /// The last token accepted for `resource`, `None` before the first write.
    ///
    /// # Errors
    /// [`FenceError`] when the store fails or holds something that is no token.
    fn last_token(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<FencingToken>, FenceError>> + Send;
}

/// Refuses a table name that is no plain SQL identifier (letters, digits and `_`, not starting
/// with a digit, each part at most `max_part` long), optionally qualified once (`qualified`
/// says how, in the error).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn check_table_name(
    table: &str,
    max_part: usize,
    qualified: &str,
) -> Result<(), FenceError> {
    let ok = |part: &str| {
        !part.is_empty()
            && part.len() <= max_part
            && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !part.as_bytes()[0].is_ascii_digit()
    };
    let parts: Vec<&str> = table.split('.').collect();
    if parts.len() > 2 || !parts.iter().all(|p| ok(p)) {
        return Err(FenceError::Invalid(format!(
            "{table:?} is no plain SQL table name; use letters, digits and _ (optionally {qualified})"
        )));
    }
    Ok(())
}

/// Refuses what no store may be asked to write: an empty resource name (every store would
/// accept it, and it names nothing), and no token at all ([`FencingToken::NONE`], a hold of a
/// manager without tokens: below every token, a first write would take it).
pub(crate) fn check_write(resource: &str, token: FencingToken) -> Result<(), FenceError> {
    if resource.is_empty() {
        return Err(FenceError::Invalid(
            "the resource name of a fenced write is empty; name what the lock protects (a guard's fenced() uses the lock's path)".into(),
        ));
    }
    if token.is_none() {
        return Err(FenceError::NoToken {
            resource: resource.to_string(),
        });
    }
    Ok(())
}
