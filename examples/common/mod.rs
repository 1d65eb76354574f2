//! What the examples share: a ZooKeeper (or a PostgreSQL) to talk to.
// Each example uses the servers it needs.
#![allow(dead_code)]

use zklock_testkit::{PostgresServer, ZkServer};

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

/// The PostgreSQL URL of `ZKLOCK_POSTGRES_URL`, or of a server started for the example (kept
/// running while the returned handle lives).
pub fn postgres() -> (Option<PostgresServer>, String) {
    match std::env::var("ZKLOCK_POSTGRES_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            eprintln!(
                "starting a PostgreSQL server for the example (set ZKLOCK_POSTGRES_URL to use yours)..."
            );
            let server = PostgresServer::start().expect("start PostgreSQL");
            let url = server.url();
            (Some(server), url)
        }
    }
}
