//! The etcd backend (feature `etcd`): locks and elections in the wire format of etcd's own
//! `concurrency` package, so that `etcdctl lock`, `etcdctl elect`, etcd's lock service and Go
//! services on `concurrency.Mutex` / `concurrency.Election` take part in the same locks.
//!
//! - A manager's holds live on one etcd lease, its session ([`session`]), kept alive every
//!   TTL/3 and replaced by a new one when it ends. A hold whose lease ended, or could have
//!   ended without a confirmed keep-alive, is lost, before etcd can let another contender in.
//! - A mutex of lock path `P` is the key `P/<lease id in hex>` on that lease; the key with the
//!   lowest create revision under `P/` holds; a waiter watches the deletion of the last key
//!   created before its own (no herd). That is what `concurrency.Mutex` does with the prefix
//!   `P`, and `etcdctl lock P`. A second contender of the same manager on the same lock (the
//!   local queue off) adds `_<n>` to its key: etcd's tools order keys by create revision and
//!   never read their names.
//! - A leader latch is `concurrency.Election` on `P` (`etcdctl elect P`): the same keys,
//!   holding the participant id as the value (etcd's proposal).
//! - A read/write lock is etcd's read/write recipe (`recipe.RWMutex`): `P/read/<n>` and
//!   `P/write/<n>`; a reader waits for the earlier writers, a writer for every earlier key.
//! - The fencing token is the holder key's create revision: every later holder's key was
//!   created later, and revisions only grow, across restarts of etcd too.
//! - A job's run record is the key `<P>%RUN` on a lease of its own, of the job's `at_least`
//!   (rounded up to whole seconds, and at least etcd's minimum TTL): the server lets the window
//!   end, by its own clock, and only ever later (a new etcd leader restarts every lease's TTL).
//!   A claim held up between the lease's grant and the record's put starts the lease's TTL
//!   again with a keep-alive, so the window counts from the put.
//! - A semaphore's leases are keys under its path, put together in one transaction (one create
//!   revision), admitted first come first served within its size ([`semaphore`]).
//! - Revocation is not offered: [`Error::Unsupported`](crate::Error::Unsupported).
//!
//! Where the process cannot know: a hold is safe while its lease is; etcd keeps a lease
//! through a leader change, but a holder paused past its TTL wakes up believing it holds. Its
//! token, checked by a fence store ([`fence`](crate::fence)), refuses what it writes then.
//!
//! The files, one role each:
//! - `mod.rs`: [`EtcdBackend`], its construction, and the `impl Backend` that hands each
//!   method to the files below.
//! - [`connect`]: the connect string, the gRPC client's options and TLS, the first contact.
//! - [`session`]: the manager's lease and its keep-alives, the clients per member, and what
//!   the parts share ([`Inner`](session::Inner)).
//! - [`acquire`]: an acquire from start to grant or give-up, and the undo of one that ends
//!   without a hold (its drop guard).
//! - [`hold`]: a granted hold: release, loss, watch, downgrade, others waiting.
//! - [`jobs`]: a scheduled job's run record (`claim_run`).
//! - [`inspect`]: what an operator sees of a lock.
//! - [`wire`]: the key layout, the transactions' shapes, the requests.
//! - [`options`]: [`EtcdOptions`], the user's settings.
//! - [`error`]: the backend's errors and their mapping to [`Error`](crate::Error).
//! - [`reaper`]: deletes keys of puts that landed late, which nothing of the manager owns.
//! - [`semaphore`]: semaphores: groups of keys admitted first come first served.

mod acquire;
mod connect;
mod error;
mod hold;
mod inspect;
mod jobs;
mod options;
mod reaper;
mod semaphore;
mod session;
mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::{
    Acquisition, Backend, BackendStats, BoxFuture, Inspect, LockTarget, SessionInfo, Wanted,
};
use crate::types::backend_kind::BackendKind;
use crate::types::error::Result;
use crate::types::mode::Wait;
use acquire::{Acquire, Entry, EtcdAcquisition};
pub use options::EtcdOptions;
use semaphore::Leases;
pub(crate) use session::MIN_LEASE;
use session::{attempt_bound, Config, Inner, Session, SessionConfig, MAX_REPLY_TIMEOUT};

