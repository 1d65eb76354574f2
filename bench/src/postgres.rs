//! The PostgreSQL rows (a `postgres://` connect string): zklock's PostgreSQL backend beside a
//! bare floor, `SELECT pg_advisory_lock($1)` and `SELECT pg_advisory_unlock($1)` (prepared
//! once) on a plain `tokio_postgres::Client` per worker: what the server costs at the least for
//! one acquire and release of a session-level advisory lock. Its waiters block in the server,
//! each on a connection of its own.
//!
//! Workloads `uncontended` (one worker) and `contended` (`workers` managers or clients, one
//! key). The lines carry `backend=postgres` and `wal_bytes_per_cycle`: the WAL the server wrote
//! per cycle (from `pg_current_wal_lsn()`), which shows the commits that must reach the disk
//! (the floor writes none; zklock commits each grant's token in the statement that takes the
//! lock, and a release that wakes someone commits its `NOTIFY` asynchronously).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls, Statement};
use zklock_core::{LockManager, Mutex};

use crate::ops::local_queue_field;
use crate::window::{Gate, Overlap, Tally};
use crate::{BenchError, Options, Peer, Report, Result, Workload};

/// The lease of zklock's holds: long enough that the bench's load never makes a liveness check
/// late.
const LEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether `connect` names a PostgreSQL server.
pub(crate) fn is_postgres(connect: &str) -> bool {
    connect.starts_with("postgres://") || connect.starts_with("postgresql://")
}

fn pg(e: tokio_postgres::Error) -> BenchError {
    BenchError(format!("postgres: {e}"))
}

/// A plain client; its connection runs on a task of its own.
async fn client(url: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.map_err(pg)?;
    tokio::spawn(connection);
    Ok(client)
}

/// The server's WAL position, in bytes.
async fn wal_position(admin: &Client) -> Result<i64> {
    let row = admin
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await
        .map_err(pg)?;
    Ok(row.get(0))
}

/// One worker of a peer: a zklock manager, or the floor's client.
enum Contender {
    Zklock {
        manager: LockManager,
        /// The measured key, then the warm-up key.
        mutexes: [Mutex; 2],
    },
    Floor {
        client: Client,
        lock: Statement,
        unlock: Statement,
        /// The measured key, then the warm-up key (advisory lock ids of the one-`bigint` form).
        keys: [i64; 2],
    },
}

impl Contender {
    async fn open(options: &Options, namespace: &str, floor_key: i64) -> Result<Contender> {
        match options.peer {
            Peer::Zklock => {
                let manager = LockManager::builder(options.connect.clone())
                    .namespace(namespace)
                    .postgres(|pg| pg.lease(LEASE))
                    .local_queue(options.local_queue)
                    .fencing_tokens(options.fencing_tokens)
                    .connect()
                    .await?;
                let mutexes = [manager.mutex("bench")?, manager.mutex("warmup")?];
                Ok(Contender::Zklock { manager, mutexes })
            }
            Peer::Floor => {
                let client = client(&options.connect).await?;
                let lock = client
                    .prepare("SELECT pg_advisory_lock($1::bigint)")
                    .await
                    .map_err(pg)?;
                let unlock = client
                    .prepare("SELECT pg_advisory_unlock($1::bigint)")
                    .await
                    .map_err(pg)?;
                Ok(Contender::Floor {
                    client,
                    lock,
                    unlock,
                    keys: [floor_key, floor_key + 1],
                })
            }
            other => Err(BenchError(format!(
                "{other} does not run on PostgreSQL; on PostgreSQL: zklock, floor"
            ))),
        }
    }

