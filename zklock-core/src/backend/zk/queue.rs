//! The queue rules of Curator's lock recipes, apart from any request: what kind of contender
//! node each recipe makes, how nodes sort, which lower nodes block a waiter, and the window of
//! blockers a waiter remembers and watches.
//!
//! A mutex's or read/write lock's path may also hold kazoo's contenders (`<uuid hex>__lock__<seq>`
//! of its `Lock` and `WriteLock`, `__rlock__` of its `ReadLock`): they queue with Curator's by
//! sequence number, since the parent's counter numbers every child (see [`lock_contender`]).
//! Any other child there is refused ([`Refused::Unknown`]), never ignored.

use super::wire::{
    KAZOO_LOCK_NAME, KAZOO_READ_NAME, LATCH_NAME, LEASE_NAME, MUTEX_NAME, READ_NAME, WRITE_NAME,
};
use crate::types::mode::HoldMode;

/// How many of the nearest lower blockers an exclusive waiter remembers from its listing, and
/// watches: its predecessor and the node before it. The last one's deletion is its grant, with
/// no listing or check after it, when no other node sorted below them. When others did, the
/// waiter lists again as soon as the node before its predecessor goes (see
/// [`Queue::wants_listing`]): in a queue taken in order that node goes as its holder releases,
/// so the listing runs while the predecessor holds, and finds it alone in front; the
/// predecessor's deletion is then the grant. So a waiter behind a queue of any length pays two
/// watches, one listing and two events, and none of them between its predecessor's release and
/// its grant, where a window of every node ahead would pay a watch and an event per node.
const NEAREST: usize = 2;

/// How many of its lowest lower writers a reader watches at a time.
const WINDOW: usize = 8;

/// What a child of a mutex's or read/write lock's path is, told by its name, with its sequence
/// number (the server's `%010d`, which sorts them all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LockContender<'a> {
    /// Excludes every later contender: Curator's mutex (`lock-`) and writer (`__WRIT__`),
    /// kazoo's `Lock`/`WriteLock` (`__lock__`).
    Exclusive(&'a str),
    /// Waits only for lower exclusive contenders: Curator's reader (`__READ__`), kazoo's
    /// `ReadLock` (`__rlock__`).
    Shared(&'a str),
}

impl<'a> LockContender<'a> {
    /// Its sequence number, as the server wrote it: what contenders sort by.
    pub(super) fn sequence(self) -> &'a str {
        match self {
            LockContender::Exclusive(seq) | LockContender::Shared(seq) => seq,
        }
    }
}

/// The lock contender a child of a mutex's or read/write lock's path is: a name that ends in one
/// of the lock names of Curator or kazoo followed by a sequence number. `None` for anything
/// else (another recipe's node, a plain node): no rule says where such a node queues.
pub(super) fn lock_contender(node: &str) -> Option<LockContender<'_>> {
    let names = [
        (WRITE_NAME, true),
        (MUTEX_NAME, true),
        (KAZOO_LOCK_NAME, true),
        (READ_NAME, false),
        (KAZOO_READ_NAME, false),
    ];
    names.into_iter().find_map(|(name, exclusive)| {
        let seq = &node[node.rfind(name)? + name.len()..];
        match (is_sequence(seq), exclusive) {
            (false, _) => None,
            (true, true) => Some(LockContender::Exclusive(seq)),
            (true, false) => Some(LockContender::Shared(seq)),
        }
    })
}

/// Whether `text` is a sequence number as the server writes it: `%010d`, so ten digits, or a
/// minus and nine or ten digits once the counter wrapped past 2^31.
fn is_sequence(text: &str) -> bool {
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    match text.strip_prefix('-') {
        Some(rest) => (9..=10).contains(&rest.len()) && digits(rest),
        None => text.len() == 10 && digits(text),
    }
}

