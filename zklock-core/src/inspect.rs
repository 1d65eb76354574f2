//! Introspection and revocation: who holds a lock, who waits, since when, with which token;
//! and asking a holder to let go.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::backend::zk::contender::{
    NodeKind, LATCH_NAME, LEASE_NAME, MUTEX_NAME, READ_NAME, WRITE_NAME,
};
use crate::backend::zk::hold::REVOKE_MESSAGE;
use crate::manager::LockManager;
use crate::types::error::{Error, Result};
use crate::types::key::{validate_path, Key};
use crate::types::token::FencingToken;

/// Which recipe a lock path belongs to.
///
/// ```
/// assert_eq!(zklock_core::LockKind::Mutex.to_string(), "mutex");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// [`Mutex`](crate::Mutex) (Curator's `InterProcessMutex`).
    Mutex,
    /// [`RwLock`](crate::RwLock) (Curator's `InterProcessReadWriteLock`).
    ReadWrite,
    /// [`Semaphore`](crate::Semaphore) (Curator's `InterProcessSemaphoreV2`).
    Semaphore,
    /// [`LeaderLatch`](crate::LeaderLatch) (Curator's `LeaderLatch`): the holder leads, the
    /// waiters are the other participants.
    Leader,
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LockKind::Mutex => "mutex",
            LockKind::ReadWrite => "rwlock",
            LockKind::Semaphore => "semaphore",
            LockKind::Leader => "leader",
        })
    }
}

/// Who created a contender node, from its data.
///
/// zklock writes `zklock host=<host> pid=<pid>[ id=<identity>]`; Curator writes the client's
/// IP address, kept in `data`.
///
/// ```
/// use zklock_core::Owner;
/// let o = Owner::parse(b"zklock host=web-3 pid=4242 id=checkout");
/// assert_eq!(o.host.as_deref(), Some("web-3"));
/// assert_eq!(o.pid, Some(4242));
/// assert_eq!(o.data, "checkout");
/// assert_eq!(Owner::parse(b"10.0.0.7").data, "10.0.0.7");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Owner {
    /// Host name of a zklock holder.
    pub host: Option<String>,
    /// Process id of a zklock holder.
    pub pid: Option<u32>,
    /// The identity the holder chose ([`Builder::identity`](crate::Builder::identity)), or the
    /// raw node data of another client.
    pub data: String,
}

impl Owner {
    /// Reads a contender node's data.
    pub fn parse(data: &[u8]) -> Owner {
        let text = String::from_utf8_lossy(data);
        let Some(rest) = text.strip_prefix("zklock ") else {
            return Owner {
                host: None,
                pid: None,
                data: text.into_owned(),
            };
        };
        let mut owner = Owner::default();
        let (fields, id) = match rest.split_once(" id=") {
            Some((fields, id)) => (fields, id.to_string()),
            None => (rest, String::new()),
        };
        owner.data = id;
        for field in fields.split(' ') {
            match field.split_once('=') {
                Some(("host", h)) => owner.host = Some(h.to_string()),
                Some(("pid", p)) => owner.pid = p.parse().ok(),
                _ => {}
            }
        }
        owner
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.host, self.pid) {
            (Some(h), Some(p)) if self.data.is_empty() => write!(f, "{h}:{p}"),
            (Some(h), Some(p)) => write!(f, "{h}:{p} ({})", self.data),
            _ => f.write_str(&self.data),
        }
    }
}

/// One contender node: a holder or a waiter.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Contender {
    /// The node's name (under the lock path, or its `leases`/`locks` child for semaphores).
    pub node: String,
    /// `mutex`, `read`, `write` or `lease`.
    pub mode: &'static str,
    /// Who created it.
    pub owner: Owner,
    /// When it was created (server time).
    pub since: SystemTime,
    /// Its fencing token (czxid).
    pub token: FencingToken,
    /// The ZooKeeper session that owns it.
    pub session: i64,
    /// This manager keeps the node after its last local release with no task holding it
    /// ([`Builder::linger`](crate::Builder::linger)): it is given up as soon as another
    /// contender appears. Only the manager that keeps it knows; elsewhere it reads `false`.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// for h in m.inspect("k").await?.holders {
    ///     let state = if h.lingering { "lingering" } else { "held" };
    ///     println!("{} {state}", h.node);
    /// }
    /// # Ok(()) }
    /// ```
    pub lingering: bool,
}

impl Contender {
    /// How long ago the node was created, by this machine's clock.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// for h in m.inspect("k").await?.holders { println!("held for {:?}", h.age()) }
    /// # Ok(()) }
    /// ```
    pub fn age(&self) -> Duration {
        SystemTime::now()
            .duration_since(self.since)
            .unwrap_or_default()
    }
}

