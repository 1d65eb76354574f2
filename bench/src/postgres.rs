//! The PostgreSQL rows (a `postgres://` connect string): zklock's PostgreSQL backend beside a
//! bare floor, `SELECT pg_advisory_lock($1)` and `SELECT pg_advisory_unlock($1)` (prepared
//! once per connection) on plain `tokio_postgres::Client`s: what the server costs at the least
//! for one acquire and release of a session-level advisory lock. Its waiters block in the
//! server, each on a connection of its own.
//!
//! Workloads `uncontended` (one worker), `contended` (`workers` managers or clients, one key),
//! `keys` (`workers` managers or clients over `keys` keys, each cycle on a random key),
//! `inproc` (`workers` tasks of one manager, or of one floor, on one key) and `drain`
//! (`workers` waiters of one process queued behind a held lock, then released). The floor's
//! tasks (`inproc`, `drain`) share a pool of at most [`POOL`] connections, task `w` on
//! connection `w mod POOL`, which it keeps from its acquire to its release: an advisory lock
//! belongs to its session, so two tasks on one connection would both hold it. With 64 tasks
//! each has a connection of its own; a drain's waiters beyond the pool wait in the process for
//! their connection, and those on a connection in the server's lock queue.
//!
//! The lines carry `backend=postgres` and `wal_bytes_per_cycle`: the WAL the server wrote per
//! cycle (from `pg_current_wal_lsn()`), which shows the commits that must reach the disk (the
//! floor writes none; zklock commits each grant's token in the statement that takes the lock,
//! and a release that wakes someone commits its `NOTIFY` asynchronously).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{rngs::StdRng, Rng, SeedableRng};
use tokio::sync::{Mutex as AsyncMutex, MutexGuard};
use tokio_postgres::{Client, NoTls, Statement};
use zklock_core::{LockGuard, LockManager, Mutex};

use crate::ops::local_queue_field;
use crate::window::{Gate, Overlap, Tally};
use crate::{BenchError, Options, Peer, Report, Result, Workload};

/// The lease of zklock's holds: long enough that the bench's load never makes a liveness check
/// late.
const LEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// The most connections the floor's tasks of one process share (`inproc`, `drain`): one per
/// task of the inproc row's 64, well below the test kit's `max_connections` of 200.
pub(crate) const POOL: usize = 64;

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

/// The backends of the server waiting for an advisory lock.
async fn advisory_waits(admin: &Client) -> Result<i64> {
    let row = admin
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
            &[],
        )
        .await
        .map_err(pg)?;
    Ok(row.get(0))
}

/// One of the floor's connections, with its statements prepared.
struct FloorConn {
    client: Client,
    lock: Statement,
    unlock: Statement,
}

impl FloorConn {
    async fn open(url: &str) -> Result<FloorConn> {
        let client = client(url).await?;
        let lock = client
            .prepare("SELECT pg_advisory_lock($1::bigint)")
            .await
            .map_err(pg)?;
        let unlock = client
            .prepare("SELECT pg_advisory_unlock($1::bigint)")
            .await
            .map_err(pg)?;
        Ok(FloorConn {
            client,
            lock,
            unlock,
        })
    }
}

/// One worker of a peer (one process's tasks, for `inproc` and `drain`): a zklock manager, or
/// the floor's connections.
enum Contender {
    Zklock {
        manager: LockManager,
        /// The measured keys, then the warm-up key.
        mutexes: Vec<Mutex>,
    },
    Floor {
        /// Task `w` uses `conns[w % conns.len()]`, for a whole cycle.
        conns: Vec<AsyncMutex<FloorConn>>,
        /// The measured keys, then the warm-up key (advisory lock ids of the one-`bigint`
        /// form).
        keys: Vec<i64>,
    },
}

/// A granted acquire, to be released.
enum Held<'a> {
    Zklock(LockGuard),
    Floor {
        conn: MutexGuard<'a, FloorConn>,
        key: i64,
    },
}

impl Held<'_> {
    async fn release(self) -> Result<()> {
        match self {
            Held::Zklock(guard) => Ok(guard.release().await?),
            Held::Floor { conn, key } => {
                let row = conn
                    .client
                    .query_one(&conn.unlock, &[&key])
                    .await
                    .map_err(pg)?;
                if row.get::<_, bool>(0) {
                    Ok(())
                } else {
                    Err(BenchError("the floor's unlock found no lock".into()))
                }
            }
        }
    }
}

