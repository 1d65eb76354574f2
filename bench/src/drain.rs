//! Drain: waiters queued in one process behind a held lock, then released; the time for the
//! whole queue to pass through.
//!
//! On ZooKeeper and on Redis (a `redis://` connect string); PostgreSQL's drain is in the
//! `postgres` module, MySQL's in the `mysql` module. On Redis the floor's waiters spin on `SET NX` (it excludes, but keeps
//! no queue) and rslock's retry after its own random pause; both have a line, beside zklock's
//! local queue. The line's `p50_us` and `p99_us` are the gaps between successive grants: one
//! handoff, from a holder's grant through its release to the next waiter's grant.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ops::{local_queue_field, per, redis_admin, redis_totals, zk_stats};
use crate::peer::{is_cluster, is_redis, is_sentinel, Contender, Setup};
use crate::server::{backend_queued, ServerProbe, Settled};
use crate::window::Overlap;
use crate::{BenchError, Options, Peer, Report, Result};

pub(crate) async fn run(options: &Options) -> Result<Report> {
    let redis = is_redis(&options.connect);
    if options.peer == Peer::Floor && !redis {
        return Err(BenchError(
            "the floor excludes nobody: it has no queue to drain".into(),
        ));
    }
    let waiters = options.workers;
    let setup = Setup::new(options, 1).await?;
    let contender = Arc::new(setup.contender(options, 1).await?);
    // Warm the session and the lock path.
    contender.acquire(0).await?.release().await?;
    contender.flush().await;
    let mut servers = redis_admin(options, &setup).await?;

    let first = contender.acquire(0).await?;
    let overlap = Arc::new(Overlap::new(1));
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(waiters);
    for w in 0..waiters {
        let contender = contender.clone();
        let overlap = overlap.clone();
        let started = started.clone();
        tasks.push(tokio::spawn(async move {
            started.fetch_add(1, Ordering::SeqCst);
            let held = contender.acquire(0).await?;
            let granted = Instant::now();
            overlap.critical_section(0, w).await;
            held.release().await?;
            Ok::<_, BenchError>(granted)
        }));
    }
    wait_queued(options, &setup, &contender, &started, waiters, None).await?;

    let contenders = [contender.clone()];
    let (requests_before, events_before) = zk_stats(&contenders);
    let naive_before = (
        setup.naive.requests.load(Ordering::SeqCst),
        setup.naive.events.load(Ordering::SeqCst),
    );
    let attempts_before = setup.attempts.load(Ordering::SeqCst);
    let redis_before = redis_totals(&mut servers).await?;
    let (t0, grants, secs) = release_and_collect(first.release(), tasks).await?;
    contender.flush().await;
    let (requests_after, events_after) = zk_stats(&contenders);
    let attempts = setup.attempts.load(Ordering::SeqCst) - attempts_before;
    let redis_after = redis_totals(&mut servers).await?;

    let n = waiters as f64;
    let mut report = line(options, secs, t0, grants, &overlap);
    if redis {
        // Less the first `INFO` on each server (one command, one read).
        let asked = servers.len() as u64;
        let commands = (redis_after.0 - redis_before.0).saturating_sub(asked);
        let reads = (redis_after.1 - redis_before.1).saturating_sub(asked);
        let backend = if is_sentinel(&options.connect) {
            "redis-sentinel"
        } else if is_cluster(&options.connect) {
            "redis-cluster"
        } else {
            "redis"
        };
        report.push("backend", backend);
        // No server counted over TLS (see `redis_admin`).
        if asked > 0 {
            report.push("round_trips_per_cycle", per(reads, waiters as u64));
            report.push("commands_per_cycle", per(commands, waiters as u64));
        }
    }
    match options.peer {
        Peer::Zklock => {
            if !redis {
                report.push(
                    "requests_per_handoff",
                    format!("{:.2}", (requests_after - requests_before) as f64 / n),
                );
                report.push(
                    "events_per_handoff",
                    format!("{:.2}", (events_after - events_before) as f64 / n),
                );
            }
            report.push("local_queue", local_queue_field(options));
        }
        Peer::Naive => {
            let requests = setup.naive.requests.load(Ordering::SeqCst) - naive_before.0;
            let events = setup.naive.events.load(Ordering::SeqCst) - naive_before.1;
            // Creates and exists-watches counted by the peer, plus one delete per release.
            report.push(
                "requests_per_handoff",
                format!("{:.2}", (requests as f64 + n + 1.0) / n),
            );
            report.push("events_per_release", format!("{:.2}", events as f64 / n));
        }
        Peer::Floor => report.push("set_nx_per_cycle", per(attempts, waiters as u64)),
        Peer::Zkclient | Peer::Rslock | Peer::LockService => {}
    }
    drop(contenders);
    drop(contender);
    if !redis {
        setup.cleanup().await;
    }
    Ok(report)
}

