//! The Redis backend's [`Breaks`]: the count of connection breaks (and failovers) that holds
//! are confirmed against, and on Redis Cluster which slots each one ended the holds of.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

pub(crate) use super::super::wire::keys::SLOTS;
use crate::types::loss::LossReason;

/// The epoch of a backend's connections: bumped whenever one of them (a command connection, a
/// pub/sub connection of the hub) breaks or is given up as silent. The server may have
/// restarted then and lost every key (or a proxy may have cut us off while someone else got
/// in): a hold is held only while no break that reaches it came after the epoch it was granted
/// in (its grant's request sent in it, and answered before the next such break); such a break
/// is a loss of every hold it reaches granted before.
///
/// Off Cluster a break reaches every hold. On Cluster a break reaches the holds in the slots
/// of the node whose connection broke, and a slot that changes owner in the map (a failover, a
/// migration) is a failover of the holds in it: a blip of one primary's connection costs the
/// holds on that primary, not every hold of the process. A node's slots are those of the map
/// as last learned, so a hold whose key a migration moved to another node before the client
/// heard of it (no `-ASK` or `-MOVED` yet) is reached by that node's break only once its next
/// renewal (at most lease/3 away) is redirected: with lease/3 below the Cluster's failover
/// time (`cluster-node-timeout` and the election), that comes before a replica of that node
/// can take over.
///
/// A failover (a Sentinel announced a new primary, the server turned replica, a slot's owner
/// changed) is a break too, remembered as such so that the holds it ends say why
/// ([`LossReason::Failover`]).
#[derive(Clone)]
pub(crate) struct Breaks(Arc<Inner>);

struct Inner {
    /// The current epoch; bumped by every break, wherever it reaches.
    epoch: watch::Sender<u64>,
    /// The last epoch whose break reached every hold.
    all: AtomicU64,
    /// The last epoch whose failover reached every hold.
    all_failover: AtomicU64,
    /// On Cluster, per slot: the last epoch whose break reached the holds in it, and the last
    /// whose failover did.
    slots: Option<Box<[(AtomicU64, AtomicU64)]>>,
}

impl Breaks {
    /// The breaks of one server (or the Sentinels' primary): every break reaches every hold.
    pub(crate) fn new() -> Breaks {
        Breaks::with_slots(false)
    }

    /// The breaks of a Redis Cluster: a break may reach only some slots' holds.
    pub(crate) fn of_cluster() -> Breaks {
        Breaks::with_slots(true)
    }

    fn with_slots(cluster: bool) -> Breaks {
        Breaks(Arc::new(Inner {
            epoch: watch::channel(0).0,
            all: AtomicU64::new(0),
            all_failover: AtomicU64::new(0),
            slots: cluster.then(|| {
                (0..SLOTS)
                    .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                    .collect()
            }),
        }))
    }

    /// The current epoch: read it before sending a request whose answer confirms a hold.
    pub(crate) fn epoch(&self) -> u64 {
        *self.0.epoch.borrow()
    }

    /// A connection broke: every hold it reaches (`slots`; `None`: every hold) confirmed
    /// before is unconfirmed from now on.
    pub(crate) fn broke(&self, slots: Option<&[u16]>) {
        self.mark(slots, false);
    }

    /// The primary changed (`slots`: those slots' owner; `None`: the one primary): every hold
    /// it reaches confirmed before is unconfirmed from now on, lost to a failover.
    pub(crate) fn failed_over(&self, slots: Option<&[u16]>) {
        self.mark(slots, true);
    }

    /// Bumps the epoch and marks the holds reached with it, before anyone reads the new epoch
    /// (the marks are made while the epoch is locked for writing).
    fn mark(&self, slots: Option<&[u16]>, failover: bool) {
        self.0.epoch.send_modify(|n| {
            *n += 1;
            let epoch = *n;
            match (slots, &self.0.slots) {
                (Some(slots), Some(table)) => {
                    for &slot in slots {
                        if let Some((broke, failed_over)) = table.get(usize::from(slot)) {
                            broke.fetch_max(epoch, Ordering::SeqCst);
                            if failover {
                                failed_over.fetch_max(epoch, Ordering::SeqCst);
                            }
                        }
                    }
                }
                _ => {
                    self.0.all.fetch_max(epoch, Ordering::SeqCst);
                    if failover {
                        self.0.all_failover.fetch_max(epoch, Ordering::SeqCst);
                    }
                }
            }
        });
    }

    /// Whether a break reached a hold in `slot` (`None`: off Cluster) after epoch `since`.
    pub(crate) fn ended_since(&self, since: u64, slot: Option<u16>) -> bool {
        self.0.all.load(Ordering::SeqCst) > since
            || self
                .slot(slot)
                .is_some_and(|(broke, _)| broke.load(Ordering::SeqCst) > since)
    }

    /// Why a hold in `slot` confirmed in epoch `since` is no longer held, once
    /// [`ended_since`](Self::ended_since) says so: a failover came since, or only a break.
    pub(crate) fn why(&self, since: u64, slot: Option<u16>) -> LossReason {
        let failover = self.0.all_failover.load(Ordering::SeqCst) > since
            || self
                .slot(slot)
                .is_some_and(|(_, failed_over)| failed_over.load(Ordering::SeqCst) > since);
        if failover {
            LossReason::Failover
        } else {
            LossReason::Disconnected
        }
    }

    fn slot(&self, slot: Option<u16>) -> Option<&(AtomicU64, AtomicU64)> {
        self.0.slots.as_ref()?.get(usize::from(slot?))
    }

    /// Wakes on every break.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.epoch.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_cluster_every_break_reaches_every_hold() {
        let breaks = Breaks::new();
        let since = breaks.epoch();
        breaks.broke(Some(&[7]));
        assert!(breaks.ended_since(since, None));
        assert_eq!(breaks.why(since, None), LossReason::Disconnected);
        let since = breaks.epoch();
        assert!(!breaks.ended_since(since, None));
        breaks.failed_over(None);
        assert_eq!(breaks.why(since, None), LossReason::Failover);
    }

    #[test]
    fn on_cluster_a_break_reaches_the_slots_it_names() {
        let breaks = Breaks::of_cluster();
        let since = breaks.epoch();
        breaks.broke(Some(&[1, 2]));
        assert!(breaks.ended_since(since, Some(1)));
        assert!(breaks.ended_since(since, Some(2)));
        assert!(!breaks.ended_since(since, Some(3)), "another node's slot");
        // A hold granted after the break is not reached by it.
        let later = breaks.epoch();
        assert!(!breaks.ended_since(later, Some(1)));
        breaks.failed_over(Some(&[3]));
        assert_eq!(breaks.why(since, Some(3)), LossReason::Failover);
        assert_eq!(breaks.why(since, Some(1)), LossReason::Disconnected);
        // A failover of the whole deployment reaches every slot.
        let since = breaks.epoch();
        breaks.failed_over(None);
        assert!(breaks.ended_since(since, Some(9)));
        assert_eq!(breaks.why(since, Some(9)), LossReason::Failover);
    }
}
