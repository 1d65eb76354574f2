//! Observability: acquire (with wait time), hold, release, handoff and loss are traced with
//! the key and the token as fields.

use crate::common;

use crate::capture::Captured;

use common::*;

#[tokio::test]
async fn lock_life_is_traced_with_key_and_token() {
    let (captured, _default) = Captured::start();

    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let token = m
        .with_lock("traced", async {
            tracing::info!("inside the body");
            zklock::current_fencing_token().unwrap()
        })
        .await
        .unwrap();
    let g = m.lock("traced").await.unwrap();
    let ops = manager(&zk.connect_string()).await;
    ops.client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .delete(g.node_path(), None)
        .await
        .unwrap();
    g.lost().await;
    drop(g);

    let log = captured.text();
    assert!(
        log.contains("zklock: acquired") && log.contains("waited_ms="),
        "{log}"
    );
    assert!(log.contains(&format!("token={token}")), "{log}");
    assert!(log.contains("key=traced"), "{log}");
    assert!(
        log.contains("zklock.hold"),
        "the body runs in a hold span: {log}"
    );
    assert!(
        log.contains("zklock: released") && log.contains("held_ms="),
        "{log}"
    );
    assert!(
        log.contains("deleted by someone else"),
        "loss is traced: {log}"
    );
}