impl Contender {
    /// Handles for the keys `floor_keys` (the last one the warm-up's); the floor with
    /// `connections` connections.
    async fn open(
        options: &Options,
        namespace: &str,
        floor_keys: &[i64],
        connections: usize,
    ) -> Result<Contender> {
        match options.peer {
            Peer::Zklock => {
                let tls = options.tls.clone();
                let manager = LockManager::builder(options.connect.clone())
                    .namespace(namespace)
                    .postgres(|pg| {
                        let pg = pg.lease(LEASE);
                        match tls {
                            Some(tls) => pg.tls(tls),
                            None => pg,
                        }
                    })
                    .local_queue(options.local_queue)
                    .fencing_tokens(options.fencing_tokens)
                    .connect()
                    .await?;
                let mut mutexes = (0..floor_keys.len() - 1)
                    .map(|k| manager.mutex(&format!("bench{k}")))
                    .collect::<zklock_core::Result<Vec<_>>>()?;
                mutexes.push(manager.mutex("warmup")?);
                Ok(Contender::Zklock { manager, mutexes })
            }
            Peer::Floor => {
                let conns = futures::future::try_join_all(
                    (0..connections).map(|_| FloorConn::open(&options.connect)),
                )
                .await?
                .into_iter()
                .map(AsyncMutex::new)
                .collect();
                Ok(Contender::Floor {
                    conns,
                    keys: floor_keys.to_vec(),
                })
            }
            other => Err(BenchError(format!(
                "{other} does not run on PostgreSQL; on PostgreSQL: zklock, floor"
            ))),
        }
    }

    /// Task `who`'s acquire of key `k`.
    async fn acquire(&self, k: usize, who: usize) -> Result<Held<'_>> {
        match self {
            Contender::Zklock { mutexes, .. } => Ok(Held::Zklock(mutexes[k].lock().await?)),
            Contender::Floor { conns, keys } => {
                let conn = conns[who % conns.len()].lock().await;
                conn.client
                    .query_one(&conn.lock, &[&keys[k]])
                    .await
                    .map_err(pg)?;
                Ok(Held::Floor { conn, key: keys[k] })
            }
        }
    }

    /// One acquire of key `k`, the critical section of task `who` (when timed: `overlap`),
    /// one release. When timed: how long the acquire took, and whether the key changed hands.
    async fn cycle(
        &self,
        k: usize,
        who: usize,
        overlap: Option<&Overlap>,
    ) -> Result<(Duration, bool)> {
        let t0 = Instant::now();
        let held = self.acquire(k, who).await?;
        let waited = t0.elapsed();
        let mut changed = false;
        if let Some(overlap) = overlap {
            changed = overlap.critical_section(k, who).await;
        }
        held.release().await?;
        Ok((waited, changed))
    }

    fn manager(&self) -> Option<&LockManager> {
        match self {
            Contender::Zklock { manager, .. } => Some(manager),
            Contender::Floor { .. } => None,
        }
    }

    async fn flush(&self) {
        if let Contender::Zklock { manager, .. } = self {
            manager.flush().await;
        }
    }
}

pub(crate) async fn run(options: &Options) -> Result<Report> {
    let workload = options.workload;
    let keys = match workload {
        Workload::Keys => options.keys.max(1),
        Workload::Uncontended | Workload::Contended | Workload::Inproc | Workload::Drain => 1,
        other => {
            return Err(BenchError(format!(
                "{other} does not run on PostgreSQL; on PostgreSQL: uncontended, contended, \
                 keys, inproc, drain, mem-waiters, mem-keys"
            )))
        }
    };
    if workload == Workload::Drain && options.tls.is_some() {
        return Err(BenchError(
            "drain does not run over TLS: it watches the server's lock queue on a plain \
             connection of its own"
                .into(),
        ));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let namespace = format!("/bench-{nanos}-{}", std::process::id());
    // The floor's keys: fresh per run, and apart from anything else on the server.
    let base = ((nanos as i64) & 0x3fff_ffff_ffff) << 8;
    let floor_keys: Vec<i64> = (0..=keys as i64).map(|k| base + k).collect();
    // One process's tasks share one manager, or the floor's pool; else one each.
    let (processes, connections) = match workload {
        Workload::Inproc | Workload::Drain => (1, options.workers.clamp(1, POOL)),
        _ => (options.workers, 1),
    };
    let contenders: Vec<Arc<Contender>> = futures::future::try_join_all(
        (0..processes).map(|_| Contender::open(options, &namespace, &floor_keys, connections)),
    )
    .await?
    .into_iter()
    .map(Arc::new)
    .collect();

    // Warm-up on its own key, as CuratorBench does.
    for _ in 0..options.warmup {
        contenders[0].cycle(keys, 0, None).await?;
    }
    for c in &contenders {
        c.flush().await;
    }
    // The server's WAL position, asked on a plain connection of the bench's own: none over
    // TLS.
    let admin = match options.tls {
        None => Some(client(&options.connect).await?),
        Some(_) => None,
    };
    if let (Workload::Drain, Some(admin)) = (workload, &admin) {
        return drain(options, contenders[0].clone(), admin).await;
    }

    let overlap = Arc::new(Overlap::new(keys));
    let check = options.peer != Peer::Floor;
    let gate = Arc::new(Gate::new(options.workers));
    let mut tasks = Vec::with_capacity(options.workers);
    for w in 0..options.workers {
        let contender = contenders[w % contenders.len()].clone();
        let (overlap, gate) = (overlap.clone(), gate.clone());
        let cycles = options.cycles;
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(w as u64);
            // Untimed: each worker's first acquire.
            let first = contender.cycle(w % keys, w, None).await;
            gate.ready().await;
            first?;
            let mut tally = Tally::with_capacity(cycles);
            for _ in 0..cycles {
                let k = if keys > 1 { rng.gen_range(0..keys) } else { 0 };
                let t0 = Instant::now();
                let (waited, changed) = contender.cycle(k, w, Some(&overlap)).await?;
                tally.record(t0, waited, changed);
            }
            Ok::<_, BenchError>(tally)
        }));
    }
    gate.all_ready().await;
    let wal_before = match &admin {
        Some(admin) => Some(wal_position(admin).await?),
        None => None,
    };
    let window = gate.open(options.server_pid);
    let tally = Tally::gather(tasks).await?;
    let window = window.close();
    let elapsed = window.elapsed;
    for c in &contenders {
        c.flush().await;
    }
    let wal = match (&admin, wal_before) {
        (Some(admin), Some(before)) => Some(wal_position(admin).await? - before),
        _ => None,
    };
    let mut latencies = tally.latencies;

    let n = latencies.len().max(1) as f64;
    let mut report = Report::new();
    report.push("peer", options.peer);
    report.push("workload", workload);
    report.push("workers", options.workers);
    report.push_ops(elapsed, &mut latencies);
    window.push_cpu(n as u64, &mut report);
    if options.workers > 1 {
        report.push_contention(elapsed, tally.changes, tally.max_wait_ns);
    }
    if check {
        report.push("violations", overlap.violations.load(Ordering::SeqCst));
    }
    if workload == Workload::Keys {
        report.push("keys", keys);
    }
    push_postgres(&mut report, options, connections, wal.map(|w| w as f64 / n));
    Ok(report)
}

