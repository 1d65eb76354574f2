//! What an operator sees of a lock on etcd: the keys under its prefix in create order, read in
//! one request (one revision), and who holds by the same rule the contenders follow. Keys of
//! etcd's own tools (`etcdctl lock`, a Go `concurrency.Mutex`) show too, with their value as
//! the owner (often empty) and their lease as the session.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};

use super::error::bounded;
use super::EtcdBackend;
use crate::backend::{BoxFuture, Inspect};
use crate::types::error::Result;
use crate::types::inspect::{Contender, LockInfo, LockKind, Owner};
use crate::types::mode::HoldMode;
use crate::types::token::FencingToken;

/// Since when a key's contender waits or holds: the `at=` its value carries (zklock's
/// contenders write it), else the time in a read/write key's name, else the epoch.
fn since(kv: &KeyValue, name: &str) -> SystemTime {
    let value = String::from_utf8_lossy(kv.value());
    let at_ms = value
        .split(' ')
        .find_map(|f| f.strip_prefix("at="))
        .and_then(|ms| ms.parse::<u64>().ok());
    match at_ms {
        Some(ms) => UNIX_EPOCH + Duration::from_millis(ms),
        None => name
            .rsplit('/')
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .map_or(UNIX_EPOCH, |nanos| UNIX_EPOCH + Duration::from_nanos(nanos)),
    }
}

/// Who a key's value says its contender is.
fn owner(kv: &KeyValue) -> Owner {
    let value = String::from_utf8_lossy(kv.value());
    // Drop the `at=` and `max=` fields the owner's text does not show.
    let text: Vec<&str> = value
        .split(' ')
        .filter(|f| !f.starts_with("at=") && !f.starts_with("max="))
        .collect();
    Owner::parse(text.join(" ").as_bytes())
}

/// Which side of a read/write lock a key under `prefix` is: `Some(true)` a writer,
/// `Some(false)` a reader, `None` neither.
fn side(prefix: &str, kv: &KeyValue) -> Option<bool> {
    let name = String::from_utf8_lossy(kv.key());
    let rest = name.strip_prefix(prefix).unwrap_or(&name);
    if rest.starts_with("read/") {
        Some(false)
    } else if rest.starts_with("write/") {
        Some(true)
    } else {
        None
    }
}

/// The holders and the waiters among `kvs` (the keys under `prefix`, in create order), by the
/// rule the contenders of `kind` follow.
fn contenders(prefix: &str, kind: LockKind, kvs: &[KeyValue]) -> (Vec<Contender>, Vec<Contender>) {
    let exclusive = HoldMode::exclusive_of(kind).name();
    // A semaphore's size, as its first contender's process asked it.
    let max = kvs
        .first()
        .and_then(|kv| {
            String::from_utf8_lossy(kv.value())
                .split(' ')
                .find_map(|f| f.strip_prefix("max=").and_then(|m| m.parse::<u32>().ok()))
        })
        .unwrap_or(1);
    let revisions: Vec<i64> = kvs.iter().map(|kv| kv.create_revision()).collect();
    let (mut holders, mut waiters) = (vec![], vec![]);
    let (mut any_before, mut writer_before) = (false, false);
    for kv in kvs {
        let (mode, reader) = match (kind, side(prefix, kv)) {
            (LockKind::ReadWrite, Some(false)) => (HoldMode::Read.name(), true),
            (LockKind::ReadWrite, Some(true)) => (HoldMode::Write.name(), false),
            // Some other key under a read/write lock's prefix: not a contender.
            (LockKind::ReadWrite, None) => continue,
            _ => (exclusive, false),
        };
        let holds = match kind {
            LockKind::Semaphore => {
                super::semaphore::admitted(&revisions, kv.create_revision(), max)
            }
            _ if reader => !writer_before,
            _ => !any_before,
        };
        let name = String::from_utf8_lossy(kv.key()).into_owned();
        let contender = Contender {
            node: name.strip_prefix(prefix).unwrap_or(&name).to_string(),
            mode,
            owner: owner(kv),
            since: since(kv, &name),
            token: FencingToken::new(kv.create_revision(), 0),
            session: kv.lease(),
            lingering: false,
            location: name.clone(),
        };
        if holds {
            holders.push(contender);
        } else {
            waiters.push(contender);
        }
        any_before = true;
        writer_before |= !reader;
    }
    (holders, waiters)
}

impl EtcdBackend {
    async fn inspect_at(&self, path: &str, kind: Option<LockKind>) -> Result<LockInfo> {
        let inner = &self.inner;
        let prefix = format!("{path}/");
        let mut client = inner.client.clone();
        inner.count_request();
        let got = bounded(
            "inspect a lock",
            inner.config.reply_timeout,
            client.get(
                prefix.as_str(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend),
                ),
            ),
        )
        .await?;
        let kind = kind.unwrap_or_else(|| {
            if got.kvs().iter().any(|kv| side(&prefix, kv).is_some()) {
                LockKind::ReadWrite
            } else {
                LockKind::Mutex
            }
        });
        let (holders, waiters) = contenders(&prefix, kind, got.kvs());
        Ok(LockInfo::at(path, kind, holders, waiters))
    }

    async fn paths_under(&self, namespace: &str) -> Result<Vec<String>> {
        let inner = &self.inner;
        let prefix = format!("{namespace}/");
        let mut client = inner.client.clone();
        inner.count_request();
        let got = bounded(
            "list the locks",
            inner.config.reply_timeout,
            client.get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            ),
        )
        .await?;
        let mut paths = BTreeSet::new();
        for kv in got.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            let rest = &key[prefix.len()..];
            let parts: Vec<&str> = rest.split('/').collect();
            // `<key>/<contender>`, `%RW/<key>/<side>/<n>`, `%LATCH/<key>/<contender>`.
            let depth = match parts.first() {
                Some(folder) if folder.starts_with('%') => 2,
                _ => 1,
            };
            if parts.len() > depth {
                paths.insert(format!("{prefix}{}", parts[..depth].join("/")));
            }
        }
        Ok(paths.into_iter().collect())
    }
}

impl Inspect for EtcdBackend {
    fn inspect<'a>(
        &'a self,
        path: &'a str,
        kind: Option<LockKind>,
    ) -> BoxFuture<'a, Result<LockInfo>> {
        Box::pin(self.inspect_at(path, kind))
    }

    fn lock_paths<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(self.paths_under(namespace))
    }
}
