//! The manager's etcd session: one lease that every hold's key is attached to, kept alive
//! every TTL/3, and replaced by a new one when it ends; and what the backend's parts share
//! ([`Inner`]: the client, the session, the settings).
//!
//! What a hold may believe comes from [`LeaseState`]: while the lease is `epoch` and its
//! `deadline` has not passed, etcd cannot have let the lease (and with it the hold's key) go.
//! The deadline is the send time of the last keep-alive etcd confirmed plus the TTL it
//! confirmed, less a margin (1% + 2 ms for the clocks' drift, 5% for the process to stop): the
//! server counts the TTL from when it received that keep-alive, later than it was sent. A
//! leader change in etcd only makes leases longer (the new leader restarts every lease's TTL).
//! The lease ends for this process when etcd answers a keep-alive with no TTL (expired, or
//! revoked from outside) or when the deadline passes; every hold of that epoch is then lost,
//! and the next acquire waits for a new lease.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::watch;
use tokio::time::Instant;

use super::error::{bounded, server_error};
use crate::backend::backoff::Backoff;
use crate::backend::undos::Undos;
use crate::background::Background;
use crate::types::error::{Error, Result};
use crate::types::loss::LossReason;

/// The shortest TTL accepted: etcd counts in seconds and grants no lease under its own minimum
/// (1.5 election timeouts, 2 s by default).
pub(crate) const MIN_LEASE: Duration = Duration::from_secs(2);

/// The longest any single request waits for its reply; shorter when the lease is.
pub(super) const MAX_REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one keep-alive (and one HTTP/2 ping) waits for its answer before it is tried on
/// the next member: a sixth of the lease, at most [`MAX_REPLY_TIMEOUT`]. A keep-alive is due
/// every third of the lease, so one member that stays silent costs half the time a hold has
/// left, not all of it.
pub(super) fn attempt_bound(ttl: Duration) -> Duration {
    (ttl / 6).min(MAX_REPLY_TIMEOUT)
}

/// The settings the backend's parts read.
pub(super) struct Config {
    pub(super) reply_timeout: Duration,
    pub(super) tokens: bool,
    pub(super) identity: Option<String>,
    pub(super) ttl: Duration,
}

/// What the backend's holds and tasks share.
pub(super) struct Inner {
    pub(super) client: Client,
    pub(super) session: Session,
    pub(super) config: Config,
    /// The keys this manager's contenders use now: a name is taken again only once its key is
    /// deleted.
    pub(super) names: StdMutex<HashSet<String>>,
    pub(super) next_name: AtomicU64,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) background: Arc<Background>,
    /// Undos of dropped acquires under way, per lock path.
    pub(super) undos: Arc<Undos>,
    pub(super) requests: AtomicU64,
    pub(super) events: AtomicU64,
    /// Whether a put of this manager's went unanswered (it may still land): the reaper then
    /// looks for keys nothing owns ([`reaper`](super::reaper)).
    pub(super) suspect: std::sync::atomic::AtomicBool,
}

impl Inner {
    /// Whether lease `id` may still keep keys: a delete of a key on it is worth retrying.
    pub(super) fn lease_may_hold(&self, id: i64) -> bool {
        let state = self.session.watch();
        let s = state.borrow();
        s.id == id
            && s.ended.is_none()
            && tokio::time::Instant::now() < s.deadline + self.config.ttl
    }

    pub(super) fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn count_event(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }
}

/// The lease as this process knows it.
#[derive(Debug, Clone)]
pub(super) struct LeaseState {
    /// Which lease this is, counted from 1; 0 before the first.
    pub(super) epoch: u64,
    /// Its id (0 while there is none).
    pub(super) id: i64,
    /// Until when etcd cannot have let it go.
    pub(super) deadline: Instant,
    /// Why it ended, once it has: every hold attached to it is lost.
    pub(super) ended: Option<LossReason>,
}

impl LeaseState {
    /// Why a hold on lease `epoch` is no longer certain at `now`, if it is not.
    pub(super) fn reason_for(&self, epoch: u64, now: Instant) -> Option<LossReason> {
        if self.epoch != epoch {
            return Some(LossReason::LeaseExpired);
        }
        if let Some(reason) = self.ended {
            return Some(reason);
        }
        (now >= self.deadline).then_some(LossReason::LeaseExpired)
    }

    /// Whether the lease is live at `now`.
    pub(super) fn live(&self, now: Instant) -> bool {
        self.id != 0 && self.ended.is_none() && now < self.deadline
    }
}

/// Completes once the lease of `epoch` ended, or could have (its deadline passed without a
/// confirmed keep-alive), as `state` tells.
pub(super) async fn lease_ended(mut state: watch::Receiver<LeaseState>, epoch: u64) {
    loop {
        let until = {
            let s = state.borrow_and_update();
            if s.reason_for(epoch, Instant::now()).is_some() {
                return;
            }
            s.deadline
        };
        tokio::select! {
            changed = state.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep_until(until) => {}
        }
    }
}

