//! One contender node on ZooKeeper: create it (with the listing pipelined), wait until the
//! nodes that block it are gone, and clean it up if the acquire ends without a hold.
//!
//! Shared by the mutex and both sides of the read/write lock, in Curator's formats.

use std::sync::Arc;

use tokio::time::Instant;
use zookeeper_client::{Client, EventType};

use super::hold::{Given, Hold, NodeWatch, REVOKE_MESSAGE};
use super::protocol::{
    check_path_acl, contender_options, delete_by_prefix_in_background, delete_in_background,
    ensure_parents, PATH_VANISHED_RETRIES,
};
use super::session::{connection_lost, Session};
use super::{Incarnation, Inner};
use crate::types::error::{Error, Result};
use crate::types::mode::Wait;
use crate::types::token::FencingToken;

/// How many of the nearest lower blockers an exclusive waiter remembers from its listing, and
/// watches: the last one's deletion is its grant, with no listing or check after it. Only when
/// more nodes sorted below the window does the waiter list again once the window is empty.
/// (A reader watches this many of its lowest lower writers at a time.)
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
    /// A participant of Curator's `LeaderLatch`: `_c_<uuid>-latch-<seq>`, the participant id as
    /// data; the lowest is the leader, every lower node blocks.
    Latch,
}

pub(crate) const READ_NAME: &str = "__READ__";
pub(crate) const WRITE_NAME: &str = "__WRIT__";
pub(crate) const MUTEX_NAME: &str = "lock-";
pub(crate) const LEASE_NAME: &str = "lease-";
pub(crate) const LATCH_NAME: &str = "latch-";

impl NodeKind {
    fn lock_name(self) -> &'static str {
        match self {
            NodeKind::Mutex => MUTEX_NAME,
            NodeKind::Read => READ_NAME,
            NodeKind::Write => WRITE_NAME,
            NodeKind::Lease => LEASE_NAME,
            NodeKind::Latch => LATCH_NAME,
        }
    }

    /// Curator's sort key for a child of a path of this kind's recipe.
    pub(crate) fn sort_key(self, node: &str) -> &str {
        match self {
            NodeKind::Mutex => super::protocol::sort_key(node, MUTEX_NAME),
            NodeKind::Lease => super::protocol::sort_key(node, LEASE_NAME),
            NodeKind::Latch => super::protocol::sort_key(node, LATCH_NAME),
            // InterProcessReadWriteLock's driver strips both names, read then write.
            NodeKind::Read | NodeKind::Write => {
                super::protocol::sort_key(super::protocol::sort_key(node, READ_NAME), WRITE_NAME)
            }
        }
    }

    /// Whether `other` (a lower node) blocks a contender of this kind.
    fn blocked_by(self, other: &str) -> bool {
        match self {
            NodeKind::Mutex | NodeKind::Write | NodeKind::Latch => true,
            NodeKind::Read => other.contains(WRITE_NAME),
            NodeKind::Lease => false,
        }
    }

    /// Exclusive grants prove that every lower node is gone.
    fn exclusive(self) -> bool {
        matches!(self, NodeKind::Mutex | NodeKind::Write | NodeKind::Latch)
    }
}

/// Acquires one contender node of `kind` under `path`: `Ok(None)` only for [`Wait::Never`]
/// when the lock is taken. The node, every listing and the granted floor belong to the session
/// that is live when the acquire starts; if it ends meanwhile, so does the acquire.
pub(crate) async fn acquire_node(
    inner: &Arc<Inner>,
    path: &Arc<str>,
    key: &Arc<str>,
    kind: NodeKind,
    data: Option<&[u8]>,
    wait: Wait,
) -> Result<Option<Hold>> {
    let session = inner.live_session(wait.deadline()).await?;
    Contend {
        inner,
        session,
        path,
        key,
        kind,
        data: data.unwrap_or(&inner.node_data),
        deadline: wait.deadline(),
    }
    .acquire(wait)
    .await
}