/// The text Curator sorts contenders by: what follows the last occurrence of the lock name
/// (`StandardLockInternalsDriver.fixForSorting`). Compared as strings, as Curator does.
pub(super) fn sort_key<'a>(node: &'a str, lock_name: &str) -> &'a str {
    match node.rfind(lock_name) {
        Some(i) => &node[i + lock_name.len()..],
        None => node,
    }
}

/// Why a listing gives no queue for our node.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// Our node is not among the children: it was deleted.
    Gone,
    /// A child that is no lock contender of Curator or kazoo (see [`lock_contender`]).
    Unknown(String),
}

/// What a hold mode means in Curator's node protocol: its nodes' names, their order, and
/// which lower nodes block a contender. A trait of this backend's own, so that the shared
/// [`HoldMode`] stays free of ZooKeeper's names.
///
/// A hold's mode names its contender node and so which nodes block it, Curator's rules:
/// - a mutex: `_c_<uuid>-lock-<seq>`; every lower node blocks;
/// - a read hold: `_c_<uuid>-__READ__<seq>`; only lower exclusive nodes block;
/// - a write hold: `_c_<uuid>-__WRIT__<seq>`; every lower node blocks;
/// - a lease of `InterProcessSemaphoreV2`: `_c_<uuid>-lease-<seq>`; counted, not queued;
/// - a participant of `LeaderLatch`: `_c_<uuid>-latch-<seq>`, the participant id as data; the
///   lowest is the leader, every lower node blocks.
pub(super) trait CuratorMode {
    /// The name Curator gives this mode's contender nodes, before the sequence number.
    fn lock_name(self) -> &'static str;
    /// Curator's sort key for a child of a path of this kind's recipe.
    fn sort_key(self, node: &str) -> &str;
    /// Whether `other` (a lower node) blocks a contender of this kind.
    fn blocked_by(self, other: &str) -> bool;
    /// Whether this kind's path is a lock's, holding lock contenders only (a mutex's or a
    /// read/write lock's).
    fn lock_path(self) -> bool;
    /// Exclusive grants prove that every lower node is gone.
    fn exclusive(self) -> bool;
}

impl CuratorMode for HoldMode {
    /// The name Curator gives this mode's contender nodes, before the sequence number.
    fn lock_name(self) -> &'static str {
        match self {
            HoldMode::Exclusive => MUTEX_NAME,
            HoldMode::Read => READ_NAME,
            HoldMode::Write => WRITE_NAME,
            HoldMode::Lease => LEASE_NAME,
            HoldMode::Leader => LATCH_NAME,
        }
    }

    /// Curator's sort key for a child of a path of this kind's recipe. On a mutex's or
    /// read/write lock's path, every lock contender (Curator's or kazoo's) sorts by its
    /// sequence number: for Curator's own nodes that is exactly the text Curator's drivers
    /// keep after stripping the lock name.
    fn sort_key(self, node: &str) -> &str {
        match self {
            HoldMode::Exclusive | HoldMode::Read | HoldMode::Write => {
                lock_contender(node).map_or(node, LockContender::sequence)
            }
            HoldMode::Lease => sort_key(node, LEASE_NAME),
            HoldMode::Leader => sort_key(node, LATCH_NAME),
        }
    }

    /// Whether `other` (a lower node) blocks a contender of this kind: a reader waits only
    /// for exclusive contenders (Curator's or kazoo's).
    fn blocked_by(self, other: &str) -> bool {
        match self {
            HoldMode::Exclusive | HoldMode::Write | HoldMode::Leader => true,
            HoldMode::Read => matches!(lock_contender(other), Some(LockContender::Exclusive(_))),
            HoldMode::Lease => false,
        }
    }

    /// Whether this kind's path holds lock contenders only (see [`lock_contender`]): a
    /// mutex's or a read/write lock's.
    fn lock_path(self) -> bool {
        matches!(self, HoldMode::Exclusive | HoldMode::Read | HoldMode::Write)
    }

    /// Exclusive grants prove that every lower node is gone.
    fn exclusive(self) -> bool {
        matches!(
            self,
            HoldMode::Exclusive | HoldMode::Write | HoldMode::Leader
        )
    }
}

