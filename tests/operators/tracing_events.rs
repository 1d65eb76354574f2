//! Observability: acquire (with wait time), hold, release, handoff and loss are traced with
//! the key and the token as fields.

use crate::common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn lock_life_is_traced_with_key_and_token() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

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

    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
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
