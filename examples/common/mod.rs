//! What the examples share: a ZooKeeper to talk to.

use zklock_testkit::ZkServer;

/// The connect string of `ZKLOCK_CONNECT`, or of a server started for the example (kept
/// running while the returned handle lives).
pub fn zookeeper() -> (Option<ZkServer>, String) {
    match std::env::var("ZKLOCK_CONNECT") {
        Ok(connect) => (None, connect),
        Err(_) => {
            eprintln!(
                "starting a ZooKeeper server for the example (set ZKLOCK_CONNECT to use yours)..."
            );
            let server = ZkServer::start().expect("start ZooKeeper");
            let connect = server.connect_string();
            (Some(server), connect)
        }
    }
}
