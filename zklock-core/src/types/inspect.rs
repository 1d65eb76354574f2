//! What an operator sees of a lock: its recipe, its holders and its waiters, each with who they
//! are, since when and with which token. Every backend that can show them fills these in from
//! what its server holds.

use std::fmt;
use std::time::{Duration, SystemTime};

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

/// One contender: a holder or a waiter, as the server has it.
///
/// What each field holds on each backend:
///
/// | field | ZooKeeper | Redis | PostgreSQL |
/// | --- | --- | --- | --- |
/// | `node` | the node's name | the holder id (a uuid, then who) | `pid <backend pid>` |
/// | `since` | the node's creation | the grant (read from its token) or the time it queued | the grant (read from its token) or the wait's start |
/// | `token` | the node's czxid | the grant's token; for a waiter, none (0) | the grant's token; for a waiter, none (0) |
/// | `session` | the session id | 0 (a lease belongs to no session) | the backend pid |
///
/// ```no_run
/// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
/// let info = m.inspect("sku_7").await?;
/// if let Some(h) = info.holders.first() {
///     println!("{} holds it (token {}, for {:?})", h.owner, h.token, h.age());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Contender {
    /// Its name on the server: a ZooKeeper node's name (under the lock path, or its
    /// `leases`/`locks` child for semaphores), a Redis holder id, a PostgreSQL session's pid.
    pub node: String,
    /// `mutex`, `read`, `write`, `lease` or `leader` (a leader latch's participant).
    pub mode: &'static str,
    /// Who it is.
    pub owner: Owner,
    /// Since when it holds or waits (server time).
    pub since: SystemTime,
    /// Its fencing token; zero for a waiter on Redis and PostgreSQL, which has none yet.
    pub token: FencingToken,
    /// The server session that owns it: ZooKeeper's session id, PostgreSQL's backend pid, 0
    /// on Redis.
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
    /// Where a hold of this process on it says it lives (what the local table knows lingering
    /// holds by).
    pub(crate) location: String,
}

impl Contender {
    /// How long it has held or waited, by this machine's clock.
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

impl LockInfo {
    /// What a backend saw at the lock path `path`, named by its path until the manager puts
    /// the key it was asked for in its place.
    pub(crate) fn at(
        path: &str,
        kind: LockKind,
        holders: Vec<Contender>,
        waiters: Vec<Contender>,
    ) -> LockInfo {
        LockInfo {
            key: path.to_string(),
            path: path.to_string(),
            kind,
            holders,
            waiters,
        }
    }
}
