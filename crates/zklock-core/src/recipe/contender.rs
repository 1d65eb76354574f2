//! One contender node on ZooKeeper: create it (with the listing pipelined), wait until the
//! nodes that block it are gone, and clean it up if the acquire ends without a hold.
//!
//! Shared by the mutex and both sides of the read/write lock, in Curator's formats.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Client, EventType};

use super::{
    contender_options, delete_by_prefix_in_background, delete_in_background, ensure_parents,
};
use crate::error::{Error, Result};
use crate::guard::{FencingToken, Hold};
use crate::manager::Inner;

/// How many of the nearest lower blockers an exclusive waiter remembers from its listing. When
/// its predecessor goes, the next one is taken from this window instead of listing again.
const WINDOW: usize = 8;

/// What kind of contender node, and so which nodes block it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum NodeKind {
    /// Curator's `InterProcessMutex`: `_c_<uuid>-lock-<seq>`; every lower node blocks.
    Mutex,
    /// Curator's read lock: `_c_<uuid>-__READ__<seq>`; only lower write nodes block.
    Read,
    /// Curator's write lock: `_c_<uuid>-__WRIT__<seq>`; every lower node blocks.
    Write,
    /// A lease of Curator's `InterProcessSemaphoreV2`: `_c_<uuid>-lease-<seq>`; counted, not
    /// queued.
    Lease,
}

pub(crate) const READ_NAME: &str = "__READ__";
pub(crate) const WRITE_NAME: &str = "__WRIT__";
pub(crate) const MUTEX_NAME: &str = "lock-";
pub(crate) const LEASE_NAME: &str = "lease-";

impl NodeKind {
    fn lock_name(self) -> &'static str {
        match self {
            NodeKind::Mutex => MUTEX_NAME,
            NodeKind::Read => READ_NAME,
            NodeKind::Write => WRITE_NAME,
            NodeKind::Lease => LEASE_NAME,
        }
    }

    /// Curator's sort key for a child of a path of this kind's recipe.
    pub(crate) fn sort_key(self, node: &str) -> &str {
        match self {
            NodeKind::Mutex => super::sort_key(node, MUTEX_NAME),
            NodeKind::Lease => super::sort_key(node, LEASE_NAME),
            // InterProcessReadWriteLock's driver strips both names, read then write.
            NodeKind::Read | NodeKind::Write => {
                super::sort_key(super::sort_key(node, READ_NAME), WRITE_NAME)
            }
        }
    }

    /// Whether `other` (a lower node) blocks a contender of this kind.
    fn blocked_by(self, other: &str) -> bool {
        match self {
            NodeKind::Mutex | NodeKind::Write => true,
            NodeKind::Read => other.contains(WRITE_NAME),
            NodeKind::Lease => false,
        }
    }

    /// Exclusive grants prove that every lower node is gone.
    fn exclusive(self) -> bool {
        matches!(self, NodeKind::Mutex | NodeKind::Write)
    }
}

/// How long an acquire may wait.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Wait {
    Forever,
    Until(Instant, Duration),
    Never,
}

impl Wait {
    pub(crate) fn timeout(timeout: Option<Duration>) -> Wait {
        match timeout {
            Some(t) => Wait::Until(Instant::now() + t, t),
            None => Wait::Forever,
        }
    }
}

/// Acquires one contender node of `kind` under `path`: `Ok(None)` only for [`Wait::Never`]
/// when the lock is taken.
pub(crate) async fn acquire_node(
    inner: &Arc<Inner>,
    path: &Arc<str>,
    key: &Arc<str>,
    kind: NodeKind,
    wait: Wait,
) -> Result<Option<Hold>> {
    Contend {
        inner,
        path,
        key,
        kind,
    }
    .acquire(wait)
    .await
}

/// Creates a contender node of `kind` under `path` without waiting for it (a downgrade, whose
/// caller already excludes everyone), and returns it with the listing taken after it.
pub(crate) async fn create_node(
    inner: &Arc<Inner>,
    path: &Arc<str>,
    key: &Arc<str>,
    kind: NodeKind,
) -> Result<(Hold, Vec<String>)> {
    let contend = Contend {
        inner,
        path,
        key,
        kind,
    };
    let ticket = inner.enter_dir(path);
    let client = inner.live_client().await?;
    let mut pending = Pending::new(inner, &client, path);
    let (_, czxid, children) = contend.create(&client, &mut pending).await?;
    let node = pending.disarm().expect("a created contender has a node");
    Ok((
        Hold::new(
            inner.clone(),
            client,
            key.clone(),
            node,
            FencingToken::new(czxid, 0),
            ticket,
        ),
        children,
    ))
}