/// Creates a contender node of `kind` under `path` on `session` without waiting for it (a
/// downgrade or a semaphore lease, whose caller holds what excludes the others on that very
/// session), and returns it with the listing taken after it.
pub(crate) async fn create_node(
    inner: &Arc<Inner>,
    session: &Session,
    path: &Arc<str>,
    key: &Arc<str>,
    kind: NodeKind,
    deadline: Option<Instant>,
) -> Result<(Hold, Vec<String>)> {
    let contend = Contend {
        inner,
        session: session.clone(),
        path,
        key,
        kind,
        data: &inner.node_data,
        deadline,
    };
    let ticket = inner.enter_dir(path);
    let mut pending = Pending::new(inner, &session.client, path);
    let created = contend.create(&mut pending).await?;
    check_path_acl(inner, &session.client, path, created.incarnation.czxid).await?;
    let node = pending.disarm().expect("a created contender has a node");
    Ok((
        Hold::new(
            inner.clone(),
            session.clone(),
            key.clone(),
            node,
            FencingToken::new(created.czxid, 0),
            ticket,
            Given::Nothing,
        ),
        created.children,
    ))
}

/// A listing of a lock path, and the incarnation of the path it was taken on.
struct Listing {
    children: Vec<String>,
    incarnation: Incarnation,
}

/// What [`Contend::create`] made: the node's name and czxid, and the listing after it.
struct Created {
    name: String,
    czxid: i64,
    children: Vec<String>,
    incarnation: Incarnation,
    /// The children watch the listing set (none when the listing was retried).
    watcher: Option<zookeeper_client::OneshotWatcher>,
}

struct Contend<'a> {
    inner: &'a Arc<Inner>,
    session: Session,
    path: &'a Arc<str>,
    key: &'a Arc<str>,
    kind: NodeKind,
    /// The new node's data: who made it (a leader latch's participant id).
    data: &'a [u8],
    deadline: Option<Instant>,
}

