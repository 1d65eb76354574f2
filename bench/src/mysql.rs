//! The MySQL / MariaDB rows (a `mysql://` or `mariadb://` connect string): zklock's MySQL
//! backend beside a bare floor, `SELECT GET_LOCK(?, 86400)` and `SELECT RELEASE_LOCK(?)`
//! (prepared once per session) on plain `mysql_async::Conn`s: what the server costs at the
//! least for one acquire and release of a user lock. Its waiters block in the server's queue,
//! each on a session of its own, with a timeout (a day) that no run reaches.
//!
//! Workloads `uncontended` (one worker), `contended` (`workers` managers or sessions, one key),
//! `keys` (`workers` managers or sessions over `keys` keys, each cycle on a random key),
//! `inproc` (`workers` tasks of one manager, or of one floor, on one key) and `drain`
//! (`workers` waiters of one process queued behind a held lock, then released). The floor's
//! tasks (`inproc`, `drain`) share a pool of at most [`POOL`] sessions, task `w` on session
//! `w mod POOL`, which it keeps from its acquire to its release: a user lock belongs to its
//! session, and a session that asks again for a lock it holds gets it again, so two tasks on
//! one session would both hold it. With 64 tasks each has a session of its own; a drain's
//! waiters beyond the pool wait in the process for their session, and those on a session in
//! the server's queue.
//!
//! zklock runs with a lease of 10 s; each grant raises the lock's fencing token in the table
//! `zklock_locks` (one write, so one commit, per grant; none with `fencing_tokens(false)`).
//! The floor writes nothing. Both speak TCP with `TCP_NODELAY` (the floor as zklock's
//! sessions: never switched to the server's Unix socket), and both peers' lines check
//! exclusion (`violations`): a user lock excludes.
//!
//! The lines carry `backend=mysql` and, read around the timed window on a plain session of
//! the bench's own (none over TLS), per cycle over every client: the redo log InnoDB wrote
//! (`redo_bytes_per_cycle`, from `Innodb_os_log_written`), its fsyncs (`fsyncs_per_cycle`,
//! `Innodb_data_fsyncs`: on MariaDB 10.11 the redo log's at every commit of a durable server
//! among them) and the statements clients sent (`statements_per_cycle`, `Questions`, less the
//! bench's own read).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Statement};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{Mutex as AsyncMutex, MutexGuard};
use tokio::task::JoinHandle;
use zklock_core::{LockGuard, LockManager, Mutex};

use crate::ops::{local_queue_field, per};
use crate::peer::{mysql_session as session, zklock_manager};
use crate::window::{Closed, Gate, Overlap, Tally};
use crate::{BenchError, Options, Peer, Report, Result, Workload};

/// The most sessions the floor's tasks of one process share (`inproc`, `drain`): one per task
/// of the inproc row's 64, well below the test kit's `max_connections` of 200.
pub(crate) const POOL: usize = 64;

/// How long a floor's `GET_LOCK` waits in the server's queue before it gives up, in seconds:
/// a day, which no run reaches.
const FLOOR_WAIT_S: u32 = 86_400;

fn my(e: mysql_async::Error) -> BenchError {
    BenchError(format!("mysql: {e}"))
}

/// The server's counters, over every client.
#[derive(Debug, Clone, Copy)]
struct Counters {
    /// `Innodb_os_log_written`: bytes written to the redo log.
    redo: u64,
    /// `Innodb_data_fsyncs`.
    fsyncs: u64,
    /// `Questions`: statements sent by clients (the read of these among them).
    statements: u64,
}

impl Counters {
    async fn read(admin: &mut Conn) -> Result<Counters> {
        let rows: Vec<(String, String)> = admin
            .query(
                "SHOW GLOBAL STATUS WHERE Variable_name IN \
                 ('Innodb_os_log_written', 'Innodb_data_fsyncs', 'Questions')",
            )
            .await
            .map_err(my)?;
        let of = |name: &str| {
            rows.iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .and_then(|(_, v)| v.parse().ok())
                .ok_or_else(|| BenchError(format!("mysql: the server shows no {name}")))
        };
        Ok(Counters {
            redo: of("Innodb_os_log_written")?,
            fsyncs: of("Innodb_data_fsyncs")?,
            statements: of("Questions")?,
        })
    }

