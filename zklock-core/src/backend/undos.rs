//! [`Undos`]: the undos that a backend runs in the background (of dropped acquires, and the
//! releases of dropped holds), counted per lock, so that the process's next acquire of that
//! lock starts only once they are done.
//!
//! An acquire dropped while its request may still take the lock on the server leaves an undo
//! behind, which releases what the request took; a hold dropped (its guard dropped, or given
//! up by the local table) is released by a request sent from a task of its own. Until that
//! has run, the lock may be held, for a moment, by an acquire that its caller already gave up
//! or a hold it already let go of: the process's own next try of the same lock would find it
//! taken (a job skipped for nothing, a `try_lock` right after a drop refused). Waiting for the
//! undos first keeps a process from being held up by itself; other processes can still meet
//! such a moment, as they would meet a holder.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::watch;

/// The undos of one lock under way: each numbered in the order it started.
#[derive(Default)]
struct Running {
    /// The number the next undo gets.
    next: u64,
    /// The numbers of those under way.
    running: BTreeSet<u64>,
}

/// Undos under way, per lock (by its path).
#[derive(Default)]
pub(crate) struct Undos {
    pending: StdMutex<HashMap<Arc<str>, watch::Sender<Running>>>,
}

#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "postgres",
        feature = "etcd",
        feature = "mysql"
    )),
    allow(dead_code)
)]
impl Undos {
    /// An undo of `lock` (of an acquire, or a release in the background) starts: it counts until the returned [`Undoing`] is
    /// dropped (move it into the undo's task: a task dropped unrun ends it too).
    pub(crate) fn start(self: &Arc<Self>, lock: &Arc<str>) -> Undoing {
        let mut number = 0;
        self.pending
            .lock()
            .expect("not poisoned")
            .entry(lock.clone())
            .or_insert_with(|| watch::channel(Running::default()).0)
            .send_modify(|r| {
                number = r.next;
                r.next += 1;
                r.running.insert(number);
            });
        Undoing {
            undos: self.clone(),
            lock: lock.clone(),
            number,
        }
    }

    /// The undo `number` of an acquire of `lock` ended, done or failed.
    fn done(&self, lock: &str, number: u64) {
        let mut pending = self.pending.lock().expect("not poisoned");
        if let Some(running) = pending.get(lock) {
            running.send_modify(|r| {
                r.running.remove(&number);
            });
            if running.borrow().running.is_empty() {
                pending.remove(lock);
            }
        }
    }

    /// Waits until every undo of an acquire of `lock` that had started when it was called has
    /// ended. Undos that start later are not waited for: a stream of dropped acquires cannot
    /// hold a later acquire up for ever.
    pub(crate) async fn finished(&self, lock: &str) {
        let pending = self
            .pending
            .lock()
            .expect("not poisoned")
            .get(lock)
            .map(|r| (r.subscribe(), r.borrow().next));
        if let Some((mut pending, upto)) = pending {
            // The lock's entry goes (the sender with it) once none runs: done too.
            let _ = pending
                .wait_for(|r| r.running.first().is_none_or(|first| *first >= upto))
                .await;
        }
    }
}

/// One undo under way (see [`Undos::start`]); ends when dropped.
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "postgres",
        feature = "etcd",
        feature = "mysql"
    )),
    allow(dead_code)
)]
pub(crate) struct Undoing {
    undos: Arc<Undos>,
    lock: Arc<str>,
    number: u64,
}

impl Drop for Undoing {
    fn drop(&mut self) {
        self.undos.done(&self.lock, self.number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The path of lock `n`.
    fn path(n: u32) -> Arc<str> {
        format!("/zklock/locks/{n}").into()
    }

    /// `finished` waits for every undo of its lock, and for no other lock's.
    #[tokio::test]
    async fn finished_waits_for_the_undos_of_its_lock_only() {
        let undos = Arc::new(Undos::default());
        let first = undos.start(&path(1));
        let second = undos.start(&path(1));
        let _other = undos.start(&path(2));
        // Lock 3 has none: at once.
        undos.finished(&path(3)).await;
        let waiting = tokio::spawn({
            let undos = undos.clone();
            async move { undos.finished(&path(1)).await }
        });
        drop(first);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiting.is_finished(),
            "finished before the second undo ended"
        );
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("finished once both undos ended")
            .unwrap();
        // Lock 2's undo still runs, and holds up nobody else.
        tokio::time::timeout(Duration::from_millis(100), undos.finished(&path(2)))
            .await
            .expect_err("lock 2's undo is under way");
    }

    /// `finished` waits for the undos under way when it was called, not for those that start
    /// later: a stream of overlapping undos (an acquire dropped again and again) does not hold
    /// it up for ever. (Waiting for the count to reach zero, it never returned here.)
    #[tokio::test]
    async fn finished_is_not_held_up_by_undos_that_start_later() {
        let undos = Arc::new(Undos::default());
        let mut under_way = undos.start(&path(1));
        let waiting = tokio::spawn({
            let undos = undos.clone();
            async move { undos.finished(&path(1)).await }
        });
        tokio::task::yield_now().await;
        // Each undo ends only after the next has started: never none under way.
        for _ in 0..20 {
            let next = undos.start(&path(1));
            drop(std::mem::replace(&mut under_way, next));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("finished once the undo under way at the call ended")
            .unwrap();
        drop(under_way);
    }
}