/// The state of one lock: its holders and its waiters in queue order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key (decoded) or raw path.
    pub key: String,
    /// The lock path.
    pub path: String,
    /// The recipe.
    pub kind: LockKind,
    /// Who holds it now (several readers, or up to N semaphore leases).
    pub holders: Vec<Contender>,
    /// Who waits, first in line first.
    pub waiters: Vec<Contender>,
}

fn mode_of(node: &str) -> &'static str {
    if node.contains(WRITE_NAME) {
        "write"
    } else if node.contains(READ_NAME) {
        "read"
    } else if node.contains(LEASE_NAME) {
        "lease"
    } else if node.contains(LATCH_NAME) {
        "latch"
    } else if node.contains(MUTEX_NAME) {
        "mutex"
    } else {
        "unknown"
    }
}

impl LockManager {
    /// Who holds the lock on `key` and who waits, of whichever recipe uses the key (mutex,
    /// read/write lock or semaphore).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let info = m.inspect("order_42").await?;
    /// for h in &info.holders {
    ///     println!("held by {} since {:?} (token {})", h.owner, h.since, h.token);
    /// }
    /// println!("{} waiting", info.waiters.len());
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<LockInfo> {
        let k = Key::new(key)?;
        let ns = self.namespace();
        let mut first = None;
        for (path, kind) in [
            (format!("{ns}/{}", k.encoded()), LockKind::Mutex),
            (format!("{ns}/%RW/{}", k.encoded()), LockKind::ReadWrite),
            (format!("{ns}/%SEM/{}", k.encoded()), LockKind::Semaphore),
            (format!("{ns}/%LATCH/{}", k.encoded()), LockKind::Leader),
        ] {
            let mut info = self.inspect_as(&path, kind).await?;
            info.key = key.to_string();
            if !info.holders.is_empty() || !info.waiters.is_empty() {
                return Ok(info);
            }
            first.get_or_insert(info);
        }
        Ok(first.expect("four paths were inspected"))
    }

    /// [`inspect`](Self::inspect) for a raw lock path; the recipe is told by its nodes.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let info = m.inspect_path("/billing/locks/nightly").await?;
    /// # Ok(()) }
    /// ```
    pub async fn inspect_path(&self, path: &str) -> Result<LockInfo> {
        validate_path(path, "lock path")?;
        let client = self.zk_backend("inspection")?.session().client();
        let children = client.list_children(path).await.unwrap_or_default();
        let kind = if children.iter().any(|c| c == "leases") {
            LockKind::Semaphore
        } else if children.iter().any(|c| c.contains(LATCH_NAME)) {
            LockKind::Leader
        } else if children
            .iter()
            .any(|c| c.contains(READ_NAME) || c.contains(WRITE_NAME))
        {
            LockKind::ReadWrite
        } else {
            LockKind::Mutex
        };
        self.inspect_as(path, kind).await
    }

    async fn inspect_as(&self, path: &str, kind: LockKind) -> Result<LockInfo> {
        let key = self.key_of(path);
        let mut info = LockInfo {
            key,
            path: path.to_string(),
            kind,
            holders: vec![],
            waiters: vec![],
        };
        match kind {
            LockKind::Semaphore => {
                info.holders = self
                    .contenders(&format!("{path}/leases"), NodeKind::Lease)
                    .await?;
                info.waiters = self
                    .contenders(&format!("{path}/locks"), NodeKind::Mutex)
                    .await?;
            }
            LockKind::Mutex | LockKind::Leader => {
                let node = match kind {
                    LockKind::Leader => NodeKind::Latch,
                    _ => NodeKind::Mutex,
                };
                let mut all = self.contenders(path, node).await?;
                if !all.is_empty() {
                    info.waiters = all.split_off(1);
                    info.holders = all;
                }
            }
            LockKind::ReadWrite => {
                let all = self.contenders(path, NodeKind::Write).await?;
                let mut writer_ahead = false;
                for (i, c) in all.into_iter().enumerate() {
                    // The first node holds; a reader holds while no writer is ahead of it.
                    let holds = i == 0 || (c.mode == "read" && !writer_ahead);
                    writer_ahead |= c.mode == "write";
                    if holds {
                        info.holders.push(c);
                    } else {
                        info.waiters.push(c);
                    }
                }
            }
        }
        Ok(info)
    }

