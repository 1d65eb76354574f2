//! The fencing token: what a store checks to refuse a stale holder's writes.

use std::fmt;

/// A number that strictly increases across successive holders of one key.
///
/// It has two parts. The first, [`grant`](Self::grant), is what the store handed out with the
/// grant to this process: on ZooKeeper the czxid of the holder's contender node (the zxid of
/// the transaction that created it); on etcd the create revision of the holder's key; on Redis
/// and PostgreSQL the key's counter, raised to the server's clock in microseconds at each
/// grant. The second, [`local`](Self::local), counts
/// the handoffs from task to task within the process that followed that grant without asking
/// the store again. Pass the token to the store you protect and have the store refuse writes
/// that carry an older token than the last it accepted: a holder that was paused past its
/// session or lease then cannot overwrite what the next holder wrote.
///
/// Tokens order by `(grant, local)`; [`as_u128`](Self::as_u128) packs them into one number.
///
/// What it promises: across holders that exclude each other (mutex holders, writers, a writer
/// and the readers before or after it), a later holder's token is larger. Readers that share
/// the lock may hold in any token order among themselves. A read hold made by
/// [`downgrade`](crate::LockGuard::downgrade) continues the write hold: its token is the write
/// token extended by one, so it is above every holder before the writer and below every
/// writer after it.
///
/// # Examples
///
/// ```
/// use zklock_core::FencingToken;
///
/// let first = FencingToken::new(0x1_0000_0005, 0);
/// let handed_on = FencingToken::new(0x1_0000_0005, 1);
/// let next_node = FencingToken::new(0x1_0000_0009, 0);
/// assert!(first < handed_on && handed_on < next_node);
/// assert_eq!(first.to_string(), "4294967301");
/// assert_eq!(handed_on.to_string(), "4294967301.1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken {
    grant: i64,
    local: u32,
}

impl FencingToken {
    /// The token of a hold that has none: what every hold of a manager built with
    /// [`fencing_tokens(false)`](crate::Builder::fencing_tokens) reports. It is below every
    /// token, and a fenced write refuses to carry it.
    ///
    /// ```
    /// use zklock_core::FencingToken;
    /// assert!(FencingToken::NONE.is_none());
    /// assert!(FencingToken::NONE < FencingToken::new(1, 0));
    /// assert!(!FencingToken::new(1, 0).is_none());
    /// ```
    pub const NONE: FencingToken = FencingToken { grant: 0, local: 0 };

    /// Whether this is no token at all ([`NONE`](Self::NONE), or a local handoff of none):
    /// the hold's manager issues none. Every backend's tokens start above zero.
    ///
    /// ```
    /// assert!(zklock_core::FencingToken::new(0, 3).is_none());
    /// assert!(!zklock_core::FencingToken::new(9, 0).is_none());
    /// ```
    pub fn is_none(&self) -> bool {
        self.grant == 0
    }

    /// Makes a token from the store's grant and a local handoff counter.
    ///
    /// ```
    /// let t = zklock_core::FencingToken::new(42, 0);
    /// assert_eq!(t.grant(), 42);
    /// ```
    pub fn new(grant: i64, local: u32) -> FencingToken {
        FencingToken { grant, local }
    }

    /// The part the store handed out with the grant behind this hold: the contender node's
    /// czxid on ZooKeeper, the key's counter (at least the server's clock in µs) on Redis and
    /// PostgreSQL, a counter on the in-memory backend. It orders before
    /// [`local`](Self::local).
    ///
    /// ```
    /// use zklock_core::FencingToken;
    /// // A handoff within the process keeps the grant and counts on.
    /// let granted = FencingToken::new(7, 0);
    /// let handed_on = FencingToken::new(7, 2);
    /// assert_eq!(granted.grant(), handed_on.grant());
    /// assert!(granted < handed_on);
    /// ```
    pub fn grant(&self) -> i64 {
        self.grant
    }

    /// How many local handoffs followed the same grant before this hold.
    ///
    /// ```
    /// assert_eq!(zklock_core::FencingToken::new(7, 2).local(), 2);
    /// ```
    pub fn local(&self) -> u32 {
        self.local
    }

    /// The token as one unsigned number, ordered as the token (`grant << 32 | local`).
    ///
    /// ```
    /// use zklock_core::FencingToken;
    /// assert!(FencingToken::new(7, 9).as_u128() < FencingToken::new(8, 0).as_u128());
    /// ```
    pub fn as_u128(&self) -> u128 {
        ((self.grant as u64 as u128) << 32) | self.local as u128
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.local == 0 {
            write!(f, "{}", self.grant)
        } else {
            write!(f, "{}.{}", self.grant, self.local)
        }
    }
}
