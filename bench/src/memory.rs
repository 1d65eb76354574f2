//! Memory probes: the resident set of one process with many tasks waiting on one key, or with
//! many distinct keys held; on ZooKeeper, Redis, PostgreSQL and MySQL.
//!
//! On Redis, PostgreSQL and MySQL the line also carries `backend=`, the connections the process
//! holds on the server at the moment of the figure (`server_connections`, counted by a probe
//! connection of its own, see [`crate::server`]) and, for `mem-waiters`, the waiters the
//! server shows on the lock (`backend_waiters`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::drain::wait_queued;
use crate::ops::local_queue_field;
use crate::peer::{is_mysql, is_redis, Setup};
use crate::server::ServerProbe;
use crate::{BenchError, Options, Peer, Report, Result, Workload};

/// A number field of `/proc/self/status`: in kB for `VmRSS` and `VmHWM`, a count for
/// `Threads`; 0 where there is none.
///
/// ```
/// assert!(zklock_bench::status_kb("VmRSS") > 0);
/// assert_eq!(zklock_bench::status_kb("NoSuchField"), 0);
/// ```
pub fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let rest = line.strip_prefix(field)?.strip_prefix(':')?;
                rest.split_whitespace().next()?.parse().ok()
            })
        })
        .unwrap_or(0)
}

pub(crate) async fn run(options: &Options) -> Result<Report> {
    if options.peer != Peer::Zklock {
        return Err(BenchError(
            "the memory probes measure zklock (Curator's: bench/java/CuratorMem.java)".into(),
        ));
    }
    let tasks = options.workers;
    let setup = Setup::new(options, 1).await?;
    let contender = Arc::new(setup.contender(options, 1).await?);
    let manager = contender.manager().expect("a zklock contender").clone();
    contender.acquire(0).await?.release().await?;
    manager.flush().await;
    // Opened before the base figure: its connection is in every figure alike.
    let mut probe = ServerProbe::open(&options.connect).await?;
    let base_kb = status_kb("VmRSS");
    let t0 = Instant::now();

    let mut report = Report::new();
    report.push("peer", options.peer);
    report.push("workload", options.workload);
    report.push("tasks", tasks);
    // What the server shows at the figure: (connections, waiters on the lock).
    let mut seen: Option<(u64, Option<usize>)> = None;
    match options.workload {
        Workload::MemWaiters => {
            let first = contender.acquire(0).await?;
            let started = Arc::new(AtomicUsize::new(0));
            let mut waiters = Vec::with_capacity(tasks);
            for _ in 0..tasks {
                let contender = contender.clone();
                let started = started.clone();
                waiters.push(tokio::spawn(async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    let held = contender.acquire(0).await?;
                    held.release().await?;
                    Ok::<_, BenchError>(())
                }));
            }
            let settled =
                wait_queued(options, &setup, &contender, &started, tasks, probe.as_mut()).await?;
            let secs = t0.elapsed().as_secs_f64();
            push_rss(&mut report, base_kb, tasks, secs);
            seen = settled.map(|s| (s.connections, Some(s.backend_waiters)));
            // A waiter that ended (its acquire failed) was not waiting: the figure is not one
            // of `tasks` waiters.
            if let Some(ended) = waiters.iter().position(|w| w.is_finished()) {
                for w in &waiters {
                    w.abort();
                }
                let ended = waiters.swap_remove(ended);
                let why = match ended.await {
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(())) => "it was granted while the first task held the key".into(),
                    Err(e) => format!("it panicked: {e}"),
                };
                return Err(BenchError(format!(
                    "a waiter ended before the figure was taken, so fewer than {tasks} tasks \
                     waited: {why}"
                )));
            }
            // Cancel the waiters: each removes its node (cancel safety), then release.
            for w in &waiters {
                w.abort();
            }
            for w in waiters {
                let _ = w.await;
            }
            first.release().await?;
        }
        Workload::MemKeys => {
            let acquires = (0..tasks).map(|i| {
                let manager = manager.clone();
                tokio::spawn(
                    async move { Ok::<_, BenchError>(manager.lock(&format!("m{i}")).await?) },
                )
            });
            let mut guards = Vec::with_capacity(tasks);
            for acquire in acquires.collect::<Vec<_>>() {
                guards.push(
                    acquire
                        .await
                        .map_err(|e| BenchError(format!("acquire panicked: {e}")))??,
                );
            }
            let secs = t0.elapsed().as_secs_f64();
            push_rss(&mut report, base_kb, tasks, secs);
            if let Some(probe) = &mut probe {
                seen = Some((probe.connections().await?, None));
            }
            drop(guards);
        }
        _ => unreachable!("not a memory workload"),
    }
    report.push("local_queue", local_queue_field(options));
    if let Some((connections, waiters)) = seen {
        let backend = if is_redis(&options.connect) {
            "redis"
        } else if is_mysql(&options.connect) {
            "mysql"
        } else {
            "postgres"
        };
        report.push("backend", backend);
        report.push("server_connections", connections);
        if let Some(waiters) = waiters {
            report.push("backend_waiters", waiters);
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(60), manager.flush()).await;
    drop(manager);
    drop(contender);
    setup.cleanup().await;
    Ok(report)
}

fn push_rss(report: &mut Report, base_kb: u64, tasks: usize, secs: f64) {
    let rss_kb = status_kb("VmRSS");
    let peak_kb = status_kb("VmHWM");
    report.push("secs", format!("{secs:.3}"));
    report.push("rss_base_kb", base_kb);
    report.push("rss_kb", rss_kb);
    report.push("peak_kb", peak_kb);
    report.push(
        "peak_per_task_kb",
        format!(
            "{:.2}",
            peak_kb.saturating_sub(base_kb) as f64 / tasks.max(1) as f64
        ),
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_its_own_status() {
        let rss = super::status_kb("VmRSS");
        assert!(rss > 0);
        assert!(super::status_kb("VmHWM") >= rss);
        assert_eq!(super::status_kb("NoSuchField"), 0);
    }
}
