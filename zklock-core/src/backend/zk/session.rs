//! The ZooKeeper session: the one owner of the ZooKeeper connection, its session, the epoch every
//! hold is stamped with, the retry policy, and the background tasks (releases, cleanups) with
//! the background delete of a node that every part shares.
//!
//! A session's generation counts the sessions a manager has had; its health's epoch counts
//! losses. Whatever is learned through a session (a hold, a granted floor, a listing) is
//! stamped with it, and is void once it has ended: by construction, not by a check at each use.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use zookeeper_client::{Client, SessionState, StateWatcher};

use super::error::{connection_lost, is_terminal, unreachable};
use super::Inner;
use crate::backend::backoff::Backoff;
use crate::metrics;
use crate::types::backend_kind::BackendKind;
use crate::types::disconnect::DisconnectPolicy;
use crate::types::error::{Error, Result};
use crate::types::loss::LossReason;

/// The first pause before trying again to open a session after expiry.
const RENEW_RETRY_MIN: Duration = Duration::from_millis(100);
/// The longest pause between tries.
const RENEW_RETRY_MAX: Duration = Duration::from_secs(5);

/// What the session layer is configured with (the session part of
/// [`Builder`](crate::Builder)).
#[derive(Debug, Clone)]
pub(crate) struct SessionConfig {
    pub(crate) connect: String,
    pub(crate) session_timeout: Duration,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) disconnect_policy: DisconnectPolicy,
    pub(crate) renew_session: bool,
    /// `user:password` for ZooKeeper's digest scheme.
    pub(crate) digest: Option<String>,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<zookeeper_client::TlsOptions>,
}

impl SessionConfig {
    /// The connection timeout given to the client: how long a connect may take, and (through
    /// the client's ticks) how soon it notices a silent connection.
    pub(super) fn connection_timeout(&self) -> Duration {
        self.connect_timeout.unwrap_or(self.session_timeout)
    }

    /// Refuses a configuration that could keep a hold past the session (see [`check_grace`]).
    pub(super) fn check(&self) -> Result<()> {
        if let DisconnectPolicy::Grace(grace) = self.disconnect_policy {
            // Checked first against what was asked; the server may negotiate less (below).
            check_grace(grace, self.session_timeout, self.connection_timeout())?;
        }
        if self.connect.trim().is_empty() {
            return Err(Error::Config(
                "the connect string is empty; give host:port[,host:port...]".into(),
            ));
        }
        Ok(())
    }
}

