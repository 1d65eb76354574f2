//! Read/write locks: readers share, a writer excludes everyone, FIFO between them, downgrade,
//! no silent upgrade deadlock, and Curator's node format.

use crate::common;

use std::time::Duration;

use common::*;
use zklock::Error;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_excludes_everyone() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let (ra, rb) = (a.rwlock("cfg").unwrap(), b.rwlock("cfg").unwrap());
    let r1 = ra.read().await.unwrap();
    let r2 = rb.try_read().await.unwrap().expect("readers share");
    assert!(
        rb.try_write().await.unwrap().is_none(),
        "a writer waits for readers"
    );
    drop((r1, r2));
    a.flush().await;
    b.flush().await;
    let w = ra.write().await.unwrap();
    assert!(
        rb.try_read().await.unwrap().is_none(),
        "a writer excludes readers"
    );
    assert!(
        rb.try_write().await.unwrap().is_none(),
        "a writer excludes writers"
    );
    let name = w.node_path().rsplit('/').next().unwrap().to_string();
    assert!(
        name.starts_with("_c_") && name.contains("-__WRIT__"),
        "{name}"
    );
    drop(w);
    let r = rb.read().await.unwrap();
    assert!(r.node_path().contains("-__READ__"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_a_queued_writer_waits_fifo() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let c = manager(&zk.connect_string()).await;
    let path = a.rwlock("fifo").unwrap().path().to_string();
    let first = a.rwlock("fifo").unwrap().read().await.unwrap();
    let writer = tokio::spawn({
        let b = b.clone();
        async move {
            let rw = b.rwlock("fifo").unwrap();
            let w = rw.write().await.unwrap();
            w.release().await.unwrap();
        }
    });
    until_children(&a, &path, 2).await;
    // A new reader queues behind the writer instead of joining the first reader.
    let late = c.rwlock("fifo").unwrap();
    assert!(
        late.try_read().await.unwrap().is_none(),
        "a reader must not overtake a queued writer"
    );
    drop(first);
    tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .unwrap()
        .unwrap();
    assert!(late.try_read().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_inside_write_reenters_and_write_inside_read_is_refused() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let rw = m.rwlock("doc").unwrap();
    let ok = tokio::time::timeout(
        Duration::from_secs(10),
        rw.with_write(async { rw.with_read(async { 7 }).await }),
    )
    .await
    .expect("a writer taking its own read lock must not deadlock")
    .unwrap()
    .unwrap();
    assert_eq!(ok, 7);
    let refused = rw
        .with_read(async { rw.with_write(async {}).await })
        .await
        .unwrap();
    assert!(
        matches!(refused, Err(Error::WouldDeadlock { .. })),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_keeps_excluding_writers_and_lets_readers_in() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let path = a.rwlock("dg").unwrap().path().to_string();
    let w = a.rwlock("dg").unwrap().write().await.unwrap();
    let token = w.fencing_token();
    let r = w.downgrade().await.unwrap();
    assert!(r.fencing_token() > token);
    assert!(r.node_path().contains("__READ__"));
    let rb = b.rwlock("dg").unwrap();
    assert!(
        rb.try_read().await.unwrap().is_some(),
        "after a downgrade other readers share"
    );
    assert!(
        rb.try_write().await.unwrap().is_none(),
        "but writers still wait"
    );
    b.flush().await;

    // With a writer queued behind the write node, the write node is kept until the read ends.
    drop(r);
    a.flush().await;
    let w = a.rwlock("dg").unwrap().write().await.unwrap();
    let queued = tokio::spawn({
        let b = b.clone();
        async move {
            b.rwlock("dg")
                .unwrap()
                .write()
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        }
    });
    until_children(&a, &path, 2).await;
    let r = w.downgrade().await.unwrap();
    assert_eq!(
        children(&a, &path).await.len(),
        3,
        "write node kept: a writer is queued behind it"
    );
    assert!(!queued.is_finished());
    drop(r);
    tokio::time::timeout(Duration::from_secs(10), queued)
        .await
        .unwrap()
        .unwrap();
    a.flush().await;
    b.flush().await;
    assert!(children(&a, &path).await.is_empty());
}
