//! What an operator sees of a lock on Redis, read from its keys in one read-only script (one
//! consistent snapshot): the exclusive holder's id and the lock's last token, the shared set
//! (readers, semaphore leases), a waiting writer's intent, and a mutex's queue of live
//! waiters with the server time each queued at.
//!
//! What the server does not keep cannot be shown: readers and semaphore leases waiting for
//! their lock wait in their own processes (they listen for a release), so only a mutex's
//! queue and a waiting writer appear as waiters; and the token of each reader or lease is not
//! kept apart from the lock's counter, so they show token 0 and, as `since`, the start of
//! their current lease period as this manager's lease reckons it. Nor does a mutex taken
//! without a token (a process with `fencing_tokens(false)`) leave its time: its holder shows
//! the lock's last token and that token's time, the last grant's that had one.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use once_cell::sync::Lazy;
use redis::Script;

use super::conn::Inner;
use super::error::server_error;
use super::wire::keys::{Keys, PREFIX};
use crate::backend::{BoxFuture, Inspect};
use crate::types::error::Result;
use crate::types::inspect::{Contender, LockInfo, LockKind, Owner};
use crate::types::mode::HoldMode;
use crate::types::token::FencingToken;

/// KEYS: exclusive, shared, intent, fence, queue, alive. Answers `{now ms, holder or false,
/// fence or false, {shared member, lease end ms, ...}, intent or false, {queue member,
/// queued µs, ...}, {alive member, alive until ms, ...}}`.
static SNAPSHOT: Lazy<Script> = Lazy::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {
  now,
  redis.call('GET', KEYS[1]),
  redis.call('GET', KEYS[4]),
  redis.call('ZRANGEBYSCORE', KEYS[2], now, '+inf', 'WITHSCORES'),
  redis.call('GET', KEYS[3]),
  redis.call('ZRANGE', KEYS[5], 0, -1, 'WITHSCORES'),
  redis.call('ZRANGEBYSCORE', KEYS[6], now, '+inf', 'WITHSCORES'),
}
"#,
    )
});

type Snapshot = (
    i64,
    Option<String>,
    Option<String>,
    Vec<(String, f64)>,
    Option<String>,
    Vec<(String, f64)>,
    Vec<(String, f64)>,
);

/// Who a holder id is: `<uuid> host=<host> pid=<pid> hub=<hub id>[ id=<identity>]`, or what
/// another client wrote.
fn owner(holder_id: &str) -> Owner {
    match holder_id.split_once(' ') {
        Some((_uuid, tag)) if tag.starts_with("host=") => {
            Owner::parse(format!("zklock {tag}").as_bytes())
        }
        _ => Owner::parse(holder_id.as_bytes()),
    }
}

fn at_ms(ms: f64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0.0) as u64)
}

fn at_us(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us.max(0) as u64)
}

impl Inner {
    async fn snapshot(&self, keys: &Keys) -> Result<Snapshot> {
        let conn = &self.conn;
        conn.run(&keys.exclusive, Some(conn.reply_timeout), |mut c| {
            let mut call = SNAPSHOT.key(&keys.exclusive);
            call.key(&keys.shared)
                .key(&keys.intent)
                .key(&keys.fence)
                .key(&keys.queue)
                .key(&keys.alive);
            async move { call.invoke_async::<Snapshot>(&mut c).await }
        })
        .await
        .map_err(|e| server_error("inspect a lock", e))
    }

    fn contender(
        &self,
        id: &str,
        mode: &'static str,
        since: SystemTime,
        token: i64,
        location: &str,
    ) -> Contender {
        Contender {
            node: id.to_string(),
            mode,
            owner: owner(id),
            since,
            token: FencingToken::new(token, 0),
            session: 0,
            lingering: false,
            location: location.to_string(),
        }
    }

