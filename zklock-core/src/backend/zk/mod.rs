//! The ZooKeeper backend: Curator's node protocol on one session at a time.
//!
//! - `mod.rs`: this map, the backend's state and its construction, and the `impl Backend`.
//! - [`session`]: the session and its owner, its health, the retry policy, the background tasks.
//! - [`acquire`]: an acquire from start to grant or give-up: the create, the wait, the undo.
//! - [`hold`]: a granted node: release, loss, the node's watch, downgrade, others waiting.
//! - [`jobs`]: a scheduled job's run record (`claim_run`).
//! - [`inspect`]: inspection and revocation.
//! - [`wire`]: the nodes as the server sees them: create modes and ACLs, names, data.
//! - [`options`]: the user's settings, [`ZooKeeperOptions`].
//! - [`error`]: the client's errors and their mapping to zklock's `Error`.
//! - [`queue`]: Curator's queue rules: the nodes' order, which lower node blocks whom.
//! - [`path`]: the lock path: made as CONTAINER nodes, its ACL checked.
//! - [`semaphore`]: the leases of Curator's `InterProcessSemaphoreV2`.

mod acquire;
mod error;
mod hold;
mod inspect;
mod jobs;
mod options;
mod path;
mod queue;
mod semaphore;
mod session;
mod wire;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use super::{
    Acquisition, Backend, BackendStats, BoxFuture, Inspect, LockTarget, Revoke, SessionInfo, Wanted,
};
use crate::types::backend_kind::BackendKind;
use crate::types::error::Result;
use crate::types::mode::{HoldMode, Wait};
use acquire::floor::DirState;
use acquire::NodeAcquisition;
pub use options::ZooKeeperOptions;
use session::Session;
pub(crate) use session::{SessionConfig, SessionOwner};
pub(crate) use wire::digest_id;

/// What the ZooKeeper backend is configured with (its part of [`Builder`](crate::Builder)).
#[derive(Debug, Clone)]
pub(crate) struct ZkConfig {
    pub(crate) revocable: bool,
    pub(crate) watch_held_nodes: bool,
    pub(crate) identity: Option<String>,
    /// The session authenticates: lock paths and nodes get `creator_all` ACLs.
    pub(crate) protected: bool,
    /// The digest scheme's id of the session's credentials (`user:base64(sha1(user:password))`),
    /// when it authenticates: the only id a lock path's ACL may give DELETE or ADMIN.
    pub(crate) owner: Option<String>,
}

/// Counters that tests and benchmarks read; see [`LockManager::stats`](crate::LockManager::stats).
#[derive(Default, Debug)]
struct Stats {
    predecessor_events: AtomicU64,
    requests: AtomicU64,
}

/// The ZooKeeper backend's state: the session owner, the floors, the node data, the counters.
struct Inner {
    config: ZkConfig,
    session: Arc<SessionOwner>,
    runtime: tokio::runtime::Handle,
    dirs: StdMutex<HashMap<Arc<str>, DirState>>,
    /// Lock paths whose ACL was checked (with credentials), by the incarnation (czxid)
    /// checked: a path re-created since is checked again.
    safe_paths: StdMutex<HashMap<Arc<str>, i64>>,
    node_data: Vec<u8>,
    stats: Stats,
}

impl Inner {
    fn count_requests(&self, requests: u64) {
        self.stats.requests.fetch_add(requests, Ordering::Relaxed);
    }

    /// A live session to acquire on; see [`SessionOwner::live_session`].
    async fn live_session(&self) -> Result<Session> {
        self.session.live_session().await
    }

    /// Runs `fut` in the background, counted so that a flush waits for it.
    fn spawn_background(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.session.spawn_background(fut)
    }
}

/// The ZooKeeper backend.
pub(crate) struct ZkBackend {
    inner: Arc<Inner>,
}

impl ZkBackend {
    pub(crate) fn new(session: Arc<SessionOwner>, config: ZkConfig) -> ZkBackend {
        let node_data = wire::node_data(config.identity.as_deref());
        ZkBackend {
            inner: Arc::new(Inner {
                runtime: session.runtime.clone(),
                session,
                dirs: StdMutex::new(HashMap::new()),
                safe_paths: StdMutex::new(HashMap::new()),
                node_data,
                stats: Stats::default(),
                config,
            }),
        }
    }
}

impl Backend for ZkBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::ZooKeeper
    }

    fn acquisition<'a>(
        &'a self,
        target: &'a LockTarget,
        wanted: Wanted,
        wait: Wait,
    ) -> Result<Box<dyn Acquisition + 'a>> {
        let inner = &self.inner;
        Ok(match wanted {
            Wanted::Hold(mode) => Box::new(NodeAcquisition::new(
                inner,
                &target.path,
                &target.key,
                HoldMode::from(mode),
                target.participant.as_deref().map(str::as_bytes),
            )),
            Wanted::Leases { max, n } => Box::new(semaphore::LeasesAcquisition::new(
                inner, target, max, n, wait,
            )),
        })
    }

    fn claim_run<'a>(
        &'a self,
        target: &'a LockTarget,
        at_least: std::time::Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(jobs::claim_run(&self.inner, target, at_least))
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.inner.session.flush())
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            predecessor_events: self.inner.stats.predecessor_events.load(Ordering::Relaxed),
            requests: self.inner.stats.requests.load(Ordering::Relaxed),
        }
    }

    fn inspector(&self) -> std::result::Result<&dyn Inspect, &'static str> {
        Ok(self)
    }

    fn revoker(&self) -> std::result::Result<&dyn Revoke, &'static str> {
        Ok(self)
    }

    fn session(&self) -> Option<SessionInfo> {
        let client = self.inner.session.client();
        Some(SessionInfo {
            id: client.session_id().0,
        })
    }

    fn lease(&self) -> Option<std::time::Duration> {
        Some(self.inner.session.client().session_timeout())
    }

    fn client(&self) -> Option<Box<dyn std::any::Any + Send>> {
        Some(Box::new(self.inner.session.client()))
    }
}
