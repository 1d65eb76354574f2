//! What the server sees of one run's process, for the memory probes on Redis, PostgreSQL and
//! MySQL: the connections it holds, and how many of its waiters wait on the server.
//!
//! The count comes from a connection of the probe's own, which it leaves out: on Redis the
//! entries of `CLIENT LIST` (command and pub/sub connections alike) less its own; on
//! PostgreSQL the sessions of `pg_stat_activity` on the run's database less its own; on MySQL
//! the sessions of the process list on the run's database less its own (the test kit's
//! account sees every session). All three count every other client of the server, so the
//! figure is the process's only on a server that serves the run alone (the suite's servers
//! do).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;

use crate::peer::{is_mysql, is_postgres, is_redis, redis_connection, Contender};
use crate::{BenchError, Options, Result};

/// A probe connection to the run's Redis, PostgreSQL or MySQL server.
pub(crate) enum ServerProbe {
    Redis(redis::aio::MultiplexedConnection),
    Postgres(tokio_postgres::Client),
    MySql(mysql_async::Conn),
}

impl ServerProbe {
    /// A probe of `connect`'s server; `None` on ZooKeeper.
    pub(crate) async fn open(connect: &str) -> Result<Option<ServerProbe>> {
        if is_redis(connect) {
            return Ok(Some(ServerProbe::Redis(redis_connection(connect).await?)));
        }
        if is_postgres(connect) {
            let (client, connection) = tokio_postgres::connect(connect, tokio_postgres::NoTls)
                .await
                .map_err(|e| BenchError(format!("postgres probe: {e}")))?;
            tokio::spawn(connection);
            return Ok(Some(ServerProbe::Postgres(client)));
        }
        if is_mysql(connect) {
            return Ok(Some(ServerProbe::MySql(
                crate::peer::mysql_session(connect).await?,
            )));
        }
        Ok(None)
    }

    /// The connections other clients than this probe hold on the server (on PostgreSQL and
    /// MySQL: on the run's database).
    pub(crate) async fn connections(&mut self) -> Result<u64> {
        match self {
            ServerProbe::Redis(conn) => {
                let list: String = redis::cmd("CLIENT")
                    .arg("LIST")
                    .query_async(conn)
                    .await
                    .map_err(|e| BenchError(format!("redis CLIENT LIST: {e}")))?;
                let entries = list.lines().filter(|l| !l.trim().is_empty()).count() as u64;
                Ok(entries.saturating_sub(1))
            }
            ServerProbe::Postgres(client) => {
                let row = client
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity \
                         WHERE datname = current_database() AND pid <> pg_backend_pid()",
                        &[],
                    )
                    .await
                    .map_err(|e| BenchError(format!("postgres pg_stat_activity: {e}")))?;
                Ok(row.get::<_, i64>(0) as u64)
            }
            ServerProbe::MySql(conn) => {
                let n: Option<u64> = conn
                    .query_first(
                        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                         WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
                    )
                    .await
                    .map_err(|e| BenchError(format!("mysql PROCESSLIST: {e}")))?;
                Ok(n.unwrap_or(0))
            }
        }
    }
}

/// What [`backend_queued`] saw once the waiters had settled.
pub(crate) struct Settled {
    /// The waiters the server shows on the lock (`LockManager::inspect`).
    pub(crate) backend_waiters: usize,
    /// The connections the process holds on the server.
    pub(crate) connections: u64,
}

/// How long the waiters of one run may take to settle.
const SETTLE_LIMIT: Duration = Duration::from_secs(240);
/// The pause between two looks at the server.
const LOOK_EVERY: Duration = Duration::from_millis(200);
/// Unchanged looks in a row that make the waiters settled.
const STILL_LOOKS: usize = 5;

/// Waits until `waiters` tasks of zklock on Redis, PostgreSQL or MySQL wait on key 0: every task has
/// started, and what the server shows of the process (the lock's waiters, as
/// `LockManager::inspect` reads them from the server, and the process's connections) has not
/// changed for [`STILL_LOOKS`] looks in a row, [`LOOK_EVERY`] apart. With Redis and the local
/// queue off, each task queues on the server: the lock's queue must also hold all of them.
/// With the local queue on, one hold per process is on the server and the tasks queue behind
/// it in the process, so the server shows no waiter. On PostgreSQL at most a few acquires per
/// process wait in the server's lock queue (the backend's `QUEUED_WAITS`); the others retry
/// on notified releases, each on a connection of its own, which the connection count shows.
/// On MySQL every acquire that reaches the server waits in `GET_LOCK` on a session of its own.
pub(crate) async fn backend_queued(
    options: &Options,
    contender: &Contender,
    started: &AtomicUsize,
    waiters: usize,
    probe: &mut ServerProbe,
) -> Result<Settled> {
    let t0 = Instant::now();
    while started.load(Ordering::SeqCst) < waiters {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let manager = contender.manager().expect("a zklock contender");
    let path = contender.lock_dir(0)?;
    let every_one_queues = is_redis(&options.connect) && !options.local_queue;
    let mut last = None;
    let mut still = 0;
    loop {
        let backend_waiters = manager.inspect_path(&path).await?.waiters.len();
        let connections = probe.connections().await?;
        let now = (backend_waiters, connections);
        let complete = !every_one_queues || backend_waiters >= waiters;
        if complete && last == Some(now) {
            still += 1;
            if still >= STILL_LOOKS {
                return Ok(Settled {
                    backend_waiters,
                    connections,
                });
            }
        } else {
            still = 0;
        }
        last = Some(now);
        if t0.elapsed() > SETTLE_LIMIT {
            return Err(BenchError(format!(
                "{waiters} waiters did not settle within {} s: the server shows {backend_waiters} \
                 waiting on the lock and {connections} connections of this process",
                SETTLE_LIMIT.as_secs()
            )));
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}