impl Contend<'_> {
    async fn acquire(&self, wait: Wait) -> Result<Option<Hold>> {
        let inner = self.inner;
        let client = &self.session.client;
        let ticket = inner.enter_dir(self.path);
        let mut pending = Pending::new(inner, client, self.path);

        let created = self.create(&mut pending).await?;
        let name = created.name;
        let czxid = created.czxid;
        let me = self.kind.sort_key(&name).to_string();
        let mut incarnation = created.incarnation;
        // With credentials, a path that lets others delete our node is refused before any
        // grant (our node, in `pending`, is deleted with the error).
        check_path_acl(inner, client, self.path, incarnation.czxid).await?;
        // The listing's children watch, kept only if that listing showed our node alone and
        // granted it (dropped as soon as the acquire waits or lists again).
        let mut alone = created
            .watcher
            .filter(|_| created.children.iter().all(|c| *c == name));
        let mut queue = self.queue(created.children, &name, &pending.protect)?;
        self.remove_strays(&mut queue);
        // Every blocker in the window is watched (one pipelined round), so the deletion of the
        // last one is the grant: no request after the predecessor goes, whether the nodes below
        // it were granted, gave up or died with their sessions (each shows as its deletion).
        // Behind a longer queue, only the nearest is watched until it goes (see `to_watch`).
        let mut watches = Watches::default();
        // The same round watches our own node's data: its deletion while we wait (by someone
        // else) ends the acquire instead of granting a node that is gone, and the watch is
        // handed to the hold. Spent once it reported a data change: the hold reads the data.
        let own_path = format!("{}/{name}", self.path);
        let mut own: Option<NodeWatch> = None;
        let mut own_spent = false;
        loop {
            // Only what was learned on this very incarnation of the path, through this session.
            if let Some(floor) = ticket.granted_floor(incarnation) {
                queue.prune_below(&floor);
            }
            if queue.below.is_empty() {
                if queue.hidden {
                    alone = None;
                    watches = Watches::default();
                    let listing = self.list().await?;
                    incarnation = listing.incarnation;
                    check_path_acl(inner, client, self.path, incarnation.czxid).await?;
                    queue = self.queue(listing.children, &name, &pending.protect)?;
                    self.remove_strays(&mut queue);
                    continue;
                }
                break;
            }
            alone = None;
            if matches!(wait, Wait::Never) {
                pending.cancel_now();
                return Ok(None);
            }
            let unwatched: Vec<String> = queue
                .to_watch()
                .iter()
                .filter(|n| !watches.names.contains(*n))
                .cloned()
                .collect();
            let watch_own = own.is_none() && !own_spent;
            if !unwatched.is_empty() || watch_own {
                let requests: Vec<_> = unwatched
                    .iter()
                    .map(|n| client.check_and_watch_stat(&format!("{}/{n}", self.path)))
                    .collect();
                inner.count(requests.len() as u64 + u64::from(watch_own));
                let own_request = async {
                    match watch_own {
                        true => Some(client.get_and_watch_data(&own_path).await),
                        false => None,
                    }
                };
                let (results, own_result) =
                    futures::join!(futures::future::join_all(requests), own_request);
                let mut failed = None;
                match own_result {
                    Some(Ok((data, _, watcher))) => {
                        own = Some(NodeWatch {
                            fired: Box::pin(watcher.changed()),
                            revoke_requested: data == REVOKE_MESSAGE,
                        })
                    }
                    Some(Err(zookeeper_client::Error::NoNode)) => {
                        return Err(self.deleted(&mut pending))
                    }
                    Some(Err(err)) => failed = Some(err),
                    None => {}
                }
                for (node, result) in unwatched.into_iter().zip(results) {
                    match result {
                        Ok((None, _)) => queue.remove(&node),
                        Ok((Some(_), watcher)) => watches.add(node, watcher),
                        Err(err) => failed = Some(err),
                    }
                }
                if let Some(err) = failed {
                    self.retry_or_fail("watch the contenders ahead", err)
                        .await?;
                }
                continue;
            }
            let next = async {
                match own.as_mut() {
                    Some(own) => tokio::select! {
                        biased;
                        event = &mut own.fired => (None, event),
                        (node, event) = watches.next() => (Some(node), event),
                    },
                    None => {
                        let (node, event) = watches.next().await;
                        (Some(node), event)
                    }
                }
            };
            let (node, event) = match wait {
                Wait::Until(deadline, waited) => {
                    match tokio::time::timeout_at(deadline, next).await {
                        Ok(fired) => fired,
                        Err(_) => {
                            pending.cancel_now();
                            return Err(Error::Timeout {
                                key: self.key.to_string(),
                                waited,
                            });
                        }
                    }
                }
                _ => next.await,
            };
            let Some(node) = node else {
                // Our own node's watch.
                self.own_event(&event, &mut pending)?;
                own = None;
                own_spent = true;
                continue;
            };
            inner
                .stats
                .predecessor_events
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            match event.event_type {
                EventType::NodeDeleted => {
                    queue.remove(&node);
                    queue.near = true;
                }
                // The session ended while waiting: our node went with it.
                EventType::Session => return Err(session_ended(&event)),
                // Data changed (e.g. a Curator revocation request): the watch is spent; the
                // next round sets it again.
                _ => {}
            }
        }
        // Our node's deletion may have been told before the last blocker's, and not looked
        // at yet (both were ready together): it is in its watch's channel by now.
        if let Some(watch) = own.as_mut() {
            use futures::FutureExt;
            if let Some(event) = (&mut watch.fired).now_or_never() {
                self.own_event(&event, &mut pending)?;
                own = None;
            }
        }
        if self.kind.exclusive() {
            ticket.record_grant(incarnation, &me);
        }
        let node = pending.disarm().expect("a granted contender has a node");
        tracing::debug!(key = %self.key, node = %node, token = czxid, "lock node granted");
        Ok(Some(Hold::new(
            inner.clone(),
            self.session.clone(),
            self.key.clone(),
            node,
            FencingToken::new(czxid, 0),
            ticket,
            match (alone, own) {
                (Some(alone), _) => Given::Alone(alone),
                (None, Some(own)) => Given::Node(own),
                (None, None) => Given::Nothing,
            },
        )))
    }

    /// Our node was deleted while we waited (by someone else: the end of the session shows as
    /// such): the acquire ends, and nothing is left to clean up.
    fn deleted(&self, pending: &mut Pending) -> Error {
        pending.disarm();
        tracing::warn!(key = %self.key, "our waiting node was deleted by someone else");
        Error::Dequeued {
            key: self.key.to_string(),
        }
    }

    /// What an event of our own node's watch means while we wait: its deletion, or the end of
    /// the session, ends the acquire; a data change (a revoke request?) only spends the watch.
    fn own_event(
        &self,
        event: &zookeeper_client::WatchedEvent,
        pending: &mut Pending,
    ) -> Result<()> {
        match event.event_type {
            EventType::NodeDeleted => Err(self.deleted(pending)),
            EventType::Session => Err(session_ended(event)),
            _ => Ok(()),
        }
    }

    /// The blockers of our node `name` in a listing; our node missing from it means it was
    /// deleted (by someone else, or with its session).
    fn queue(&self, children: Vec<String>, name: &str, protect: &str) -> Result<Queue> {
        Queue::new(self.kind, children, name, protect).ok_or_else(|| Error::Dequeued {
            key: self.key.to_string(),
        })
    }

    /// Deletes nodes of our own that a create whose reply was lost made after all: they carry
    /// our protected prefix, and must neither block us nor outlive the acquire.
    fn remove_strays(&self, queue: &mut Queue) {
        for stray in queue.strays.drain(..) {
            tracing::debug!(path = %self.path, %stray, "deleting a second node of our own");
            delete_in_background(
                self.inner,
                self.session.client.clone(),
                format!("{}/{stray}", self.path),
            );
        }
    }

    /// Creates the contender node (making the lock path on first use) and lists its siblings,
    /// pipelined: one round trip.
    async fn create(&self, pending: &mut Pending) -> Result<Created> {
        let inner = self.inner;
        let client = &self.session.client;
        let prefix = format!("{}/{}{}", self.path, pending.protect, self.kind.lock_name());
        for _ in 0..PATH_VANISHED_RETRIES {
            // Both requests are sent here, in this order: the listing sees the new node.
            let create = client.create(&prefix, self.data, contender_options(inner));
            // With a children watch: a contender granted on this listing watches its node
            // through it (see `Hold::new`), with no request of its own.
            let list = client.get_and_watch_children(self.path);
            pending.sent = true;
            inner.count(2);
            let (created, listed) = futures::join!(create, list);
            match created {
                Ok((stat, seq)) => {
                    let name = format!("{}{}{seq}", pending.protect, self.kind.lock_name());
                    pending.node = Some(format!("{}/{name}", self.path));
                    let (listing, watcher) = match listed {
                        Ok((children, parent, watcher)) => {
                            (self.listing(children, &parent), Some(watcher))
                        }
                        Err(_) => (self.list().await?, None),
                    };
                    return Ok(Created {
                        name,
                        czxid: stat.czxid,
                        children: listing.children,
                        incarnation: listing.incarnation,
                        watcher,
                    });
                }
                Err(zookeeper_client::Error::NoNode) => {
                    ensure_parents(inner, client, self.path).await?
                }
                Err(ref err) if connection_lost(err) => {
                    // The create may have happened: find it by its protected prefix.
                    self.session
                        .wait_connected("create the contender node", self.deadline)
                        .await?;
                    if let Some(found) = self.find_own(pending).await? {
                        return Ok(found);
                    }
                }
                Err(err) => return Err(Error::zk("create the contender node", self.path, err)),
            }
        }
        Err(Error::zk(
            "create the contender node",
            self.path,
            zookeeper_client::Error::NoNode,
        ))
    }

    /// Looks for the node a create whose reply was lost may have made, by its protected
    /// prefix. The server we reconnected to may lag behind the one that took the create, so it
    /// syncs with the leader first. Should several nodes carry the prefix, the lowest is ours
    /// and the others are deleted.
    async fn find_own(&self, pending: &mut Pending) -> Result<Option<Created>> {
        let client = &self.session.client;
        loop {
            self.inner.count(1);
            match client.sync(self.path).await {
                Ok(()) => break,
                // No lock path: the create failed for want of it; the caller makes it.
                Err(zookeeper_client::Error::NoNode) => return Ok(None),
                Err(err) => {
                    self.retry_or_fail("sync before looking for our node", err)
                        .await?
                }
            }
        }
        let listing = match self.list().await {
            Ok(listing) => listing,
            Err(Error::ZooKeeper {
                source: zookeeper_client::Error::NoNode,
                ..
            }) => return Ok(None),
            Err(err) => return Err(err),
        };
        let mut ours: Vec<&String> = listing
            .children
            .iter()
            .filter(|c| c.starts_with(&pending.protect))
            .collect();
        ours.sort_by(|a, b| self.kind.sort_key(a).cmp(self.kind.sort_key(b)));
        let Some(name) = ours.first().map(|n| n.to_string()) else {
            return Ok(None);
        };
        for stray in &ours[1..] {
            delete_in_background(self.inner, client.clone(), format!("{}/{stray}", self.path));
        }
        let path = format!("{}/{name}", self.path);
        pending.node = Some(path.clone());
        self.inner.count(1);
        match client.check_stat(&path).await {
            Ok(Some(stat)) => Ok(Some(Created {
                name,
                czxid: stat.czxid,
                children: listing.children,
                incarnation: listing.incarnation,
                watcher: None,
            })),
            Ok(None) => {
                pending.node = None;
                Ok(None)
            }
            Err(err) => Err(Error::zk("read the contender node", &path, err)),
        }
    }

    fn listing(&self, children: Vec<String>, parent: &zookeeper_client::Stat) -> Listing {
        Listing {
            children,
            incarnation: Incarnation {
                generation: self.session.generation,
                czxid: parent.czxid,
            },
        }
    }

    async fn list(&self) -> Result<Listing> {
        loop {
            self.inner.count(1);
            match self.session.client.get_children(self.path).await {
                Ok((children, parent)) => return Ok(self.listing(children, &parent)),
                Err(err) => self.retry_or_fail("list the contenders", err).await?,
            }
        }
    }

    /// Waits out a connection loss of this acquire's session (until its deadline); any other
    /// error, or the end of the session, ends the acquire.
    async fn retry_or_fail(
        &self,
        operation: &'static str,
        err: zookeeper_client::Error,
    ) -> Result<()> {
        match err {
            err if connection_lost(&err) => {
                self.session.wait_connected(operation, self.deadline).await
            }
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

/// The watches a waiter has set on the blockers in its window, each answering with the node it
/// was set on.
#[derive(Default)]
struct Watches {
    names: std::collections::HashSet<String>,
    fired: futures::stream::FuturesUnordered<
        futures::future::BoxFuture<'static, (String, zookeeper_client::WatchedEvent)>,
    >,
}

impl Watches {
    fn add(&mut self, node: String, watcher: zookeeper_client::OneshotWatcher) {
        use futures::FutureExt;
        self.names.insert(node.clone());
        self.fired
            .push(async move { (node, watcher.changed().await) }.boxed());
    }

    /// The next watch to fire, and the node it was set on (which is then no longer watched).
    /// Pends forever when nothing is watched: the caller only waits with a blocker watched.
    async fn next(&mut self) -> (String, zookeeper_client::WatchedEvent) {
        use futures::StreamExt;
        match self.fired.next().await {
            Some((node, event)) => {
                self.names.remove(&node);
                (node, event)
            }
            None => std::future::pending().await,
        }
    }
}

/// The lower contenders that block a waiter.
struct Queue {
    kind: NodeKind,
    /// Blockers in ascending order. Exclusive kinds keep the nearest [`WINDOW`] lower nodes;
    /// readers keep every lower writer. See [`Queue::to_watch`].
    below: Vec<String>,
    /// More blockers sort below the window.
    hidden: bool,
    /// The queue ahead is short, or its nearest node has gone: every node in the window is
    /// watched. Until then a waiter behind a longer queue watches only its nearest blocker: the
    /// others go first (every such deletion would be an event for nothing), and when the
    /// nearest goes one pipelined round of watches finds which of them are left.
    near: bool,
    /// Sort key of the lowest node in the window when it was built; hidden nodes sort below it.
    floor: String,
    /// Other nodes of our own (same protected prefix), to delete.
    strays: Vec<String>,
}

impl Queue {
    /// The blockers of `me` in `children`. Other children with our protected prefix `protect`
    /// are ours too (a create whose reply was lost): they never block, and are set aside in
    /// `strays` for deletion.
    /// `None` when `me` is not among the children: our node is gone.
    fn new(kind: NodeKind, mut children: Vec<String>, me: &str, protect: &str) -> Option<Queue> {
        if !children.iter().any(|c| c == me) {
            return None;
        }
        let mut strays = Vec::new();
        children.retain(|c| {
            let stray = c != me && c.starts_with(protect);
            if stray {
                strays.push(c.clone());
            }
            !stray
        });
        let mine = kind.sort_key(me);
        let order = |a: &String, b: &String| kind.sort_key(a).cmp(kind.sort_key(b));
        let mut below: Vec<String> = children
            .into_iter()
            .filter(|c| kind.sort_key(c) < mine)
            .collect();
        if !kind.exclusive() {
            below.retain(|c| kind.blocked_by(c));
            below.sort_unstable_by(order);
            return Some(Queue {
                kind,
                below,
                hidden: false,
                near: true,
                floor: String::new(),
                strays,
            });
        }
        // Nodes whose sequence wrapped are always kept: no floor can vouch for them.
        let mut kept: Vec<String> = Vec::new();
        below.retain(|c| {
            let wrapped = wrapped(kind.sort_key(c));
            if wrapped {
                kept.push(c.clone());
            }
            !wrapped
        });
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
        kept.sort_unstable_by(order);
        kept.append(&mut below);
        let below = kept;
        Some(Queue {
            kind,
            below,
            hidden,
            near: !hidden,
            floor,
            strays,
        })
    }

    /// The blockers to watch: all of an exclusive waiter's window (its nearest lower nodes), or
    /// only the nearest while more sort below the window and none has gone (see
    /// [`near`](Queue::near)); a reader's lowest [`WINDOW`] lower writers (the next ones are
    /// watched as these go).
    fn to_watch(&self) -> &[String] {
        if self.kind.exclusive() {
            if self.near {
                &self.below
            } else {
                &self.below[self.below.len().saturating_sub(1)..]
            }
        } else {
            &self.below[..self.below.len().min(WINDOW)]
        }
    }

    /// `node` is gone.
    fn remove(&mut self, node: &str) {
        self.below.retain(|n| n != node);
    }

    /// Forgets every node sorting below `granted`, the highest node this process was granted an
    /// exclusive hold on in this incarnation of the path: all of those were gone when it was
    /// granted. A sequence that wrapped past 2^31 (a negative `%010d`) sorts below any floor
    /// without being older, so neither such a node nor such a floor prunes anything.
    fn prune_below(&mut self, granted: &str) {
        if wrapped(granted) {
            return;
        }
        let kind = self.kind;
        self.below.retain(|n| {
            let k = kind.sort_key(n);
            wrapped(k) || k >= granted
        });
        if self.hidden && granted >= self.floor.as_str() {
            self.hidden = false;
        }
    }
}

/// The error of an acquire whose session ended while it waited.
fn session_ended(event: &zookeeper_client::WatchedEvent) -> Error {
    match event.session_state {
        zookeeper_client::SessionState::Expired => Error::SessionExpired,
        _ => Error::Closed,
    }
}

/// Whether a sort key is a sequence number that wrapped past 2^31 (`%010d` of a negative).
fn wrapped(sort_key: &str) -> bool {
    sort_key.starts_with('-')
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
        let q = Queue::new(
            NodeKind::Read,
            kids.clone(),
            "_c_4-__READ__0000000004",
            "_c_4-",
        )
        .unwrap();
        assert_eq!(q.below, vec!["_c_2-__WRIT__0000000002".to_string()]);
        let q = Queue::new(
            NodeKind::Read,
            kids.clone(),
            "_c_1-__READ__0000000001",
            "_c_1-",
        )
        .unwrap();
        assert!(q.to_watch().is_empty());
        let q = Queue::new(NodeKind::Write, kids, "_c_5-__WRIT__0000000005", "_c_5-").unwrap();
        // A writer watches every lower node (here all four).
        assert_eq!(q.to_watch().len(), 4);
        assert_eq!(q.to_watch().last().unwrap(), "_c_4-__READ__0000000004");
    }

    #[test]
    fn a_reader_behind_many_writers_watches_the_lowest_window_first() {
        let mut kids: Vec<String> = (0..12)
            .map(|i| format!("_c_{i}-__WRIT__{:010}", i + 1))
            .collect();
        kids.push("_c_me-__READ__0000000013".to_string());
        let mut q = Queue::new(NodeKind::Read, kids, "_c_me-__READ__0000000013", "_c_me-").unwrap();
        assert_eq!(q.to_watch().len(), WINDOW);
        assert!(q.to_watch()[0].ends_with("0000000001"));
        // As the lowest go, the next ones come into view.
        q.remove("_c_0-__WRIT__0000000001");
        assert_eq!(q.to_watch().len(), WINDOW);
        assert!(q.to_watch()[WINDOW - 1].ends_with("0000000009"));
    }

    fn mutex_nodes(seqs: &[&str]) -> Vec<String> {
        seqs.iter()
            .enumerate()
            .map(|(i, seq)| format!("_c_{i}-lock-{seq}"))
            .collect()
    }

    #[test]
    fn other_nodes_with_our_prefix_are_ours_not_blockers() {
        // A create whose reply was lost made `_c_me-lock-0000000001` after all; the retry made
        // `_c_me-lock-0000000003`. The first must not block the second: it is deleted.
        let kids = vec![
            "_c_me-lock-0000000001".to_string(),
            "_c_x-lock-0000000002".to_string(),
            "_c_me-lock-0000000003".to_string(),
        ];
        let q = Queue::new(NodeKind::Mutex, kids, "_c_me-lock-0000000003", "_c_me-").unwrap();
        assert_eq!(q.below, vec!["_c_x-lock-0000000002".to_string()]);
        assert_eq!(q.strays, vec!["_c_me-lock-0000000001".to_string()]);
    }

    #[test]
    fn a_floor_prunes_only_older_nodes_never_wrapped_ones() {
        let kids = mutex_nodes(&["0000000001", "0000000004", "-2147483648", "0000000009"]);
        let me = kids[3].clone();
        let mut q = Queue::new(NodeKind::Mutex, kids, &me, "_c_3-").unwrap();
        assert_eq!(q.below.len(), 3);
        q.prune_below("0000000005");
        // The wrapped sequence sorts below every floor without being older: it stays.
        assert_eq!(q.below, vec!["_c_2-lock--2147483648".to_string()]);
        // A wrapped floor vouches for nothing.
        let kids = mutex_nodes(&["0000000001", "0000000009"]);
        let me = kids[1].clone();
        let mut q = Queue::new(NodeKind::Mutex, kids, &me, "_c_1-").unwrap();
        q.prune_below("-2147483600");
        assert_eq!(q.below, vec!["_c_0-lock-0000000001".to_string()]);
    }

    #[test]
    fn wrapped_nodes_stay_in_the_window_however_long_the_queue() {
        let mut seqs: Vec<String> = (0..20).map(|i| format!("{:010}", i + 100)).collect();
        seqs.push("-2147483647".into());
        seqs.push("0000000999".into());
        let refs: Vec<&str> = seqs.iter().map(String::as_str).collect();
        let kids = mutex_nodes(&refs);
        let me = kids.last().unwrap().clone();
        let q = Queue::new(NodeKind::Mutex, kids, &me, "_c_21-").unwrap();
        assert!(q.hidden);
        assert_eq!(q.below.len(), WINDOW + 1);
        assert!(q.below[0].ends_with("-2147483647"));
    }
}
