//! The backend seam: what a lock service gives the layers above it (local table, frames,
//! guards, recipes, `#[distributed_lock]`), none of which knows which service it is. A new
//! backend is a folder here that implements [`Backend`] and [`BackendHold`] (and the optional
//! abilities it has), and one line in the connect string's scheme parser.
//!
//! What every backend must do:
//!
//! - Grant holds of a lock in a mode ([`LockMode`]) by a deadline ([`Wait`]), with mutual
//!   exclusion between holders of different processes and managers exactly as the mode says,
//!   whatever the network or the servers do: a hold whose certainty is gone reports a loss
//!   (and once lost stays lost) before another contender can be granted.
//! - Give each grant a fencing token above every token of an earlier exclusive grant of the
//!   lock, across restarts of the process and of the server as far as the server keeps its
//!   writes.
//! - Be cancel safe: a dropped acquire leaves nothing on the server (undone in the
//!   background), a dropped hold is released in the background, and [`Backend::flush`] waits
//!   for both. The deadline of a [`Wait`] is the caller's: the recipe drops the acquire at it
//!   and reports the timeout, so a backend never builds `Error::Timeout` (it may bound a wait
//!   on the server by the deadline).
//! - Refuse what it cannot do with [`Error::Unsupported`](crate::types::error::Error), naming
//!   itself and why, at the call, never by weakening a promise.
//!
//! Optional abilities are their own traits, asked for through [`Backend`]: [`Inspect`] (who
//! holds and waits, read from the server), [`Revoke`], and the in-memory test hook [`Lose`];
//! and through [`BackendHold`]: [`Revocable`] (a hold that opts in to revocation).

pub(crate) mod backoff;
pub(crate) mod drive;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod memory;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(any(feature = "redis", feature = "etcd"))]
pub(crate) mod others;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod undos;
#[cfg(feature = "zookeeper")]
pub(crate) mod zk;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::types::backend_kind::BackendKind;
use crate::types::error::Result;
use crate::types::inspect::{LockInfo, LockKind};
use crate::types::loss::{LossReason, LossSignal};
use crate::types::mode::Wait;
use crate::types::token::FencingToken;
pub(crate) use drive::{Acquisition, Step, Wanted};

/// `host=<host> pid=<pid>`, read once.
pub(crate) static HOST_PID: once_cell::sync::Lazy<String> = once_cell::sync::Lazy::new(|| {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "unknown".into());
    format!("host={host} pid={}", std::process::id())
});

/// A boxed, sendable future: what the seam's async methods return.
/// The default lease of a hold on Redis, PostgreSQL and etcd (see their options' `lease`).
pub const DEFAULT_LEASE: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A shared backend hold.
pub(crate) type SharedHold = Arc<dyn BackendHold>;

/// One lock as a backend names it: the user's key (for errors and tracing) and the lock's
/// path, unique per lock and recipe (see `types::layout`), which the backend maps to its own
/// names injectively.
#[derive(Clone, Debug)]
pub(crate) struct LockTarget {
    pub(crate) key: Arc<str>,
    pub(crate) path: Arc<str>,
    /// A leader latch's participant id, kept with its hold (Curator's `LeaderLatch` writes it as
    /// the node's data); `None` for locks.
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    pub(crate) participant: Option<Arc<str>>,
}

impl LockTarget {
    /// A lock's target.
    pub(crate) fn lock(key: Arc<str>, path: Arc<str>) -> LockTarget {
        LockTarget {
            key,
            path,
            participant: None,
        }
    }
}