struct Contend<'a> {
    inner: &'a Arc<Inner>,
    path: &'a Arc<str>,
    key: &'a Arc<str>,
    kind: NodeKind,
}

impl Contend<'_> {
    async fn acquire(&self, wait: Wait) -> Result<Option<Hold>> {
        let inner = self.inner;
        let ticket = inner.enter_dir(self.path);
        let client = inner.live_client().await?;
        let mut pending = Pending::new(inner, &client, self.path);

        let (name, czxid, children) = self.create(&client, &mut pending).await?;
        let me = self.kind.sort_key(&name).to_string();
        let mut queue = Queue::new(self.kind, children, &name)?;
        // Set when a blocker went: the rest of the window may have gone too (in a FIFO drain it
        // always has), so it is checked in one pipelined round instead of one node at a time.
        let mut stale = false;
        loop {
            if let Some(floor) = ticket.granted_floor() {
                queue.prune_below(&floor);
            }
            if stale && queue.below.len() > 1 {
                stale = false;
                let checks: Vec<_> = queue
                    .below
                    .iter()
                    .map(|n| client.check_stat(&format!("{}/{n}", self.path)))
                    .collect();
                inner.count(checks.len() as u64);
                let results = futures::future::join_all(checks).await;
                let mut failed = None;
                let mut alive = Vec::with_capacity(queue.below.len());
                for (node, result) in queue.below.drain(..).zip(results) {
                    match result {
                        Ok(None) => {}
                        Ok(Some(_)) => alive.push(node),
                        Err(err) => {
                            alive.push(node);
                            failed = Some(err);
                        }
                    }
                }
                queue.below = alive;
                if let Some(err) = failed {
                    self.retry_or_fail("check the contenders", err).await?;
                }
                continue;
            }
            let Some(blocker) = queue.next_blocker() else {
                if queue.hidden {
                    let children = self.list(&client).await?;
                    queue = Queue::new(self.kind, children, &name)?;
                    continue;
                }
                break;
            };
            if matches!(wait, Wait::Never) {
                pending.cancel_now();
                return Ok(None);
            }
            let blocker_path = format!("{}/{blocker}", self.path);
            inner.count(1);
            let watcher = match client.check_and_watch_stat(&blocker_path).await {
                Ok((None, _)) => {
                    queue.remove_blocker();
                    stale = true;
                    continue;
                }
                Ok((Some(_), watcher)) => watcher,
                Err(err) => {
                    self.retry_or_fail("watch the predecessor", err).await?;
                    continue;
                }
            };
            let event = match wait {
                Wait::Until(deadline, waited) => {
                    match tokio::time::timeout_at(deadline, watcher.changed()).await {
                        Ok(event) => event,
                        Err(_) => {
                            pending.cancel_now();
                            return Err(Error::Timeout {
                                key: self.key.to_string(),
                                waited,
                            });
                        }
                    }
                }
                _ => watcher.changed().await,
            };
            inner
                .stats
                .predecessor_events
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match event.event_type {
                EventType::NodeDeleted => {
                    queue.remove_blocker();
                    stale = true;
                }
                EventType::Session => {
                    // The session ended while waiting: our node went with it.
                    return Err(match event.session_state {
                        zookeeper_client::SessionState::Expired => Error::SessionExpired,
                        _ => Error::Closed,
                    });
                }
                // Data changed (e.g. a Curator revocation request): look again.
                _ => {}
            }
        }
        if self.kind.exclusive() {
            ticket.record_grant(&me);
        }
        let node = pending.disarm().expect("a granted contender has a node");
        tracing::debug!(key = %self.key, node = %node, token = czxid, "lock node granted");
        Ok(Some(Hold::new(
            inner.clone(),
            client,
            self.key.clone(),
            node,
            FencingToken::new(czxid, 0),
            ticket,
        )))
    }

    /// Creates the contender node (making the lock path on first use) and lists its siblings,
    /// pipelined: one round trip. Returns the node's name, its czxid and the listing.
    async fn create(
        &self,
        client: &Client,
        pending: &mut Pending,
    ) -> Result<(String, i64, Vec<String>)> {
        let inner = self.inner;
        let prefix = format!("{}/{}{}", self.path, pending.protect, self.kind.lock_name());
        for _ in 0..20 {
            // Both requests are sent here, in this order: the listing sees the new node.
            let create = client.create(&prefix, &inner.node_data, contender_options(inner));
            let list = client.list_children(self.path);
            pending.sent = true;
            inner.count(2);
            let (created, listed) = futures::join!(create, list);
            match created {
                Ok((stat, seq)) => {
                    let name = format!("{}{}{seq}", pending.protect, self.kind.lock_name());
                    pending.node = Some(format!("{}/{name}", self.path));
                    let children = match listed {
                        Ok(children) => children,
                        Err(_) => self.list(client).await?,
                    };
                    return Ok((name, stat.czxid, children));
                }
                Err(zookeeper_client::Error::NoNode) => {
                    ensure_parents(inner, client, self.path).await?
                }
                Err(ref err) if super::connection_lost(err) => {
                    // The create may have happened: find it by its protected prefix.
                    inner.wait_connected("create the contender node").await?;
                    let children = match self.list(client).await {
                        Ok(children) => children,
                        // No lock path: the create failed for want of it; make it and retry.
                        Err(Error::ZooKeeper {
                            source: zookeeper_client::Error::NoNode,
                            ..
                        }) => continue,
                        Err(err) => return Err(err),
                    };
                    if let Some(name) = children
                        .iter()
                        .find(|c| c.starts_with(&pending.protect))
                        .cloned()
                    {
                        let path = format!("{}/{name}", self.path);
                        pending.node = Some(path.clone());
                        inner.count(1);
                        match client.check_stat(&path).await {
                            Ok(Some(stat)) => return Ok((name, stat.czxid, children)),
                            Ok(None) => pending.node = None,
                            Err(err) => {
                                return Err(Error::zk("read the contender node", &path, err))
                            }
                        }
                    }
                }
                Err(err) => return Err(Error::zk("create the contender node", self.path, err)),
            }
        }
        Err(Error::Config(format!(
            "could not create a contender under {} after 20 tries: the lock path keeps disappearing",
            self.path
        )))
    }

    async fn list(&self, client: &Client) -> Result<Vec<String>> {
        loop {
            self.inner.count(1);
            match client.list_children(self.path).await {
                Ok(children) => return Ok(children),
                Err(err) => self.retry_or_fail("list the contenders", err).await?,
            }
        }
    }

    /// Waits out a connection loss; any other error ends the acquire.
    async fn retry_or_fail(
        &self,
        operation: &'static str,
        err: zookeeper_client::Error,
    ) -> Result<()> {
        match err {
            err if super::connection_lost(&err) => self.inner.wait_connected(operation).await,
            err => Err(Error::zk(operation, self.path, err)),
        }
    }
}