/// The session's settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct SessionConfig {
    pub(super) ttl: Duration,
    /// How long one request may wait for its reply.
    pub(super) reply_timeout: Duration,
    /// How long one keep-alive may wait for its answer before the next is sent to the next
    /// member (well inside the lease; see `attempt_bound`).
    pub(super) attempt: Duration,
}

/// The clients keep-alives go through: the manager's own (one endpoint), or one per member of
/// the connect string, used one at a time and left for the next after a keep-alive that failed
/// or stayed silent. A frozen member keeps its connections open and answers nothing, so a
/// client balanced over every member (the manager's) may send the next keep-alive to it again;
/// here it costs one attempt's bound per turn. Each member's client is made when first used.
pub(super) struct Keepers {
    endpoints: Vec<String>,
    options: Option<ConnectOptions>,
    clients: Vec<Option<Client>>,
    /// The member keep-alives go to now.
    at: usize,
}

impl Keepers {
    /// Keep-alives through the manager's own client.
    pub(super) fn one(client: Client) -> Keepers {
        Keepers {
            endpoints: Vec::new(),
            options: None,
            clients: vec![Some(client)],
            at: 0,
        }
    }

    /// Keep-alives through a client of each member of `endpoints`, connected with `options`.
    pub(super) fn each(endpoints: Vec<String>, options: ConnectOptions) -> Keepers {
        Keepers {
            clients: vec![None; endpoints.len()],
            endpoints,
            options: Some(options),
            at: 0,
        }
    }

    /// The client of the member keep-alives go to now, made if it is the first use.
    async fn client(&mut self, bound: Duration) -> Result<Client> {
        if let Some(client) = &self.clients[self.at] {
            return Ok(client.clone());
        }
        let endpoint = [self.endpoints[self.at].as_str()];
        let made = bounded(
            "keep the lease alive",
            bound,
            Client::connect(endpoint, self.options.clone()),
        )
        .await?;
        self.clients[self.at] = Some(made.clone());
        Ok(made)
    }

    /// The next member, after a keep-alive on this one failed or stayed silent.
    fn next(&mut self) {
        self.at = (self.at + 1) % self.clients.len();
    }
}

impl SessionConfig {
    /// What is taken off a confirmed TTL before a hold counts as lost (see the module docs).
    fn margin(&self) -> Duration {
        self.ttl / 100 + Duration::from_millis(2) + self.ttl / 20
    }
}

/// The session: its lease's state, kept by a task of its own.
pub(super) struct Session {
    state: watch::Receiver<LeaseState>,
    /// The task's sender too, so that a request that finds the lease gone can say so at once.
    tell: std::sync::Arc<watch::Sender<LeaseState>>,
    task: tokio::task::AbortHandle,
    client: Client,
}

impl Session {
    /// Grants the first lease (so that connect fails when etcd does not grant one) and starts
    /// keeping it alive.
    pub(super) async fn start(
        client: Client,
        keepers: Keepers,
        config: SessionConfig,
    ) -> Result<Session> {
        let first = grant(&client, config).await?;
        let (tx, state) = watch::channel(LeaseState {
            epoch: 1,
            id: first.0,
            deadline: first.1,
            ended: None,
        });
        let tx = std::sync::Arc::new(tx);
        let task = tokio::spawn(keep(client.clone(), keepers, config, tx.clone())).abort_handle();
        Ok(Session {
            state,
            tell: tx,
            task,
            client,
        })
    }

    /// A request found lease `id` gone (etcd: "requested lease not found"): it ended, revoked
    /// from outside or expired, before a keep-alive said so. Every hold on it is lost now, and
    /// the session grants the next.
    pub(super) fn lease_gone(&self, id: i64) {
        self.tell.send_if_modified(|s| {
            let now = s.id == id && s.ended.is_none();
            if now {
                s.ended = Some(if Instant::now() < s.deadline {
                    LossReason::NodeDeleted
                } else {
                    LossReason::LeaseExpired
                });
            }
            now
        });
    }

    /// The lease's state, to watch.
    pub(super) fn watch(&self) -> watch::Receiver<LeaseState> {
        self.state.clone()
    }

    /// A live lease: the current one, or the next once it is granted (for as long as that
    /// takes: an acquire's deadline is its caller's).
    pub(super) async fn live(&self) -> Result<LeaseState> {
        let mut state = self.state.clone();
        loop {
            {
                let s = state.borrow_and_update();
                if s.live(Instant::now()) {
                    return Ok(s.clone());
                }
            }
            if state.changed().await.is_err() {
                return Err(Error::Closed);
            }
        }
    }

    /// Ends the session: stops the keep-alives and revokes the lease, which deletes every key
    /// attached to it (best effort: a lease not revoked expires after its TTL).
    pub(super) fn close(&self, runtime: &tokio::runtime::Handle) {
        self.task.abort();
        let id = self.state.borrow().id;
        let mut client = self.client.clone();
        if id != 0 {
            runtime.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), client.lease_revoke(id)).await;
            });
        }
    }
}