/// A hold a backend granted. Shared by the local holders it is handed to; released when the
/// last reference drops (in the background) or by [`release`](BackendHold::release).
pub(crate) trait BackendHold: Send + Sync + 'static {
    /// The fencing token of the grant; local handoffs extend it.
    fn token(&self) -> FencingToken;

    /// Where the hold lives on the server, for users and operators (what [`Inspect`] shows as
    /// the contender's location).
    fn location(&self) -> &str;

    /// Why the hold is no longer certain, or `None` while it is held.
    fn loss_reason(&self) -> Option<LossReason>;

    /// Why the hold is no longer certain, from what is known now, without starting anything
    /// (no watch, no request): what metrics read when a hold ends.
    fn loss_known(&self) -> Option<LossReason> {
        self.loss_reason()
    }

    /// The hold's loss signal, apart from the hold (watching it does not keep the hold alive).
    fn loss(&self) -> LossSignal;

    /// The same signal, taken without showing interest: what the local table keeps of each
    /// holder. A backend that watches holds only on interest may show a loss here only once
    /// something else showed interest. By default [`loss`](Self::loss).
    fn loss_unwatched(&self) -> LossSignal {
        self.loss()
    }

    /// Completes once the backend has confirmed that the hold still exists (what a local task
    /// waits for before it takes over a hold handed on to it), or once it is lost.
    fn confirmed(&self) -> BoxFuture<'_, ()>;

    /// Whether another contender (another process, or another manager) may be waiting for
    /// this hold's lock: what the local queue's bound on handoffs applies to. `true` when in
    /// doubt, as here by default. A backend that learns it with a request starts that request
    /// on the first call and answers `true` meanwhile; [`confirmed`](Self::confirmed) waits
    /// for its answer.
    fn others_waiting(&self) -> bool {
        true
    }

    /// Completes once another contender may be waiting for this hold's lock: what ends a
    /// lingering hold (see the local table's linger) at once. Completes at once when in doubt,
    /// as here by default, so that a backend that cannot tell never lingers. It may also
    /// complete when the hold is lost; callers watch [`loss`](Self::loss) as well.
    fn others_appeared(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }

    /// Whether the hold may be granted again by this process with no request (a lingering
    /// hold taken again): it is held, and nothing known says otherwise, including anything
    /// that would keep this process from hearing of a loss now (a backend that keeps holds
    /// through a short disconnection grants nothing new during it). By default, while
    /// [`loss_reason`](Self::loss_reason) is `None`.
    fn can_regrant(&self) -> bool {
        self.loss_reason().is_none()
    }

    /// Releases the hold and waits for the backend's answer. Cancel safe: dropping the future
    /// before the answer leaves the release to the background.
    fn release(&self) -> BoxFuture<'_, Result<()>>;

    /// The hold's optional ability to be revoked ([`Revocable`]); `None`, as here by default,
    /// on a backend without revocation.
    fn revocable(&self) -> Option<&dyn Revocable> {
        None
    }

    /// Turns this write hold into a read hold of the same lock without letting another writer
    /// in. Returns the read hold, and whether the write hold must be kept until the read hold
    /// ends (a writer queued in between).
    fn downgrade(self: Arc<Self>, target: LockTarget) -> BoxFuture<'static, Result<Downgraded>>;
}

/// An optional ability of a hold: opting in to revocation (ZooKeeper: Curator's).
pub(crate) trait Revocable {
    /// Opts in: a revoke request becomes a loss ([`LossReason::Revoked`]).
    fn make_revocable(&self);
}

/// What a downgrade made.
pub(crate) struct Downgraded {
    pub(crate) read: Arc<dyn BackendHold>,
    pub(crate) keep_write: bool,
}