/// The retry policy of every request that failed on a lost connection: wait for this session
/// to reconnect (bounded by the caller's deadline) and send it again; stop when the session
/// ends, since whatever the request was about ended with it.
pub(super) async fn wait_reconnect(client: &Client) -> bool {
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

async fn open_session(config: &SessionConfig) -> Result<Client> {
    let wait = config.connection_timeout();
    let mut connector = Client::connector()
        .with_session_timeout(config.session_timeout)
        .with_connection_timeout(wait);
    if let Some(digest) = &config.digest {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    #[cfg(feature = "tls")]
    let connecting = match config.tls.clone() {
        Some(tls) => {
            futures::future::Either::Left(connector.with_tls(tls).secure_connect(&config.connect))
        }
        None => futures::future::Either::Right(connector.connect(&config.connect)),
    };
    #[cfg(not(feature = "tls"))]
    let connecting = connector.connect(&config.connect);
    let connecting = async {
        tokio::select! {
            connected = connecting => Some(connected),
            () = refused_everywhere(&config.connect) => None,
        }
    };
    match tokio::time::timeout(wait + Duration::from_millis(500), connecting).await {
        Ok(None) => Err(Error::Refused {
            connect: config.connect.clone(),
        }),
        Ok(Some(Ok(client))) => Ok(client),
        Ok(Some(Err(source))) => Err(unreachable(&config.connect, source)),
        Err(_) => Err(unreachable(
            &config.connect,
            zookeeper_client::Error::Timeout,
        )),
    }
}

/// The `host:port` servers of a ZooKeeper connect string (`h1:p1,h2:p2[/chroot]`), or `None`
/// when one of them does not read as such (the client then says what is wrong with it).
fn servers(connect: &str) -> Option<Vec<String>> {
    let hosts = connect.split('/').next()?;
    hosts
        .split(',')
        .map(|server| {
            let server = server.trim();
            let (host, port) = server.rsplit_once(':')?;
            let ok = !host.is_empty() && port.parse::<u16>().is_ok();
            ok.then(|| server.to_string())
        })
        .collect()
}

/// Completes once every server of `connect` has refused a TCP connection in three rounds
/// about 400 ms apart: nothing listens there, and the rest of the connection timeout would
/// tell the user nothing more. Never completes while any server accepts, stays silent, or
/// cannot be named (a connect string the client will judge itself).
async fn refused_everywhere(connect: &str) {
    let Some(servers) = servers(connect) else {
        return std::future::pending().await;
    };
    for round in 0..3 {
        if round > 0 {
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let tries = servers.iter().map(|server| async move {
            let attempt = tokio::net::TcpStream::connect(server.as_str());
            matches!(
                tokio::time::timeout(Duration::from_secs(1), attempt).await,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
            )
        });
        if !futures::future::join_all(tries)
            .await
            .into_iter()
            .all(|r| r)
        {
            return std::future::pending().await;
        }
    }
}

/// How long the client takes to notice a silent connection, for a negotiated session timeout
/// and the connection timeout it was given: zookeeper-client gives up on a connection after 8
/// ticks without an answer, a tick being 1/20 of the session timeout, or 1/8 of a connection
/// timeout shorter than 3/5 of it. One more tick for its timer's granularity.
fn detection_time(session_timeout: Duration, connection: Duration) -> Duration {
    let tick = if connection > session_timeout * 3 / 5 {
        session_timeout / 20
    } else {
        connection / 8
    };
    tick * 9
}

/// Refuses a disconnect grace that, with the time the client takes to notice a dead
/// connection, reaches the session timeout: the server may already have expired the session
/// and given the lock to someone else while the hold still looked certain.
fn check_grace(grace: Duration, session_timeout: Duration, connection: Duration) -> Result<()> {
    let detection = detection_time(session_timeout, connection);
    if grace + detection >= session_timeout {
        return Err(Error::Config(format!(
            "a disconnect grace of {grace:?} with a session timeout of {session_timeout:?} (as \
             granted by the server) could keep a hold the server has already given away: the \
             client needs up to {detection:?} to notice a dead connection; keep the grace under \
             {:?} or ask for a longer session timeout (the server's maxSessionTimeout bounds it)",
            session_timeout.saturating_sub(detection)
        )));
    }
    Ok(())
}

/// The grace to apply on a session whose negotiated timeout is `session_timeout`: the one asked
/// for when it fits, else the longest that does (a renewed session can be granted less than the
/// first, and a session cannot be refused once it replaced an expired one).
fn safe_grace(grace: Duration, session_timeout: Duration, connection: Duration) -> Duration {
    if check_grace(grace, session_timeout, connection).is_ok() {
        return grace;
    }
    let safe = session_timeout
        .saturating_sub(detection_time(session_timeout, connection))
        .saturating_sub(session_timeout / 20);
    tracing::warn!(
        asked = ?grace,
        applied = ?safe,
        negotiated = ?session_timeout,
        "the server granted a shorter session timeout than asked: the disconnect grace is shortened to fit it"
    );
    safe
}

/// Deletes a contender node: the request is sent now, so that any later request of this
/// session is ordered after it; the reply is awaited in the background, retrying on
/// connection loss until the node is gone or the session (and so the node) has ended.
pub(super) fn delete_in_background(inner: &Arc<Inner>, client: Client, path: String) {
    inner.count_requests(1);
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
                    counter.count_requests(1);
                    metrics::release_retry(BackendKind::ZooKeeper);
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

/// One ZooKeeper session of a manager: its client, and its generation (0 for the first
/// session, one more for each session that replaced an expired one). Every hold, granted floor
/// and listing is stamped with the session it was learned on, and dies with it.
#[derive(Clone)]
pub(super) struct Session {
    pub(super) client: Client,
    pub(super) generation: u64,
}

impl Session {
    /// Waits until this session is connected again after a connection loss (the acquire's
    /// deadline is the recipe's: it drops the wait then).
    ///
    /// # Errors
    /// [`Error::SessionExpired`] when this session ended (whatever session the manager has
    /// now: what was learned on this one is void), [`Error::Closed`] when the manager closed.
    pub(super) async fn wait_connected(&self) -> Result<()> {
        let mut watcher = self.client.state_watcher();
        let mut state = watcher.peek_state();
        loop {
            match state {
                SessionState::SyncConnected | SessionState::ConnectedReadOnly => return Ok(()),
                SessionState::Expired => return Err(Error::SessionExpired),
                SessionState::Closed | SessionState::AuthFailed => return Err(Error::Closed),
                // Past the acquire's deadline the recipe drops the wait.
                SessionState::Disconnected => state = watcher.changed().await,
            }
        }
    }
}

/// Session health as the monitor sees it: `epoch` counts losses; a hold granted in one epoch
/// is lost once the epoch moves on. The current session lives here too, so that a reader sees
/// a session and its health together.
#[derive(Clone)]
pub(super) struct Health {
    pub(super) epoch: u64,
    pub(super) ok: bool,
    pub(super) reason: Option<LossReason>,
    pub(super) session: Session,
}

/// The owner of a manager's sessions: the current one with its health, the monitor that
/// renews it, and the background tasks that outlive the calls that started them.
pub(crate) struct SessionOwner {
    pub(super) config: SessionConfig,
    pub(super) health: watch::Sender<Health>,
    pub(super) runtime: tokio::runtime::Handle,
    background: Arc<crate::background::Background>,
    monitor: StdMutex<Option<AbortHandle>>,
}

impl Drop for SessionOwner {
    fn drop(&mut self) {
        if let Some(monitor) = self.monitor.lock().unwrap().take() {
            monitor.abort();
        }
    }
}

impl SessionOwner {
    /// Opens the first session and starts following it. Must run inside a tokio runtime.
    pub(crate) async fn connect(config: SessionConfig) -> Result<Arc<SessionOwner>> {
        config.check()?;
        let client = open_session(&config).await?;
        if let DisconnectPolicy::Grace(grace) = config.disconnect_policy {
            // The server clamps the session timeout (to 20 x tickTime by default): a grace that
            // fits the timeout asked for may not fit the one granted.
            check_grace(grace, client.session_timeout(), config.connection_timeout())?;
        }
        let (health, _) = watch::channel(Health {
            epoch: 0,
            ok: true,
            reason: None,
            session: Session {
                client: client.clone(),
                generation: 0,
            },
        });
        let owner = Arc::new(SessionOwner {
            config,
            health,
            runtime: tokio::runtime::Handle::current(),
            background: Arc::default(),
            monitor: StdMutex::new(None),
        });
        let monitor = tokio::spawn(monitor_session(Arc::downgrade(&owner), client));
        *owner.monitor.lock().unwrap() = Some(monitor.abort_handle());
        Ok(owner)
    }

    /// The client of the current session.
    pub(super) fn client(&self) -> Client {
        self.health.borrow().session.client.clone()
    }

    /// A live session to acquire on: when the current one has expired and the manager renews
    /// sessions, waits for the new one (at most twice the session timeout: then
    /// [`Error::SessionExpired`]; an earlier deadline of the acquire is the recipe's).
    pub(super) async fn live_session(&self) -> Result<Session> {
        let mut health = self.health.subscribe();
        let deadline = tokio::time::Instant::now() + 2 * self.config.session_timeout;
        loop {
            let session = health.borrow_and_update().session.clone();
            match session.client.state() {
                SessionState::Expired if self.config.renew_session => {
                    if tokio::time::timeout_at(deadline, health.changed())
                        .await
                        .is_err()
                    {
                        return Err(Error::SessionExpired);
                    }
                }
                SessionState::Expired => return Err(Error::SessionExpired),
                SessionState::Closed | SessionState::AuthFailed => return Err(Error::Closed),
                _ => return Ok(session),
            }
        }
    }

    /// Runs `fut` in the background (a release or a cleanup), counted so that
    /// [`flush`](Self::flush) can wait for it.
    pub(super) fn spawn_background(
        self: &Arc<Self>,
        fut: impl Future<Output = ()> + Send + 'static,
    ) {
        // The task keeps the owner (its session and monitor) alive until it ends.
        let owner = self.clone();
        self.background.spawn(&self.runtime, async move {
            fut.await;
            drop(owner);
        });
    }

    /// Waits until every background task has finished.
    pub(super) async fn flush(&self) {
        self.background.flush().await;
    }
}

/// Follows the session's state, turns it into lock health, and renews an expired session.
async fn monitor_session(inner: Weak<SessionOwner>, client: Client) {
    let mut monitor = SessionMonitor::new(inner, &client);
    drop(client);
    loop {
        let Some(state) = monitor.next_state().await else {
            return;
        };
        let Some(manager) = monitor.owner.upgrade() else {
            return;
        };
        record_state(state);
        if monitor.follow(manager, state).await.is_break() {
            return;
        }
    }
}

/// What [`monitor_session`] keeps between two changes of the session's state. It holds its
/// owner weakly, so that the manager can go while it waits: it ends then.
struct SessionMonitor {
    owner: Weak<SessionOwner>,
    /// The state changes of the current session (the one in the owner's health).
    watcher: StateWatcher,
    /// The disconnect grace fitted to the current session, when the policy has one.
    grace: Option<Duration>,
    /// When the grace of the disconnect under way runs out.
    grace_deadline: Option<tokio::time::Instant>,
}

impl SessionMonitor {
    /// Starts following `client`'s session, the first of `owner`.
    fn new(owner: Weak<SessionOwner>, client: &Client) -> SessionMonitor {
        let watcher = client.state_watcher();
        let mut grace = None;
        if let Some(manager) = owner.upgrade() {
            grace = session_grace(&manager.config, client);
        }
        SessionMonitor {
            owner,
            watcher,
            grace,
            grace_deadline: None,
        }
    }

    /// The session's next state. A disconnect's grace that runs out first makes the holds
    /// lost (and the wait goes on). `None` once the owner is gone.
    async fn next_state(&mut self) -> Option<SessionState> {
        loop {
            let grace_deadline = self.grace_deadline;
            tokio::select! {
                state = self.watcher.changed() => return Some(state),
                _ = async { tokio::time::sleep_until(grace_deadline.unwrap()).await }, if grace_deadline.is_some() => {
                    self.grace_deadline = None;
                    let inner = self.owner.upgrade()?;
                    lose(&inner, LossReason::Disconnected);
                }
            }
        }
    }

    /// Turns a new state of the current session into lock health: connected is healthy; a
    /// disconnect makes the holds lost at once, when its grace runs out, or only with the
    /// session's expiry, as the policy says; an expiry makes them lost and renews the session
    /// (see [`renew`](Self::renew)). Breaks once the monitor has nothing more to follow: the
    /// session was closed, or expired and is not renewed.
    async fn follow(&mut self, manager: Arc<SessionOwner>, state: SessionState) -> ControlFlow<()> {
        match state {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                self.grace_deadline = None;
                manager.health.send_modify(|h| h.ok = true);
            }
            SessionState::Disconnected => match (manager.config.disconnect_policy, self.grace) {
                (DisconnectPolicy::Grace(_), Some(grace)) => {
                    self.grace_deadline = Some(tokio::time::Instant::now() + grace)
                }
                (DisconnectPolicy::UntilExpired, _) => {}
                _ => lose(&manager, LossReason::Disconnected),
            },
            SessionState::Expired => return self.renew(manager).await,
            SessionState::Closed | SessionState::AuthFailed => {
                lose(&manager, LossReason::Closed);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// The current session expired: makes the holds lost and, if the manager renews sessions,
    /// opens a new one and makes it the current session (a new generation), then follows it.
    /// Breaks when the manager does not renew, or is gone before the new session opened
    /// (`manager` is let go while it opens).
    async fn renew(&mut self, manager: Arc<SessionOwner>) -> ControlFlow<()> {
        self.grace_deadline = None;
        lose(&manager, LossReason::SessionExpired);
        if !manager.config.renew_session {
            return ControlFlow::Break(());
        }
        let config = manager.config.clone();
        drop(manager);
        let Some(client) = reopen(&self.owner, &config).await else {
            return ControlFlow::Break(());
        };
        let Some(manager) = self.owner.upgrade() else {
            return ControlFlow::Break(());
        };
        self.watcher = client.state_watcher();
        self.grace = session_grace(&config, &client);
        // The session and its health change together: a reader never sees the new
        // session with the old generation, nor the other way round.
        manager.health.send_modify(|h| {
            h.session = Session {
                client,
                generation: h.session.generation + 1,
            };
            h.ok = true;
        });
        tracing::info!("opened a new ZooKeeper session after expiry");
        ControlFlow::Continue(())
    }
}

/// Opens a new session, retrying while the servers are unreachable, with a pause that grows
/// from 100 ms to 5 s. `None` once `owner` is gone (looked at after each failure).
async fn reopen(owner: &Weak<SessionOwner>, config: &SessionConfig) -> Option<Client> {
    let mut backoff = Backoff::new(RENEW_RETRY_MIN, RENEW_RETRY_MAX);
    loop {
        match open_session(config).await {
            Ok(client) => {
                metrics::session_renewal(true);
                return Some(client);
            }
            Err(err) => {
                metrics::session_renewal(false);
                tracing::warn!(%err, "could not renew the expired ZooKeeper session; retrying");
                if owner.strong_count() == 0 {
                    return None;
                }
                backoff.wait().await;
            }
        }
    }
}

/// Traces a new state of the session and shows it in the session-state metric.
fn record_state(state: SessionState) {
    tracing::debug!(?state, "zookeeper session state");
    metrics::session_state(match state {
        SessionState::SyncConnected => metrics::SessionState::Connected,
        SessionState::ConnectedReadOnly => metrics::SessionState::ReadOnly,
        SessionState::Disconnected => metrics::SessionState::Disconnected,
        SessionState::Expired => metrics::SessionState::Expired,
        SessionState::Closed => metrics::SessionState::Closed,
        SessionState::AuthFailed => metrics::SessionState::AuthFailed,
    });
}

/// The disconnect grace that applies to `client`'s session, fitted to its negotiated timeout.
fn session_grace(config: &SessionConfig, client: &Client) -> Option<Duration> {
    match config.disconnect_policy {
        DisconnectPolicy::Grace(grace) => Some(safe_grace(
            grace,
            client.session_timeout(),
            config.connection_timeout(),
        )),
        _ => None,
    }
}

fn lose(inner: &SessionOwner, reason: LossReason) {
    tracing::warn!(%reason, "ZooKeeper session trouble: holds of this manager are no longer certain");
    inner.health.send_modify(|h| {
        h.epoch += 1;
        h.ok = false;
        h.reason = Some(reason);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connect_string_names_its_servers() {
        assert_eq!(
            servers("a:1,b:2/chroot/x"),
            Some(vec!["a:1".to_string(), "b:2".to_string()])
        );
        assert_eq!(servers("[::1]:2181"), Some(vec!["[::1]:2181".to_string()]));
        assert_eq!(servers("a:1,b"), None);
        assert_eq!(servers("a:99999"), None);
    }
}