/// Grants a lease of the configured TTL: its id and the deadline it starts with.
async fn grant(client: &Client, config: SessionConfig) -> Result<(i64, Instant)> {
    let sent = Instant::now();
    let mut client = client.clone();
    let secs = config.ttl.as_secs().max(1) as i64;
    let granted = bounded(
        "grant a lease",
        config.reply_timeout,
        client.lease_grant(secs, None),
    )
    .await?;
    let ttl = Duration::from_secs(granted.ttl().clamp(0, secs) as u64);
    Ok((granted.id(), sent + ttl.saturating_sub(config.margin())))
}

/// Keeps the session's leases alive, one after another, until the session is dropped.
async fn keep(
    client: Client,
    mut keepers: Keepers,
    config: SessionConfig,
    state: std::sync::Arc<watch::Sender<LeaseState>>,
) {
    let mut backoff = Backoff::requests();
    loop {
        let (id, epoch) = {
            let s = state.borrow();
            (s.id, s.epoch)
        };
        let ended = keep_alive(&mut keepers, config, id, &state).await;
        tracing::warn!(lease = format_args!("{id:x}"), %ended, "the etcd lease ended: every hold on it is lost");
        // (A request that found it gone may have said so first, with its own reason.)
        state.send_if_modified(|s| {
            let first = s.ended.is_none();
            if first {
                s.ended = Some(ended);
            }
            first
        });
        // The next lease, as soon as etcd grants one.
        loop {
            if state.is_closed() {
                return;
            }
            match grant(&client, config).await {
                Ok((id, deadline)) => {
                    state.send_replace(LeaseState {
                        epoch: epoch + 1,
                        id,
                        deadline,
                        ended: None,
                    });
                    backoff.reset();
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "granting a new etcd lease failed; retrying");
                    backoff.wait().await;
                }
            }
        }
    }
}

/// Keeps lease `id` alive every TTL/3 until it ends: returns why. A keep-alive that fails or
/// gets no answer within `config.attempt` is sent again at once to the next member.
async fn keep_alive(
    keepers: &mut Keepers,
    config: SessionConfig,
    id: i64,
    state: &watch::Sender<LeaseState>,
) -> LossReason {
    let period = config.ttl / 3;
    let mut stream = None;
    let mut next = Instant::now() + period;
    let mut told = state.subscribe();
    loop {
        let deadline = state.borrow().deadline;
        // Sleep until the next keep-alive is due, but never past the deadline, and stop when
        // a request found the lease gone.
        tokio::select! {
            () = tokio::time::sleep_until(next.min(deadline)) => {}
            told = told.wait_for(|s| s.ended.is_some()) => {
                return told.ok().and_then(|s| s.ended).unwrap_or(LossReason::Closed);
            }
        }
        if Instant::now() >= deadline {
            return LossReason::LeaseExpired;
        }
        let sent = Instant::now();
        next = sent + period;
        let bound = config.attempt.min(deadline.saturating_duration_since(sent));
        if stream.is_none() {
            let opened = async {
                let mut c = keepers.client(bound).await?;
                bounded("keep the lease alive", bound, c.lease_keep_alive(id)).await
            };
            match opened.await {
                Ok(s) => stream = Some(s),
                Err(e) => {
                    tracing::debug!(error = %e, "opening the etcd keep-alive stream failed; trying the next member");
                    keepers.next();
                    next = sent + Duration::from_millis(100).min(period);
                    continue;
                }
            }
        }
        let answer = renew(stream.as_mut().expect("just opened"));
        match tokio::time::timeout(bound, answer).await {
            Ok(Ok(ttl)) if ttl > 0 => {
                let ttl = Duration::from_secs((ttl as u64).min(config.ttl.as_secs().max(1)));
                let confirmed = sent + ttl.saturating_sub(config.margin());
                state.send_if_modified(|s| {
                    let later = confirmed > s.deadline;
                    if later {
                        s.deadline = confirmed;
                    }
                    later
                });
            }
            // etcd no longer has the lease: expired, or revoked from outside while this
            // process still counted it live.
            Ok(Ok(_)) => {
                return if Instant::now() < state.borrow().deadline {
                    LossReason::NodeDeleted
                } else {
                    LossReason::LeaseExpired
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "an etcd keep-alive failed; reopening the stream on the next member");
                stream = None;
                keepers.next();
                next = Instant::now() + Duration::from_millis(100).min(period);
            }
            Err(_) => {
                tracing::debug!(
                    "an etcd keep-alive got no answer in time; sending it to the next member"
                );
                stream = None;
                keepers.next();
                next = Instant::now();
            }
        }
    }
}

/// One keep-alive on `stream`: the TTL etcd answered (0: the lease is gone), or why there was
/// no answer.
pub(super) async fn renew(stream: &mut (LeaseKeeper, LeaseKeepAliveStream)) -> Result<i64> {
    let (keeper, responses) = stream;
    keeper
        .keep_alive()
        .await
        .map_err(|e| server_error("keep the lease alive", e))?;
    match responses.message().await {
        Ok(Some(r)) => Ok(r.ttl()),
        Ok(None) => Err(Error::Closed),
        Err(e) => Err(server_error("keep the lease alive", e)),
    }
}
