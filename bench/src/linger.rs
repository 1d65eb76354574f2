//! The `handover` workload: what zklock's linger costs the first other process that wants a
//! lingering key, beside a normal handoff and an acquire of a free key.

use std::time::{Duration, Instant};

use crate::peer::zklock_manager;
use crate::{run_root, BenchError, Options, Peer, Report, Result};

const KEY: &str = "handover";

/// `p`-th percentile of `samples` (sorted in place), in µs.
fn percentile(samples: &mut [Duration], p: f64) -> u128 {
    samples.sort();
    let at = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples.get(at).map_or(0, |d| d.as_micros())
}

/// Each cycle measures, on one key and three managers of their own sessions:
/// - `lingering`: a session (`linger` on) takes the key twice and lets go, so that its node
///   lingers; then a second session's acquire, from the call to the grant;
/// - `handoff`: a session (linger off) holds the key and a second session queues behind it
///   (its node created and given time to set its watch); from the holder's release call to
///   the waiter's grant;
/// - `free`: the second session's acquire of the free key.
pub(crate) async fn handover(options: &Options) -> Result<Report> {
    if options.peer != Peer::Zklock {
        return Err(BenchError("handover measures zklock's linger only".into()));
    }
    let root = run_root(Peer::Zklock);
    let lingering = zklock_manager(options, &root).await?;
    let plain_options = Options {
        linger: Duration::ZERO,
        ..options.clone()
    };
    let holder = zklock_manager(&plain_options, &root).await?;
    let other = zklock_manager(&plain_options, &root).await?;
    let path = other.path_of(KEY)?;
    let client = holder
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
    let (mut on_linger, mut on_handoff, mut on_free) = (vec![], vec![], vec![]);
    for _ in 0..options.cycles {
        // 1. The first other process on a lingering node.
        lingering.lock(KEY).await?.release().await?;
        lingering.lock(KEY).await?.release().await?;
        let t0 = Instant::now();
        let g = other.lock(KEY).await?;
        on_linger.push(t0.elapsed());
        g.release().await?;
        lingering.flush().await;
        other.flush().await;

        // 2. A normal handoff between two sessions.
        let held = holder.lock(KEY).await?;
        let waiter = {
            let other = other.clone();
            tokio::spawn(async move {
                let g = other.lock(KEY).await;
                (Instant::now(), g)
            })
        };
        while client.list_children(&path).await.map_or(0, |c| c.len()) < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The waiter lists and watches the nodes ahead of it after its create.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t0 = Instant::now();
        held.release().await?;
        let (granted, g) = waiter
            .await
            .map_err(|e| BenchError(format!("waiter panicked: {e}")))?;
        on_handoff.push(granted - t0);
        g?.release().await?;
        holder.flush().await;
        other.flush().await;

        // 3. An acquire of the free key.
        let t0 = Instant::now();
        let g = other.lock(KEY).await?;
        on_free.push(t0.elapsed());
        g.release().await?;
        other.flush().await;
    }
    let mut report = Report::new();
    report.push("peer", Peer::Zklock);
    report.push("workload", options.workload);
    report.push("cycles", options.cycles);
    report.push("linger_ms", options.linger.as_millis());
    let linger_p50 = percentile(&mut on_linger, 0.5);
    let handoff_p50 = percentile(&mut on_handoff, 0.5);
    let free_p50 = percentile(&mut on_free, 0.5);
    report.push("linger_wait_p50_us", linger_p50);
    report.push("linger_wait_p99_us", percentile(&mut on_linger, 0.99));
    report.push("handoff_wait_p50_us", handoff_p50);
    report.push("handoff_wait_p99_us", percentile(&mut on_handoff, 0.99));
    report.push("free_acquire_p50_us", free_p50);
    report.push("free_acquire_p99_us", percentile(&mut on_free, 0.99));
    report.push(
        "wait_ratio",
        format!("{:.2}", linger_p50 as f64 / handoff_p50.max(1) as f64),
    );
    report.push(
        "free_ratio",
        format!("{:.2}", linger_p50 as f64 / free_p50.max(1) as f64),
    );
    Ok(report)
}
