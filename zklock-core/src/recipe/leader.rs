//! Leader election: Curator's `LeaderLatch` recipe. Every participant of an election has a
//! contender node `_c_<uuid>-latch-<seq>` under the election's path, with its participant id as
//! the node's data; the lowest node leads. A participant that is not leader watches the nearest
//! 8 nodes ahead of it (never all of them: no herd), and leads when the last of them is gone; a
//! leader whose hold is lost (its session expired, its node was deleted) is told, exactly as a
//! guard is.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{Core, Target};

/// How long a participant that requeues waits after a failed attempt to join (the session
/// expired or the connection is down), doubling up to [`REQUEUE_BACKOFF_MAX`].
const REQUEUE_BACKOFF: Duration = Duration::from_millis(100);
const REQUEUE_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Failed attempts in a row after which a requeueing participant gives up and reports the
/// error (about a minute with the backoff above: longer than a session renewal takes).
const REQUEUE_ATTEMPTS: u32 = 16;
use crate::backend::LockTarget;
use crate::guard::LockGuard;
use crate::metrics::Recipe;
use crate::types::error::{Error, Result};
use crate::types::loss::LossReason;
use crate::types::mode::LockMode;
use crate::types::token::FencingToken;

/// One participant of a leader election: a cheap handle (`Clone`) made by
/// [`LockManager::leader_latch`](crate::LockManager::leader_latch).
///
/// Wire-compatible with Curator's `LeaderLatch` on the same path: zklock and Curator
/// participants elect one leader among them.
///
/// # Examples
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager) -> zklock_core::Result<()> {
/// let latch = manager.leader_latch("scheduler", "instance-7")?;
/// let leadership = latch.lead().await?; // waits until this instance leads
/// println!("leading with epoch {}", leadership.epoch());
/// tokio::select! {
///     reason = leadership.lost() => eprintln!("no longer leader: {reason}"),
///     _ = async { /* schedule jobs, fenced by leadership.epoch() */ } => {}
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct LeaderLatch {
    target: Target,
    participant: Arc<str>,
}

impl LeaderLatch {
    pub(crate) fn new(
        core: Arc<Core>,
        path: Arc<str>,
        key: Arc<str>,
        participant: Arc<str>,
    ) -> Self {
        LeaderLatch {
            target: Target::new(
                core,
                LockTarget {
                    key,
                    path,
                    participant: Some(participant.clone()),
                },
                LockMode::Leader,
                Recipe::Leader,
            ),
            participant,
        }
    }

    /// The path of the election (its participants are its children on ZooKeeper).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.leader_latch("scheduler", "a")?.path(), "/zklock/locks/%LATCH/scheduler");
    /// # Ok(()) }
    /// ```
    pub fn path(&self) -> &str {
        &self.target.lock.path
    }

    /// This participant's id.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.leader_latch("scheduler", "web-3")?.participant(), "web-3");
    /// # Ok(()) }
    /// ```
    pub fn participant(&self) -> &str {
        &self.participant
    }

    /// Joins the election and waits until this participant leads.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait leaves the election (nothing is left behind on the server).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let leadership = m.leader_latch("scheduler", "a")?.lead().await?;
    /// # drop(leadership); Ok(()) }
    /// ```
    pub async fn lead(&self) -> Result<Leadership> {
        Ok(self.leadership(self.target.acquire(None).await?))
    }

    /// Waits at most `timeout` to lead.
    ///
    /// # Errors
    /// [`Error::Timeout`] when another participant still leads then; this one has left.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// use std::time::Duration;
    /// match m.leader_latch("scheduler", "a")?.lead_timeout(Duration::from_secs(1)).await {
    ///     Ok(leadership) => drop(leadership),
    ///     Err(zklock_core::Error::Timeout { .. }) => println!("someone else leads"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lead_timeout(&self, timeout: Duration) -> Result<Leadership> {
        Ok(self.leadership(self.target.acquire(Some(timeout)).await?))
    }

    /// Leads only if no other participant leads or waits: `Ok(None)` otherwise.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// if let Some(leadership) = m.leader_latch("scheduler", "a")?.try_lead().await? {
    ///     drop(leadership);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_lead(&self) -> Result<Option<Leadership>> {
        Ok(self
            .target
            .try_acquire()
            .await?
            .map(|guard| self.leadership(guard)))
    }

    /// Leads again after a loss: connection trouble and expired sessions are waited out (the
    /// manager renews its session), up to [`REQUEUE_ATTEMPTS`] failures in a row.
    async fn requeue(&self) -> Result<Leadership> {
        let mut backoff = REQUEUE_BACKOFF;
        let mut failures = 0;
        loop {
            match self.lead().await {
                Err(Error::SessionExpired | Error::ConnectionLoss { .. })
                    if failures + 1 < REQUEUE_ATTEMPTS =>
                {
                    failures += 1;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(REQUEUE_BACKOFF_MAX);
                }
                led => return led,
            }
        }
    }

    fn leadership(&self, guard: LockGuard) -> Leadership {
        tracing::info!(
            election = %self.target.lock.key,
            participant = %self.participant,
            epoch = %guard.fencing_token(),
            "zklock: elected leader"
        );
        Leadership {
            guard,
            participant: self.participant.clone(),
        }
    }

    /// Runs `body` each time this participant leads, as Curator's `LeaderSelector` with
    /// auto-requeue does: waits for leadership, runs `body` with it, and when the leadership is
    /// lost, drops `body` at its next await point and queues again. On the wire it stays a
    /// latch (`latch-` nodes): it elects one leader with Curator's `LeaderLatch`, not with a
    /// `LeaderSelector` on the same path, whose `lock-` nodes are an `InterProcessMutex`'s
    /// (share that election through [`LockManager::mutex_at_path`](crate::LockManager::mutex_at_path)). Returns what `body`
    /// returns once it completes while leading; leadership is given up then.
    ///
    /// # Errors
    /// What joining the election fails with (for example [`Error::Closed`]); a loss of
    /// leadership is not an error here, nor are connection trouble and an expired session
    /// while the manager renews it: it requeues.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops `body` and leaves the election.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let latch = m.leader_latch("mailer", "instance-2")?;
    /// latch.run(|leadership| async move {
    ///     loop {
    ///         // send the emails, fencing each batch with leadership.epoch()
    ///         tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    ///     }
    /// }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<T, F, Fut>(&self, mut body: F) -> Result<T>
    where
        F: FnMut(LeadershipInfo) -> Fut,
        Fut: Future<Output = T>,
    {
        loop {
            let leadership = self.requeue().await?;
            let info = leadership.info();
            let work = Box::pin(body(info));
            tokio::select! {
                biased;
                reason = leadership.lost() => {
                    tracing::warn!(
                        election = %self.target.lock.key,
                        participant = %self.participant,
                        %reason,
                        "zklock: leadership lost; the leader's work was stopped; queueing again"
                    );
                }
                value = work => {
                    leadership.leave().await.or_else(|e| match e {
                        Error::LockLost { .. } => Ok(()),
                        e => Err(e),
                    })?;
                    return Ok(value);
                }
            }
        }
    }

    /// Takes part in the election for as long as the returned [`LeadershipEvents`] lives, and
    /// reports every change: elected (with the epoch), lost (with the reason). After a loss
    /// the participant queues again. Dropping the events leaves the election.
    ///
    /// Must run inside a tokio runtime (the participation is a spawned task).
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// use zklock_core::LeadershipEvent;
    /// let mut events = m.leader_latch("scheduler", "web-1")?.participate();
    /// while let Some(event) = events.next().await {
    ///     match event {
    ///         LeadershipEvent::Elected { epoch } => println!("leading, epoch {epoch}"),
    ///         LeadershipEvent::Lost { reason } => println!("following: {reason}"),
    ///         LeadershipEvent::Failed(err) => { eprintln!("{err}"); break }
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn participate(&self) -> LeadershipEvents {
        let (tx, rx) = mpsc::channel(16);
        let latch = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let leadership = tokio::select! {
                    _ = tx.closed() => return,
                    led = latch.requeue() => match led {
                        Ok(leadership) => leadership,
                        Err(err) => {
                            let _ = tx.send(LeadershipEvent::Failed(err)).await;
                            return;
                        }
                    },
                };
                let epoch = leadership.epoch();
                if tx.send(LeadershipEvent::Elected { epoch }).await.is_err() {
                    return;
                }
                tokio::select! {
                    _ = tx.closed() => return,
                    reason = leadership.lost() => {
                        if tx.send(LeadershipEvent::Lost { reason }).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        LeadershipEvents {
            rx,
            task: task.abort_handle(),
        }
    }
}

/// What the body of [`LeaderLatch::run`] is told about its leadership.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LeadershipInfo {
    /// The leadership's epoch; see [`Leadership::epoch`].
    pub epoch: FencingToken,
    /// This participant's id.
    pub participant: Arc<str>,
}

