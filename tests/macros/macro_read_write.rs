//! `mode = "read"` holds are shared and `mode = "write"` holds exclusive, across sessions.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use tokio::sync::Barrier;
use zklock::{distributed_lock, Error, LockManager};

#[derive(Default)]
struct Counts {
    readers: AtomicUsize,
    writers: AtomicUsize,
    bad: AtomicUsize,
}

/// Waits inside the read hold until every reader is inside: only possible if they share.
#[distributed_lock("catalog_{id}", manager = m, mode = "read")]
async fn read(m: &LockManager, id: u32, all_in: &Barrier, counts: &Counts) -> Result<(), Error> {
    counts.readers.fetch_add(1, Ordering::SeqCst);
    if counts.writers.load(Ordering::SeqCst) != 0 {
        counts.bad.fetch_add(1, Ordering::SeqCst);
    }
    all_in.wait().await;
    counts.readers.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock("catalog_{id}", manager = m, mode = "write")]
async fn write(m: &LockManager, id: u32, counts: &Counts) -> Result<(), Error> {
    if counts.writers.fetch_add(1, Ordering::SeqCst) != 0
        || counts.readers.load(Ordering::SeqCst) != 0
    {
        counts.bad.fetch_add(1, Ordering::SeqCst);
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    counts.writers.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock("catalog_{id}", manager = m, mode = "read", timeout = "300ms")]
async fn read_bounded(m: &LockManager, id: u32) -> Result<(), Error> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_across_sessions() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let counts = Arc::new(Counts::default());
    let all_in = Arc::new(Barrier::new(2));
    let (ra, rb) = tokio::time::timeout(Duration::from_secs(15), async {
        tokio::join!(read(&a, 1, &all_in, &counts), read(&b, 1, &all_in, &counts))
    })
    .await
    .expect("both readers were inside at once");
    ra.unwrap();
    rb.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_exclude_readers_and_writers() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let counts = Arc::new(Counts::default());
    let mut tasks = vec![];
    for (i, m) in [a.clone(), b.clone(), a.clone(), b.clone()]
        .into_iter()
        .enumerate()
    {
        let counts = counts.clone();
        tasks.push(tokio::spawn(async move {
            let alone = Barrier::new(1);
            for _ in 0..5 {
                if i % 2 == 0 {
                    write(&m, 2, &counts).await.unwrap();
                } else {
                    read(&m, 2, &alone, &counts).await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(counts.bad.load(Ordering::SeqCst), 0, "a writer overlapped");

    // While a writer holds the key, a bounded read times out.
    let rw = b.rwlock("catalog_3").unwrap();
    let held = rw.write().await.unwrap();
    let err = read_bounded(&a, 3).await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    drop(held);
    read_bounded(&a, 3).await.unwrap();
}
