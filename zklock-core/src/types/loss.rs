//! Why a hold ended, and how a layer above the backend watches for it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Why a hold is no longer certain.
///
/// # Examples
///
/// ```
/// use zklock_core::LossReason;
/// assert_eq!(LossReason::SessionExpired.to_string(), "the server session expired");
/// assert!(LossReason::Disconnected.to_string().contains("disconnect policy"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The session expired: the server deleted the node, and another process may hold the lock.
    SessionExpired,
    /// The connection was lost for longer than the manager's [`DisconnectPolicy`](crate::DisconnectPolicy) allows
    /// (ZooKeeper); a connection of the manager broke, the command connection or the pub/sub
    /// one (Redis: the server may have restarted and lost every key, so every hold granted
    /// before the break is lost at once, before anyone else can be granted); the holding
    /// session's connection broke or its check failed (PostgreSQL).
    Disconnected,
    /// The contender node (ZooKeeper) or the lease (Redis) was deleted by someone else: an
    /// operator, a revocation, a Redis failover to a replica that had not received it, an
    /// eviction. On Redis it shows at the next renewal (within lease/3), and before any local
    /// handoff or linger re-take, which asks the server first.
    NodeDeleted,
    /// No renewal of the lease was confirmed in time, so the lease could have run out and
    /// another process may hold the lock (Redis: the server was slow, paused or unreachable, or
    /// this process was). Reported when the lease could have run out, measured from the send
    /// time of the last confirmed renewal, before the server lets anyone else in.
    LeaseExpired,
    /// The holder was asked to give up the lock (Curator's `__REVOKE__`).
    Revoked,
    /// The manager was closed.
    Closed,
    /// The hold ran past the limit its job set ([`Job::at_most`](crate::Job::at_most)).
    HoldLimit,
    /// The store failed over to another server (Redis under Sentinel: a Sentinel announced a
    /// new primary, or the server the hold lived on turned replica). Replication is
    /// asynchronous, so the new primary may not have the hold: it is lost at once, before
    /// this process could confirm it there. Another process may be granted the lock on the
    /// new primary; its token is larger (see the guide on failovers).
    Failover,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::SessionExpired => "the server session expired",
            LossReason::Disconnected => {
                "the connection to the lock server broke (for longer than the disconnect policy allows, where the backend has one)"
            }
            LossReason::NodeDeleted => "the lock node or lease was deleted by someone else",
            LossReason::LeaseExpired => {
                "the lease could have run out before a renewal was confirmed"
            }
            LossReason::Revoked => "the lock was revoked",
            LossReason::Closed => "the lock manager was closed",
            LossReason::HoldLimit => "the hold ran past its job's at_most limit",
            LossReason::Failover => {
                "the store failed over to a new primary, which may not have had the hold"
            }
        })
    }
}

/// How a hold's loss shows, apart from the hold itself (watching it must not keep a hold, and so
/// its node or lease, alive). Each backend gives its own.
pub(crate) trait Loss: Send + Sync + 'static {
    /// Why the hold was lost, or `None` while it is held.
    fn reason(&self) -> Option<LossReason>;
    /// Completes when the hold is lost.
    fn lost(&self) -> Pin<Box<dyn Future<Output = LossReason> + Send + 'static>>;
}

/// A shared [`Loss`].
pub(crate) type LossSignal = Arc<dyn Loss>;
