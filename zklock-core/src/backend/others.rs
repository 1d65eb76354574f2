//! What a hold knows of other contenders for its lock, where a task of its own finds out
//! (Redis: the first waiter's word on the hub; etcd: a watch of the lock's prefix): the answer
//! that bounds the local queue's handoffs and ends a linger. ZooKeeper's holds learn it from
//! their children watch instead (`zk/hold/others.rs`).

use tokio::sync::watch;

/// Whether another contender may be waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Others {
    /// Not known yet: nobody asked, or the check is under way.
    Unknown,
    /// None came after the hold, as far as the check has seen.
    Nobody,
    /// One came, or may have (the check failed or its connection broke).
    Maybe,
}

/// The answer as it stands, shared between a hold and the task that finds out.
#[derive(Clone)]
pub(crate) struct OthersState(watch::Sender<Others>);

impl OthersState {
    /// Not known yet.
    pub(crate) fn new() -> OthersState {
        OthersState(watch::Sender::new(Others::Unknown))
    }

    /// The answer now.
    pub(crate) fn now(&self) -> Others {
        *self.0.borrow()
    }

    /// Another contender may be waiting (or the check gave up): for good.
    pub(crate) fn maybe(&self) {
        self.0.send_replace(Others::Maybe);
    }

    /// The check found nobody, unless the answer is known already (a "maybe" that came first
    /// stays).
    pub(crate) fn nobody(&self) {
        self.0.send_if_modified(|s| {
            let unknown = *s == Others::Unknown;
            if unknown {
                *s = Others::Nobody;
            }
            unknown
        });
    }

    /// Completes once the answer is known (nobody, or maybe).
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) async fn known(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|o| *o != Others::Unknown).await;
    }

    /// Completes once another contender may be waiting.
    pub(crate) fn appeared(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|o| *o == Others::Maybe).await;
        }
    }
}
