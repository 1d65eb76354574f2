//! Semaphore: at most N holders at once across processes.
//!
//! `cargo run --example semaphore` (starts its own ZooKeeper; or set ZKLOCK_CONNECT).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use zklock::LockManager;

#[tokio::main]
async fn main() -> zklock::Result<()> {
    let (_server, connect) = common::zookeeper();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut workers = vec![];
    for instance in 0..3 {
        let manager = LockManager::connect(&connect).await?;
        for _ in 0..3 {
            let (exports, running, peak) = (
                manager.semaphore("exports", 2)?,
                running.clone(),
                peak.clone(),
            );
            workers.push(tokio::spawn(async move {
                let lease = exports.acquire().await?;
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                println!(
                    "instance {instance}: export running ({now} at once, lease {})",
                    lease.fencing_token()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                lease.release().await
            }));
        }
    }
    for w in workers {
        w.await.expect("worker")?;
    }
    println!(
        "9 exports ran, at most {} at once (limit 2)",
        peak.load(Ordering::SeqCst)
    );
    Ok(())
}