/// The PostgreSQL fields of a line, with the WAL written per cycle if it was read (not over
/// TLS).
fn push_postgres(report: &mut Report, options: &Options, connections: usize, wal: Option<f64>) {
    report.push("backend", "postgres");
    if let Some(wal) = wal {
        report.push("wal_bytes_per_cycle", format!("{wal:.0}"));
    }
    match options.peer {
        Peer::Zklock => {
            report.push("local_queue", local_queue_field(options));
            if !options.fencing_tokens {
                report.push("fencing_tokens", "off");
            }
        }
        _ if matches!(options.workload, Workload::Inproc | Workload::Drain) => {
            report.push("connections", connections);
        }
        _ => {}
    }
}

/// `workers` waiters of `contender` (one process) queued behind a hold of the same process on
/// key 0, then released: the time for the queue to pass through. The floor's holder is task 0
/// and waiter `w` task `w + 1`: with the pool of [`POOL`], 63 waiters wait in the server's
/// lock queue, and the others in the process for their connection.
async fn drain(options: &Options, contender: Arc<Contender>, admin: &Client) -> Result<Report> {
    let waiters = options.workers;
    contender.cycle(0, 0, None).await?;
    contender.flush().await;
    let first = contender.acquire(0, 0).await?;
    let overlap = Arc::new(Overlap::new(1));
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(waiters);
    for w in 1..=waiters {
        let (contender, overlap, started) = (contender.clone(), overlap.clone(), started.clone());
        tasks.push(tokio::spawn(async move {
            started.fetch_add(1, Ordering::SeqCst);
            let held = contender.acquire(0, w).await?;
            let granted = Instant::now();
            overlap.critical_section(0, w).await;
            held.release().await?;
            Ok::<_, BenchError>(granted)
        }));
    }
    let connections = match &*contender {
        Contender::Zklock { .. } => 0,
        Contender::Floor { conns, .. } => conns.len(),
    };
    match contender.manager() {
        Some(manager) if options.local_queue => {
            crate::drain::wait_local_queue(manager, &started, waiters).await;
        }
        _ => {
            // The floor's waiters on a connection of their own (all but the holder's) block
            // in the server's lock queue; zklock's without the local queue, at most a few.
            let queued = if connections > 0 {
                waiters.min(connections - 1) as i64
            } else {
                1
            };
            while started.load(Ordering::SeqCst) < waiters || advisory_waits(admin).await? < queued
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let wal_before = wal_position(admin).await?;
    let (t0, grants, secs) = crate::drain::release_and_collect(first.release(), tasks).await?;
    contender.flush().await;
    let wal = wal_position(admin).await? - wal_before;
    let mut report = crate::drain::line(options, secs, t0, grants, &overlap);
    push_postgres(
        &mut report,
        options,
        connections,
        Some(wal as f64 / waiters as f64),
    );
    Ok(report)
}
