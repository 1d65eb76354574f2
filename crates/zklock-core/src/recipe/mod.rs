//! Lock recipes on ephemeral sequential znodes, in Apache Curator's wire format.

pub(crate) mod contender;
pub(crate) mod mutex;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use once_cell::sync::Lazy;
use zookeeper_client::{Acls, Client, CreateMode, CreateOptions, SessionState};

use crate::error::{Error, Result};
use crate::frame::Reentry;
use crate::guard::{HoldMode, OwnedLockGuard};
use crate::manager::Inner;
use crate::private::OnLost;

/// One lock of one recipe: what the handles (`Mutex`, each side of `RwLock`) share.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) manager: crate::LockManager,
    pub(crate) path: Arc<str>,
    pub(crate) key: Arc<str>,
    pub(crate) kind: contender::NodeKind,
}

impl Target {
    fn mode(&self) -> HoldMode {
        match self.kind {
            contender::NodeKind::Mutex => HoldMode::Exclusive,
            contender::NodeKind::Read => HoldMode::Read,
            contender::NodeKind::Write => HoldMode::Write,
            contender::NodeKind::Lease => HoldMode::Lease,
        }
    }

    /// A guard: a re-entry when an enclosing frame holds the lock, else a real acquire.
    /// `Ok(None)` only for [`Wait::Never`] when the lock is taken.
    pub(crate) async fn guard(&self, wait: contender::Wait) -> Result<Option<OwnedLockGuard>> {
        let try_only = matches!(wait, contender::Wait::Never);
        match crate::frame::reenter(&self.path, self.mode(), &self.key, try_only).await? {
            Reentry::Entered(grant, gate) => {
                return Ok(Some(OwnedLockGuard::reentered(
                    grant,
                    Some(gate),
                    self.key.clone(),
                )))
            }
            Reentry::Busy => return Ok(None),
            Reentry::NotHeld => {}
        }
        let started = std::time::Instant::now();
        let span = tracing::debug_span!("zklock.acquire", key = %self.key, kind = ?self.kind);
        let acquire =
            crate::local::acquire(&self.manager.inner, &self.path, &self.key, self.kind, wait);
        let grant = tracing::Instrument::instrument(acquire, span).await?;
        if let Some(g) = &grant {
            let waited_ms = started.elapsed().as_millis() as u64;
            tracing::debug!(key = %self.key, token = %g.token, waited_ms, "zklock: acquired");
        }
        Ok(grant.map(|g| OwnedLockGuard::new(g, self.key.clone())))
    }

    /// Runs `body` in a holder frame of this lock.
    pub(crate) async fn run<T, F: Future<Output = T>>(
        &self,
        timeout: Option<Duration>,
        on_lost: OnLost,
        body: F,
    ) -> Result<T> {
        let guard = Box::pin(self.guard(contender::Wait::timeout(timeout))).await?;
        let guard = guard.expect("a blocking wait ends with the lock or an error");
        let grant = guard.grant().clone();
        let key = &self.key;
        let span = tracing::debug_span!("zklock.hold", key = %self.key, token = %grant.token);
        let body = tracing::Instrument::instrument(body, span);
        let result = crate::frame::run_in(grant.clone(), async move {
            match on_lost {
                OnLost::Continue => Ok(body.await),
                OnLost::Abort => {
                    tokio::pin!(body);
                    tokio::select! {
                        biased;
                        reason = grant.lost() => Err(Error::LockLost { key: key.to_string(), reason }),
                        value = &mut body => Ok(value),
                    }
                }
            }
        })
        .await;
        drop(guard);
        result
    }
}

pub(crate) static EPHEMERAL_SEQUENTIAL: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
/// Contender nodes of a manager with credentials: only the same credentials may touch them.
pub(crate) static EPHEMERAL_SEQUENTIAL_PROTECTED: CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::creator_all());
static CONTAINER: CreateOptions<'static> = CreateMode::Container.with_acls(Acls::anyone_all());
static CONTAINER_PROTECTED: CreateOptions<'static> =
    CreateMode::Container.with_acls(Acls::creator_all());

/// The create options of contender nodes for `inner`'s manager.
pub(crate) fn contender_options(inner: &Inner) -> &'static CreateOptions<'static> {
    if inner.config.protected() {
        &EPHEMERAL_SEQUENTIAL_PROTECTED
    } else {
        &EPHEMERAL_SEQUENTIAL
    }
}

/// The data each contender node carries: who created it (Curator writes the client's address).
/// `zklock host=<host> pid=<pid>[ id=<identity>]`; see [`crate::inspect::Owner`].
pub(crate) fn node_data(identity: Option<&str>) -> Vec<u8> {
    static HOST: Lazy<String> = Lazy::new(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| "unknown".into())
    });
    let mut data = format!("zklock host={} pid={}", *HOST, std::process::id());
    if let Some(id) = identity {
        data.push_str(" id=");
        data.push_str(id);
    }
    data.into_bytes()
}

