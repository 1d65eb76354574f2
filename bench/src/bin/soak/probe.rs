//! What the soak samples, and the faults it deals: this process's memory, file descriptors and
//! threads (from `/proc/self`), and what the server keeps for it (ZooKeeper's nodes, watches
//! and connections from `mntr`; Redis's keys and clients; PostgreSQL's sessions, advisory
//! locks and key rows).

use std::fmt::Write as _;

use zklock_bench::status_kb;
use zklock_testkit::{PostgresServer, RedisServer, ZkServer};

/// The server under soak, with a way to look at it and to hurt it.
pub(crate) enum Server {
    ZooKeeper(ZkServer),
    Redis(RedisServer, redis::aio::MultiplexedConnection),
    Postgres(PostgresServer, tokio_postgres::Client),
}

/// One sample: the cycles so far and what was counted then.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub(crate) cycles: u64,
    pub(crate) rss_kb: u64,
    pub(crate) fds: u64,
    pub(crate) threads: u64,
    /// What the server keeps, by name.
    pub(crate) server: Vec<(&'static str, u64)>,
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

impl Server {
    pub(crate) async fn start(backend: &str) -> Result<Server, String> {
        let text = |e: &dyn std::fmt::Display| e.to_string();
        Ok(match backend {
            "zookeeper" => Server::ZooKeeper(ZkServer::start().map_err(|e| text(&e))?),
            "redis" => {
                let server = RedisServer::start().map_err(|e| text(&e))?;
                let client = redis::Client::open(server.url()).map_err(|e| text(&e))?;
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| text(&e))?;
                Server::Redis(server, conn)
            }
            "postgres" => {
                let server = PostgresServer::start().map_err(|e| text(&e))?;
                let (client, connection) =
                    tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
                        .await
                        .map_err(|e| text(&e))?;
                tokio::spawn(connection);
                Server::Postgres(server, client)
            }
            other => {
                return Err(format!(
                    "no backend {other:?}: zookeeper, redis or postgres"
                ))
            }
        })
    }

    pub(crate) fn connect(&self) -> String {
        match self {
            Server::ZooKeeper(s) => s.connect_string(),
            Server::Redis(s, _) => s.url(),
            Server::Postgres(s, _) => s.url(),
        }
    }

    /// Whether the backend has semaphores.
    pub(crate) fn semaphores(&self) -> bool {
        !matches!(self, Server::Postgres(..))
    }

    pub(crate) async fn sample(&mut self, cycles: u64) -> Sample {
        Sample {
            cycles,
            rss_kb: status_kb("VmRSS"),
            fds: open_fds(),
            threads: status_kb("Threads"),
            server: self.kept().await,
        }
    }

    /// What the server keeps for the soak now.
    async fn kept(&mut self) -> Vec<(&'static str, u64)> {
        match self {
            Server::ZooKeeper(s) => {
                let mntr = s.four_letter("mntr").unwrap_or_default();
                let field = |name: &str| {
                    mntr.lines()
                        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                        .unwrap_or(0)
                };
                vec![
                    ("znodes", field("zk_znode_count")),
                    ("ephemerals", field("zk_ephemerals_count")),
                    ("watches", field("zk_watch_count")),
                    ("connections", field("zk_num_alive_connections")),
                ]
            }
            Server::Redis(_, conn) => {
                let keys: u64 = redis::cmd("DBSIZE").query_async(conn).await.unwrap_or(0);
                // Keys that are holds (a mutex's or writer's key, readers' and leases' sets).
                let mut held = 0;
                for pattern in ["zklock:lock:*", "zklock:shared:*"] {
                    let found: Vec<String> = redis::cmd("KEYS")
                        .arg(pattern)
                        .query_async(conn)
                        .await
                        .unwrap_or_default();
                    held += found.len() as u64;
                }
                let list: String = redis::cmd("CLIENT")
                    .arg("LIST")
                    .query_async(conn)
                    .await
                    .unwrap_or_default();
                let clients = list.lines().filter(|l| !l.trim().is_empty()).count() as u64;
                vec![
                    ("keys", keys),
                    ("held", held),
                    ("clients", clients.saturating_sub(1)),
                ]
            }
            Server::Postgres(_, client) => {
                let mut kept = Vec::new();
                for (name, sql) in [
                    (
                        "sessions",
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'zklock%'",
                    ),
                    (
                        "locks",
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
                    ),
                    ("rows", "SELECT count(*) FROM zklock_keys"),
                ] {
                    let count = client.query_one(sql, &[]).await;
                    kept.push((name, count.map_or(0, |r| r.get::<_, i64>(0) as u64)));
                }
                kept
            }
        }
    }

    /// A fault: every connection of the managers cut (Redis), one of their sessions ended
    /// (PostgreSQL); ZooKeeper's sessions are left alone (its faults have soaks of their own).
    pub(crate) async fn fault(&mut self) -> &'static str {
        match self {
            Server::ZooKeeper(_) => "none",
            Server::Redis(_, conn) => {
                let _: redis::RedisResult<u64> = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .arg("SKIPME")
                    .arg("yes")
                    .query_async(conn)
                    .await;
                "CLIENT KILL TYPE normal"
            }
            Server::Postgres(_, client) => {
                let _ = client
                    .query(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE application_name LIKE 'zklock%' ORDER BY random() LIMIT 1",
                        &[],
                    )
                    .await;
                "pg_terminate_backend (one session)"
            }
        }
    }
}

impl Sample {
    /// `name=value` for each server count, for a line of the report.
    pub(crate) fn server_text(&self) -> String {
        let mut text = String::new();
        for (name, value) in &self.server {
            let _ = write!(text, " {name}={value}");
        }
        text
    }
}