/// The lower contenders that block a waiter.
pub(super) struct Queue {
    kind: HoldMode,
    /// Blockers in ascending order. Exclusive kinds keep the [`NEAREST`] lower nodes (and any
    /// whose sequence wrapped); readers keep every lower writer. See [`Queue::to_watch`].
    pub(super) below: Vec<String>,
    /// More blockers sort below the window.
    pub(super) hidden: bool,
    /// Sort key of the lowest node in the window when it was built; hidden nodes sort below it.
    floor: String,
    /// Other nodes of our own (same protected prefix), to delete.
    pub(super) strays: Vec<String>,
}

impl Queue {
    /// The blockers of `me` in `children`. Other children with our protected prefix `protect`
    /// are ours too (a create whose reply was lost): they never block, and are set aside in
    /// `strays` for deletion.
    /// Refused when `me` is not among the children (our node is gone), or when a mutex's or
    /// read/write lock's path holds a child that is no lock contender.
    pub(super) fn new(
        kind: HoldMode,
        mut children: Vec<String>,
        me: &str,
        protect: &str,
    ) -> Result<Queue, Refused> {
        if !children.iter().any(|c| c == me) {
            return Err(Refused::Gone);
        }
        if kind.lock_path() {
            if let Some(unknown) = children.iter().find(|c| lock_contender(c).is_none()) {
                return Err(Refused::Unknown(unknown.clone()));
            }
        }
        let mut strays = Vec::new();
        children.retain(|c| {
            let stray = c != me && c.starts_with(protect);
            if stray {
                strays.push(c.clone());
            }
            !stray
        });
        let mine = kind.sort_key(me);
        let order = |a: &String, b: &String| kind.sort_key(a).cmp(kind.sort_key(b));
        let mut below: Vec<String> = children
            .into_iter()
            .filter(|c| kind.sort_key(c) < mine)
            .collect();
        if !kind.exclusive() {
            below.retain(|c| kind.blocked_by(c));
            below.sort_unstable_by(order);
            return Ok(Queue {
                kind,
                below,
                hidden: false,
                floor: String::new(),
                strays,
            });
        }
        // Nodes whose sequence wrapped are always kept: no floor can vouch for them.
        let mut kept: Vec<String> = Vec::new();
        below.retain(|c| {
            let wrapped = wrapped(kind.sort_key(c));
            if wrapped {
                kept.push(c.clone());
            }
            !wrapped
        });
        // Only the nearest matter: select them instead of sorting a long queue.
        let hidden = below.len() > NEAREST;
        if hidden {
            let cut = below.len() - NEAREST;
            below.select_nth_unstable_by(cut, order);
            below.drain(..cut);
        }
        below.sort_unstable_by(order);
        let floor = below
            .first()
            .map(|n| kind.sort_key(n).to_string())
            .unwrap_or_default();
        kept.sort_unstable_by(order);
        kept.append(&mut below);
        let below = kept;
        Ok(Queue {
            kind,
            below,
            hidden,
            floor,
            strays,
        })
    }

    /// The blockers to watch: all of an exclusive waiter's window (its [`NEAREST`] lower
    /// nodes); a reader's lowest [`WINDOW`] lower writers (the next ones are watched as these
    /// go).
    pub(super) fn to_watch(&self) -> &[String] {
        if self.kind.exclusive() {
            &self.below
        } else {
            &self.below[..self.below.len().min(WINDOW)]
        }
    }

    /// Whether the waiter should list the queue again now: nodes sorted below its window when
    /// it listed, and fewer than [`NEAREST`] of the window are left (at most its predecessor),
    /// so a listing tells whether the predecessor's deletion will be the grant. Never twice for
    /// one state: a new listing that still hides nodes fills the window again.
    pub(super) fn wants_listing(&self) -> bool {
        self.hidden && self.below.len() < NEAREST
    }

