//! `zklock top`: the lock table refreshed live, like top(1), the locks waited for longest
//! first.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use zklock_core::{Contender, LockInfo, LockManager};

use crate::args::TopArgs;
use crate::durations::short;
use crate::supervise::signal;

/// One line of `zklock top`.
struct TopRow {
    key: String,
    kind: String,
    holders: String,
    waiters: usize,
    /// How long the longest waiter has waited.
    longest_wait: Option<Duration>,
    /// How long the first holder has held it.
    held: Option<Duration>,
    token: String,
}

impl TopRow {
    fn of(lock: &LockInfo) -> TopRow {
        let holders: Vec<String> = lock.holders.iter().map(|h| h.owner.to_string()).collect();
        TopRow {
            key: lock.key.clone(),
            kind: lock.kind.to_string(),
            holders: if holders.is_empty() {
                "-".into()
            } else {
                holders.join(", ")
            },
            waiters: lock.waiters.len(),
            longest_wait: lock.waiters.iter().map(Contender::age).max(),
            held: lock.holders.iter().map(Contender::age).max(),
            token: lock
                .holders
                .first()
                .map_or_else(|| "-".into(), |h| h.token.to_string()),
        }
    }
}

/// The lines of `zklock top` for `locks`: the longest wait first, then the longest hold.
fn top_rows(locks: &[LockInfo]) -> Vec<TopRow> {
    let mut rows: Vec<TopRow> = locks.iter().map(TopRow::of).collect();
    rows.sort_by(|a, b| {
        (b.longest_wait, b.held)
            .cmp(&(a.longest_wait, a.held))
            .then_with(|| a.key.cmp(&b.key))
    });
    rows
}

/// `zklock top`: the lock table every `--interval`, `--iterations` times (or until Ctrl-C).
pub(crate) async fn top(manager: &LockManager, args: &TopArgs) -> zklock_core::Result<u8> {
    let frames = if args.once { Some(1) } else { args.iterations };
    let terminal = std::io::stdout().is_terminal();
    let mut int = signal(libc::SIGINT);
    let mut shown = 0u64;
    loop {
        let locks = manager.list(&args.prefix).await?;
        let mut out = String::new();
        if terminal {
            // Home and clear, as top(1) redraws.
            out.push_str("\x1b[H\x1b[2J");
        } else if shown > 0 {
            out.push('\n');
        }
        out.push_str(&frame(manager.namespace(), &args.prefix, &top_rows(&locks)));
        let mut stdout = std::io::stdout().lock();
        // A closed pipe (`zklock top | head`) ends the watch quietly.
        if stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return Ok(0);
        }
        drop(stdout);
        shown += 1;
        if frames.is_some_and(|n| shown >= n) {
            return Ok(0);
        }
        tokio::select! {
            _ = tokio::time::sleep(args.interval) => {}
            _ = int.recv() => return Ok(0),
        }
    }
}

/// One table: the summary line (locks, waiters, namespace, prefix, time), the header, the rows.
fn frame(namespace: &str, prefix: &str, rows: &[TopRow]) -> String {
    let mut out = String::new();
    let waiting: usize = rows.iter().map(|r| r.waiters).sum();
    out.push_str(&format!(
        "zklock top: {} locks, {} waiters under {}{} at {}\n",
        rows.len(),
        waiting,
        namespace,
        if prefix.is_empty() {
            String::new()
        } else {
            format!(" (prefix {prefix:?})")
        },
        humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
    ));
    out.push_str(&format!(
        "{:<32} {:<9} {:<36} {:>7} {:>12} {:>8} {:>14}\n",
        "KEY", "KIND", "HOLDERS", "WAITERS", "LONGEST WAIT", "HELD", "TOKEN"
    ));
    for r in rows {
        out.push_str(&format!(
            "{:<32} {:<9} {:<36} {:>7} {:>12} {:>8} {:>14}\n",
            r.key,
            r.kind,
            r.holders,
            r.waiters,
            short(r.longest_wait),
            short(r.held),
            r.token
        ));
    }
    out
}
