//! What an operator sees of a lock on ZooKeeper, read from its nodes: the contender nodes in
//! Curator's order (kazoo's among them), each node's data (who) and stat (since when, token,
//! session); a node that is no lock contender is shown as a holder of mode `unknown`, since
//! no zklock acquire gets past it. And Curator's revocation, which writes `__REVOKE__` into a
//! holder's node.

use std::time::{Duration, UNIX_EPOCH};

use super::error::zk_error;
use super::queue::{lock_contender, CuratorMode, LockContender};
use super::wire::{
    KAZOO_READ_NAME, LATCH_NAME, LEASE_NAME, MUTEX_NAME, READ_NAME, REVOKE_MESSAGE,
    SEMAPHORE_LEASES, SEMAPHORE_LOCKS, WRITE_NAME,
};
use super::ZkBackend;
use crate::backend::{BoxFuture, Inspect, Revoke};
use crate::types::error::Result;
use crate::types::inspect::{Contender, LockInfo, LockKind, Owner};
use crate::types::layout;
use crate::types::mode::HoldMode;
use crate::types::token::FencingToken;

/// The mode a contender node's name says, on a path of `kind`'s recipe. On a mutex's or
/// read/write lock's path, kazoo's `__lock__` is a mutex or a writer as the path's recipe is,
/// its `__rlock__` a reader, and a node that is no lock contender `unknown`.
fn mode_of(node: &str, kind: HoldMode) -> &'static str {
    node_mode(node, kind).map_or("unknown", HoldMode::name)
}

/// The hold mode of a contender node's name (see [`mode_of`]); `None` for no contender.
fn node_mode(node: &str, kind: HoldMode) -> Option<HoldMode> {
    if kind.lock_path() {
        return match lock_contender(node)? {
            LockContender::Shared(_) => Some(HoldMode::Read),
            _ if node.contains(WRITE_NAME) => Some(HoldMode::Write),
            _ if kind == HoldMode::Exclusive || node.contains(MUTEX_NAME) => {
                Some(HoldMode::Exclusive)
            }
            _ => Some(HoldMode::Write),
        };
    }
    [
        (WRITE_NAME, HoldMode::Write),
        (READ_NAME, HoldMode::Read),
        (LEASE_NAME, HoldMode::Lease),
        (LATCH_NAME, HoldMode::Leader),
        (MUTEX_NAME, HoldMode::Exclusive),
    ]
    .into_iter()
    .find(|(name, _)| node.contains(name))
    .map(|(_, mode)| mode)
}

/// The recipe of a raw lock path, told by the names of its children.
fn kind_of(children: &[String]) -> LockKind {
    if children.iter().any(|c| c == SEMAPHORE_LEASES) {
        LockKind::Semaphore
    } else if children.iter().any(|c| c.contains(LATCH_NAME)) {
        LockKind::Leader
    } else if children
        .iter()
        .any(|c| c.contains(READ_NAME) || c.contains(WRITE_NAME) || c.contains(KAZOO_READ_NAME))
    {
        LockKind::ReadWrite
    } else {
        LockKind::Mutex
    }
}

/// Splits a read/write lock's contenders, in queue order, into holders and waiters: the first
/// node holds, and a reader holds while no writer (nor mutex) is ahead of it.
fn split_read_write(all: Vec<Contender>) -> (Vec<Contender>, Vec<Contender>) {
    let (mut holders, mut waiters) = (vec![], vec![]);
    let mut writer_ahead = false;
    for (i, c) in all.into_iter().enumerate() {
        let reader = c.mode == HoldMode::Read.name();
        let holds = i == 0 || (reader && !writer_ahead);
        writer_ahead |= !reader;
        if holds {
            holders.push(c);
        } else {
            waiters.push(c);
        }
    }
    (holders, waiters)
}

/// Who a node is, from its data; a node that is no lock contender on a lock's path is named
/// as such (its data, if any, follows), so that a listing of holders shows it.
fn owner_of(node: &str, kind: HoldMode, data: &[u8]) -> Owner {
    let mut owner = Owner::parse(data);
    if mode_of(node, kind) == "unknown" {
        owner.data = match owner.data.is_empty() {
            true => format!("unknown node {node}"),
            false => format!("unknown node {node} ({})", owner.data),
        };
    }
    owner
}

/// The contenders of mode `unknown` (first), apart from the others (second), each in order.
fn unknown_apart(all: Vec<Contender>) -> (Vec<Contender>, Vec<Contender>) {
    all.into_iter().partition(|c| c.mode == "unknown")
}

impl ZkBackend {
    fn client(&self) -> zookeeper_client::Client {
        self.inner.session.client()
    }

