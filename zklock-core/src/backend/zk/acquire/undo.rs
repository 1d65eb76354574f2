//! The undo of an acquire that ends without a hold (an error, a timeout, a cancellation): its
//! contender node is deleted in the background, or, when only the create was sent, whatever
//! node carries its protected prefix.

use std::sync::Arc;

use zookeeper_client::Client;

use super::super::error::connection_lost;
use super::super::session::{delete_in_background, wait_reconnect};
use super::super::wire::protected_prefix;
use super::super::Inner;

/// The contender node of an acquire in progress: if the acquire ends without a hold (error,
/// timeout, cancellation), the node is deleted.
pub(super) struct Unfinished {
    inner: Arc<Inner>,
    client: Client,
    dir: Arc<str>,
    pub(super) protect: String,
    pub(super) node: Option<String>,
    /// The create was sent: if no node is known, one may still exist under `protect`.
    pub(super) sent: bool,
}

impl Unfinished {
    /// A contender about to be created under `dir`, with a fresh protected prefix
    /// (`_c_<uuid>-`, Curator's protection).
    pub(super) fn new(inner: &Arc<Inner>, client: &Client, dir: &Arc<str>) -> Unfinished {
        Unfinished {
            inner: inner.clone(),
            client: client.clone(),
            dir: dir.clone(),
            protect: protected_prefix(),
            node: None,
            sent: false,
        }
    }

    /// The acquire succeeded: the node now belongs to the hold.
    pub(super) fn disarm(&mut self) -> Option<String> {
        self.sent = false;
        self.node.take()
    }

    pub(super) fn cancel_now(&mut self) {
        if let Some(node) = self.node.take() {
            delete_in_background(&self.inner, self.client.clone(), node);
        }
        self.sent = false;
    }
}

impl Drop for Unfinished {
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

/// Removes the node a create may have made when its reply never came: the `_c_<uuid>-`
/// prefix finds it (Curator's protected mode). The listing is sent now, so it is ordered
/// after the create.
pub(super) fn delete_by_prefix_in_background(
    inner: &Arc<Inner>,
    client: Client,
    dir: Arc<str>,
    prefix: String,
) {
    inner.count_requests(1);
    let listing = client.get_children(&dir);
    let owner = inner.clone();
    inner.spawn_background(async move {
        let mut result = listing.await.map(|(children, _)| children);
        loop {
            match result {
                Ok(children) => {
                    for child in children.into_iter().filter(|c| c.starts_with(&prefix)) {
                        delete_in_background(&owner, client.clone(), format!("{dir}/{child}"));
                    }
                    return;
                }
                Err(err) if connection_lost(&err) => {
                    if !wait_reconnect(&client).await {
                        return;
                    }
                    owner.count_requests(1);
                    result = client.list_children(&dir).await;
                }
                Err(_) => return,
            }
        }
    });
}
