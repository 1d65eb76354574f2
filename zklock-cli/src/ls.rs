//! `zklock ls`: the locks that have holders or waiters, one line each.

use zklock_core::{LockInfo, LockManager};

use crate::durations::age;

/// Prints the locks under the namespace whose keys start with `prefix`.
pub(crate) async fn ls(manager: &LockManager, prefix: &str) -> zklock_core::Result<u8> {
    let locks = manager.list(prefix).await?;
    if locks.is_empty() {
        println!(
            "no locks held or waited for under {}{}",
            manager.namespace(),
            if prefix.is_empty() {
                String::new()
            } else {
                format!(" with prefix {prefix:?}")
            }
        );
        return Ok(0);
    }
    println!(
        "{:<32} {:<9} {:<40} {:>7} {:>6} {:>14}",
        "KEY", "KIND", "HOLDERS", "WAITERS", "AGE", "TOKEN"
    );
    for lock in locks {
        print_line(&lock);
    }
    Ok(0)
}

/// One lock's line: key, kind, holders, waiters, how long the first holder has held it, and its
/// token.
fn print_line(lock: &LockInfo) {
    let holders: Vec<String> = lock.holders.iter().map(|h| h.owner.to_string()).collect();
    let (held_for, token) = match lock.holders.first() {
        Some(h) => (age(h), h.token.to_string()),
        None => ("-".into(), "-".into()),
    };
    let holders = if holders.is_empty() {
        "-".to_string()
    } else {
        holders.join(", ")
    };
    println!(
        "{:<32} {:<9} {:<40} {:>7} {:>6} {:>14}",
        lock.key,
        lock.kind,
        holders,
        lock.waiters.len(),
        held_for,
        token
    );
}