    /// The children of `dir`; none when it does not exist.
    async fn children(&self, dir: &str, what: &'static str) -> Result<Vec<String>> {
        match self.client().list_children(dir).await {
            Ok(names) => Ok(names),
            Err(zookeeper_client::Error::NoNode) => Ok(vec![]),
            Err(err) => Err(zk_error(what, dir, err)),
        }
    }

    /// The contender nodes under `dir`, in Curator's order, with their data and stat read in
    /// one pipelined round trip.
    async fn contenders(&self, dir: &str, kind: HoldMode) -> Result<Vec<Contender>> {
        let client = self.client();
        let mut names = self.children(dir, "list the contenders").await?;
        // On a lock's path, nodes that are no contender come last.
        fn order(kind: HoldMode, n: &str) -> (bool, &str) {
            (
                kind.lock_path() && lock_contender(n).is_none(),
                kind.sort_key(n),
            )
        }
        names.sort_by(|a, b| order(kind, a).cmp(&order(kind, b)));
        let reads: Vec<_> = names
            .iter()
            .map(|n| client.get_data(&format!("{dir}/{n}")))
            .collect();
        let mut out = Vec::with_capacity(names.len());
        for (name, read) in names.into_iter().zip(reads) {
            match read.await {
                Ok((data, stat)) => out.push(Contender {
                    mode: mode_of(&name, kind),
                    owner: owner_of(&name, kind, &data),
                    since: UNIX_EPOCH + Duration::from_millis(stat.ctime.max(0) as u64),
                    token: FencingToken::new(stat.czxid, 0),
                    session: stat.ephemeral_owner,
                    lingering: false,
                    location: format!("{dir}/{name}"),
                    node: name,
                }),
                // Gone between the listing and the read: it no longer contends.
                Err(zookeeper_client::Error::NoNode) => {}
                Err(err) => return Err(zk_error("read a contender", dir, err)),
            }
        }
        Ok(out)
    }

    async fn inspect_as(&self, path: &str, kind: LockKind) -> Result<LockInfo> {
        let (holders, waiters) = match kind {
            LockKind::Semaphore => (
                self.contenders(&format!("{path}/{SEMAPHORE_LEASES}"), HoldMode::Lease)
                    .await?,
                self.contenders(&format!("{path}/{SEMAPHORE_LOCKS}"), HoldMode::Exclusive)
                    .await?,
            ),
            LockKind::Mutex | LockKind::Leader => {
                let node = match kind {
                    LockKind::Leader => HoldMode::Leader,
                    _ => HoldMode::Exclusive,
                };
                let (unknown, mut all) = unknown_apart(self.contenders(path, node).await?);
                let waiters = if all.is_empty() {
                    vec![]
                } else {
                    all.split_off(1)
                };
                all.extend(unknown);
                (all, waiters)
            }
            LockKind::ReadWrite => {
                let (unknown, all) = unknown_apart(self.contenders(path, HoldMode::Write).await?);
                let (mut holders, waiters) = split_read_write(all);
                holders.extend(unknown);
                (holders, waiters)
            }
        };
        Ok(LockInfo::at(path, kind, holders, waiters))
    }
}

impl Inspect for ZkBackend {
    fn inspect<'a>(
        &'a self,
        path: &'a str,
        kind: Option<LockKind>,
    ) -> BoxFuture<'a, Result<LockInfo>> {
        Box::pin(async move {
            let kind = match kind {
                Some(kind) => kind,
                None => kind_of(&self.children(path, "list the contenders").await?),
            };
            self.inspect_as(path, kind).await
        })
    }

    fn lock_paths<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(async move {
            let mut out = vec![];
            for kind in layout::KINDS {
                let dir = layout::dir(namespace, kind);
                for name in self.children(&dir, "list the namespace").await? {
                    out.push(format!("{dir}/{name}"));
                }
            }
            Ok(out)
        })
    }
}

impl Revoke for ZkBackend {
    fn revoke<'a>(&'a self, lock: &'a LockInfo) -> BoxFuture<'a, Result<Vec<String>>> {
        Box::pin(async move {
            let client = self.client();
            let dir = match lock.kind {
                LockKind::Semaphore => format!("{}/{SEMAPHORE_LEASES}", lock.path),
                _ => lock.path.clone(),
            };
            let mut asked = vec![];
            for h in &lock.holders {
                let node = format!("{dir}/{}", h.node);
                match client.set_data(&node, REVOKE_MESSAGE, None).await {
                    Ok(_) => asked.push(node),
                    Err(zookeeper_client::Error::NoNode) => {}
                    Err(err) => return Err(zk_error("revoke the lock", &node, err)),
                }
            }
            Ok(asked)
        })
    }
}
