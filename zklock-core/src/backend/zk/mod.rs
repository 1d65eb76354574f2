//! The ZooKeeper backend: Curator's node protocol on one session at a time: contender nodes,
//! the granted floors, holds and their watches, semaphore leases, downgrades.

mod acquire;
mod error;
pub(crate) mod hold;
mod inspect;
mod options;
pub(crate) mod queue;
pub(crate) mod semaphore;
pub(crate) mod wire;
pub(crate) mod session;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use super::{
    Backend, BackendHold, BackendStats, BoxFuture, Inspect, LockTarget, Revoke, SessionInfo,
    SharedHold,
};
use crate::types::backend_kind::BackendKind;
use crate::types::error::Result;
use crate::types::mode::{HoldMode, LockMode, Wait};
pub use options::ZooKeeperOptions;
pub(crate) use wire::digest_id;
use session::Session;
pub(crate) use session::{SessionConfig, SessionOwner};

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

#[derive(Default)]
pub(crate) struct DirState {
    /// Local contenders (waiting or holding) on this lock path.
    pub(crate) contenders: usize,
    /// What this process learned from its exclusive grants on the path; see [`Floor`].
    pub(crate) granted: Option<Floor>,
}

/// Which incarnation of a lock path, seen through which session, something was learned on: the
/// path's czxid (a path that empties is reaped by the server and may be re-created by anyone,
/// its sequence numbers starting again at 0) and the session's generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Incarnation {
    pub(crate) generation: u64,
    pub(crate) czxid: i64,
}

/// The sort key of the highest node this process was granted an exclusive hold on, in one
/// incarnation of the path: every node of that incarnation that sorts below it was gone at the
/// grant and never comes back. Worth nothing for another incarnation or session.
#[derive(Debug, Clone)]
pub(crate) struct Floor {
    pub(crate) incarnation: Incarnation,
    pub(crate) sort_key: String,
}

/// Counters that tests and benchmarks read; see [`LockManager::stats`](crate::LockManager::stats).
#[derive(Default, Debug)]
pub(crate) struct Stats {
    pub(crate) predecessor_events: AtomicU64,
    pub(crate) requests: AtomicU64,
}

/// Keeps a lock path's local state alive while a contender of this process uses it.
pub(crate) struct DirTicket {
    inner: Arc<Inner>,
    pub(crate) dir: Arc<str>,
}

impl DirTicket {
    /// The granted floor learned on `incarnation` of the path, if any: a floor learned on
    /// another incarnation or session is forgotten here.
    pub(crate) fn granted_floor(&self, incarnation: Incarnation) -> Option<String> {
        let mut dirs = self.inner.dirs.lock().unwrap();
        let state = dirs.get_mut(&self.dir)?;
        match &state.granted {
            Some(floor) if floor.incarnation == incarnation => Some(floor.sort_key.clone()),
            Some(_) => {
                state.granted = None;
                None
            }
            None => None,
        }
    }

    /// Records an exclusive grant of the node sorting as `sort_key` in `incarnation`.
    pub(crate) fn record_grant(&self, incarnation: Incarnation, sort_key: &str) {
        let mut dirs = self.inner.dirs.lock().unwrap();
        if let Some(d) = dirs.get_mut(&self.dir) {
            let higher = match &d.granted {
                Some(floor) if floor.incarnation == incarnation => {
                    floor.sort_key.as_str() < sort_key
                }
                _ => true,
            };
            if higher {
                d.granted = Some(Floor {
                    incarnation,
                    sort_key: sort_key.to_string(),
                });
            }
        }
    }
}

impl Drop for DirTicket {
    fn drop(&mut self) {
        let mut dirs = self.inner.dirs.lock().unwrap();
        if let Some(d) = dirs.get_mut(&self.dir) {
            d.contenders -= 1;
            if d.contenders == 0 {
                dirs.remove(&self.dir);
            }
        }
    }
}

/// The ZooKeeper backend's state: the session owner, the floors, the node data, the counters.
pub(crate) struct Inner {
    pub(crate) config: ZkConfig,
    pub(crate) session: Arc<SessionOwner>,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) dirs: StdMutex<HashMap<Arc<str>, DirState>>,
    /// Lock paths whose ACL was checked (with credentials), by the incarnation (czxid)
    /// checked: a path re-created since is checked again.
    pub(crate) safe_paths: StdMutex<HashMap<Arc<str>, i64>>,
    pub(crate) node_data: Vec<u8>,
    pub(crate) stats: Stats,
}

impl Inner {
    pub(crate) fn count_requests(&self, requests: u64) {
        self.stats.requests.fetch_add(requests, Ordering::Relaxed);
    }

    /// A live session to acquire on; see [`SessionOwner::live_session`].
    pub(crate) async fn live_session(
        &self,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Session> {
        self.session.live_session(deadline).await
    }

    /// Runs `fut` in the background, counted so that a flush waits for it.
    pub(crate) fn spawn_background(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.session.spawn_background(fut)
    }

    /// Registers a local contender on `dir`; the returned token unregisters it on drop.
    pub(crate) fn enter_dir(self: &Arc<Self>, dir: &Arc<str>) -> DirTicket {
        let mut dirs = self.dirs.lock().unwrap();
        dirs.entry(dir.clone()).or_default().contenders += 1;
        DirTicket {
            inner: self.clone(),
            dir: dir.clone(),
        }
    }
}

/// The ZooKeeper backend.
pub(crate) struct ZkBackend {
    pub(crate) inner: Arc<Inner>,
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

    fn acquire<'a>(
        &'a self,
        target: &'a LockTarget,
        mode: LockMode,
        wait: Wait,
    ) -> BoxFuture<'a, Result<Option<Arc<dyn BackendHold>>>> {
        Box::pin(async move {
            let data = target.participant.as_deref().map(str::as_bytes);
            let hold = acquire::acquire_node(
                &self.inner,
                &target.path,
                &target.key,
                HoldMode::from(mode),
                data,
                wait,
            )
            .await?;
            Ok(hold.map(|h| Arc::new(h) as Arc<dyn BackendHold>))
        })
    }

    fn acquire_leases<'a>(
        &'a self,
        target: &'a LockTarget,
        max_leases: u32,
        n: u32,
        wait: Wait,
    ) -> BoxFuture<'a, Result<Option<Vec<SharedHold>>>> {
        Box::pin(semaphore::acquire_leases(
            &self.inner,
            target,
            max_leases,
            n,
            wait,
        ))
    }

    fn claim_run<'a>(
        &'a self,
        target: &'a LockTarget,
        at_least: std::time::Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(wire::claim_run(&self.inner, target, at_least))
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
