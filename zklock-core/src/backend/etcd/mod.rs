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
//! - Revocation is not offered: [`Error::Unsupported`].
//!
//! Where the process cannot know: a hold is safe while its lease is; etcd keeps a lease
//! through a leader change, but a holder paused past its TTL wakes up believing it holds. Its
//! token, checked by a fence store ([`fence`](crate::fence)), refuses what it writes then.

mod acquire;
mod error;
mod hold;
mod inspect;
mod options;
mod reaper;
mod semaphore;
mod session;
mod wire;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};

use super::undos::Undos;
use super::{
    Backend, BackendHold, BackendStats, BoxFuture, Inspect, LockTarget, SessionInfo, SharedHold,
    HOST_PID,
};
use crate::background::Background;
use crate::types::backend_kind::BackendKind;
use crate::types::error::{redacted, Error, Result, ServerError};
use crate::types::mode::{LockMode, Wait};
use acquire::Acquire;
pub use options::EtcdOptions;
pub(crate) use session::MIN_LEASE;
use session::{Keepers, Session, SessionConfig};

/// The longest any single request waits for its reply; shorter when the lease is.
const MAX_REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// The oldest etcd the backend works with (revision bounds on range reads, lease keep-alive
/// streams and watches from a revision: all in 3.4's v3 API).
const OLDEST: (u32, u32) = (3, 4);

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

/// The settings the backend's parts read.
pub(crate) struct Config {
    pub(crate) reply_timeout: Duration,
    pub(crate) tokens: bool,
    identity: Option<String>,
    pub(crate) ttl: Duration,
}

/// What the backend's holds and tasks share.
pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) session: Session,
    pub(crate) config: Config,
    /// The keys this manager's contenders use now: a name is taken again only once its key is
    /// deleted.
    names: StdMutex<HashSet<String>>,
    next_name: AtomicU64,
    pub(crate) runtime: tokio::runtime::Handle,
    pub(crate) background: Arc<Background>,
    /// Undos of dropped acquires under way, per lock path.
    pub(crate) undos: Arc<Undos<Arc<str>>>,
    requests: AtomicU64,
    events: AtomicU64,
    /// Whether a put of this manager's went unanswered (it may still land): the reaper then
    /// looks for keys nothing owns ([`reaper`]).
    pub(crate) suspect: std::sync::atomic::AtomicBool,
}

impl Inner {
    /// A key name for a contender of this manager in `mode` on `path`, on lease `lease`.
    pub(crate) fn reserve(&self, path: &str, mode: LockMode, lease: i64) -> String {
        let mut names = self.names.lock().expect("not poisoned");
        match mode {
            LockMode::Exclusive | LockMode::Leader => {
                let base = format!("{path}/{lease:x}");
                if names.insert(base.clone()) {
                    return base;
                }
                loop {
                    let n = self.next_name.fetch_add(1, Ordering::Relaxed);
                    let name = format!("{base}_{n}");
                    if names.insert(name.clone()) {
                        return name;
                    }
                }
            }
            LockMode::Read | LockMode::Write => {
                let side = if mode == LockMode::Read {
                    "read"
                } else {
                    "write"
                };
                loop {
                    let nanos = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_nanos();
                    let name = format!("{path}/{side}/{nanos}");
                    if names.insert(name.clone()) {
                        return name;
                    }
                }
            }
        }
    }

    /// Takes exactly `key` as a name, if nothing of this manager has it.
    pub(crate) fn reserve_exact(&self, key: &str) -> bool {
        self.names
            .lock()
            .expect("not poisoned")
            .insert(key.to_string())
    }

    /// Frees a name once its key is deleted.
    pub(crate) fn unreserve(&self, key: &str) {
        self.names.lock().expect("not poisoned").remove(key);
    }

