//! The acquire/release loops: uncontended, contended, keys, inproc.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rand::{rngs::StdRng, Rng, SeedableRng};
use redis::aio::MultiplexedConnection;

use crate::peer::{is_cluster, is_redis, is_sentinel, redis_connection, Contender, Setup};
use crate::window::{Gate, Overlap, Tally};
use crate::{BenchError, Options, Peer, Report, Result, Workload};

/// Sum of the zklock managers' counters (requests, predecessor events).
pub(crate) fn zk_stats(contenders: &[Arc<Contender>]) -> (u64, u64) {
    contenders
        .iter()
        .filter_map(|c| c.manager())
        .map(|m| m.stats())
        .fold((0, 0), |(r, e), s| {
            (r + s.requests, e + s.predecessor_events)
        })
}

/// Redis' counters (`INFO stats`), from a connection of its own: the commands it ran
/// (`total_commands_processed`: those a client sent and those a script ran inside the server),
/// and the reads it processed from clients (`total_reads_processed`: one per batch of requests
/// a client sent before waiting for replies, so one per round trip of a client that waits for
/// each reply; pub/sub messages the server pushes are not reads).
async fn redis_counters(conn: &mut MultiplexedConnection) -> Result<(u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .map_err(|e| BenchError(format!("redis INFO: {e}")))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| BenchError(format!("no {name} in INFO stats")))
    };
    Ok((
        field("total_commands_processed")?,
        field("total_reads_processed")?,
    ))
}

/// Connections to the servers whose counters count a Redis run: the one server (or the
/// Sentinels' primary), or every primary of a Cluster; none off Redis, and none over TLS (the
/// bench's own connections speak plain TCP).
pub(crate) async fn redis_admin(
    options: &Options,
    setup: &Setup,
) -> Result<Vec<MultiplexedConnection>> {
    Ok(match &setup.cluster {
        _ if options.tls.is_some() => vec![],
        Some(map) => map.connections().await?,
        None if is_redis(&options.connect) => vec![redis_connection(&options.connect).await?],
        None => vec![],
    })
}

/// The commands run and the reads processed, summed over `servers` (see [`redis_counters`]).
pub(crate) async fn redis_totals(servers: &mut [MultiplexedConnection]) -> Result<(u64, u64)> {
    let (mut commands, mut reads) = (0, 0);
    for conn in servers.iter_mut() {
        let (c, r) = redis_counters(conn).await?;
        commands += c;
        reads += r;
    }
    Ok((commands, reads))
}

/// The counters a run reads before and after its window: the server's (Redis), zklock's
/// managers', and the bench's own (the floor's `SET NX` attempts, the naive herd's requests).
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    /// Redis: commands run, reads from clients (summed over every primary of a Cluster), and
    /// the servers asked.
    commands: u64,
    reads: u64,
    servers: u64,
    /// Redis floor: `SET NX` sent.
    attempts: u64,
    /// zklock on ZooKeeper: requests, predecessor events.
    requests: u64,
    events: u64,
    /// The naive herd: requests, watch events.
    naive_requests: u64,
    naive_events: u64,
}

impl Counters {
    async fn read(
        setup: &Setup,
        contenders: &[Arc<Contender>],
        redis_admin: &mut [MultiplexedConnection],
    ) -> Result<Counters> {
        let (commands, reads) = redis_totals(redis_admin).await?;
        let (requests, events) = zk_stats(contenders);
        Ok(Counters {
            commands,
            reads,
            servers: redis_admin.len() as u64,
            attempts: setup.attempts.load(Ordering::SeqCst),
            requests,
            events,
            naive_requests: setup.naive.requests.load(Ordering::SeqCst),
            naive_events: setup.naive.events.load(Ordering::SeqCst),
        })
    }

    /// What happened between `before` and `self`; less the first `INFO` itself on each server
    /// (one command, one read), counted once it had run.
    fn since(self, before: Counters) -> Counters {
        Counters {
            commands: (self.commands - before.commands).saturating_sub(self.servers),
            reads: (self.reads - before.reads).saturating_sub(self.servers),
            servers: self.servers,
            attempts: self.attempts - before.attempts,
            requests: self.requests - before.requests,
            events: self.events - before.events,
            naive_requests: self.naive_requests - before.naive_requests,
            naive_events: self.naive_events - before.naive_events,
        }
    }
}

/// Worker `w`'s task: one untimed cycle on its first key, then (once the gate opens) `cycles`
/// timed ones, each on one of `keys` keys.
fn worker(
    w: usize,
    contender: Arc<Contender>,
    keys: usize,
    cycles: usize,
    overlap: Arc<Overlap>,
    gate: Arc<Gate>,
) -> tokio::task::JoinHandle<Result<Tally>> {
    tokio::spawn(async move {
        let mut rng = StdRng::seed_from_u64(w as u64);
        // Untimed: each worker's first acquire (which may create the lock's path).
        let first = async { contender.acquire(w % keys).await?.release().await }.await;
        gate.ready().await;
        first?;
        let mut tally = Tally::with_capacity(cycles);
        for _ in 0..cycles {
            let k = if keys > 1 { rng.gen_range(0..keys) } else { 0 };
            let t0 = Instant::now();
            let held = contender.acquire(k).await?;
            let waited = t0.elapsed();
            // The floor excludes nobody: it runs the same section (for the same timing) but
            // its overlaps are not violations.
            let changed = overlap.critical_section(k, w).await;
            held.release().await?;
            tally.record(t0, waited, changed);
        }
        Ok(tally)
    })
}