    async fn inspect_at(&self, path: &str, kind: Option<LockKind>) -> Result<LockInfo> {
        let keys = Keys::laid_out(path, self.keys.layout());
        let (now, holder, fence, shared, intent, queue, alive) = self.snapshot(&keys).await?;
        let kind = kind.unwrap_or(if holder.is_some() || !queue.is_empty() {
            LockKind::Mutex
        } else {
            LockKind::ReadWrite
        });
        let lease_ms = self.lease.as_millis() as f64;
        let fence: i64 = fence.and_then(|f| f.parse().ok()).unwrap_or(0);
        let mut holders = vec![];
        let mut waiters = vec![];
        if let Some(id) = &holder {
            // A queued waiter the key was reserved for holds it once it takes it; until then
            // the key names it too, and it is shown as the holder: nobody else can take it.
            let mode = HoldMode::exclusive_of(kind).name();
            holders.push(self.contender(id, mode, at_us(fence), fence, &keys.exclusive));
        }
        for (id, ends) in &shared {
            let mode = if kind == LockKind::Semaphore {
                HoldMode::Lease.name()
            } else {
                HoldMode::Read.name()
            };
            holders.push(self.contender(id, mode, at_ms(ends - lease_ms), 0, &keys.shared));
        }
        if let Some(id) = &intent {
            waiters.push(self.contender(
                id,
                HoldMode::Write.name(),
                at_ms(now as f64),
                0,
                &keys.intent,
            ));
        }
        for (member, queued_us) in &queue {
            if !alive.iter().any(|(m, _)| m == member) {
                continue; // dead: dropped at the next hand-over
            }
            // `<hub id> <holder id>`
            let id = member.split_once(' ').map_or(member.as_str(), |(_, id)| id);
            let mode = if kind == LockKind::Leader {
                HoldMode::Leader.name()
            } else {
                HoldMode::Exclusive.name()
            };
            waiters.push(self.contender(id, mode, at_us(*queued_us as i64), 0, &keys.queue));
        }
        Ok(LockInfo::at(path, kind, holders, waiters))
    }

    /// Every key name matching `pattern`, by `SCAN` (which never blocks the server), on the
    /// one server or on every Cluster primary.
    async fn scan(&self, pattern: &str) -> Result<Vec<String>> {
        let conn = &self.conn;
        let mut out = vec![];
        for node in conn.servers.every_node(conn.reply_timeout).await {
            self.scan_node(&node, pattern, &mut out).await?;
        }
        Ok(out)
    }

    /// [`scan`](Self::scan) on one server, into `out`.
    async fn scan_node(
        &self,
        node: &Option<(String, u16)>,
        pattern: &str,
        out: &mut Vec<String>,
    ) -> Result<()> {
        let conn = &self.conn;
        let mut cursor = 0u64;
        loop {
            let (next, names): (u64, Vec<String>) = conn
                .run_node(node, conn.reply_timeout, |mut c| async move {
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut c)
                        .await
                })
                .await
                .map_err(|e| server_error("list the locks", e))?;
            out.extend(names);
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

/// `text` as a literal in a `SCAN MATCH` pattern.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Inspect for Inner {
    fn inspect<'a>(
        &'a self,
        path: &'a str,
        kind: Option<LockKind>,
    ) -> BoxFuture<'a, Result<LockInfo>> {
        Box::pin(self.inspect_at(path, kind))
    }

    fn lock_paths<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(async move {
            let mut paths = vec![];
            // The keys that exist while a lock is held or waited for (the fence counter is
            // kept for ever, and is no sign of either).
            let layout = self.keys.layout();
            for kind in ["lock", "shared", "intent", "queue"] {
                let prefix = format!("{PREFIX}{kind}:");
                let pattern = format!(
                    "{}{}{}/*",
                    glob_escape(&prefix),
                    layout.tag_pattern(),
                    glob_escape(namespace)
                );
                for name in self.scan(&pattern).await? {
                    if let Some(path) = name.strip_prefix(&prefix).and_then(|r| layout.path_of(r)) {
                        paths.push(path.to_string());
                    }
                }
            }
            paths.sort();
            paths.dedup();
            Ok(paths)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_id_names_its_owner() {
        let o = owner("6f1c0b1e-0000-4000-8000-000000000000 host=web-3 pid=42 hub=abc id=checkout");
        assert_eq!(o.host.as_deref(), Some("web-3"));
        assert_eq!(o.pid, Some(42));
        assert_eq!(o.data, "checkout");
        assert_eq!(owner("someone else").data, "someone else");
    }

    #[test]
    fn a_namespace_is_matched_literally() {
        assert_eq!(glob_escape("/a*b?[c]\\"), "/a\\*b\\?\\[c\\]\\\\");
    }
}