    /// What a contender's key holds: who it is and since when (what inspection shows).
    pub(crate) fn owner_value(&self) -> String {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        match &self.config.identity {
            Some(id) => format!("zklock {} at={ms} id={id}", *HOST_PID),
            None => format!("zklock {} at={ms}", *HOST_PID),
        }
    }

    /// Whether lease `id` may still keep keys: a delete of a key on it is worth retrying.
    pub(crate) fn lease_may_hold(&self, id: i64) -> bool {
        let state = self.session.watch();
        let s = state.borrow();
        s.id == id
            && s.ended.is_none()
            && tokio::time::Instant::now() < s.deadline + self.config.ttl
    }

    pub(crate) fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_event(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }
}

/// A user name and its password.
type User = (String, String);

/// The endpoints of an `etcd://` connect string, and the user it names.
fn parse_url(url: &str) -> Result<(Vec<String>, Option<User>)> {
    let bad = |why: &str| {
        Error::Config(format!(
            "the etcd connect string {} is not usable: {why}; give etcd://[user:password@]host:port[,host:port...]",
            redacted(url)
        ))
    };
    let trimmed = url.trim();
    let (rest, scheme) = match trimmed.strip_prefix("etcds://") {
        Some(rest) => (rest, "https"),
        None => (
            trimmed
                .strip_prefix("etcd://")
                .ok_or_else(|| bad("it does not start with etcd:// or etcds://"))?,
            "http",
        ),
    };
    let (user, hosts) = match rest.rsplit_once('@') {
        Some((user, hosts)) => {
            let (name, password) = user.split_once(':').unwrap_or((user, ""));
            (Some((name.to_string(), password.to_string())), hosts)
        }
        None => (None, rest),
    };
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    if hosts.contains('/') || hosts.contains('?') {
        return Err(bad("it has a path or options, which etcd does not take"));
    }
    let mut endpoints = Vec::new();
    for host in hosts.split(',').map(str::trim) {
        if host.is_empty() {
            return Err(bad("a host is empty"));
        }
        let with_port = match host.rsplit_once(':') {
            Some((h, port)) if !h.is_empty() && !h.ends_with(':') => {
                port.parse::<u16>()
                    .map_err(|_| bad(&format!("the port of {host} is not a number")))?;
                host.to_string()
            }
            _ => format!("{host}:2379"),
        };
        endpoints.push(format!("{scheme}://{with_port}"));
    }
    Ok((endpoints, user))
}

/// `3.4.23` -> whether it is at least [`OLDEST`].
fn new_enough(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= OLDEST
}

/// How the backend's clients connect: a member cut off from the others answers nothing but
/// errors (`require_leader`: no request, watch or keep-alive waits on a member without a
/// leader), and a silent connection (a frozen member) is found by HTTP/2 pings within a third
/// of the lease and given up after [`attempt_bound`], so that requests move to the members that
/// answer.
fn connect_options(
    config: &EtcdConfig,
    user: Option<&User>,
    tls: Option<&etcd_client::TlsOptions>,
) -> ConnectOptions {
    let ttl = config.options.lease;
    let options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_require_leader(true)
        .with_keep_alive(ttl / 3, attempt_bound(ttl))
        .with_keep_alive_while_idle(true);
    let options = match tls {
        Some(tls) => options.with_tls(tls.clone()),
        None => options,
    };
    match user {
        Some((name, password)) => options.with_user(name.clone(), password.clone()),
        None => options,
    }
}

/// The gRPC client's TLS settings from [`Tls`](crate::types::tls::Tls) (its files read now), for
/// `endpoints` (`https://`); `None` in plaintext.
fn grpc_tls(config: &EtcdConfig, endpoints: &[String]) -> Result<Option<etcd_client::TlsOptions>> {
    if !endpoints.iter().any(|e| e.starts_with("https://")) {
        return Ok(None);
    }
    let tls = config.options.tls.clone().unwrap_or_default();
    let first = endpoints[0].trim_start_matches("https://");
    let pem = tls.pem_now(first)?;
    let mut options = etcd_client::TlsOptions::new();
    options = match pem.ca {
        Some(ca) => options.ca_certificate(etcd_client::Certificate::from_pem(ca)),
        None => options.with_native_roots(),
    };
    if let Some((cert, key)) = pem.client {
        options = options.identity(etcd_client::Identity::from_pem(cert, key));
    }
    if let Some(name) = pem.server_name {
        options = options.domain_name(name);
    }
    Ok(Some(options))
}

