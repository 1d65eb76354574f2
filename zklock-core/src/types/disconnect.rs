//! What a disconnection from the server means for the holds a manager has.

use std::time::Duration;

/// What a disconnection from ZooKeeper means for the locks a manager holds.
///
/// While disconnected, the client cannot know whether the server has expired its session and
/// let another process take its locks. Curator's advice is to treat a suspended connection as
/// a lost lock; that is the default here.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use zklock_core::DisconnectPolicy;
///
/// let strict = DisconnectPolicy::Immediate;
/// let lenient = DisconnectPolicy::Grace(Duration::from_secs(2));
/// assert_ne!(strict, lenient);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DisconnectPolicy {
    /// A hold is lost as soon as the connection is lost (Curator's SUSPENDED = lost).
    Immediate,
    /// A hold survives a disconnection shorter than this; keep it well under the session timeout.
    Grace(Duration),
    /// A hold is lost only when the session expires (unsafe: another holder may already run).
    UntilExpired,
}