/// The contender node of an acquire in progress: if the acquire ends without a hold (error,
/// timeout, cancellation), the node is deleted.
struct Pending {
    inner: Arc<Inner>,
    client: Client,
    dir: Arc<str>,
    protect: String,
    node: Option<String>,
    /// The create was sent: if no node is known, one may still exist under `protect`.
    sent: bool,
}

impl Pending {
    /// A contender about to be created under `dir`, with a fresh protected prefix
    /// (`_c_<uuid>-`, Curator's protection).
    fn new(inner: &Arc<Inner>, client: &Client, dir: &Arc<str>) -> Pending {
        Pending {
            inner: inner.clone(),
            client: client.clone(),
            dir: dir.clone(),
            protect: format!("_c_{}-", uuid::Uuid::new_v4()),
            node: None,
            sent: false,
        }
    }

    /// The acquire succeeded: the node now belongs to the hold.
    fn disarm(&mut self) -> Option<String> {
        self.sent = false;
        self.node.take()
    }

    fn cancel_now(&mut self) {
        if let Some(node) = self.node.take() {
            delete_in_background(&self.inner, self.client.clone(), node);
        }
        self.sent = false;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            delete_in_background(&self.inner, self.client.clone(), node);
        } else if self.sent {
            delete_by_prefix_in_background(
                &self.inner,
                self.client.clone(),
                self.dir.clone(),
                self.protect.clone(),
            );
        }
    }
}

