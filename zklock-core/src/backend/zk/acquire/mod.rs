//! An acquire on ZooKeeper from start to grant or give-up, Curator's driver loop: create the
//! node (see [`create`]), watch the nodes that block it (see [`queue`](super::queue)) until the
//! last one is gone, and hand the node over, with the watches set on the way, to become a hold;
//! or delete it if the acquire ends without a hold ([`undo`]). Shared by every recipe, in
//! Curator's formats. The granted floor that lets a draining queue skip listings is
//! [`floor`].

mod create;
pub(crate) mod floor;
mod undo;

use std::sync::Arc;

use zookeeper_client::EventType;

use super::error::{session_ended, unknown_node};
use super::path::check_path_acl;
use super::queue::{CuratorMode, Queue, Refused};
use super::session::{delete_in_background, Session};
use super::wire::REVOKE_MESSAGE;
use super::Inner;
use crate::backend::{Acquisition, BoxFuture, Step};
use crate::types::error::{Error, Result};
use crate::types::mode::HoldMode;
use crate::types::token::FencingToken;
pub(crate) use create::create_node;
use create::Attempt;
use floor::{DirTicket, Incarnation};
use undo::Unfinished;

/// An acquire of one contender node of `kind` under `path`, for the driver
/// ([`drive`](crate::backend::drive)). The node, every listing and the granted floor belong to
/// the session that is live when it enters; if that session ends meanwhile, so does the
/// acquire. What it grants is `H`: the seam's shared hold, or the [`Granted`] node itself (a
/// semaphore's gate).
pub(crate) struct NodeAcquisition<'a> {
    inner: &'a Arc<Inner>,
    path: &'a Arc<str>,
    key: &'a Arc<str>,
    kind: HoldMode,
    data: &'a [u8],
    entered: Option<Entered<'a>>,
}

/// A node acquire once entered: its attempt on the live session, the path's local state, the
/// node to delete if it ends without a hold, and what it knows while it waits.
struct Entered<'a> {
    attempt: Attempt<'a>,
    ticket: DirTicket,
    unfinished: Unfinished,
    waiting: Option<Waiting>,
}

impl<'a> NodeAcquisition<'a> {
    /// An acquire of a node of `kind` under `path`, with `data` (by default the manager's).
    pub(crate) fn new(
        inner: &'a Arc<Inner>,
        path: &'a Arc<str>,
        key: &'a Arc<str>,
        kind: HoldMode,
        data: Option<&'a [u8]>,
    ) -> Self {
        NodeAcquisition {
            inner,
            path,
            key,
            kind,
            data: data.unwrap_or(&inner.node_data),
            entered: None,
        }
    }

    /// Whether anything still blocks the node: busy, or granted.
    async fn blocked_or_granted<H: FromGranted>(&mut self) -> Result<Step<H>> {
        let e = self.entered.as_mut().expect("entered");
        let waiting = e.waiting.as_mut().expect("created");
        if e.attempt.blocked(waiting, &e.ticket, &e.unfinished).await? {
            waiting.alone = None;
            return Ok(Step::Busy);
        }
        let Entered {
            attempt,
            ticket,
            unfinished,
            waiting,
        } = self.entered.take().expect("entered");
        let granted = attempt.grant(waiting.expect("created"), ticket, unfinished)?;
        Ok(Step::Held(vec![H::from_granted(granted)]))
    }
}

/// What a node acquire grants: made from the granted node (the seam's shared hold: see
/// `hold`).
pub(crate) trait FromGranted: Send {
    fn from_granted(granted: Granted) -> Self;
}

impl FromGranted for Granted {
    fn from_granted(granted: Granted) -> Self {
        granted
    }
}