/// The text Curator sorts contenders by: what follows the last occurrence of the lock name
/// (`StandardLockInternalsDriver.fixForSorting`). Compared as strings, as Curator does.
pub(crate) fn sort_key<'a>(node: &'a str, lock_name: &str) -> &'a str {
    match node.rfind(lock_name) {
        Some(i) => &node[i + lock_name.len()..],
        None => node,
    }
}

/// Creates `dir` and its missing ancestors as CONTAINER nodes, which the server removes once
/// they are empty, so that no lock path is left behind.
///
/// With credentials, the lock path itself is `creator_all` (deleting a child needs DELETE on
/// its parent, so this is what keeps other tenants from removing contenders); the ancestors
/// stay open so that every tenant can make its own lock paths.
pub(crate) async fn ensure_parents(inner: &Inner, client: &Client, dir: &str) -> Result<()> {
    let leaf = if inner.config.protected() {
        &CONTAINER_PROTECTED
    } else {
        &CONTAINER
    };
    for _ in 0..10 {
        match client.create(dir, &[], leaf).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => return Ok(()),
            Err(zookeeper_client::Error::NoNode) => {
                let parent = &dir[..dir.rfind('/').unwrap_or(0)];
                if !parent.is_empty() {
                    match client.mkdir(parent, &CONTAINER).await {
                        Ok(()) => {}
                        // mkdir makes every ancestor: only a missing chroot stops it for good.
                        Err(zookeeper_client::Error::NoNode)
                            if matches!(client.check_stat("/").await, Ok(None)) =>
                        {
                            return Err(Error::Config(format!(
                                "cannot create the lock path {dir}: the chroot of the connect \
                                 string does not exist on the server; create it first or remove \
                                 it from the connect string"
                            )))
                        }
                        Err(zookeeper_client::Error::NoNode) => {}
                        Err(err) => return Err(Error::zk("create the lock path", parent, err)),
                    }
                }
            }
            Err(err) => return Err(Error::zk("create the lock path", dir, err)),
        }
    }
    Err(Error::zk(
        "create the lock path",
        dir,
        zookeeper_client::Error::NoNode,
    ))
}

/// Waits until `client`'s session is connected; false when the session is over for good.
pub(crate) async fn wait_reconnect(client: &Client) -> bool {
    let mut watcher = client.state_watcher();
    let mut state = watcher.state();
    loop {
        match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => return true,
            SessionState::Disconnected => state = watcher.changed().await,
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                return false
            }
        }
    }
}

/// Deletes a contender node: the request is sent now, so that any later request of this
/// session is ordered after it; the reply is awaited in the background, retrying on
/// connection loss until the node is gone or the session (and so the node) has ended.
pub(crate) fn delete_in_background(inner: &Arc<Inner>, client: Client, path: String) {
    inner.count(1);
    let first = client.delete(&path, None);
    let counter = inner.clone();
    inner.spawn_background(async move {
        let mut result = first.await;
        loop {
            match result {
                Ok(()) | Err(zookeeper_client::Error::NoNode) => return,
                Err(err) if connection_lost(&err) => {
                    if !wait_reconnect(&client).await {
                        return;
                    }
                    counter.count(1);
                    result = client.delete(&path, None).await;
                }
                Err(err) if is_terminal(&err) => return,
                Err(err) => {
                    tracing::warn!(%path, %err, "could not delete lock node");
                    return;
                }
            }
        }
    });
}

/// Removes the node a create may have made when its reply never came: the `_c_<uuid>-`
/// prefix finds it (Curator's protected mode). The listing is sent now, so it is ordered
/// after the create.
pub(crate) fn delete_by_prefix_in_background(
    inner: &Arc<Inner>,
    client: Client,
    dir: Arc<str>,
    prefix: String,
) {
    inner.count(1);
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
                    owner.count(1);
                    result = client.list_children(&dir).await;
                }
                Err(_) => return,
            }
        }
    });
}

/// Whether a request failed because its connection broke (its outcome unknown, the session
/// possibly alive): zookeeper-client reports a clean close as `ConnectionLoss`, but fails the
/// requests in flight with the transport's own error (`Custom`: a reset connection, no answer
/// within the read timeout) when the connection breaks otherwise. Both are a connection loss.
pub(crate) fn connection_lost(err: &zookeeper_client::Error) -> bool {
    matches!(
        err,
        zookeeper_client::Error::ConnectionLoss | zookeeper_client::Error::Custom(_)
    )
}

fn is_terminal(err: &zookeeper_client::Error) -> bool {
    matches!(
        err,
        zookeeper_client::Error::SessionExpired
            | zookeeper_client::Error::ClientClosed
            | zookeeper_client::Error::AuthFailed
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_like_curator() {
        assert_eq!(
            sort_key("_c_8d0f-lock-0000000007", contender::MUTEX_NAME),
            "0000000007"
        );
        assert_eq!(
            sort_key("lock-0000000003", contender::MUTEX_NAME),
            "0000000003"
        );
        // The last occurrence counts, so a uuid or prefix containing "lock-" does not confuse it.
        assert_eq!(
            sort_key("_c_x-lock-lock-0000000001", contender::MUTEX_NAME),
            "0000000001"
        );
        assert_eq!(sort_key("foreign", contender::MUTEX_NAME), "foreign");
    }
}
