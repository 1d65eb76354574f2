//! The global manager: configured from ZKLOCK_CONNECT on first use, shared afterwards.

#[path = "../common/mod.rs"]
mod common;

use common::*;

#[tokio::test]
async fn global_manager_comes_from_zklock_connect() {
    let zk = server();
    std::env::set_var("ZKLOCK_CONNECT", zk.connect_string());
    let a = zklock::global().await.unwrap();
    let b = zklock::global().await.unwrap();
    assert_eq!(
        a.client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .session_id(),
        b.client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .session_id(),
        "one session for the process"
    );
    let g = a.lock("global").await.unwrap();
    assert!(b.try_lock("global").await.unwrap().is_none());
    drop(g);
    // set_global after the fact is refused with a clear error.
    let other = manager(&zk.connect_string()).await;
    assert!(matches!(
        zklock::set_global(other),
        Err(zklock::Error::Config(_))
    ));
}
