//! What an operator sees of a lock on MySQL / MariaDB: the holding session from
//! `IS_USED_LOCK`, who it is and its token from the lock's row of `zklock_locks` (written at
//! each grant), and the sessions waiting in `GET_LOCK` for it from the process list (all
//! sessions for an account with the `PROCESS` privilege, else the account's own).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mysql_async::prelude::Queryable;

use super::conn::bounded;
use super::error::{mysql_error, MySqlError};
use super::wire;
use super::MySqlBackend;
use crate::backend::{BoxFuture, Inspect};
use crate::types::error::Result;
use crate::types::inspect::{Contender, LockInfo, LockKind, Owner};
use crate::types::token::FencingToken;

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

/// What the server says of one lock name.
struct Seen {
    holder: Option<i64>,
    row: Option<(i64, String, i64)>,
    waiters: Vec<(i64, i64, String)>,
}

impl MySqlBackend {
    async fn seen(&self, name: &str) -> std::result::Result<Seen, MySqlError> {
        let inner = &self.inner;
        let within = inner.config.reply_timeout;
        let mut conn = inner.take().await?;
        inner.count();
        let holder: Option<Option<i64>> =
            bounded(within, conn.query_first(wire::is_used_lock(name))).await?;
        inner.count();
        let row: Option<(i64, String, i64)> =
            bounded(within, conn.exec_first(wire::ROW, (name,))).await?;
        inner.count();
        let waiters: Vec<(i64, i64, String)> =
            bounded(within, conn.query(wire::waiters(name))).await?;
        inner.give_back(conn);
        Ok(Seen {
            holder: holder.flatten(),
            row,
            waiters,
        })
    }
}

impl Inspect for MySqlBackend {
    fn inspect<'a>(
        &'a self,
        path: &'a str,
        kind: Option<LockKind>,
    ) -> BoxFuture<'a, Result<LockInfo>> {
        Box::pin(async move {
            let name = wire::name(path);
            let kind = kind.unwrap_or(LockKind::Mutex);
            let mode = match kind {
                LockKind::Leader => "leader",
                _ => "mutex",
            };
            let seen = self
                .seen(&name)
                .await
                .map_err(mysql_error("inspect the lock"))?;
            let holders = seen
                .holder
                .map(|session| {
                    let (fence, holder, since) = seen.row.clone().unwrap_or_default();
                    Contender {
                        node: format!("session {session}"),
                        mode,
                        owner: Owner::parse(holder.as_bytes()),
                        since: at_us(since),
                        token: FencingToken::new(fence, 0),
                        session,
                        lingering: false,
                        location: format!("{path} (user lock {name}, session {session})"),
                    }
                })
                .into_iter()
                .collect();
            let now = SystemTime::now();
            // The holder's own GET_LOCK has ended; any other still in the list waits.
            let waiters = seen
                .waiters
                .into_iter()
                .filter(|(session, _, _)| Some(*session) != seen.holder)
                .map(|(session, secs, info)| Contender {
                    node: format!("session {session}"),
                    mode,
                    owner: Owner::parse(wire::who_asked(&info).as_bytes()),
                    since: now - Duration::from_secs(secs.max(0) as u64),
                    token: FencingToken::NONE,
                    session,
                    lingering: false,
                    location: String::new(),
                })
                .collect();
            Ok(LockInfo::at(path, kind, holders, waiters))
        })
    }

    fn lock_paths<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(async move {
            let inner = &self.inner;
            let pattern = format!("{}/%", like_escape(namespace.trim_end_matches('/')));
            let paths = async {
                let mut conn = inner.take().await?;
                inner.count();
                let rows: Vec<(String, String, i64, String, i64)> = bounded(
                    inner.config.reply_timeout,
                    conn.exec(wire::ROWS_UNDER, (pattern,)),
                )
                .await?;
                inner.give_back(conn);
                Ok::<_, MySqlError>(rows.into_iter().map(|r| r.1).collect())
            };
            paths.await.map_err(mysql_error("list the locks"))
        })
    }
}