/// Opens the run's sessions (one per worker; one for `inproc`) and warms up on a key of its own,
/// as CuratorBench does.
async fn open(options: &Options, setup: &Setup, keys: usize) -> Result<Vec<Arc<Contender>>> {
    let sessions = if options.workload == Workload::Inproc {
        1
    } else {
        options.workers
    };
    let contenders: Vec<Arc<Contender>> =
        futures::future::try_join_all((0..sessions).map(|_| setup.contender(options, keys)))
            .await?
            .into_iter()
            .map(Arc::new)
            .collect();
    if let Some(map) = &setup.cluster {
        for c in &contenders {
            c.reach_every_primary(map).await?;
        }
    }
    for _ in 0..options.warmup {
        contenders[0].acquire(keys).await?.release().await?;
    }
    for c in &contenders {
        c.flush().await;
    }
    Ok(contenders)
}

pub(crate) async fn run(options: &Options) -> Result<Report> {
    let keys = if options.workload == Workload::Keys {
        options.keys.max(1)
    } else {
        1
    };
    let setup = Setup::new(options, keys).await?;
    let contenders = open(options, &setup, keys).await?;
    // The servers whose counters count the run: the one server (or the Sentinels' primary),
    // or every primary of a Cluster.
    let mut redis_admin = redis_admin(options, &setup).await?;
    // On a Cluster: how the timed keys spread over the primaries (`CLUSTER KEYSLOT`).
    let spread = match &setup.cluster {
        Some(map) => {
            let names = contenders[0].cluster_keys();
            Some(map.spread(&names[..keys.min(names.len())]).await?)
        }
        None => None,
    };
    let overlap = Arc::new(Overlap::new(keys));
    let gate = Arc::new(Gate::new(options.workers));
    let tasks: Vec<_> = (0..options.workers)
        .map(|w| {
            let contender = contenders[w % contenders.len()].clone();
            worker(
                w,
                contender,
                keys,
                options.cycles,
                overlap.clone(),
                gate.clone(),
            )
        })
        .collect();
    gate.all_ready().await;
    let before = Counters::read(&setup, &contenders, &mut redis_admin).await?;
    let window = gate.open(options.server_pid);
    let mut tally = Tally::gather(tasks).await?;
    let window = window.close();
    let elapsed = window.elapsed;
    for c in &contenders {
        c.flush().await;
    }
    let counted = Counters::read(&setup, &contenders, &mut redis_admin)
        .await?
        .since(before);

    let mut report = Report::new();
    report.push("peer", options.peer);
    report.push("workload", options.workload);
    report.push("workers", options.workers);
    let cycles = tally.latencies.len() as u64;
    report.push_ops(elapsed, &mut tally.latencies);
    window.push_cpu(cycles, &mut report);
    if options.workers > 1 {
        report.push_contention(elapsed, tally.changes, tally.max_wait_ns);
    }
    if options.peer != Peer::Floor {
        report.push("violations", overlap.violations.load(Ordering::SeqCst));
    }
    if options.workload == Workload::Keys {
        report.push("keys", keys);
    }
    if is_redis(&options.connect) {
        push_redis(&mut report, options, counted, cycles);
        if let Some(spread) = spread {
            report.push("primaries", redis_admin.len());
            report.push("keys_per_primary", spread);
        }
    } else {
        push_zookeeper(&mut report, options, counted, cycles);
    }
    drop(contenders);
    if !is_redis(&options.connect) {
        setup.cleanup().await;
    }
    Ok(report)
}

/// `n / cycles` with two decimals.
pub(crate) fn per(n: u64, cycles: u64) -> String {
    format!("{:.2}", n as f64 / cycles.max(1) as f64)
}

/// A Redis run's figures per cycle.
fn push_redis(report: &mut Report, options: &Options, counted: Counters, cycles: u64) {
    report.push(
        "backend",
        if is_sentinel(&options.connect) {
            "redis-sentinel"
        } else if is_cluster(&options.connect) {
            "redis-cluster"
        } else {
            "redis"
        },
    );
    // No server counted over TLS (see `redis_admin`).
    if counted.servers > 0 {
        report.push("round_trips_per_cycle", per(counted.reads, cycles));
        report.push("commands_per_cycle", per(counted.commands, cycles));
    }
    match options.peer {
        Peer::Zklock => {
            report.push("local_queue", local_queue_field(options));
            if !options.fencing_tokens {
                report.push("fencing_tokens", "off");
            }
            if options.replica_acks > 0 {
                report.push("replica_acks", options.replica_acks);
            }
        }
        Peer::Floor => report.push("set_nx_per_cycle", per(counted.attempts, cycles)),
        _ => {}
    }
}

/// A ZooKeeper run's figures per cycle.
fn push_zookeeper(report: &mut Report, options: &Options, counted: Counters, cycles: u64) {
    match options.peer {
        Peer::Zklock => {
            report.push("requests_per_cycle", per(counted.requests, cycles));
            report.push("events_per_cycle", per(counted.events, cycles));
            report.push("local_queue", local_queue_field(options));
            if !options.linger.is_zero() {
                report.push("linger_ms", options.linger.as_millis());
            }
        }
        Peer::Naive => {
            // Each cycle's delete is one request the counters do not see.
            report.push(
                "requests_per_cycle",
                per(counted.naive_requests + cycles, cycles),
            );
            report.push("events_per_release", per(counted.naive_events, cycles));
        }
        Peer::Floor => report.push("requests_per_cycle", "2.00"),
        Peer::Zkclient | Peer::Rslock | Peer::LockService => {}
    }
}

/// `on` / `off`: whether the manager queued this process's tasks locally behind one znode.
pub(crate) fn local_queue_field(options: &Options) -> &'static str {
    if options.local_queue {
        "on"
    } else {
        "off"
    }
}
