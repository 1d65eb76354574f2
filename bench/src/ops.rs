//! The acquire/release loops: uncontended, contended, keys, inproc.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::peer::{is_redis, redis_connection, Contender, Setup};
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
async fn redis_counters(conn: &mut redis::aio::MultiplexedConnection) -> Result<(u64, u64)> {
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
    let overlap = Arc::new(Overlap::new(keys));
    let check = options.peer != Peer::Floor;
    let gate = Arc::new(Gate::new(options.workers));
    let mut tasks = Vec::with_capacity(options.workers);
    for w in 0..options.workers {
        let contender = contenders[w % sessions].clone();
        let (overlap, gate) = (overlap.clone(), gate.clone());
        let cycles = options.cycles;
        tasks.push(tokio::spawn(async move {
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
                // The floor excludes nobody: it runs the same section (for the same timing)
                // but its overlaps are not violations.
                let changed = overlap.critical_section(k, w).await;
                held.release().await?;
                tally.record(t0, waited, changed);
            }
            Ok::<_, BenchError>(tally)
        }));
    }
    gate.all_ready().await;
    let counters_before = match &mut redis_admin {
        Some(conn) => redis_counters(conn).await?,
        None => (0, 0),
    };
    let attempts_before = setup.attempts.load(Ordering::SeqCst);
    let (requests_before, events_before) = zk_stats(&contenders);
    let naive_before = (
        setup.naive.requests.load(Ordering::SeqCst),
        setup.naive.events.load(Ordering::SeqCst),
    );
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
    let (requests_after, events_after) = zk_stats(&contenders);
    // Less the first INFO itself (one command, one read), counted once it had run.
    let (commands, reads) = match &mut redis_admin {
        Some(conn) => {
            let after = redis_counters(conn).await?;
            (
                (after.0 - counters_before.0).saturating_sub(1),
                (after.1 - counters_before.1).saturating_sub(1),
            )
        }
        None => (0, 0),
    };
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
    if workload == Workload::Keys {
        report.push("keys", keys);
    }
    if redis {
        report.push("backend", "redis");
        report.push("round_trips_per_cycle", format!("{:.2}", reads as f64 / n));
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
