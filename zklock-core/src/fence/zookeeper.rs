//! The fence on ZooKeeper: a token node per resource, checked and advanced in the same multi
//! as your operations.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use zookeeper_client::{
    Acls, Client, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult, MultiWriter,
};

use super::error::FenceError;
use super::{check_write, Fence, Outcome};
use crate::types::token::FencingToken;

/// How many times a write re-reads the token node after losing a race for it.
const MAX_ATTEMPTS: u32 = 64;

/// Fenced multis on ZooKeeper.
///
/// Each resource has a token node under `root`, holding the last accepted token
/// ([`FencingToken::to_sortable_string`]). A write reads it, returns
/// [`Outcome::Stale`] if the token there is newer, and otherwise commits one multi: the token
/// node set to the new token *at the version it read* (or created, the first time), then
/// your operations. ZooKeeper applies all of it or none; if another writer changed the token
/// node in between, the version check fails, nothing is applied, and the write reads again
/// (up to 64 times, then [`FenceError::Contended`]).
///
/// Nodes are made with the open ACL (`world:anyone`); `root` and its parents are created when
/// missing. Resource names are percent-encoded into one node name.
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager) -> Result<(), Box<dyn std::error::Error>> {
/// use zklock_core::fence::{ZkFence, ZkWrite};
///
/// let fence = ZkFence::new(manager.client::<zklock_core::zookeeper_client::Client>().expect("a ZooKeeper manager"), "/shop/fence")?;
/// let guard = manager.lock("config").await?;
/// let outcome = guard
///     .fenced(&fence)
///     .write(ZkWrite::new(|multi| multi.add_set_data("/shop/config", b"v2", None)))
///     .await?;
/// assert!(outcome.is_accepted());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkFence {
    client: Client,
    root: String,
}

impl fmt::Debug for ZkFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkFence").field("root", &self.root).finish()
    }
}

/// Your operations of one fenced multi: a function that adds them to the multi, called again
/// for each attempt (so it must add the same operations each time). The results of your
/// operations come back in the same order in [`Outcome::Accepted`].
///
/// ```
/// use zklock_core::fence::ZkWrite;
/// use zklock_core::zookeeper_client::{Acls, CreateMode};
///
/// let write = ZkWrite::new(|multi| {
///     multi.add_set_data("/shop/stock/sku_7", b"9", None)?;
///     multi.add_create("/shop/orders/o-1", b"sku_7", &CreateMode::Persistent.with_acls(Acls::anyone_all()))
/// });
/// # let _ = write;
/// ```
#[derive(Clone)]
pub struct ZkWrite(Arc<AddOps>);

type AddOps = dyn for<'a> Fn(&mut MultiWriter<'a>) -> Result<(), ZkError> + Send + Sync;

impl ZkWrite {
    /// The operations `add` adds to the multi, after the token node's.
    ///
    /// ```
    /// let noop = zklock_core::fence::ZkWrite::new(|_multi| Ok(()));
    /// # let _ = noop;
    /// ```
    pub fn new(
        add: impl for<'a> Fn(&mut MultiWriter<'a>) -> Result<(), ZkError> + Send + Sync + 'static,
    ) -> ZkWrite {
        ZkWrite(Arc::new(add))
    }
}

impl fmt::Debug for ZkWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ZkWrite(..)")
    }
}

impl ZkFence {
    /// A fence keeping its token nodes under `root` (an absolute path, e.g. `/myapp/fence`).
    ///
    /// # Errors
    /// [`FenceError::Invalid`] when `root` is not an absolute path without a trailing `/`.
    ///
    /// ```no_run
    /// # fn run(manager: zklock_core::LockManager) -> Result<(), zklock_core::fence::FenceError> {
    /// let fence = zklock_core::fence::ZkFence::new(manager.client::<zklock_core::zookeeper_client::Client>().expect("a ZooKeeper manager"), "/myapp/fence")?;
    /// # let _ = fence; Ok(()) }
    /// ```
    pub fn new(client: Client, root: impl Into<String>) -> Result<ZkFence, FenceError> {
        let root = root.into();
        if !root.starts_with('/') || root.len() < 2 || root.ends_with('/') || root.contains("//") {
            return Err(FenceError::Invalid(format!(
                "the ZooKeeper fence root {root:?} is no node path; give an absolute path such as \"/myapp/fence\""
            )));
        }
        Ok(ZkFence { client, root })
    }