/// A change of leadership seen by [`LeaderLatch::participate`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum LeadershipEvent {
    /// This participant leads now, with this epoch.
    Elected {
        /// The leadership's epoch; see [`Leadership::epoch`].
        epoch: FencingToken,
    },
    /// This participant's leadership is lost; it queues again.
    Lost {
        /// Why.
        reason: LossReason,
    },
    /// Joining the election failed; the participation has ended.
    Failed(Error),
}

/// The changes of one participant's leadership; see [`LeaderLatch::participate`]. Dropping it
/// leaves the election.
#[derive(Debug)]
pub struct LeadershipEvents {
    rx: mpsc::Receiver<LeadershipEvent>,
    task: tokio::task::AbortHandle,
}

impl LeadershipEvents {
    /// The next change, or `None` once the participation has ended.
    ///
    /// # Cancel safety
    /// Cancel safe: no event is lost when the future is dropped.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let mut events = m.leader_latch("scheduler", "web-1")?.participate();
    /// let first = events.next().await;
    /// # Ok(()) }
    /// ```
    pub async fn next(&mut self) -> Option<LeadershipEvent> {
        self.rx.recv().await
    }
}

impl Drop for LeadershipEvents {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The leadership of an election, held by one participant at a time. Dropping it (or
/// [`leave`](Self::leave)) gives leadership up.
///
/// # Examples
///
/// ```no_run
/// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
/// let leadership = m.leader_latch("scheduler", "a")?.lead().await?;
/// let epoch = leadership.epoch(); // fence what the leader writes with it
/// if leadership.is_leader() { /* act */ }
/// leadership.leave().await?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the leadership is given up at once"]
#[clippy::has_significant_drop]
pub struct Leadership {
    guard: LockGuard,
    participant: Arc<str>,
}

impl Leadership {
    /// The leadership's epoch: a fencing token that strictly increases across successive
    /// leaders of the election (the czxid of the leader's node on ZooKeeper). A store that
    /// refuses writes carrying an older epoch than the last it accepted keeps a deposed
    /// leader from acting.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let l = m.leader_latch("scheduler", "a")?.lead().await?;
    /// println!("epoch {}", l.epoch());
    /// # Ok(()) }
    /// ```
    pub fn epoch(&self) -> FencingToken {
        self.guard.fencing_token()
    }

    /// This participant's id.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.leader_latch("scheduler", "a")?.lead().await?.participant(), "a");
    /// # Ok(()) }
    /// ```
    pub fn participant(&self) -> &str {
        &self.participant
    }

    /// Whether this participant still certainly leads: false once the session expired, the
    /// connection was lost past the manager's policy, or the node was deleted. Once false it
    /// stays false.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let l = m.leader_latch("scheduler", "a")?.lead().await?;
    /// if !l.is_leader() { return Ok(()) }
    /// # Ok(()) }
    /// ```
    pub fn is_leader(&self) -> bool {
        self.guard.is_held()
    }

    /// Why leadership was lost, or `None` while this participant leads.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// assert_eq!(m.leader_latch("s", "a")?.lead().await?.loss_reason(), None);
    /// # Ok(()) }
    /// ```
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.guard.loss_reason()
    }

    /// Completes when leadership is lost, with the reason.
    ///
    /// # Cancel safety
    /// Cancel safe: it only observes.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// let l = m.leader_latch("s", "a")?.lead().await?;
    /// let reason = l.lost().await;
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) -> LossReason {
        self.guard.lost().await
    }

    /// Gives leadership up and waits until the election has seen it.
    ///
    /// # Cancel safety
    /// Cancel safe: the node is deleted in the background if the future is dropped.
    ///
    /// ```no_run
    /// # async fn run(m: zklock_core::LockManager) -> zklock_core::Result<()> {
    /// m.leader_latch("s", "a")?.lead().await?.leave().await?;
    /// # Ok(()) }
    /// ```
    pub async fn leave(self) -> Result<()> {
        self.guard.release().await
    }

    fn info(&self) -> LeadershipInfo {
        LeadershipInfo {
            epoch: self.epoch(),
            participant: self.participant.clone(),
        }
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("participant", &self.participant)
            .field("epoch", &self.epoch())
            .field("leader", &self.is_leader())
            .finish()
    }
}
