//! Creating a contender node and recovering it: the create and the listing pipelined in one
//! round trip, and Curator's protected prefix to find a node whose create reply was lost.

use std::sync::Arc;

use super::super::error::{connection_lost, is_no_node, zk_error};
use super::super::path::{check_path_acl, ensure_parents, PATH_VANISHED_RETRIES};
use super::super::queue::CuratorMode;
use super::super::session::{delete_in_background, Session};
use super::super::wire::contender_options;
use super::super::Inner;
use super::floor::{DirTicket, Incarnation};
use super::undo::Unfinished;
use crate::types::error::Result;
use crate::types::mode::HoldMode;
use crate::types::token::FencingToken;

/// A contender node made without waiting for it (see [`create_node`]).
pub(crate) struct NewNode {
    /// The node's path.
    pub(crate) node: String,
    /// Its token (its czxid).
    pub(crate) token: FencingToken,
    /// The lock path's local state, kept while the node is.
    pub(crate) ticket: DirTicket,
    /// The lock path's children, listed right after the create.
    pub(crate) children: Vec<String>,
}

/// Creates a contender node of `kind` under `path` on `session` without waiting for it (a
/// downgrade or a semaphore lease, whose caller holds what excludes the others on that very
/// session), and returns it with the listing taken after it.
pub(crate) async fn create_node(
    inner: &Arc<Inner>,
    session: &Session,
    path: &Arc<str>,
    key: &Arc<str>,
    kind: HoldMode,
) -> Result<NewNode> {
    let attempt = Attempt {
        inner,
        session: session.clone(),
        path,
        key,
        kind,
        data: &inner.node_data,
    };
    let ticket = inner.enter_dir(path);
    let mut unfinished = Unfinished::new(inner, &session.client, path);
    let created = attempt.create(&mut unfinished).await?;
    check_path_acl(inner, &session.client, path, created.incarnation.czxid).await?;
    let node = unfinished.disarm().expect("a created contender has a node");
    Ok(NewNode {
        node,
        token: FencingToken::new(created.czxid, 0),
        ticket,
        children: created.children,
    })
}

/// A listing of a lock path, and the incarnation of the path it was taken on.
pub(super) struct Listing {
    pub(super) children: Vec<String>,
    pub(super) incarnation: Incarnation,
}

/// What [`Attempt::create`] made: the node's name and czxid, and the listing after it.
pub(super) struct Created {
    pub(super) name: String,
    pub(super) czxid: i64,
    pub(super) children: Vec<String>,
    pub(super) incarnation: Incarnation,
    /// The children watch the listing set (none when the listing was retried).
    pub(super) watcher: Option<zookeeper_client::OneshotWatcher>,
}

/// One attempt at a lock: the contender node it makes, on the session that is live when it
/// starts. Its node, every listing and the granted floor belong to that session.
pub(super) struct Attempt<'a> {
    pub(super) inner: &'a Arc<Inner>,
    pub(super) session: Session,
    pub(super) path: &'a Arc<str>,
    pub(super) key: &'a Arc<str>,
    pub(super) kind: HoldMode,
    /// The new node's data: who made it (a leader latch's participant id).
    pub(super) data: &'a [u8],
}

impl Attempt<'_> {
    /// Creates the contender node (making the lock path on first use) and lists its siblings,
    /// pipelined: one round trip.
    pub(super) async fn create(&self, unfinished: &mut Unfinished) -> Result<Created> {
        let inner = self.inner;
        let client = &self.session.client;
        let prefix = format!(
            "{}/{}{}",
            self.path,
            unfinished.protect,
            self.kind.lock_name()
        );
        for _ in 0..PATH_VANISHED_RETRIES {
            // Both requests are sent here, in this order: the listing sees the new node.
            let create = client.create(&prefix, self.data, contender_options(inner));
            // With a children watch: a contender granted on this listing watches its node
            // through it (see `Hold::new`), with no request of its own.
            let list = client.get_and_watch_children(self.path);
            unfinished.sent = true;
            inner.count_requests(2);
            let (created, listed) = futures::join!(create, list);
            match created {
                Ok((stat, seq)) => {
                    let name = format!("{}{}{seq}", unfinished.protect, self.kind.lock_name());
                    unfinished.node = Some(format!("{}/{name}", self.path));
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
                    self.session.wait_connected().await?;
                    if let Some(found) = self.find_own(unfinished).await? {
                        return Ok(found);
                    }
                }
                Err(err) => return Err(zk_error("create the contender node", self.path, err)),
            }
        }
        Err(zk_error(
            "create the contender node",
            self.path,
            zookeeper_client::Error::NoNode,
        ))
    }

    /// Looks for the node a create whose reply was lost may have made, by its protected
    /// prefix. The server we reconnected to may lag behind the one that took the create, so it
    /// syncs with the leader first. Should several nodes carry the prefix, the lowest is ours
    /// and the others are deleted.
    async fn find_own(&self, unfinished: &mut Unfinished) -> Result<Option<Created>> {
        let client = &self.session.client;
        loop {
            self.inner.count_requests(1);
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
            Err(err) if is_no_node(&err) => return Ok(None),
            Err(err) => return Err(err),
        };
        let mut ours: Vec<&String> = listing
            .children
            .iter()
            .filter(|c| c.starts_with(&unfinished.protect))
            .collect();
        ours.sort_by(|a, b| self.kind.sort_key(a).cmp(self.kind.sort_key(b)));
        let Some(name) = ours.first().map(|n| n.to_string()) else {
            return Ok(None);
        };
        for stray in &ours[1..] {
            delete_in_background(self.inner, client.clone(), format!("{}/{stray}", self.path));
        }
        let path = format!("{}/{name}", self.path);
        unfinished.node = Some(path.clone());
        self.inner.count_requests(1);
        match client.check_stat(&path).await {
            Ok(Some(stat)) => Ok(Some(Created {
                name,
                czxid: stat.czxid,
                children: listing.children,
                incarnation: listing.incarnation,
                watcher: None,
            })),
            Ok(None) => {
                unfinished.node = None;
                Ok(None)
            }
            Err(err) => Err(zk_error("read the contender node", &path, err)),
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

    pub(super) async fn list(&self) -> Result<Listing> {
        loop {
            self.inner.count_requests(1);
            match self.session.client.get_children(self.path).await {
                Ok((children, parent)) => return Ok(self.listing(children, &parent)),
                Err(err) => self.retry_or_fail("list the contenders", err).await?,
            }
        }
    }

    /// Waits out a connection loss of this acquire's session; any other error, or the end of
    /// the session, ends the acquire.
    pub(super) async fn retry_or_fail(
        &self,
        operation: &'static str,
        err: zookeeper_client::Error,
    ) -> Result<()> {
        match err {
            err if connection_lost(&err) => self.session.wait_connected().await,
            err => Err(zk_error(operation, self.path, err)),
        }
    }
}