impl<H: FromGranted> Acquisition<H> for NodeAcquisition<'_> {
    fn enter(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let inner = self.inner;
            let session = inner.live_session().await?;
            let unfinished = Unfinished::new(inner, &session.client, self.path);
            self.entered = Some(Entered {
                attempt: Attempt {
                    inner,
                    session,
                    path: self.path,
                    key: self.key,
                    kind: self.kind,
                    data: self.data,
                },
                ticket: inner.enter_dir(self.path),
                unfinished,
                waiting: None,
            });
            Ok(())
        })
    }

    /// Creates the node and lists the queue it joined (one round trip).
    fn attempt(&mut self) -> BoxFuture<'_, Result<Step<H>>> {
        Box::pin(async move {
            let e = self.entered.as_mut().expect("entered");
            e.waiting = Some(e.attempt.start(&mut e.unfinished).await?);
            self.blocked_or_granted().await
        })
    }

    /// Watches the blockers not watched yet (and our own node); when there was nothing new to
    /// watch, waits for the next event. Past the wait's deadline the recipe drops the acquire
    /// (and reports the timeout): the node, dropped unfinished, is deleted.
    fn wait(&mut self) -> BoxFuture<'_, Result<Step<H>>> {
        Box::pin(async move {
            let e = self.entered.as_mut().expect("entered");
            let waiting = e.waiting.as_mut().expect("created");
            if !e.attempt.watch_blockers(waiting, &mut e.unfinished).await? {
                e.attempt.next_event(waiting, &mut e.unfinished).await?;
            }
            self.blocked_or_granted().await
        })
    }

    fn give_up(&mut self) -> BoxFuture<'_, ()> {
        if let Some(e) = self.entered.as_mut() {
            e.unfinished.cancel_now();
        }
        Box::pin(async {})
    }
}

/// The data watch a waiter set on its own node while it waited (one request in the round that
/// watched the nodes ahead of it), handed to the hold it became: the node is then watched with
/// no request at the grant.
pub(crate) struct NodeWatch {
    /// The watch's event: the node deleted, its data changed, or the session's end.
    pub(crate) fired: BoxFuture<'static, zookeeper_client::WatchedEvent>,
    /// The node's data was a revoke request when the watch was set.
    pub(crate) revoke_requested: bool,
}

/// What watches a new hold's node with no request of its own.
pub(crate) enum HandedWatch {
    /// Nothing: the hold watches its node's data (one request), unless the manager opted out.
    NoWatch,
    /// The children watch of the listing that showed the node alone and granted it.
    Children(zookeeper_client::OneshotWatcher),
    /// The data watch the waiter set on its own node while it waited.
    OwnNode(NodeWatch),
}

/// A granted contender node, and the watches the acquire set on the way: what
/// [`Hold::granted`](super::hold::Hold::granted) makes a hold of, at once (nothing deletes the
/// node until then).
pub(crate) struct Granted {
    pub(crate) inner: Arc<Inner>,
    pub(crate) session: Session,
    pub(crate) key: Arc<str>,
    pub(crate) node: String,
    pub(crate) token: FencingToken,
    pub(crate) ticket: DirTicket,
    pub(crate) watch: HandedWatch,
}

/// What a waiting acquire knows between two events.
struct Waiting {
    /// Our node's name, and its token.
    name: String,
    czxid: i64,
    /// The incarnation of the lock path the queue was listed on.
    incarnation: Incarnation,
    /// What still blocks our node.
    queue: Queue,
    /// Every blocker in the window is watched (one pipelined round), so the deletion of the
    /// last one is the grant: no request after the predecessor goes, whether the nodes below
    /// it were granted, gave up or died with their sessions (each shows as its deletion).
    /// Behind a longer queue the waiter lists again once the node before its predecessor goes
    /// (see [`Queue::wants_listing`]), keeping the watches of this incarnation's nodes.
    watches: Watches,
    /// The first listing's children watch, kept only if that listing showed our node alone
    /// and granted it (dropped as soon as the acquire waits or lists again).
    alone: Option<zookeeper_client::OneshotWatcher>,
    /// The watch on our own node's data, set in the same round as the blockers': its deletion
    /// while we wait (by someone else) ends the acquire instead of granting a node that is
    /// gone, and the watch is handed to the hold.
    own: Option<NodeWatch>,
    /// The own watch reported a data change and is spent: the hold reads the data.
    own_spent: bool,
}

