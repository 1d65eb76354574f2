//! The acquire/release loops: uncontended, contended, keys, inproc.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::peer::{is_redis, redis_connection, Contender, Setup};
use crate::{BenchError, Options, Peer, Report, Result, Workload};

/// Counts moments when two holders of one key overlap (CuratorBench's `violations`).
pub(crate) struct Overlap {
    holders: Vec<AtomicUsize>,
    pub(crate) violations: AtomicU64,
}

impl Overlap {
    pub(crate) fn new(keys: usize) -> Overlap {
        Overlap {
            holders: (0..keys).map(|_| AtomicUsize::new(0)).collect(),
            violations: AtomicU64::new(0),
        }
    }

    /// The critical section: enter key `k`, let the other tasks run once, leave.
    pub(crate) async fn critical_section(&self, k: usize) {
        if self.holders[k].fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        tokio::task::yield_now().await;
        self.holders[k].fetch_sub(1, Ordering::SeqCst);
    }
}

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

/// Redis' count of the commands it has processed (`INFO stats`), from a connection of its own.
async fn redis_commands(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .map_err(|e| BenchError(format!("redis INFO: {e}")))?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| BenchError("no total_commands_processed in INFO stats".into()))
}

pub(crate) async fn run(options: &Options) -> Result<Report> {
    let workload = options.workload;
    let redis = is_redis(&options.connect);
    let keys = if workload == Workload::Keys {
        options.keys.max(1)
    } else {
        1
    };
    let sessions = if workload == Workload::Inproc {
        1
    } else {
        options.workers
    };
    let setup = Setup::new(options, keys).await?;
    let contenders: Vec<Arc<Contender>> =
        futures::future::try_join_all((0..sessions).map(|_| setup.contender(options, keys)))
            .await?
            .into_iter()
            .map(Arc::new)
            .collect();

    // Warm-up on its own key, as CuratorBench does.
    for _ in 0..options.warmup {
        contenders[0].acquire(keys).await?.release().await?;
    }
    for c in &contenders {
        c.flush().await;
    }

    let mut redis_admin = match redis {
        true => Some(redis_connection(&options.connect).await?),
        false => None,
    };
    let commands_before = match &mut redis_admin {
        Some(conn) => redis_commands(conn).await?,
        None => 0,
    };
    let attempts_before = setup.attempts.load(Ordering::SeqCst);
    let (requests_before, events_before) = zk_stats(&contenders);
    let naive_before = (
        setup.naive.requests.load(Ordering::SeqCst),
        setup.naive.events.load(Ordering::SeqCst),
    );
    let overlap = Arc::new(Overlap::new(keys));
    let check = options.peer != Peer::Floor;
    let (go, ready) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::with_capacity(options.workers);
    for w in 0..options.workers {
        let contender = contenders[w % sessions].clone();
        let overlap = overlap.clone();
        let mut ready = ready.clone();
        let cycles = options.cycles;
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(w as u64);
            let mut latencies = Vec::with_capacity(cycles);
            let _ = ready.wait_for(|go| *go).await;
            for _ in 0..cycles {
                let k = if keys > 1 { rng.gen_range(0..keys) } else { 0 };
                let t0 = Instant::now();
                let held = contender.acquire(k).await?;
                // The floor excludes nobody: it runs the same section (for the same timing)
                // but its overlaps are not violations.
                overlap.critical_section(k).await;
                held.release().await?;
                latencies.push(t0.elapsed().as_nanos() as u64);
            }
            Ok::<_, BenchError>(latencies)
        }));
    }
    let t0 = Instant::now();
    let _ = go.send(true);
    let mut latencies = Vec::with_capacity(options.workers * options.cycles);
    for task in tasks {
        let mine = task
            .await
            .map_err(|e| BenchError(format!("worker panicked: {e}")))??;
        latencies.extend(mine);
    }
    let elapsed = t0.elapsed();
    for c in &contenders {
        c.flush().await;
    }
    let (requests_after, events_after) = zk_stats(&contenders);
    // Less the first INFO itself, counted once it had run.
    let commands = match &mut redis_admin {
        Some(conn) => (redis_commands(conn).await? - commands_before).saturating_sub(1),
        None => 0,
    };

    let n = latencies.len().max(1) as f64;
    let mut report = Report::new();
    report.push("peer", options.peer);
    report.push("workload", workload);
    report.push("workers", options.workers);
    report.push_ops(elapsed, &mut latencies);
    if check {
        report.push("violations", overlap.violations.load(Ordering::SeqCst));
    }
    if workload == Workload::Keys {
        report.push("keys", keys);
    }
    if redis {
        report.push("backend", "redis");
        report.push("commands_per_cycle", format!("{:.2}", commands as f64 / n));
        match options.peer {
            Peer::Zklock => report.push("local_queue", local_queue_field(options)),
            Peer::Floor => report.push(
                "set_nx_per_cycle",
                format!(
                    "{:.2}",
                    (setup.attempts.load(Ordering::SeqCst) - attempts_before) as f64 / n
                ),
            ),
            _ => {}
        }
        drop(contenders);
        return Ok(report);
    }
    match options.peer {
        Peer::Zklock => {
            report.push(
                "requests_per_cycle",
                format!("{:.2}", (requests_after - requests_before) as f64 / n),
            );
            report.push(
                "events_per_cycle",
                format!("{:.2}", (events_after - events_before) as f64 / n),
            );
            report.push("local_queue", local_queue_field(options));
            if !options.linger.is_zero() {
                report.push("linger_ms", options.linger.as_millis());
            }
        }
        Peer::Naive => {
            let requests = setup.naive.requests.load(Ordering::SeqCst) - naive_before.0;
            let events = setup.naive.events.load(Ordering::SeqCst) - naive_before.1;
            report.push(
                "requests_per_cycle",
                format!("{:.2}", (requests + latencies.len() as u64) as f64 / n),
            );
            report.push("events_per_release", format!("{:.2}", events as f64 / n));
        }
        Peer::Floor => report.push("requests_per_cycle", "2.00"),
        Peer::Zkclient | Peer::Rslock => {}
    }
    drop(contenders);
    setup.cleanup().await;
    Ok(report)
}

/// `on` / `off`: whether the manager queued this process's tasks locally behind one znode.
pub(crate) fn local_queue_field(options: &Options) -> &'static str {
    if options.local_queue {
        "on"
    } else {
        "off"
    }
}