/// The TLS failure inside an etcd client error, as [`Error::Tls`] naming `host`, if it is
/// one: a certificate that did not verify, a refused client certificate, a plaintext member.
/// (The gRPC stack keeps rustls's error as text in its status.)
fn tls_failure(
    err: &etcd_client::Error,
    host: &str,
    tls: &crate::types::tls::Tls,
) -> Option<Error> {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        text.push_str(" / ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    // (As a broken pipe, a reset or a closed connection, whichever the client meets first; the
    // system's words are capitalised: "Connection reset by peer".)
    let lower = text.to_ascii_lowercase();
    let closed = [
        "broken pipe",
        "connection reset",
        "connection closed",
        "stream closed",
    ]
    .iter()
    .any(|c| lower.contains(c));
    let reason = match crate::types::tls::failure_in_text(&text, tls) {
        Some(reason) => reason,
        None if closed => crate::types::tls::closed_in_handshake(tls),
        None => return None,
    };
    Some(Error::Tls {
        host: host.to_string(),
        reason,
    })
}

/// How long one keep-alive (and one HTTP/2 ping) waits for its answer before it is tried on
/// the next member: a sixth of the lease, at most [`MAX_REPLY_TIMEOUT`]. A keep-alive is due
/// every third of the lease, so one member that stays silent costs half the time a hold has
/// left, not all of it.
fn attempt_bound(ttl: Duration) -> Duration {
    (ttl / 6).min(MAX_REPLY_TIMEOUT)
}

/// Connects to the cluster at `endpoints` as `user` and checks that a member answers and that
/// it is new enough.
async fn open(config: &EtcdConfig, endpoints: &[String], user: Option<&User>) -> Result<Client> {
    let unreachable = |source: ServerError| Error::Unreachable {
        connect: redacted(&config.url),
        source,
    };
    let refused = |name: &str, e: &etcd_client::Error| {
        Error::Config(format!(
                "etcd refused the user {name:?} ({}); check the user name and password (etcdctl user get {name})",
                match e {
                    etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
                    e => e.to_string(),
                }
            ))
    };
    let tls = grpc_tls(config, endpoints)?;
    let options = connect_options(config, user, tls.as_ref());
    let timeout = config.connect_timeout;
    let tls_failure = |e: &etcd_client::Error| {
        tls.as_ref().and_then(|_| {
            tls_failure(
                e,
                endpoints[0].trim_start_matches("https://"),
                &config.options.tls.clone().unwrap_or_default(),
            )
        })
    };
    // A failed step of connecting: credentials refused, a TLS failure, or no member answered.
    let failed = |e: etcd_client::Error| -> Error {
        if error::is_auth(&e) {
            return refused(user.map_or("", |u| u.0.as_str()), &e);
        }
        if let Some(failure) = tls_failure(&e) {
            return failure;
        }
        let message = format!("no etcd member answered: {e}");
        unreachable(ServerError::new(
            Arc::new(e),
            message,
            true,
            "check the endpoints and that the etcd members are up",
        ))
    };
    let timed_out = |_| unreachable(ServerError::timed_out(BackendKind::Etcd.label()));
    let mut client = tokio::time::timeout(timeout, Client::connect(endpoints, Some(options)))
        .await
        .map_err(timed_out)?
        .map_err(&failed)?;
    let status = tokio::time::timeout(timeout, client.status())
        .await
        .map_err(timed_out)?
        .map_err(&failed)?;
    if !new_enough(status.version()) {
        return Err(Error::Config(format!(
            "etcd {} is too old: zklock needs etcd {}.{} or later",
            status.version(),
            OLDEST.0,
            OLDEST.1
        )));
    }
    Ok(client)
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
    /// [`Error::Config`] for a connect string the backend cannot use, credentials etcd refuses,
    /// or a server too old; [`Error::Unreachable`] when no member answers in time.
    pub(crate) async fn connect(config: EtcdConfig) -> Result<EtcdBackend> {
        let (endpoints, url_user) = parse_url(&config.url)?;
        let user = config.options.user.clone().or(url_user);
        let ttl = config.options.lease;
        let client = open(&config, &endpoints, user.as_ref()).await?;
        let session_config = SessionConfig {
            ttl,
            reply_timeout: ttl.min(MAX_REPLY_TIMEOUT),
            attempt: attempt_bound(ttl),
        };
        // With several members, keep-alives go to one member at a time, the next one after a
        // keep-alive failed or stayed silent (see `session::Keepers`).
        let keepers = if endpoints.len() > 1 {
            let tls = grpc_tls(&config, &endpoints)?;
            Keepers::each(
                endpoints.clone(),
                connect_options(&config, user.as_ref(), tls.as_ref()),
            )
        } else {
            Keepers::one(client.clone())
        };
        let session = match Session::start(client.clone(), keepers, session_config).await {
            Ok(session) => session,
            Err(Error::Server { source, .. }) if source.downcast_ref::<etcd_client::Error>().is_some_and(error::is_auth) => {
                return Err(Error::Config(format!(
                    "etcd refused to grant a lease to the user {:?}: {source}; give the user the permission to grant leases and to write the lock keys",
                    user.as_ref().map_or("", |u| u.0.as_str())
                )))
            }
            Err(e) => return Err(e),
        };
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

    fn acquire<'a>(
        &'a self,
        target: &'a LockTarget,
        mode: LockMode,
        wait: Wait,
    ) -> BoxFuture<'a, Result<Option<Arc<dyn BackendHold>>>> {
        Box::pin(async move {
            let hold = Acquire {
                inner: &self.inner,
                target,
                mode,
                wait,
            }
            .run()
            .await?;
            Ok(hold.map(|h| Arc::new(h) as _))
        })
    }

    fn acquire_leases<'a>(
        &'a self,
        target: &'a LockTarget,
        max_leases: u32,
        n: u32,
        wait: Wait,
    ) -> BoxFuture<'a, Result<Option<Vec<SharedHold>>>> {
        Box::pin(async move {
            let acquire = Acquire {
                inner: &self.inner,
                target,
                mode: LockMode::Exclusive,
                wait,
            };
            semaphore::acquire_leases(&acquire, max_leases, n).await
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

/// How much of a job's window a claim may spend between its run lease's grant and its record's
/// put before the lease's TTL is started again: about what the body's start lags the claim by.
const CLAIM_DELAY_ALLOWED: Duration = Duration::from_millis(25);

impl EtcdBackend {
    /// A job's run: the record `<path>%RUN`, put unless it exists, on a lease of its own that
    /// lasts `at_least` (rounded up to whole seconds) by etcd's clock.
    async fn claim(&self, target: &LockTarget, at_least: Duration) -> Result<bool> {
        if at_least.is_zero() {
            return Ok(true);
        }
        let inner = &self.inner;
        let record = crate::types::layout::run_record(&target.path);
        let secs = at_least.as_secs() + u64::from(at_least.subsec_nanos() > 0);
        let mut client = inner.client.clone();
        inner.count_request();
        let asked = std::time::Instant::now();
        let lease = error::bounded(
            "grant the job's run lease",
            inner.config.reply_timeout,
            client.lease_grant(secs.min(i64::MAX as u64) as i64, None),
        )
        .await?;
        let claim = format!("{} lease={:x}", inner.owner_value(), lease.id());
        let put = Txn::new()
            .when([Compare::create_revision(
                record.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                record.as_str(),
                claim.as_str(),
                Some(PutOptions::new().with_lease(lease.id())),
            )])
            .or_else([TxnOp::get(record.as_str(), None)]);
        let mut attempts = 0;
        let resp = loop {
            match wire::txn(inner, "record the job's run", put.clone()).await {
                Ok(resp) => break resp,
                Err(e) if e.transient && attempts < 3 => attempts += 1,
                Err(e) => return Err(e.error),
            }
        };
        // A retry after a lost reply finds its own record.
        let own = resp.succeeded()
            || resp.op_responses().into_iter().any(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => {
                    g.kvs().first().is_some_and(|kv| kv.lease() == lease.id())
                }
                _ => false,
            });
        if own {
            // The window runs from the lease's grant, which etcd applied before the record's
            // put: a claim held up between the two (a stalled server, a put tried again) would
            // leave a window short by that much. Past the rounding's slack, one keep-alive
            // starts the lease's TTL again, after the put.
            let granted = Duration::from_secs(lease.ttl().max(0) as u64);
            let slack = granted.saturating_sub(at_least) + CLAIM_DELAY_ALLOWED;
            if asked.elapsed() > slack {
                return self.restart_window(lease.id()).await;
            }
            return Ok(true);
        }
        let id = lease.id();
        let mut client = inner.client.clone();
        inner.background.spawn(&inner.runtime, async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), client.lease_revoke(id)).await;
        });
        Ok(false)
    }

    /// Starts the TTL of the run record's lease `id` again with a keep-alive answered within
    /// [`CLAIM_DELAY_ALLOWED`] of its sending (etcd applied it in between, so the window then
    /// counts from no earlier than the body's start less that): whether the lease (and the
    /// record on it) was still there and so kept. A few tries; then the run is given up and its
    /// record left to its lease.
    async fn restart_window(&self, id: i64) -> Result<bool> {
        let inner = &self.inner;
        let mut client = inner.client.clone();
        let operation = "keep the job's run lease from its claim";
        let bound = inner.config.reply_timeout;
        let mut stream = error::bounded(operation, bound, client.lease_keep_alive(id)).await?;
        for _ in 0..3 {
            inner.count_request();
            let sent = std::time::Instant::now();
            let ttl = tokio::time::timeout(bound, session::renew(&mut stream))
                .await
                .map_err(|_| error::timed_out(operation))??;
            // The lease ran out before the claim's answer came: the record went with it, and
            // another instance may have claimed since. Not this run's.
            if ttl <= 0 {
                return Ok(false);
            }
            if sent.elapsed() <= CLAIM_DELAY_ALLOWED {
                return Ok(true);
            }
        }
        tracing::warn!(
            "zklock: etcd answered the job's claim too slowly to keep its at_least window from \
             the run's start; the run is skipped"
        );
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_strings() {
        let (eps, user) = parse_url("etcd://a:2379,b:2380,c").unwrap();
        assert_eq!(eps, ["http://a:2379", "http://b:2380", "http://c:2379"]);
        assert!(user.is_none());
        let (eps, user) = parse_url("etcd://me:pw@127.0.0.1:1/").unwrap();
        assert_eq!(eps, ["http://127.0.0.1:1"]);
        assert_eq!(user, Some(("me".into(), "pw".into())));
        let err = parse_url("etcd://me:secret@h:x").unwrap_err().to_string();
        assert!(!err.contains("secret") && err.contains("port"), "{err}");
        assert!(parse_url("etcd://h:1/prefix").is_err());
        assert!(parse_url("etcd://").is_err());
    }

    #[test]
    fn versions() {
        assert!(new_enough("3.4.23") && new_enough("3.5.0") && new_enough("4.0.0"));
        assert!(!new_enough("3.3.27") && !new_enough("2.3.8") && !new_enough("junk"));
    }
}
