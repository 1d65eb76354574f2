//! The fencing token: what a store checks to refuse a stale holder's writes.

use std::fmt;

/// A number that strictly increases across successive holders of one key.
///
/// It is the czxid of the holder's contender node (the zxid of the transaction that created
/// it), extended by a local counter when a process hands the lock from task to task without a
/// new node. Pass it to the store you protect and have the store refuse writes that carry an
/// older token than the last it accepted: a holder that was paused past its session timeout
/// then cannot overwrite what the next holder wrote.
///
/// Tokens order by `(zxid, local)`; [`as_u128`](Self::as_u128) packs them into one number.
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
    zxid: i64,
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
    pub const NONE: FencingToken = FencingToken { zxid: 0, local: 0 };

    /// Whether this is no token at all ([`NONE`](Self::NONE), or a local handoff of none):
    /// the hold's manager issues none. Every backend's tokens start above zero.
    ///
    /// ```
    /// assert!(zklock_core::FencingToken::new(0, 3).is_none());
    /// assert!(!zklock_core::FencingToken::new(9, 0).is_none());
    /// ```
    pub fn is_none(&self) -> bool {
        self.zxid == 0
    }

    /// Makes a token from a node's czxid and a local handoff counter.
    ///
    /// ```
    /// let t = zklock_core::FencingToken::new(42, 0);
    /// assert_eq!(t.zxid(), 42);
    /// ```
    pub fn new(zxid: i64, local: u32) -> FencingToken {
        FencingToken { zxid, local }
    }

    /// The czxid of the contender node behind the hold.
    ///
    /// ```
    /// assert_eq!(zklock_core::FencingToken::new(7, 2).zxid(), 7);
    /// ```
    pub fn zxid(&self) -> i64 {
        self.zxid
    }

    /// How many local handoffs happened on the same node before this hold.
    ///
    /// ```
    /// assert_eq!(zklock_core::FencingToken::new(7, 2).local(), 2);
    /// ```
    pub fn local(&self) -> u32 {
        self.local
    }

    /// The token as one unsigned number, ordered as the token (`zxid << 32 | local`).
    ///
    /// ```
    /// use zklock_core::FencingToken;
    /// assert!(FencingToken::new(7, 9).as_u128() < FencingToken::new(8, 0).as_u128());
    /// ```
    pub fn as_u128(&self) -> u128 {
        ((self.zxid as u64 as u128) << 32) | self.local as u128
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.local == 0 {
            write!(f, "{}", self.zxid)
        } else {
            write!(f, "{}.{}", self.zxid, self.local)
        }
    }
}
