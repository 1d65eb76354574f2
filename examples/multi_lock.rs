//! Multi-lock: a transfer locks both accounts, all or nothing, in one global order, so two
//! transfers in opposite directions never deadlock.
//!
//! `cargo run --example multi_lock` (starts its own ZooKeeper; or set ZKLOCK_CONNECT).

mod common;

use std::time::Duration;

use zklock::{LockManager, LockSpec};

#[tokio::main]
async fn main() -> zklock::Result<()> {
    let (_server, connect) = common::zookeeper();
    let a = LockManager::connect(&connect).await?;
    let b = LockManager::connect(&connect).await?;
    let transfer = |m: LockManager, from: &'static str, to: &'static str| async move {
        for _ in 0..5 {
            let both = m
                .lock_all(
                    [LockSpec::mutex(from), LockSpec::mutex(to)],
                    Some(Duration::from_secs(10)),
                )
                .await?;
            println!(
                "{from} -> {to} under {:?}",
                both.tokens()
                    .iter()
                    .map(|(_, t)| t.to_string())
                    .collect::<Vec<_>>()
            );
            both.release().await?;
        }
        zklock::Result::Ok(())
    };
    let (x, y) = tokio::join!(
        transfer(a, "account_1", "account_2"),
        transfer(b, "account_2", "account_1")
    );
    x?;
    y?;
    println!("ten transfers in opposite directions, no deadlock");
    Ok(())
}