    /// The contender nodes under `dir`, in Curator's order, with their data and stat read in
    /// one pipelined round trip.
    async fn contenders(&self, dir: &str, kind: NodeKind) -> Result<Vec<Contender>> {
        let client = self.zk_backend("inspection")?.session().client();
        let table = &self.inner.core.table;
        let mut names = match client.list_children(dir).await {
            Ok(names) => names,
            Err(zookeeper_client::Error::NoNode) => return Ok(vec![]),
            Err(err) => return Err(Error::zk("list the contenders", dir, err)),
        };
        names.sort_by(|a, b| kind.sort_key(a).cmp(kind.sort_key(b)));
        let reads: Vec<_> = names
            .iter()
            .map(|n| client.get_data(&format!("{dir}/{n}")))
            .collect();
        let mut out = Vec::with_capacity(names.len());
        for (name, read) in names.into_iter().zip(reads) {
            match read.await {
                Ok((data, stat)) => out.push(Contender {
                    mode: mode_of(&name),
                    owner: Owner::parse(&data),
                    since: UNIX_EPOCH + Duration::from_millis(stat.ctime.max(0) as u64),
                    token: FencingToken::new(stat.czxid, 0),
                    session: stat.ephemeral_owner,
                    lingering: table.is_lingering(&format!("{dir}/{name}")),
                    node: name,
                }),
                // Gone between the listing and the read: it no longer contends.
                Err(zookeeper_client::Error::NoNode) => {}
                Err(err) => return Err(Error::zk("read a contender", dir, err)),
            }
        }
        Ok(out)
    }

    fn key_of(&self, path: &str) -> String {
        let rest = path
            .strip_prefix(self.namespace())
            .and_then(|r| r.strip_prefix('/'));
        let rest = rest.map(|r| {
            r.strip_prefix("%RW/")
                .or_else(|| r.strip_prefix("%SEM/"))
                .or_else(|| r.strip_prefix("%LATCH/"))
                .unwrap_or(r)
        });
        match rest.filter(|r| !r.contains('/')).and_then(Key::decode) {
            Some(key) => key,
            None => path.to_string(),
        }
    }

    /// Every lock under the namespace whose key starts with `prefix`, with its state: what
    /// `zklock ls` shows. Locks with neither holder nor waiter are left out.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// for lock in m.list("sku_").await? {
    ///     println!("{} {} holders, {} waiting", lock.key, lock.holders.len(), lock.waiters.len());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let client = self.zk_backend("listing locks")?.session().client();
        let ns = self.namespace().to_string();
        let mut out = vec![];
        let list = |dir: String| {
            let client = client.clone();
            async move {
                match client.list_children(&dir).await {
                    Ok(c) => Ok(c),
                    Err(zookeeper_client::Error::NoNode) => Ok(vec![]),
                    Err(err) => Err(Error::zk("list the namespace", &dir, err)),
                }
            }
        };
        for (dir, kind) in [
            (ns.clone(), LockKind::Mutex),
            (format!("{ns}/%RW"), LockKind::ReadWrite),
            (format!("{ns}/%SEM"), LockKind::Semaphore),
            (format!("{ns}/%LATCH"), LockKind::Leader),
        ] {
            let mut names = list(dir.clone()).await?;
            names.sort();
            for name in names {
                if name.starts_with('%') {
                    continue;
                }
                let Some(key) = Key::decode(&name) else {
                    continue;
                };
                if !key.starts_with(prefix) {
                    continue;
                }
                let mut info = self.inspect_as(&format!("{dir}/{name}"), kind).await?;
                info.key = key;
                if !info.holders.is_empty() || !info.waiters.is_empty() {
                    out.push(info);
                }
            }
        }
        Ok(out)
    }

    /// Asks the holder(s) of the lock on `key` to let go (Curator's revocation: their node's
    /// data becomes `__REVOKE__`). Holders that opted in with
    /// [`LockGuard::make_revocable`](crate::LockGuard::make_revocable) see the hold
    /// lost with [`LossReason::Revoked`](crate::LossReason::Revoked); others are not forced.
    /// Returns the nodes asked.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let asked = m.revoke("stuck-job").await?;
    /// println!("asked {} holder(s)", asked.len());
    /// # Ok(()) }
    /// ```
    pub async fn revoke(&self, key: &str) -> Result<Vec<String>> {
        self.zk_backend("revocation")?;
        let info = self.inspect(key).await?;
        self.revoke_holders(&info).await
    }

    /// [`revoke`](Self::revoke) for a raw lock path.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// m.revoke_path("/billing/locks/nightly").await?;
    /// # Ok(()) }
    /// ```
    pub async fn revoke_path(&self, path: &str) -> Result<Vec<String>> {
        self.zk_backend("revocation")?;
        let info = self.inspect_path(path).await?;
        self.revoke_holders(&info).await
    }

    async fn revoke_holders(&self, info: &LockInfo) -> Result<Vec<String>> {
        let client = self.zk_backend("revocation")?.session().client();
        let dir = match info.kind {
            LockKind::Semaphore => format!("{}/leases", info.path),
            _ => info.path.clone(),
        };
        let mut asked = vec![];
        for h in &info.holders {
            let node = format!("{dir}/{}", h.node);
            match client.set_data(&node, REVOKE_MESSAGE, None).await {
                Ok(_) => asked.push(node),
                Err(zookeeper_client::Error::NoNode) => {}
                Err(err) => return Err(Error::zk("revoke the lock", &node, err)),
            }
        }
        Ok(asked)
    }
}
