//! Read/write lock: readers share, a writer waits for them and excludes everyone; downgrade.
//!
//! `cargo run --example rwlock` (starts its own ZooKeeper; or set ZKLOCK_CONNECT).

mod common;

use zklock::LockManager;

#[tokio::main]
async fn main() -> zklock::Result<()> {
    let (_server, connect) = common::zookeeper();
    let a = LockManager::connect(&connect).await?;
    let b = LockManager::connect(&connect).await?;
    let (ra, rb) = (a.rwlock("price-table")?, b.rwlock("price-table")?);

    let r1 = ra.read().await?;
    let r2 = rb.read().await?;
    println!(
        "two readers at once: {} and {}",
        r1.fencing_token(),
        r2.fencing_token()
    );
    println!("a writer now? {}", rb.try_write().await?.is_some());
    drop((r1, r2));

    let w = ra.write().await?;
    println!(
        "writer holds, token {}; a reader now? {}",
        w.fencing_token(),
        rb.try_read().await?.is_some()
    );
    let r = w.downgrade().await?;
    println!(
        "downgraded to a read hold ({}); other readers join: {}",
        r.fencing_token(),
        rb.try_read().await?.is_some()
    );
    Ok(())
}
