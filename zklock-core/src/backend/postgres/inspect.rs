//! What an operator sees of a lock on PostgreSQL, read from the server in one statement:
//! `pg_locks` (who holds the lock, who is blocked on it, which processes registered a waiter,
//! which writer waits), joined with the key table (which path a lock id is, its last token)
//! and `pg_stat_activity` (what each session says about itself: zklock's sessions name their
//! host, pid and identity in `application_name`).
//!
//! A holder's `since` is read from its token where it has one (a token is the server's clock
//! in µs at the grant, or just above the last token); readers share the lock's counter, so
//! they show token 0 and, as `since`, when their session last finished a statement.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::error::{is_undefined_table, pg_error, PostgresError};
use super::wire::{LOCKED_PATHS, LOCK_CLASS, LOCK_STATE, WAIT_CLASS};
use super::PostgresBackend;
use crate::backend::{BoxFuture, Inspect};
use crate::types::error::Result;
use crate::types::inspect::{Contender, LockInfo, LockKind, Owner};
use crate::types::mode::HoldMode;
use crate::types::token::FencingToken;

/// The class of a waiting writer's intent (`zkIN`), as in [`super::wire::INTENT_CLASS`].
const INTENT: i64 = 0x7A6B_494E;

/// Where a hold of lock `id` on `path` says it lives: the lock path, and the advisory lock
/// an administrator finds it by in `pg_locks`.
pub(super) fn location(path: &str, id: i32) -> String {
    format!("{path} (advisory lock {LOCK_CLASS},{id})")
}

fn at_us(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us.max(0) as u64)
}

/// `text` as a literal in a `LIKE` pattern (whose escape character is `\`).
fn like_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

struct Row {
    class: i64,
    granted: bool,
    shared: bool,
    pid: i32,
    name: String,
    since_us: i64,
    fence: i64,
    id: i32,
}

impl PostgresBackend {
    async fn rows(&self, path: &str) -> Result<Vec<Row>, PostgresError> {
        let conn = self.inner.pool.any().await?;
        let rows = conn.run(conn.client().query(LOCK_STATE, &[&path])).await?;
        Ok(rows
            .iter()
            .map(|r| Row {
                class: r.get(0),
                granted: r.get(1),
                shared: r.get(2),
                pid: r.get(3),
                name: r.get(4),
                since_us: r.get(5),
                fence: r.get(6),
                id: r.get(7),
            })
            .collect())
    }

    async fn inspect_at(&self, path: &str, kind: Option<LockKind>) -> Result<LockInfo> {
        let rows = match self.rows(path).await {
            Ok(rows) => rows,
            // No key table yet: no lock was ever taken here.
            Err(e) if is_undefined_table(&e) => vec![],
            Err(e) => return Err(pg_error("inspect a lock")(e)),
        };
        let locks: Vec<&Row> = rows
            .iter()
            .filter(|r| r.class == LOCK_CLASS as i64)
            .collect();
        let kind = kind.unwrap_or(if locks.iter().any(|r| r.shared) {
            LockKind::ReadWrite
        } else {
            LockKind::Mutex
        });
        let contender = |r: &Row, mode: &'static str, token: i64, since: SystemTime| Contender {
            node: format!("pid {}", r.pid),
            mode,
            owner: Owner::parse(r.name.as_bytes()),
            since,
            token: FencingToken::new(token, 0),
            session: r.pid as i64,
            lingering: false,
            location: location(path, r.id),
        };
        let exclusive_mode = HoldMode::exclusive_of(kind).name();
        let mode_of = |r: &Row| {
            if r.shared {
                HoldMode::Read.name()
            } else {
                exclusive_mode
            }
        };
        let mut holders = vec![];
        let mut waiters = vec![];
        // A process whose waiter is blocked on the lock is shown by that waiter, not again by
        // its registration.
        let blocked: Vec<&str> = locks
            .iter()
            .filter(|r| !r.granted)
            .map(|r| r.name.as_str())
            .collect();
        for r in &rows {
            match (r.class, r.granted) {
                (c, true) if c == LOCK_CLASS as i64 && !r.shared => {
                    holders.push(contender(r, mode_of(r), r.fence, at_us(r.fence)))
                }
                (c, true) if c == LOCK_CLASS as i64 => {
                    holders.push(contender(r, mode_of(r), 0, at_us(r.since_us)))
                }
                // Blocked on the server, in the order it will grant them.
                (c, false) if c == LOCK_CLASS as i64 => {
                    waiters.push(contender(r, mode_of(r), 0, at_us(r.since_us)))
                }
                // A writer's intent: it waits, and new readers wait behind it.
                (INTENT, true) => {
                    waiters.push(contender(r, HoldMode::Write.name(), 0, at_us(r.since_us)))
                }
                // A process that registered a waiting task (one entry per process).
                // (Its lock mode is the registration's own, not the wait's: shown as the
                // lock's exclusive mode, which a process that waits to read does not say.)
                (c, true) if c == WAIT_CLASS as i64 && !blocked.contains(&r.name.as_str()) => {
                    waiters.push(contender(r, exclusive_mode, 0, at_us(r.since_us)))
                }
                _ => {}
            }
        }
        Ok(LockInfo::at(path, kind, holders, waiters))
    }

    async fn locked_paths(&self, namespace: &str) -> Result<Vec<String>, PostgresError> {
        let conn = self.inner.pool.any().await?;
        let pattern = format!("{}/%", like_escape(namespace));
        let rows = conn
            .run(conn.client().query(LOCKED_PATHS, &[&pattern]))
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}

impl Inspect for PostgresBackend {
    fn inspect<'a>(
        &'a self,
        path: &'a str,
        kind: Option<LockKind>,
    ) -> BoxFuture<'a, Result<LockInfo>> {
        Box::pin(self.inspect_at(path, kind))
    }

    fn lock_paths<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(async move {
            match self.locked_paths(namespace).await {
                Ok(paths) => Ok(paths),
                Err(e) if is_undefined_table(&e) => Ok(vec![]),
                Err(e) => Err(pg_error("list the locks")(e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_matched_literally() {
        assert_eq!(like_escape("/a_b%c\\"), "/a\\_b\\%c\\\\");
    }

    #[test]
    fn the_statements_name_the_classes_the_locks_use() {
        for class in [LOCK_CLASS as i64, WAIT_CLASS as i64, INTENT] {
            assert!(LOCK_STATE.contains(&class.to_string()));
            assert!(LOCKED_PATHS.contains(&class.to_string()));
        }
        assert_eq!(INTENT, super::super::wire::INTENT_CLASS as i64);
    }
}
