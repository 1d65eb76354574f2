//! Drain: waiters queued in one process behind a held lock, then released; the time for the
//! whole queue to pass through.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ops::{local_queue_field, zk_stats};
use crate::peer::{Contender, Setup};
use crate::server::{backend_queued, ServerProbe, Settled};
use crate::window::Overlap;
use crate::{BenchError, Options, Peer, Report, Result};

pub(crate) async fn run(options: &Options) -> Result<Report> {
    if options.peer == Peer::Floor {
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
            overlap.critical_section(0, w).await;
            held.release().await?;
            Ok::<_, BenchError>(())
        }));
    }
    wait_queued(options, &setup, &contender, &started, waiters, None).await?;

    let contenders = [contender.clone()];
    let (requests_before, events_before) = zk_stats(&contenders);
    let naive_before = (
        setup.naive.requests.load(Ordering::SeqCst),
        setup.naive.events.load(Ordering::SeqCst),
    );
    let t0 = Instant::now();
    first.release().await?;
    for task in tasks {
        task.await
            .map_err(|e| BenchError(format!("waiter panicked: {e}")))??;
    }
    let secs = t0.elapsed().as_secs_f64();
    contender.flush().await;
    let (requests_after, events_after) = zk_stats(&contenders);

    let n = waiters as f64;
    let mut report = Report::new();
    report.push("peer", options.peer);
    report.push("workload", "drain");
    report.push("waiters", waiters);
    report.push("secs", format!("{secs:.3}"));
    report.push("handoffs_per_s", format!("{:.1}", n / secs.max(1e-9)));
    report.push("violations", overlap.violations.load(Ordering::SeqCst));
    report.push("us_per_waiter", format!("{:.1}", secs * 1e6 / n));
    match options.peer {
        Peer::Zklock => {
            report.push(
                "requests_per_handoff",
                format!("{:.2}", (requests_after - requests_before) as f64 / n),
            );
            report.push(
                "events_per_handoff",
                format!("{:.2}", (events_after - events_before) as f64 / n),
            );
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
        Peer::Zkclient | Peer::Floor | Peer::Rslock | Peer::LockService => {}
    }
    drop(contenders);
    drop(contender);
    setup.cleanup().await;
    Ok(report)
}

/// Waits until every waiter is queued: its node exists (a znode recipe), its watch is set (the
/// naive peer), or, with zklock's local queue, every task has started and the manager has
/// gone quiet. zklock on Redis or PostgreSQL (given the `probe` of its server): what the
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
            while started.load(Ordering::SeqCst) < waiters {
                tokio::time::sleep(poll).await;
            }
            let manager = contender.manager().expect("a zklock contender");
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
        _ => {
            while contender.children(0).await?.len() < waiters + 1 {
                tokio::time::sleep(poll).await;
            }
        }
    }
    Ok(None)
}