    /// What was counted since `before`, per cycle of `cycles`: the redo log's bytes, the
    /// fsyncs, and the statements less this read's own.
    fn push_since(self, before: Counters, cycles: u64, report: &mut Report) {
        let bytes = self.redo.saturating_sub(before.redo) as f64 / cycles.max(1) as f64;
        report.push("redo_bytes_per_cycle", format!("{bytes:.0}"));
        report.push(
            "fsyncs_per_cycle",
            per(self.fsyncs.saturating_sub(before.fsyncs), cycles),
        );
        let statements = self.statements.saturating_sub(before.statements + 1);
        report.push("statements_per_cycle", per(statements, cycles));
    }
}

/// The sessions of the server waiting in `GET_LOCK`, whether sent as text (`Query`) or
/// prepared (`Execute`) (the bench's account sees every session: the test kit grants it
/// `PROCESS`).
async fn lock_waits(admin: &mut Conn) -> Result<usize> {
    let n: Option<u64> = admin
        .query_first(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'",
        )
        .await
        .map_err(my)?;
    Ok(n.unwrap_or(0) as usize)
}

/// One of the floor's sessions, with its statements prepared.
struct FloorConn {
    conn: Conn,
    lock: Statement,
    unlock: Statement,
}

impl FloorConn {
    async fn open(url: &str) -> Result<FloorConn> {
        let mut conn = session(url).await?;
        let lock = conn
            .prep(format!("SELECT GET_LOCK(?, {FLOOR_WAIT_S})"))
            .await
            .map_err(my)?;
        let unlock = conn.prep("SELECT RELEASE_LOCK(?)").await.map_err(my)?;
        Ok(FloorConn { conn, lock, unlock })
    }

    /// `GET_LOCK` (or, `release`, `RELEASE_LOCK`) of `name`: whether the server answered 1
    /// (granted; released).
    async fn ask(&mut self, release: bool, name: &str) -> Result<bool> {
        let statement = if release { &self.unlock } else { &self.lock };
        let got: Option<Option<i64>> =
            self.conn.exec_first(statement, (name,)).await.map_err(my)?;
        Ok(got.flatten() == Some(1))
    }
}

/// One worker of a peer (one process's tasks, for `inproc` and `drain`): a zklock manager, or
/// the floor's sessions.
enum Contender {
    Zklock {
        manager: LockManager,
        /// The measured keys, then the warm-up key.
        mutexes: Vec<Mutex>,
    },
    Floor {
        /// Task `w` uses `conns[w % conns.len()]`, for a whole cycle.
        conns: Vec<AsyncMutex<FloorConn>>,
        /// The measured keys, then the warm-up key (user-lock names).
        keys: Vec<String>,
    },
}

/// A granted acquire, to be released.
enum Held<'a> {
    Zklock(LockGuard),
    Floor {
        conn: MutexGuard<'a, FloorConn>,
        key: &'a str,
    },
}

impl Held<'_> {
    async fn release(self) -> Result<()> {
        match self {
            Held::Zklock(guard) => Ok(guard.release().await?),
            Held::Floor { mut conn, key } => {
                if conn.ask(true, key).await? {
                    Ok(())
                } else {
                    Err(BenchError("the floor's release found no lock".into()))
                }
            }
        }
    }
}