    /// `node` is gone.
    pub(super) fn remove(&mut self, node: &str) {
        self.below.retain(|n| n != node);
    }

    /// Forgets every node sorting below `granted`, the highest node this process was granted an
    /// exclusive hold on in this incarnation of the path: all of those were gone when it was
    /// granted. A sequence that wrapped past 2^31 (a negative `%010d`) sorts below any floor
    /// without being older, so neither such a node nor such a floor prunes anything.
    pub(super) fn prune_below(&mut self, granted: &str) {
        if wrapped(granted) {
            return;
        }
        let kind = self.kind;
        self.below.retain(|n| {
            let k = kind.sort_key(n);
            wrapped(k) || k >= granted
        });
        if self.hidden && granted >= self.floor.as_str() {
            self.hidden = false;
        }
    }
}

/// Whether a sort key is a sequence number that wrapped past 2^31 (`%010d` of a negative).
fn wrapped(sort_key: &str) -> bool {
    sort_key.starts_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_like_curator() {
        assert_eq!(
            sort_key("_c_8d0f-lock-0000000007", MUTEX_NAME),
            "0000000007"
        );
        assert_eq!(sort_key("lock-0000000003", MUTEX_NAME), "0000000003");
        // The last occurrence counts, so a uuid or prefix containing "lock-" does not confuse it.
        assert_eq!(
            sort_key("_c_x-lock-lock-0000000001", MUTEX_NAME),
            "0000000001"
        );
        assert_eq!(sort_key("foreign", MUTEX_NAME), "foreign");
    }

    #[test]
    fn read_write_sort_like_curator() {
        assert_eq!(
            HoldMode::Read.sort_key("_c_ab-__READ__0000000004"),
            "0000000004"
        );
        assert_eq!(
            HoldMode::Write.sort_key("_c_ab-__WRIT__0000000003"),
            "0000000003"
        );
        assert_eq!(
            HoldMode::Read.sort_key("_c_ab-__WRIT__0000000003"),
            "0000000003"
        );
    }

    #[test]
    fn readers_wait_only_on_lower_writers() {
        let kids = vec![
            "_c_1-__READ__0000000001".to_string(),
            "_c_2-__WRIT__0000000002".to_string(),
            "_c_3-__READ__0000000003".to_string(),
            "_c_4-__READ__0000000004".to_string(),
            "_c_5-__WRIT__0000000005".to_string(),
        ];
        let q = Queue::new(
            HoldMode::Read,
            kids.clone(),
            "_c_4-__READ__0000000004",
            "_c_4-",
        )
        .unwrap();
        assert_eq!(q.below, vec!["_c_2-__WRIT__0000000002".to_string()]);
        let q = Queue::new(
            HoldMode::Read,
            kids.clone(),
            "_c_1-__READ__0000000001",
            "_c_1-",
        )
        .unwrap();
        assert!(q.to_watch().is_empty());
        let q = Queue::new(HoldMode::Write, kids, "_c_5-__WRIT__0000000005", "_c_5-").unwrap();
        // A writer is blocked by every lower node (here four), and watches the nearest two.
        assert!(q.hidden);
        assert_eq!(
            q.to_watch(),
            ["_c_3-__READ__0000000003", "_c_4-__READ__0000000004"]
        );
    }

    #[test]
    fn a_reader_behind_many_writers_watches_the_lowest_window_first() {
        let mut kids: Vec<String> = (0..12)
            .map(|i| format!("_c_{i}-__WRIT__{:010}", i + 1))
            .collect();
        kids.push("_c_me-__READ__0000000013".to_string());
        let mut q = Queue::new(HoldMode::Read, kids, "_c_me-__READ__0000000013", "_c_me-").unwrap();
        assert_eq!(q.to_watch().len(), WINDOW);
        assert!(q.to_watch()[0].ends_with("0000000001"));
        // As the lowest go, the next ones come into view.
        q.remove("_c_0-__WRIT__0000000001");
        assert_eq!(q.to_watch().len(), WINDOW);
        assert!(q.to_watch()[WINDOW - 1].ends_with("0000000009"));
    }

    #[test]
    fn curator_and_kazoo_nodes_are_lock_contenders_by_their_sequence() {
        use LockContender::{Exclusive, Shared};
        let cases = [
            ("_c_8d0f-lock-0000000007", Some(Exclusive("0000000007"))),
            ("lock-0000000003", Some(Exclusive("0000000003"))),
            ("_c_ab-__WRIT__0000000003", Some(Exclusive("0000000003"))),
            ("_c_ab-__READ__-2147483648", Some(Shared("-2147483648"))),
            ("5f1e0c__lock__0000000000", Some(Exclusive("0000000000"))),
            ("5f1e0c__rlock__0000000012", Some(Shared("0000000012"))),
            ("_c_ab-lock--000000005", Some(Exclusive("-000000005"))),
            ("_c_ab-latch-0000000001", None),
            ("_c_ab-lease-0000000001", None),
            ("leases", None),
            ("locks", None),
            ("_c_ab-lock-12", None),
            ("_c_ab-lock-00000000012", None),
            ("5f1e0c__lock__0000000000x", None),
        ];
        for (node, expected) in cases {
            assert_eq!(lock_contender(node), expected, "{node}");
        }
    }

    #[test]
    fn kazoo_nodes_queue_with_curator_nodes_by_sequence() {
        let kids = vec![
            "aa__lock__0000000000".to_string(),
            "_c_1-lock-0000000001".to_string(),
            "bb__rlock__0000000002".to_string(),
            "_c_3-__READ__0000000003".to_string(),
            "cc__lock__0000000004".to_string(),
            "_c_5-__WRIT__0000000005".to_string(),
        ];
        let q = Queue::new(HoldMode::Exclusive, kids.clone(), &kids[1], "_c_1-").unwrap();
        assert_eq!(q.below, vec![kids[0].clone()]);
        // A reader waits for kazoo's Lock and Curator's mutex and writers, not for readers.
        let q = Queue::new(HoldMode::Read, kids.clone(), &kids[3], "_c_3-").unwrap();
        assert_eq!(q.below, vec![kids[0].clone(), kids[1].clone()]);
        // A writer waits for every lower node, kazoo's reader included; the nearest is last.
        let q = Queue::new(HoldMode::Write, kids.clone(), &kids[5], "_c_5-").unwrap();
        assert_eq!(q.below, kids[3..5].to_vec());
        assert!(q.hidden);
        assert_eq!(q.to_watch().last(), Some(&kids[4]));
    }

    #[test]
    fn a_child_that_is_no_lock_contender_is_refused_by_name() {
        for kind in [HoldMode::Exclusive, HoldMode::Read, HoldMode::Write] {
            let me = format!("_c_me-{}0000000002", kind.lock_name());
            let kids = vec!["stranger".to_string(), me.clone()];
            assert_eq!(
                Queue::new(kind, kids, &me, "_c_me-").err(),
                Some(Refused::Unknown("stranger".into()))
            );
        }
        // A leader latch's path keeps Curator's rule: every child is a participant.
        let me = "_c_me-latch-0000000002".to_string();
        let kids = vec!["stranger".to_string(), me.clone()];
        assert!(Queue::new(HoldMode::Leader, kids, &me, "_c_me-").is_ok());
    }

    fn mutex_nodes(seqs: &[&str]) -> Vec<String> {
        seqs.iter()
            .enumerate()
            .map(|(i, seq)| format!("_c_{i}-lock-{seq}"))
            .collect()
    }

    #[test]
    fn other_nodes_with_our_prefix_are_ours_not_blockers() {
        // A create whose reply was lost made `_c_me-lock-0000000001` after all; the retry made
        // `_c_me-lock-0000000003`. The first must not block the second: it is deleted.
        let kids = vec![
            "_c_me-lock-0000000001".to_string(),
            "_c_x-lock-0000000002".to_string(),
            "_c_me-lock-0000000003".to_string(),
        ];
        let q = Queue::new(HoldMode::Exclusive, kids, "_c_me-lock-0000000003", "_c_me-").unwrap();
        assert_eq!(q.below, vec!["_c_x-lock-0000000002".to_string()]);
        assert_eq!(q.strays, vec!["_c_me-lock-0000000001".to_string()]);
    }

    #[test]
    fn a_floor_prunes_only_older_nodes_never_wrapped_ones() {
        let kids = mutex_nodes(&["0000000001", "0000000004", "-2147483648", "0000000009"]);
        let me = kids[3].clone();
        let mut q = Queue::new(HoldMode::Exclusive, kids, &me, "_c_3-").unwrap();
        assert_eq!(q.below.len(), 3);
        q.prune_below("0000000005");
        // The wrapped sequence sorts below every floor without being older: it stays.
        assert_eq!(q.below, vec!["_c_2-lock--2147483648".to_string()]);
        // A wrapped floor vouches for nothing.
        let kids = mutex_nodes(&["0000000001", "0000000009"]);
        let me = kids[1].clone();
        let mut q = Queue::new(HoldMode::Exclusive, kids, &me, "_c_1-").unwrap();
        q.prune_below("-2147483600");
        assert_eq!(q.below, vec!["_c_0-lock-0000000001".to_string()]);
    }

    /// Behind a long queue a waiter lists again once the node before its predecessor goes,
    /// not before and not after its predecessor; behind a short one, never.
    #[test]
    fn a_waiter_lists_again_when_only_its_predecessor_is_left_of_a_longer_queue() {
        let seqs: Vec<String> = (0..6).map(|i| format!("{i:010}")).collect();
        let refs: Vec<&str> = seqs.iter().map(String::as_str).collect();
        let kids = mutex_nodes(&refs);
        let me = kids[5].clone();
        let mut q = Queue::new(HoldMode::Exclusive, kids.clone(), &me, "_c_5-").unwrap();
        assert!(q.hidden);
        assert_eq!(q.to_watch(), &kids[3..5]);
        assert!(!q.wants_listing());
        q.remove(&kids[3]);
        assert!(q.wants_listing(), "only the predecessor is left");
        // The listing that follows finds the predecessor alone in front: its deletion grants.
        let mut q = Queue::new(HoldMode::Exclusive, kids[4..].to_vec(), &me, "_c_5-").unwrap();
        assert!(!q.hidden);
        assert!(!q.wants_listing());
        q.remove(&kids[4]);
        assert!(!q.wants_listing());
        assert!(
            q.below.is_empty(),
            "granted with no request after the deletion"
        );
        // Behind two, the window is the whole queue: no listing at all.
        let mut q = Queue::new(HoldMode::Exclusive, kids[3..].to_vec(), &me, "_c_5-").unwrap();
        assert!(!q.hidden);
        q.remove(&kids[3]);
        assert!(!q.wants_listing());
    }

    #[test]
    fn wrapped_nodes_stay_in_the_window_however_long_the_queue() {
        let mut seqs: Vec<String> = (0..20).map(|i| format!("{:010}", i + 100)).collect();
        seqs.push("-2147483647".into());
        seqs.push("0000000999".into());
        let refs: Vec<&str> = seqs.iter().map(String::as_str).collect();
        let kids = mutex_nodes(&refs);
        let me = kids.last().unwrap().clone();
        let q = Queue::new(HoldMode::Exclusive, kids, &me, "_c_21-").unwrap();
        assert!(q.hidden);
        assert_eq!(q.below.len(), NEAREST + 1);
        assert!(q.below[0].ends_with("-2147483647"));
    }
}