impl Attempt<'_> {
    /// Creates our node, lists the queue it joined, and checks the path's ACL: with
    /// credentials, a path that lets others delete our node is refused before any grant (our
    /// node, in `unfinished`, is deleted with the error).
    async fn start(&self, unfinished: &mut Unfinished) -> Result<Waiting> {
        let created = self.create(unfinished).await?;
        let name = created.name;
        check_path_acl(
            self.inner,
            &self.session.client,
            self.path,
            created.incarnation.czxid,
        )
        .await?;
        let alone = created
            .watcher
            .filter(|_| created.children.iter().all(|c| *c == name));
        let mut queue = self.queue(created.children, &name, &unfinished.protect)?;
        self.remove_strays(&mut queue);
        Ok(Waiting {
            name,
            czxid: created.czxid,
            incarnation: created.incarnation,
            queue,
            watches: Watches::default(),
            alone,
            own: None,
            own_spent: false,
        })
    }

    /// Whether anything still blocks our node: first forgets what this process's own grants
    /// on this very incarnation of the path vouch for, and lists again when at most the
    /// predecessor is left of the window with more nodes sorting below it.
    async fn blocked(
        &self,
        waiting: &mut Waiting,
        ticket: &DirTicket,
        unfinished: &Unfinished,
    ) -> Result<bool> {
        loop {
            if let Some(floor) = ticket.granted_floor(waiting.incarnation) {
                waiting.queue.prune_below(&floor);
            }
            if !waiting.queue.wants_listing() {
                return Ok(!waiting.queue.below.is_empty());
            }
            waiting.alone = None;
            let listing = self.list().await?;
            if listing.incarnation != waiting.incarnation {
                // Watches on another incarnation's nodes say nothing about this one's.
                waiting.watches = Watches::default();
            }
            waiting.incarnation = listing.incarnation;
            let czxid = waiting.incarnation.czxid;
            check_path_acl(self.inner, &self.session.client, self.path, czxid).await?;
            waiting.queue = self.queue(listing.children, &waiting.name, &unfinished.protect)?;
            self.remove_strays(&mut waiting.queue);
        }
    }

    /// Watches the blockers to watch that are not watched yet, and our own node unless it is
    /// or was, in one pipelined round. `Ok(false)` when there was nothing to watch: the waiter
    /// waits for an event then. A blocker found gone leaves the queue.
    async fn watch_blockers(
        &self,
        waiting: &mut Waiting,
        unfinished: &mut Unfinished,
    ) -> Result<bool> {
        let client = &self.session.client;
        let unwatched: Vec<String> = waiting
            .queue
            .to_watch()
            .iter()
            .filter(|n| !waiting.watches.names.contains(*n))
            .cloned()
            .collect();
        let watch_own = waiting.own.is_none() && !waiting.own_spent;
        if unwatched.is_empty() && !watch_own {
            return Ok(false);
        }
        let own_path = format!("{}/{}", self.path, waiting.name);
        let requests: Vec<_> = unwatched
            .iter()
            .map(|n| client.check_and_watch_stat(&format!("{}/{n}", self.path)))
            .collect();
        self.inner
            .count_requests(requests.len() as u64 + u64::from(watch_own));
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
                waiting.own = Some(NodeWatch {
                    fired: Box::pin(watcher.changed()),
                    revoke_requested: data == REVOKE_MESSAGE,
                })
            }
            Some(Err(zookeeper_client::Error::NoNode)) => return Err(self.deleted(unfinished)),
            Some(Err(err)) => failed = Some(err),
            None => {}
        }
        for (node, result) in unwatched.into_iter().zip(results) {
            match result {
                Ok((None, _)) => waiting.queue.remove(&node),
                Ok((Some(_), watcher)) => waiting.watches.add(node, watcher),
                Err(err) => failed = Some(err),
            }
        }
        if let Some(err) = failed {
            self.retry_or_fail("watch the contenders ahead", err)
                .await?;
        }
        Ok(true)
    }

    /// Waits for the next watch to fire, and takes in what it says: a blocker gone, the
    /// session ended, our own node deleted or its data changed.
    async fn next_event(&self, waiting: &mut Waiting, unfinished: &mut Unfinished) -> Result<()> {
        let next = async {
            match waiting.own.as_mut() {
                Some(own) => tokio::select! {
                    biased;
                    event = &mut own.fired => (None, event),
                    (node, event) = waiting.watches.next() => (Some(node), event),
                },
                None => {
                    let (node, event) = waiting.watches.next().await;
                    (Some(node), event)
                }
            }
        };
        // Past the wait's deadline the recipe drops the acquire (and reports the timeout):
        // `unfinished`, dropped, deletes the node.
        let (node, event) = next.await;
        let Some(node) = node else {
            // Our own node's watch.
            self.own_event(&event, unfinished)?;
            waiting.own = None;
            waiting.own_spent = true;
            return Ok(());
        };
        self.inner
            .stats
            .predecessor_events
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match event.event_type {
            EventType::NodeDeleted => waiting.queue.remove(&node),
            // The session ended while waiting: our node went with it.
            EventType::Session => return Err(session_ended(&event)),
            // Data changed (e.g. a Curator revocation request): the watch is spent; the
            // next round sets it again.
            _ => {}
        }
        Ok(())
    }

    /// Nothing blocks our node: it is granted, and handed over, to become a hold, with the
    /// watches that came with it.
    fn grant(
        &self,
        mut waiting: Waiting,
        ticket: DirTicket,
        mut unfinished: Unfinished,
    ) -> Result<Granted> {
        // Our node's deletion may have been told before the last blocker's, and not looked
        // at yet (both were ready together): it is in its watch's channel by now.
        if let Some(watch) = waiting.own.as_mut() {
            use futures::FutureExt;
            if let Some(event) = (&mut watch.fired).now_or_never() {
                self.own_event(&event, &mut unfinished)?;
                waiting.own = None;
            }
        }
        if self.kind.exclusive() {
            let me = self.kind.sort_key(&waiting.name).to_string();
            ticket.record_grant(waiting.incarnation, &me);
        }
        let node = unfinished.disarm().expect("a granted contender has a node");
        tracing::debug!(key = %self.key, node = %node, token = waiting.czxid, "lock node granted");
        Ok(Granted {
            inner: self.inner.clone(),
            session: self.session.clone(),
            key: self.key.clone(),
            node,
            token: FencingToken::new(waiting.czxid, 0),
            ticket,
            watch: match (waiting.alone, waiting.own) {
                (Some(alone), _) => HandedWatch::Children(alone),
                (None, Some(own)) => HandedWatch::OwnNode(own),
                (None, None) => HandedWatch::NoWatch,
            },
        })
    }

    /// Our node was deleted while we waited (by someone else: the end of the session shows as
    /// such): the acquire ends, and nothing is left to clean up.
    fn deleted(&self, unfinished: &mut Unfinished) -> Error {
        unfinished.disarm();
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
        unfinished: &mut Unfinished,
    ) -> Result<()> {
        match event.event_type {
            EventType::NodeDeleted => Err(self.deleted(unfinished)),
            EventType::Session => Err(session_ended(event)),
            _ => Ok(()),
        }
    }

    /// The blockers of our node `name` in a listing; our node missing from it means it was
    /// deleted (by someone else, or with its session). A child that is no lock contender ends
    /// the acquire (our node is deleted with the error): where it would queue is unknown.
    fn queue(&self, children: Vec<String>, name: &str, protect: &str) -> Result<Queue> {
        Queue::new(self.kind, children, name, protect).map_err(|refused| match refused {
            Refused::Gone => Error::Dequeued {
                key: self.key.to_string(),
            },
            Refused::Unknown(node) => unknown_node(self.path, &node),
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