impl Contender {
    /// Handles for the keys `floor_keys` (the last one the warm-up's); the floor with
    /// `connections` sessions.
    async fn open(
        options: &Options,
        namespace: &str,
        floor_keys: &[String],
        connections: usize,
    ) -> Result<Contender> {
        match options.peer {
            Peer::Zklock => {
                let manager = zklock_manager(options, namespace).await?;
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
                "{other} does not run on MySQL; on MySQL: zklock, floor"
            ))),
        }
    }

    /// Task `who`'s acquire of key `k`.
    async fn acquire(&self, k: usize, who: usize) -> Result<Held<'_>> {
        match self {
            Contender::Zklock { mutexes, .. } => Ok(Held::Zklock(mutexes[k].lock().await?)),
            Contender::Floor { conns, keys } => {
                let mut conn = conns[who % conns.len()].lock().await;
                if !conn.ask(false, &keys[k]).await? {
                    return Err(BenchError(format!(
                        "the floor's GET_LOCK of {} gave up after {FLOOR_WAIT_S} s",
                        keys[k]
                    )));
                }
                Ok(Held::Floor {
                    conn,
                    key: &keys[k],
                })
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

    /// The floor's sessions (zklock: 0, its manager opens its own).
    fn connections(&self) -> usize {
        match self {
            Contender::Zklock { .. } => 0,
            Contender::Floor { conns, .. } => conns.len(),
        }
    }

    async fn flush(&self) {
        if let Contender::Zklock { manager, .. } = self {
            manager.flush().await;
        }
    }
}

/// The keys `options`' workload measures, if it runs on MySQL.
fn measured_keys(options: &Options) -> Result<usize> {
    match options.workload {
        Workload::Keys => Ok(options.keys.max(1)),
        Workload::Drain if options.tls.is_some() => Err(BenchError(
            "drain does not run over TLS: it watches the server's lock queue on a plain \
             session of its own"
                .into(),
        )),
        Workload::Uncontended | Workload::Contended | Workload::Inproc | Workload::Drain => Ok(1),
        other => Err(BenchError(format!(
            "{other} does not run on MySQL; on MySQL: uncontended, contended, keys, inproc, \
             drain, mem-waiters, mem-keys"
        ))),
    }
}

pub(crate) async fn run(options: &Options) -> Result<Report> {
    let keys = measured_keys(options)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let pid = std::process::id();
    let namespace = format!("/bench-{nanos}-{pid}");
    // The floor's user-lock names: fresh per run, and apart from zklock's (`zklock:…`).
    let floor_keys: Vec<String> = (0..=keys)
        .map(|k| format!("bench-floor:{nanos}-{pid}:k{k}"))
        .collect();
    // One process's tasks share one manager, or the floor's pool; else one each.
    let (processes, connections) = match options.workload {
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
    // The server's counters, read on a plain session of the bench's own: none over TLS.
    let mut admin = match options.tls {
        None => Some(session(&options.connect).await?),
        Some(_) => None,
    };
    if let (Workload::Drain, Some(admin)) = (options.workload, admin.as_mut()) {
        return drain(options, contenders[0].clone(), admin).await;
    }
    let timed = timed(options, &contenders, keys, admin.as_mut()).await?;
    Ok(ops_line(options, keys, connections, timed))
}

/// What the timed window of a run gave.
struct Timed {
    tally: Tally,
    window: Closed,
    overlap: Arc<Overlap>,
    /// The server's counters before and after the window, if read.
    counted: Option<(Counters, Counters)>,
}

/// Worker `w` of `contender`: its untimed first cycle, then (once `gate` opens) `cycles`
/// timed ones, each on a random key of `keys`.
fn worker(
    w: usize,
    contender: Arc<Contender>,
    (overlap, gate): (Arc<Overlap>, Arc<Gate>),
    cycles: usize,
    keys: usize,
) -> JoinHandle<Result<Tally>> {
    tokio::spawn(async move {
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
        Ok(tally)
    })
}

/// Every worker's cycles in one timed window, the server's counters read (on `admin`, if
/// given) once every worker is ready and once every one is done.
async fn timed(
    options: &Options,
    contenders: &[Arc<Contender>],
    keys: usize,
    mut admin: Option<&mut Conn>,
) -> Result<Timed> {
    let overlap = Arc::new(Overlap::new(keys));
    let gate = Arc::new(Gate::new(options.workers));
    let tasks: Vec<_> = (0..options.workers)
        .map(|w| {
            let contender = contenders[w % contenders.len()].clone();
            let shared = (overlap.clone(), gate.clone());
            worker(w, contender, shared, options.cycles, keys)
        })
        .collect();
    gate.all_ready().await;
    let before = match admin.as_deref_mut() {
        Some(admin) => Some(Counters::read(admin).await?),
        None => None,
    };
    let window = gate.open(options.server_pid);
    let tally = Tally::gather(tasks).await?;
    let window = window.close();
    for c in contenders {
        c.flush().await;
    }
    let counted = match (admin, before) {
        (Some(admin), Some(before)) => Some((before, Counters::read(admin).await?)),
        _ => None,
    };
    Ok(Timed {
        tally,
        window,
        overlap,
        counted,
    })
}

/// The line of a run of an acquire/release loop.
fn ops_line(options: &Options, keys: usize, connections: usize, timed: Timed) -> Report {
    let Timed {
        mut tally,
        window,
        overlap,
        counted,
    } = timed;
    let n = tally.latencies.len().max(1) as u64;
    let mut report = Report::new();
    report.push("peer", options.peer);
    report.push("workload", options.workload);
    report.push("workers", options.workers);
    report.push_ops(window.elapsed, &mut tally.latencies);
    window.push_cpu(n, &mut report);
    if options.workers > 1 {
        report.push_contention(window.elapsed, tally.changes, tally.max_wait_ns);
    }
    report.push("violations", overlap.violations.load(Ordering::SeqCst));
    if options.workload == Workload::Keys {
        report.push("keys", keys);
    }
    push_mysql(&mut report, options, connections, counted, n);
    report
}

/// The MySQL fields of a line, with the server's counters per cycle of `cycles` if they were
/// read (not over TLS).
fn push_mysql(
    report: &mut Report,
    options: &Options,
    connections: usize,
    counted: Option<(Counters, Counters)>,
    cycles: u64,
) {
    report.push("backend", "mysql");
    if let Some((before, after)) = counted {
        after.push_since(before, cycles, report);
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
/// queue, and the others in the process for their session.
async fn drain(options: &Options, contender: Arc<Contender>, admin: &mut Conn) -> Result<Report> {
    let waiters = options.workers;
    contender.cycle(0, 0, None).await?;
    contender.flush().await;
    let first = contender.acquire(0, 0).await?;
    let overlap = Arc::new(Overlap::new(1));
    let started = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (1..=waiters)
        .map(|w| {
            let (contender, overlap, started) =
                (contender.clone(), overlap.clone(), started.clone());
            tokio::spawn(async move {
                started.fetch_add(1, Ordering::SeqCst);
                let held = contender.acquire(0, w).await?;
                let granted = Instant::now();
                overlap.critical_section(0, w).await;
                held.release().await?;
                Ok::<_, BenchError>(granted)
            })
        })
        .collect();
    wait_drain_queued(options, &contender, &started, &tasks, admin).await?;

    let before = Counters::read(admin).await?;
    let (t0, grants, secs) = crate::drain::release_and_collect(first.release(), tasks).await?;
    contender.flush().await;
    let after = Counters::read(admin).await?;
    let mut report = crate::drain::line(options, secs, t0, grants, &overlap);
    push_mysql(
        &mut report,
        options,
        contender.connections(),
        Some((before, after)),
        waiters as u64,
    );
    Ok(report)
}

/// Until the drain's waiters are queued: zklock's with the local queue, every task started
/// and the manager quiet; else until the server shows them waiting in `GET_LOCK` (the floor's
/// on a session of their own, all but the holder's; zklock's without the local queue, each
/// on a session of its own), and 200 ms more. A waiter that ended (its acquire failed) ends
/// the wait: the drain then reports its error.
async fn wait_drain_queued(
    options: &Options,
    contender: &Contender,
    started: &AtomicUsize,
    tasks: &[JoinHandle<Result<Instant>>],
    admin: &mut Conn,
) -> Result<()> {
    let waiters = options.workers;
    if let Some(manager) = contender.manager().filter(|_| options.local_queue) {
        crate::drain::wait_local_queue(manager, started, waiters).await;
        return Ok(());
    }
    let queued = match contender.connections() {
        0 => waiters,
        sessions => waiters.min(sessions - 1),
    };
    while started.load(Ordering::SeqCst) < waiters || lock_waits(admin).await? < queued {
        if tasks.iter().any(JoinHandle::is_finished) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workloads_that_run_on_mysql() {
        let mut options = Options::new("mysql://u:p@127.0.0.1:1/db", Workload::Keys);
        options.keys = 8;
        assert_eq!(measured_keys(&options).unwrap(), 8);
        options.workload = Workload::Drain;
        assert_eq!(measured_keys(&options).unwrap(), 1);
        options.tls = Some(zklock_core::Tls::new());
        assert!(measured_keys(&options).is_err());
        for workload in [Workload::Reacquire, Workload::Handover] {
            assert!(measured_keys(&Options::new("mysql://h/db", workload)).is_err());
        }
    }

    #[test]
    fn counters_per_cycle_leave_out_the_benchs_own_read() {
        let before = Counters {
            redo: 1_000,
            fsyncs: 10,
            statements: 50,
        };
        let after = Counters {
            redo: 3_000,
            fsyncs: 30,
            statements: 71,
        };
        let mut report = Report::new();
        after.push_since(before, 10, &mut report);
        assert_eq!(report.get("redo_bytes_per_cycle"), Some("200"));
        assert_eq!(report.get("fsyncs_per_cycle"), Some("2.00"));
        assert_eq!(report.get("statements_per_cycle"), Some("2.00"));
    }
}