/// A lock service.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Which backend this is: its name in messages, its label in metrics, tracing and errors.
    fn kind(&self) -> BackendKind;

    /// An acquisition of what `wanted` asks of `target`, carried out by the acquire driver
    /// ([`drive`](drive::drive)): waiting as `wait` says (a try attempts once; the deadline is
    /// the caller's). `Err` at once for what this backend cannot do
    /// ([`Error::Unsupported`](crate::types::error::Error)).
    fn acquisition<'a>(
        &'a self,
        target: &'a LockTarget,
        wanted: Wanted,
        wait: Wait,
    ) -> Result<Box<dyn Acquisition + 'a>>;

    /// For a job run under an exclusive hold of `target`: whether an earlier run's
    /// `at_least` window, by the backend's own clock, still covers now (`Ok(false)`: skip);
    /// otherwise records that no run may start before now + `at_least` (`Ok(true)`: run). The
    /// record outlives the process. Only called while holding the job's lock.
    fn claim_run<'a>(
        &'a self,
        target: &'a LockTarget,
        at_least: std::time::Duration,
    ) -> BoxFuture<'a, Result<bool>>;

    /// Waits until every background release and cleanup has finished.
    fn flush(&self) -> BoxFuture<'_, ()>;

    /// Counters of the backend's work, for tests and benchmarks; zero where not counted.
    fn stats(&self) -> BackendStats {
        BackendStats::default()
    }

    /// The backend's optional ability to show operators its locks, or why it has none.
    fn inspector(&self) -> std::result::Result<&dyn Inspect, &'static str> {
        Err("inspection")
    }

    /// The backend's optional ability to ask holders to let go, or why it has none.
    fn revoker(&self) -> std::result::Result<&dyn Revoke, &'static str> {
        Err("revocation")
    }

    /// The backend's optional test hook that makes holds lost, or why it has none.
    fn loser(&self) -> std::result::Result<&dyn Lose, &'static str> {
        Err("lose() (a test hook of the in-memory backend; on a server, end the session or delete the lock)")
    }

    /// The server session the backend holds its locks in, if it has one that users may see.
    fn session(&self) -> Option<SessionInfo> {
        None
    }

    /// How long the server keeps this backend's holds once it hears nothing from it (the
    /// session timeout it granted, a lease), if it has such a bound.
    fn lease(&self) -> Option<std::time::Duration> {
        None
    }

    /// The client the backend talks to its server through, for users' own requests beside
    /// the locks, if it has one that users may share: boxed so that the seam names no
    /// backend's types (`LockManager::client` downcasts it to the type the caller names).
    fn client(&self) -> Option<Box<dyn std::any::Any + Send>> {
        None
    }
}

/// Counters a backend keeps of its work.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct BackendStats {
    /// Wake-ups of waiters by a change of the contender ahead of them.
    pub(crate) predecessor_events: u64,
    /// Requests sent to the server.
    pub(crate) requests: u64,
}

/// The server session a backend holds its locks in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionInfo {
    /// The session's id.
    pub(crate) id: i64,
}

/// An optional ability: showing operators who holds a lock and who waits, read from what the
/// server holds now (never from what this process remembers), with who each contender is
/// (host, pid, identity), since when, and its token.
pub(crate) trait Inspect: Send + Sync {
    /// The lock at `path`: holders, and waiters first in line first. `kind` is the recipe the
    /// path belongs to, or `None` to tell it from what the server holds (a raw path). A lock
    /// nobody holds or waits for is shown empty, not as an error. Each contender's `location`
    /// is what a hold of this process there reports as its [`BackendHold::location`].
    fn inspect<'a>(
        &'a self,
        path: &'a str,
        kind: Option<LockKind>,
    ) -> BoxFuture<'a, Result<LockInfo>>;

    /// The paths under `namespace` the server keeps any state of a lock for (held, waited
    /// for, or kept between uses): a superset of the locks with a holder or a waiter.
    fn lock_paths<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<Vec<String>>>;
}

/// An optional ability: asking the holders of a lock to let go. A holder that opted in
/// ([`BackendHold::make_revocable`]) then loses its hold with [`LossReason::Revoked`].
pub(crate) trait Revoke: Send + Sync {
    /// Asks each holder in `lock` (as [`Inspect::inspect`] showed it); returns who was asked.
    fn revoke<'a>(&'a self, lock: &'a LockInfo) -> BoxFuture<'a, Result<Vec<String>>>;
}

/// An optional test hook: making holds lost as a session expiry would.
pub(crate) trait Lose: Send + Sync {
    /// Makes every hold on `path` lost with `reason`.
    fn lose(&self, path: &str, reason: LossReason);
}
