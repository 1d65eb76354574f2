//! [`Undos`]: the undos of dropped acquires that a backend runs in the background, counted per
//! lock, so that the process's next acquire of that lock starts only once they are done.
//!
//! An acquire dropped while its request may still take the lock on the server leaves an undo
//! behind, which releases what the request took. Until it has run, the lock may be held, for a
//! moment, by an acquire that its caller already gave up: the process's own next try of the
//! same lock would find it taken (a job skipped for nothing). Waiting for the undos first keeps
//! a process from being held up by its own abandoned acquires; other processes can still meet
//! such a moment, as they would meet a holder.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::watch;

/// Undos under way, per lock.
pub(crate) struct Undos<K> {
    pending: StdMutex<HashMap<K, watch::Sender<usize>>>,
}

impl<K> Default for Undos<K> {
    fn default() -> Self {
        Undos {
            pending: StdMutex::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> Undos<K> {
    /// An undo of an acquire of `lock` starts: it counts until the returned [`Undoing`] is
    /// dropped (move it into the undo's task: a task dropped unrun ends it too).
    pub(crate) fn start(self: &Arc<Self>, lock: &K) -> Undoing<K> {
        self.pending
            .lock()
            .expect("not poisoned")
            .entry(lock.clone())
            .or_insert_with(|| watch::channel(0).0)
            .send_modify(|n| *n += 1);
        Undoing {
            undos: self.clone(),
            lock: lock.clone(),
        }
    }

    /// An undo of an acquire of `lock` ended, done or failed.
    fn done(&self, lock: &K) {
        let mut pending = self.pending.lock().expect("not poisoned");
        if let Some(count) = pending.get(lock) {
            count.send_modify(|n| *n -= 1);
            if *count.borrow() == 0 {
                pending.remove(lock);
            }
        }
    }

    /// Waits until no undo of an acquire of `lock` is under way.
    pub(crate) async fn finished(&self, lock: &K) {
        let pending = self
            .pending
            .lock()
            .expect("not poisoned")
            .get(lock)
            .map(|c| c.subscribe());
        if let Some(mut pending) = pending {
            let _ = pending.wait_for(|n| *n == 0).await;
        }
    }
}

/// One undo under way (see [`Undos::start`]); ends when dropped.
pub(crate) struct Undoing<K: Hash + Eq + Clone> {
    undos: Arc<Undos<K>>,
    lock: K,
}

impl<K: Hash + Eq + Clone> Drop for Undoing<K> {
    fn drop(&mut self) {
        self.undos.done(&self.lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `finished` waits for every undo of its lock, and for no other lock's.
    #[tokio::test]
    async fn finished_waits_for_the_undos_of_its_lock_only() {
        let undos = Arc::new(Undos::default());
        let first = undos.start(&1);
        let second = undos.start(&1);
        let _other = undos.start(&2);
        // Lock 3 has none: at once.
        undos.finished(&3).await;
        let waiting = tokio::spawn({
            let undos = undos.clone();
            async move { undos.finished(&1).await }
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
        tokio::time::timeout(Duration::from_millis(100), undos.finished(&2))
            .await
            .expect_err("lock 2's undo is under way");
    }
}