/// What the etcd backend is configured with (its part of [`Builder`](crate::Builder)).
#[derive(Clone)]
pub(crate) struct EtcdConfig {
    /// `etcd://[user:password@]host:port[,host:port...]`.
    pub(crate) url: String,
    pub(crate) options: EtcdOptions,
    /// How long connecting may take before the cluster counts as unreachable.
    pub(crate) connect_timeout: Duration,
    /// Shown in the keys' values beside host and pid.
    pub(crate) identity: Option<String>,
    pub(crate) tokens: bool,
}

/// The etcd backend; see [`LockManager::connect`](crate::LockManager::connect).
pub(crate) struct EtcdBackend {
    inner: Arc<Inner>,
    reaper: tokio::task::AbortHandle,
}

impl EtcdBackend {
    /// Connects to the cluster, checks its version, and grants the session's first lease.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) for a connect string the backend cannot use,
    /// credentials etcd refuses, or a server too old;
    /// [`Error::Unreachable`](crate::Error::Unreachable) when no member answers in time.
    pub(crate) async fn connect(config: EtcdConfig) -> Result<EtcdBackend> {
        let (endpoints, url_user) = connect::parse_url(&config.url)?;
        let user = config.options.user.clone().or(url_user);
        let ttl = config.options.lease;
        let client = connect::open(&config, &endpoints, user.as_ref()).await?;
        let session_config = SessionConfig {
            ttl,
            reply_timeout: ttl.min(MAX_REPLY_TIMEOUT),
            attempt: attempt_bound(ttl),
        };
        let keepers = connect::keepers(&config, &endpoints, user.as_ref(), &client)?;
        let session = Session::start(client.clone(), keepers, session_config)
            .await
            .map_err(|e| error::lease_refused(e, user.as_ref().map_or("", |u| u.0.as_str())))?;
        let inner = Arc::new(Inner {
            client,
            session,
            config: Config {
                reply_timeout: session_config.reply_timeout,
                tokens: config.tokens,
                identity: config.identity,
                ttl,
            },
            names: StdMutex::default(),
            next_name: AtomicU64::new(1),
            runtime: tokio::runtime::Handle::current(),
            background: Arc::default(),
            undos: Arc::default(),
            requests: AtomicU64::new(0),
            events: AtomicU64::new(0),
            suspect: std::sync::atomic::AtomicBool::new(false),
        });
        let reaper = reaper::start(&inner);
        Ok(EtcdBackend { inner, reaper })
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        self.reaper.abort();
        self.inner.session.close(&self.inner.runtime);
    }
}

impl Backend for EtcdBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Etcd
    }

    fn acquisition<'a>(
        &'a self,
        target: &'a LockTarget,
        wanted: Wanted,
        wait: Wait,
    ) -> Result<Box<dyn Acquisition + 'a>> {
        let inner = &self.inner;
        let acquire = Acquire {
            inner,
            target,
            wait,
        };
        Ok(match wanted {
            Wanted::Hold(mode) => Box::new(EtcdAcquisition::new(acquire, move |lease| {
                Entry::new(inner, target, mode, lease)
            })),
            Wanted::Leases { max, n } => Box::new(EtcdAcquisition::new(acquire, move |lease| {
                Leases::new(inner, target, n, max, lease)
            })),
        })
    }

    fn claim_run<'a>(
        &'a self,
        target: &'a LockTarget,
        at_least: Duration,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.claim(target, at_least))
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.inner.background.flush())
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            predecessor_events: self.inner.events.load(Ordering::Relaxed),
            requests: self.inner.requests.load(Ordering::Relaxed),
        }
    }

    fn inspector(&self) -> std::result::Result<&dyn Inspect, &'static str> {
        Ok(self)
    }

    fn revoker(&self) -> std::result::Result<&dyn crate::backend::Revoke, &'static str> {
        Err("revocation (an etcd holder is not told of a revoke request; revoke its lease with `etcdctl lease revoke <id in hex>`, which `zklock status` shows as its session)")
    }

    fn session(&self) -> Option<SessionInfo> {
        Some(SessionInfo {
            id: self.inner.session.watch().borrow().id,
        })
    }

    fn lease(&self) -> Option<Duration> {
        Some(self.inner.config.ttl)
    }

    fn client(&self) -> Option<Box<dyn std::any::Any + Send>> {
        Some(Box::new(self.inner.client.clone()))
    }
}
