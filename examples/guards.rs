//! Guards: lock, try_lock, a timeout, the fencing token, the loss signal, and re-entry.
//!
//! `cargo run --example guards` (starts its own ZooKeeper; or set ZKLOCK_CONNECT).

mod common;

use std::time::Duration;

use zklock::LockManager;

#[tokio::main]
async fn main() -> zklock::Result<()> {
    let (_server, connect) = common::zookeeper();
    let a = LockManager::connect(&connect).await?; // one instance of the service
    let b = LockManager::connect(&connect).await?; // another instance

    let guard = a.lock("report").await?;
    println!("a holds report, token {}", guard.fencing_token());
    println!(
        "b try_lock: {:?}",
        b.try_lock("report").await?.map(|g| g.fencing_token())
    );
    match b.lock_timeout("report", Duration::from_millis(300)).await {
        Err(e) => println!("b with a timeout: {e}"),
        Ok(_) => unreachable!("a holds it"),
    }

    // Re-entry: inside a frame, taking the same key again costs nothing.
    guard
        .scope(async {
            a.with_lock("report", async {
                println!("re-entered, holds: {}", guard.hold_count())
            })
            .await
        })
        .await?;

    // Loss is reported: race the work against guard.lost().
    tokio::select! {
        reason = guard.lost() => println!("lost: {reason}"),
        _ = tokio::time::sleep(Duration::from_millis(100)) => println!("work done while held: {}", guard.is_held()),
    }
    guard.release().await?;
    let next = b.lock("report").await?;
    println!(
        "b holds report now, token {} (larger)",
        next.fencing_token()
    );
    Ok(())
}