    /// One acquire of key `k` (0: measured, 1: warm-up), the critical section of worker
    /// `who` (when timed: `overlap`), one release. When timed: how long the acquire took, and
    /// whether the key changed hands.
    async fn cycle(
        &self,
        k: usize,
        who: usize,
        overlap: Option<&Overlap>,
    ) -> Result<(Duration, bool)> {
        let t0 = Instant::now();
        let mut changed = false;
        let waited;
        match self {
            Contender::Zklock { mutexes, .. } => {
                let guard = mutexes[k].lock().await?;
                waited = t0.elapsed();
                if let Some(overlap) = overlap {
                    changed = overlap.critical_section(0, who).await;
                }
                guard.release().await?;
            }
            Contender::Floor {
                client,
                lock,
                unlock,
                keys,
            } => {
                client.query_one(lock, &[&keys[k]]).await.map_err(pg)?;
                waited = t0.elapsed();
                if let Some(overlap) = overlap {
                    changed = overlap.critical_section(0, who).await;
                }
                let row = client.query_one(unlock, &[&keys[k]]).await.map_err(pg)?;
                if !row.get::<_, bool>(0) {
                    return Err(BenchError("the floor's unlock found no lock".into()));
                }
            }
        }
        Ok((waited, changed))
    }

    async fn flush(&self) {
        if let Contender::Zklock { manager, .. } = self {
            manager.flush().await;
        }
    }
}

pub(crate) async fn run(options: &Options) -> Result<Report> {
    let workload = options.workload;
    if !matches!(workload, Workload::Uncontended | Workload::Contended) {
        return Err(BenchError(format!(
            "{workload} does not run on PostgreSQL; on PostgreSQL: uncontended, contended, \
             mem-waiters, mem-keys"
        )));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let namespace = format!("/bench-{nanos}-{}", std::process::id());
    // The floor's keys: fresh per run, and apart from anything else on the server.
    let floor_key = ((nanos as i64) & 0x3fff_ffff_ffff) << 1;
    let contenders: Vec<Arc<Contender>> = futures::future::try_join_all(
        (0..options.workers).map(|_| Contender::open(options, &namespace, floor_key)),
    )
    .await?
    .into_iter()
    .map(Arc::new)
    .collect();

    // Warm-up on its own key, as CuratorBench does.
    for _ in 0..options.warmup {
        contenders[0].cycle(1, 0, None).await?;
    }
    for c in &contenders {
        c.flush().await;
    }

    let admin = client(&options.connect).await?;
    let overlap = Arc::new(Overlap::new(1));
    let check = options.peer != Peer::Floor;
    let gate = Arc::new(Gate::new(options.workers));
    let mut tasks = Vec::with_capacity(options.workers);
    for (w, contender) in contenders.iter().enumerate() {
        let (contender, overlap, gate) = (contender.clone(), overlap.clone(), gate.clone());
        let cycles = options.cycles;
        tasks.push(tokio::spawn(async move {
            // Untimed: each worker's first acquire.
            let first = contender.cycle(0, w, None).await;
            gate.ready().await;
            first?;
            let mut tally = Tally::with_capacity(cycles);
            for _ in 0..cycles {
                let t0 = Instant::now();
                let (waited, changed) = contender.cycle(0, w, Some(&overlap)).await?;
                tally.record(t0, waited, changed);
            }
            Ok::<_, BenchError>(tally)
        }));
    }
    gate.all_ready().await;
    let wal_before = wal_position(&admin).await?;
    let t0 = gate.open();
    let mut tally = Tally::default();
    for task in tasks {
        let mine = task
            .await
            .map_err(|e| BenchError(format!("worker panicked: {e}")))??;
        tally.merge(mine);
    }
    let elapsed = t0.elapsed();
    for c in &contenders {
        c.flush().await;
    }
    let wal = wal_position(&admin).await? - wal_before;
    let mut latencies = tally.latencies;

    let n = latencies.len().max(1) as f64;
    let mut report = Report::new();
    report.push("peer", options.peer);
    report.push("workload", workload);
    report.push("workers", options.workers);
    report.push_ops(elapsed, &mut latencies);
    if options.workers > 1 {
        report.push_contention(elapsed, tally.changes, tally.max_wait_ns);
    }
    if check {
        report.push("violations", overlap.violations.load(Ordering::SeqCst));
    }
    report.push("backend", "postgres");
    report.push("wal_bytes_per_cycle", format!("{:.0}", wal as f64 / n));
    if options.peer == Peer::Zklock {
        report.push("local_queue", local_queue_field(options));
        if !options.fencing_tokens {
            report.push("fencing_tokens", "off");
        }
    }
    Ok(report)
}