/// The fields every drain line starts with, for a queue released at `t0` that passed through
/// in `secs`, its waiters granted at `grants`: `p50_us` and `p99_us` are the gaps between
/// successive grants (the first from `t0`).
pub(crate) fn line(
    options: &Options,
    secs: f64,
    t0: Instant,
    mut grants: Vec<Instant>,
    overlap: &Overlap,
) -> Report {
    let n = options.workers as f64;
    let mut report = Report::new();
    report.push("peer", options.peer);
    report.push("workload", "drain");
    report.push("waiters", options.workers);
    report.push("secs", format!("{secs:.3}"));
    report.push("handoffs_per_s", format!("{:.1}", n / secs.max(1e-9)));
    report.push("violations", overlap.violations.load(Ordering::SeqCst));
    report.push("us_per_waiter", format!("{:.1}", secs * 1e6 / n));
    grants.sort_unstable();
    let mut gaps: Vec<u64> = grants
        .iter()
        .scan(t0, |last, &at| {
            let gap = at.saturating_duration_since(*last);
            *last = at;
            Some(gap.as_micros() as u64)
        })
        .collect();
    gaps.sort_unstable();
    let pct = |q: f64| {
        gaps.get(((gaps.len() as f64 * q) as usize).min(gaps.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    report.push("p50_us", pct(0.5));
    report.push("p99_us", pct(0.99));
    report
}

/// Releases the hold the queue waits behind (`release`) and collects every waiter's grant
/// time: the time of the release's start, the grants, and the seconds from then until the last
/// waiter was done.
pub(crate) async fn release_and_collect(
    release: impl std::future::Future<Output = Result<()>>,
    tasks: Vec<tokio::task::JoinHandle<Result<Instant>>>,
) -> Result<(Instant, Vec<Instant>, f64)> {
    let t0 = Instant::now();
    release.await?;
    let mut grants = Vec::with_capacity(tasks.len());
    for task in tasks {
        grants.push(
            task.await
                .map_err(|e| BenchError(format!("waiter panicked: {e}")))??,
        );
    }
    Ok((t0, grants, t0.elapsed().as_secs_f64()))
}

/// Until every one of `waiters` tasks has started its acquire (counted in `started`), and
/// `manager` (with its local queue on) has sent nothing for 200 ms.
pub(crate) async fn wait_local_queue(
    manager: &zklock_core::LockManager,
    started: &AtomicUsize,
    waiters: usize,
) {
    while started.load(Ordering::SeqCst) < waiters {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut last = manager.stats().requests;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = manager.stats().requests;
        if now == last {
            break;
        }
        last = now;
    }
}

/// Waits until every waiter is queued: its node exists (a znode recipe), its watch is set (the
/// naive peer), or, with zklock's local queue, every task has started and the manager has
/// gone quiet. zklock on Redis, PostgreSQL or MySQL (given the `probe` of its server): what the
/// server shows of the waiters and of the process's connections has settled (see
/// [`backend_queued`]), which is returned.
pub(crate) async fn wait_queued(
    options: &Options,
    setup: &Setup,
    contender: &Contender,
    started: &AtomicUsize,
    waiters: usize,
    probe: Option<&mut ServerProbe>,
) -> Result<Option<Settled>> {
    let poll = Duration::from_millis(50);
    if let Some(probe) = probe {
        if options.peer != Peer::Zklock {
            return Err(BenchError(format!(
                "{} has no waiters to count on this server",
                options.peer
            )));
        }
        let settled = backend_queued(options, contender, started, waiters, probe).await?;
        return Ok(Some(settled));
    }
    match options.peer {
        Peer::Naive => {
            while setup.naive.watching.load(Ordering::SeqCst) < waiters as u64 {
                tokio::time::sleep(poll).await;
            }
        }
        Peer::Zklock if options.local_queue => {
            let manager = contender.manager().expect("a zklock contender");
            wait_local_queue(manager, started, waiters).await;
        }
        _ if is_redis(&options.connect) => {
            while started.load(Ordering::SeqCst) < waiters {
                tokio::time::sleep(poll).await;
            }
            match contender.manager() {
                // zklock without the local queue: every task waits on the server.
                Some(manager) => {
                    let path = contender.lock_dir(0)?;
                    while manager.inspect_path(&path).await?.waiters.len() < waiters {
                        tokio::time::sleep(poll).await;
                    }
                }
                // The floor spins and rslock retries: each has asked (the floor counts its
                // attempts: twice as many as waiters; rslock's first comes at once, and it
                // pauses 0–200 ms between its retries).
                None if options.peer == Peer::Floor => {
                    while setup.attempts.load(Ordering::SeqCst) < 2 * waiters as u64 {
                        tokio::time::sleep(poll).await;
                    }
                }
                None => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
        _ => {
            while contender.children(0).await?.len() < waiters + 1 {
                tokio::time::sleep(poll).await;
            }
        }
    }
    Ok(None)
}
