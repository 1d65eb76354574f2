//! Background tasks (releases, cleanups, undos of cancelled acquires), counted so that a flush
//! can wait for them: the ZooKeeper session owner's, and the Redis, PostgreSQL and etcd
//! backends'.

// A build with only the in-memory backend has no background work.
#![cfg_attr(
    not(any(
        feature = "zookeeper",
        feature = "redis",
        feature = "postgres",
        feature = "etcd",
        feature = "mysql"
    )),
    allow(dead_code)
)]

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Background tasks (releases, undos of cancelled acquires), counted so that a flush can wait
/// for them.
#[derive(Default)]
pub(crate) struct Background {
    running: AtomicUsize,
    done: Notify,
}

impl Background {
    /// Runs `fut` on `runtime`, counted.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        runtime: &tokio::runtime::Handle,
        fut: impl Future<Output = ()> + Send + 'static,
    ) {
        self.running.fetch_add(1, Ordering::SeqCst);
        let me = self.clone();
        runtime.spawn(async move {
            fut.await;
            if me.running.fetch_sub(1, Ordering::SeqCst) == 1 {
                me.done.notify_waiters();
            }
        });
    }

    /// Waits until every background task has finished.
    pub(crate) async fn flush(&self) {
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.running.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}
