//! Regression: the fencing token of a downgraded read hold must stay below the token of the
//! writer that follows it.
//!
//! Bug guarded against: `downgrade()` gives the read hold the czxid of its new read node. When a
//! writer W2 queued between W1's write node and that read node, W2's node is older, so W2's token
//! is *smaller* than the read hold's, although W2 only gets the lock after the read hold (which
//! continues W1's exclusive hold) ended. A store that keeps the largest token it has seen would
//! then refuse W2's writes, or, compared the other way, accept a stale reader's.
//!
//! The rule: tokens strictly increase across successive holders that exclude each other. The read
//! hold that continues W1 excludes W2, so W1 < read < W2 must hold.

use crate::common;
use crate::faults;

use std::time::Duration;

use common::*;
use faults::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgraded_read_hold_carries_a_token_below_the_next_writers() {
    let zk = server();
    let a = manager(&zk.connect_string()).await;
    let b = manager(&zk.connect_string()).await;
    let key = "ledger";
    let rw = a.rwlock(key).unwrap();
    let path = rw.path().to_string();

    let w1 = rw.write().await.unwrap();
    let w1_token = w1.fencing_token();
    let w2 = tokio::spawn({
        let b = b.clone();
        async move {
            let guard = b.rwlock(key).unwrap().write().await.unwrap();
            let token = guard.fencing_token();
            guard.release().await.unwrap();
            token
        }
    });
    // W2 queued behind W1 before the downgrade.
    until_children(&a, &path, 2).await;

    let read = w1.downgrade().await.unwrap();
    let read_token = read.fencing_token();
    assert!(read.is_held());
    assert!(
        !w2.is_finished(),
        "the queued writer must not get in while the downgraded read hold lasts"
    );
    read.release().await.unwrap();

    let w2_token = tokio::time::timeout(Duration::from_secs(20), w2)
        .await
        .expect("the queued writer gets in once the read hold ends")
        .unwrap();
    println!("tokens: W1 {w1_token}, W1's downgraded read {read_token}, next writer W2 {w2_token}");
    assert!(
        w1_token <= read_token,
        "the downgraded read hold's token {read_token} is below W1's {w1_token}"
    );
    assert!(
        read_token < w2_token,
        "token order broken: the read hold that continued W1 carries {read_token}, but the \
         writer that followed it got {w2_token}; tokens must strictly increase across successive \
         exclusive holders"
    );
    a.flush().await;
    b.flush().await;
    assert_no_contenders(
        &a.client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
}