    /// The token node of `resource`.
    ///
    /// ```no_run
    /// # fn run(manager: zklock_core::LockManager) -> Result<(), zklock_core::fence::FenceError> {
    /// let fence = zklock_core::fence::ZkFence::new(manager.client::<zklock_core::zookeeper_client::Client>().expect("a ZooKeeper manager"), "/f")?;
    /// assert_eq!(fence.node_of("/zklock/locks/sku_7"), "/f/%2Fzklock%2Flocks%2Fsku_7");
    /// # Ok(()) }
    /// ```
    pub fn node_of(&self, resource: &str) -> String {
        let mut node = format!("{}/", self.root);
        for b in resource.bytes() {
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
                node.push(b as char);
            } else {
                node.push_str(&format!("%{b:02X}"));
            }
        }
        node
    }

    async fn read(&self, node: &str) -> Result<Option<(FencingToken, i32)>, FenceError> {
        match self.client.get_data(node).await {
            Ok((data, stat)) => {
                let text = String::from_utf8(data).map_err(|e| FenceError::Encoding {
                    found: format!("{:02x?}", e.as_bytes()),
                    expected: "30 decimal digits (FencingToken::to_sortable_string)",
                })?;
                Ok(Some((FencingToken::parse_sortable(&text)?, stat.version)))
            }
            Err(ZkError::NoNode) => Ok(None),
            Err(source) => Err(FenceError::ZooKeeper { op: None, source }),
        }
    }

    async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        write: ZkWrite,
    ) -> Result<Outcome<Vec<MultiWriteResult>>, FenceError> {
        check_write(resource, token)?;
        let node = self.node_of(resource);
        let data = token.to_sortable_string();
        let ours = |source| FenceError::ZooKeeper { op: None, source };
        for _ in 0..MAX_ATTEMPTS {
            let current = self.read(&node).await?;
            let mut multi = self.client.new_multi_writer();
            match current {
                Some((last, _)) if token < last => return Ok(Outcome::Stale { last }),
                Some((_, version)) => multi
                    .add_set_data(&node, data.as_bytes(), Some(version))
                    .map_err(ours)?,
                None => multi
                    .add_create(
                        &node,
                        data.as_bytes(),
                        &CreateMode::Persistent.with_acls(Acls::anyone_all()),
                    )
                    .map_err(ours)?,
            }
            (write.0)(&mut multi).map_err(|source| FenceError::ZooKeeper { op: None, source })?;
            match multi.commit().await {
                Ok(mut results) => {
                    results.remove(0);
                    return Ok(Outcome::Accepted(results));
                }
                // Another writer changed, made or removed the token node since the read.
                Err(MultiWriteError::OperationFailed {
                    index: 0,
                    source: ZkError::BadVersion | ZkError::NodeExists,
                }) => continue,
                Err(MultiWriteError::OperationFailed {
                    index: 0,
                    source: ZkError::NoNode,
                }) => {
                    if current.is_none() {
                        // The root is missing (the first write under it).
                        match self
                            .client
                            .mkdir(
                                &self.root,
                                &CreateMode::Persistent.with_acls(Acls::anyone_all()),
                            )
                            .await
                        {
                            Ok(()) | Err(ZkError::NodeExists) => {}
                            Err(source) => return Err(ours(source)),
                        }
                    }
                    continue;
                }
                Err(MultiWriteError::OperationFailed { index: 0, source }) => {
                    return Err(ours(source))
                }
                Err(MultiWriteError::OperationFailed { index, source }) => {
                    return Err(FenceError::ZooKeeper {
                        op: Some(index - 1),
                        source,
                    })
                }
                Err(MultiWriteError::RequestFailed { source }) => return Err(ours(source)),
            }
        }
        Err(FenceError::Contended {
            resource: resource.to_string(),
            attempts: MAX_ATTEMPTS,
        })
    }
}

impl Fence for ZkFence {
    type Write = ZkWrite;
    /// The results of your operations, in order.
    type Applied = Vec<MultiWriteResult>;

    fn fenced_write(
        &self,
        resource: &str,
        token: FencingToken,
        write: ZkWrite,
    ) -> impl Future<Output = Result<Outcome<Vec<MultiWriteResult>>, FenceError>> + Send {
        self.write(resource, token, write)
    }

    fn last_token(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<FencingToken>, FenceError>> + Send {
        let node = self.node_of(resource);
        async move { Ok(self.read(&node).await?.map(|(t, _)| t)) }
    }
}