/// The lower contenders that block a waiter.
struct Queue {
    kind: NodeKind,
    /// Blockers in ascending order. Exclusive kinds keep the nearest [`WINDOW`] lower nodes and
    /// wait on the nearest; readers keep every lower writer and wait on the lowest.
    below: Vec<String>,
    /// More blockers sort below the window.
    hidden: bool,
    /// Sort key of the lowest node in the window when it was built; hidden nodes sort below it.
    floor: String,
}

impl Queue {
    fn new(kind: NodeKind, children: Vec<String>, me: &str) -> Result<Queue> {
        if !children.iter().any(|c| c == me) {
            return Err(Error::LockLost {
                key: me.to_string(),
                reason: crate::LossReason::NodeDeleted,
            });
        }
        let mine = kind.sort_key(me);
        let order = |a: &String, b: &String| kind.sort_key(a).cmp(kind.sort_key(b));
        let mut below: Vec<String> = children
            .into_iter()
            .filter(|c| kind.sort_key(c) < mine)
            .collect();
        if !kind.exclusive() {
            below.retain(|c| kind.blocked_by(c));
            below.sort_unstable_by(order);
            return Ok(Queue {
                kind,
                below,
                hidden: false,
                floor: String::new(),
            });
        }
        // Only the nearest WINDOW matter: select them instead of sorting a long queue.
        let hidden = below.len() > WINDOW;
        if hidden {
            let cut = below.len() - WINDOW;
            below.select_nth_unstable_by(cut, order);
            below.drain(..cut);
        }
        below.sort_unstable_by(order);
        let floor = below
            .first()
            .map(|n| kind.sort_key(n).to_string())
            .unwrap_or_default();
        Ok(Queue {
            kind,
            below,
            hidden,
            floor,
        })
    }

    fn next_blocker(&self) -> Option<&str> {
        if self.kind.exclusive() {
            self.below.last()
        } else {
            self.below.first()
        }
        .map(String::as_str)
    }

    fn remove_blocker(&mut self) {
        if self.kind.exclusive() {
            self.below.pop();
        } else if !self.below.is_empty() {
            self.below.remove(0);
        }
    }

    /// Forgets every node sorting below `granted`, the highest node this process was granted an
    /// exclusive hold on: all of those were gone when it was granted.
    fn prune_below(&mut self, granted: &str) {
        let kind = self.kind;
        self.below.retain(|n| kind.sort_key(n) >= granted);
        if self.hidden && granted >= self.floor.as_str() {
            self.hidden = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_sort_like_curator() {
        assert_eq!(
            NodeKind::Read.sort_key("_c_ab-__READ__0000000004"),
            "0000000004"
        );
        assert_eq!(
            NodeKind::Write.sort_key("_c_ab-__WRIT__0000000003"),
            "0000000003"
        );
        assert_eq!(
            NodeKind::Read.sort_key("_c_ab-__WRIT__0000000003"),
            "0000000003"
        );
    }

    #[test]
    fn readers_wait_only_on_lower_writers() {
        let kids = vec![
            "_c_1-__READ__0000000001".to_string(),
            "_c_2-__WRIT__0000000002".to_string(),
            "_c_3-__READ__0000000003".to_string(),
            "_c_4-__READ__0000000004".to_string(),
            "_c_5-__WRIT__0000000005".to_string(),
        ];
        let q = Queue::new(NodeKind::Read, kids.clone(), "_c_4-__READ__0000000004").unwrap();
        assert_eq!(q.below, vec!["_c_2-__WRIT__0000000002".to_string()]);
        let q = Queue::new(NodeKind::Read, kids.clone(), "_c_1-__READ__0000000001").unwrap();
        assert!(q.next_blocker().is_none());
        let q = Queue::new(NodeKind::Write, kids, "_c_5-__WRIT__0000000005").unwrap();
        assert_eq!(q.next_blocker(), Some("_c_4-__READ__0000000004"));
    }
}
