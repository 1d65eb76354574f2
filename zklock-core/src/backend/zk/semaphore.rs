//! Semaphore leases on ZooKeeper: Curator's `InterProcessSemaphoreV2` layout. A mutex on
//! `<path>/locks` admits one acquirer at a time; it creates its leases
//! `<path>/leases/_c_<uuid>-lease-<seq>` and waits, still holding the mutex, until at most N
//! leases exist. Only that one acquirer watches the leases: no herd.

use std::sync::Arc;

use zookeeper_client::{EventType, OneshotWatcher};

use super::acquire::{create_node, Granted, HandedWatch, NodeAcquisition};
use super::error::{connection_lost, zk_error};
use super::hold::Hold;
use super::session::Session;
use super::wire::{SEMAPHORE_LEASES, SEMAPHORE_LOCKS};
use super::Inner;
use crate::backend::drive::drive;
use crate::backend::{Acquisition, BackendHold, BoxFuture, LockTarget, SharedHold, Step};
use crate::types::error::{Error, Result};
use crate::types::loss::LossReason;
use crate::types::mode::HoldMode;
use crate::types::mode::Wait;

/// An acquire of `n` leases of a semaphore with `max` leases, for the driver: takes the
/// `<path>/locks` gate (a mutex, acquired through the driver too), makes all `n` lease nodes
/// on the gate's own session, and waits, still holding the gate, until at most `max` leases
/// exist: all or none. Holding the gate through all `n` is what keeps two acquirers of several
/// leases from each taking some and waiting for the others for ever; and a lease counted under
/// the gate must come from the session that holds the gate.
///
/// Cancel safe: the leases made so far, then the gate, go when it is dropped.
pub(super) struct LeasesAcquisition<'a> {
    inner: &'a Arc<Inner>,
    target: &'a LockTarget,
    gate: LockTarget,
    max: u32,
    n: u32,
    wait: Wait,
    leases: Option<Leases<'a>>,
}

impl<'a> LeasesAcquisition<'a> {
    pub(super) fn new(
        inner: &'a Arc<Inner>,
        target: &'a LockTarget,
        max: u32,
        n: u32,
        wait: Wait,
    ) -> Self {
        let gate_path: Arc<str> = format!("{}/{SEMAPHORE_LOCKS}", target.path).into();
        LeasesAcquisition {
            inner,
            target,
            gate: LockTarget::lock(target.key.clone(), gate_path),
            max,
            n,
            wait,
            leases: None,
        }
    }

    /// Whether the leases fit now (the gate is given up then, and they are held), or must wait.
    async fn room(&mut self) -> Result<Step> {
        let leases = self.leases.as_mut().expect("made");
        if !leases.room(self.max as usize)? {
            return Ok(Step::Busy);
        }
        let leases = self.leases.take().expect("made");
        release_gate(&leases.gate, &self.target.key).await;
        Ok(Step::Held(leases.granted()))
    }
}

impl Acquisition for LeasesAcquisition<'_> {
    /// The gate's acquire enters a session of its own.
    fn enter(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    /// Takes the gate (a try: once), makes the leases, and sees whether they fit.
    fn attempt(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(async move {
            let inner = self.inner;
            let gate = NodeAcquisition::new(
                inner,
                &self.gate.path,
                &self.target.key,
                HoldMode::Exclusive,
                None,
            );
            let gate = drive::<Granted>(Box::new(gate), &self.gate, self.wait).await?;
            let Some(gate) = gate.and_then(|g| g.into_iter().next()) else {
                return Ok(Step::Busy);
            };
            let mut leases = Leases::new(inner, self.target, Hold::granted(gate));
            leases.make(self.n).await?;
            self.leases = Some(leases);
            self.room().await
        })
    }

    /// Lists the leases with a watch, waits for it while they do not fit, and sees again.
    /// Fails when the gate or one of this acquire's leases is lost meanwhile. Cancel safe: it
    /// changes nothing on the server but its watches.
    fn wait(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(async move {
            let max = self.max as usize;
            let leases = self.leases.as_mut().expect("made");
            if let Some(watcher) = leases.list_and_watch().await? {
                if leases.children.len() > max {
                    leases.changed(watcher).await?;
                    leases.list().await?;
                }
            }
            self.room().await
        })
    }
}

/// The lease nodes one acquire makes under `<path>/leases` while it holds the gate, all on the
/// gate's session, and the leases' latest listing. Dropped before it is
/// [`granted`](Self::granted), it deletes its leases in the background (each [`Hold`] does).
struct Leases<'a> {
    inner: &'a Arc<Inner>,
    key: &'a Arc<str>,
    /// The leases made so far, in order. (Declared before the gate: dropped first.)
    holds: Vec<Hold>,
    /// The `<path>/locks` gate this acquire holds.
    gate: Hold,
    /// The gate's session: the one the leases are made on and listed through.
    session: Session,
    /// `<path>/leases`.
    path: Arc<str>,
    /// The leases' names as last listed.
    children: Vec<String>,
}

impl<'a> Leases<'a> {
    /// No lease yet, for the acquire of `target` that holds `gate`.
    fn new(inner: &'a Arc<Inner>, target: &'a LockTarget, gate: Hold) -> Self {
        Leases {
            inner,
            key: &target.key,
            session: gate.session.clone(),
            gate,
            path: format!("{}/{SEMAPHORE_LEASES}", target.path).into(),
            holds: Vec::new(),
            children: Vec::new(),
        }
    }

    /// Makes `n` lease nodes on the gate's session, one request each, checking before each
    /// that the gate is still held. Cancelled between two, the leases made so far are kept in
    /// `self` (deleted when it is dropped); one whose create was under way is deleted by
    /// [`create_node`].
    async fn make(&mut self, n: u32) -> Result<()> {
        self.holds.reserve_exact(n as usize);
        for _ in 0..n {
            self.check_gate()?;
            let made = create_node(
                self.inner,
                &self.session,
                &self.path,
                self.key,
                HoldMode::Lease,
            )
            .await?;
            self.holds.push(Hold::new(
                self.inner.clone(),
                self.session.clone(),
                self.key.clone(),
                made.node,
                made.token,
                made.ticket,
                HandedWatch::NoWatch,
            ));
            self.children = made.children;
        }
        Ok(())
    }

    /// Whether at most `max` leases exist in the last listing. Fails when the gate or one of
    /// this acquire's leases was lost.
    fn room(&self, max: usize) -> Result<bool> {
        let names: Vec<&str> = self
            .holds
            .iter()
            .map(|h| h.node.rsplit('/').next().unwrap_or_default())
            .collect();
        self.check_gate()?;
        self.check_listed(&names)?;
        Ok(self.children.len() <= max)
    }

    /// Fails with [`Error::LockLost`] once the gate is lost.
    fn check_gate(&self) -> Result<()> {
        match self.gate.loss_reason() {
            Some(reason) => Err(Error::LockLost {
                key: self.key.to_string(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Fails with [`Error::LockLost`] when one of this acquire's leases (`names`) is missing
    /// from the last listing: someone deleted it while it waited.
    fn check_listed(&self, names: &[&str]) -> Result<()> {
        let Some(name) = names
            .iter()
            .find(|n| !self.children.iter().any(|c| c == *n))
        else {
            return Ok(());
        };
        let key = self.key;
        tracing::warn!(%key, %name, "semaphore lease node deleted while waiting");
        Err(Error::LockLost {
            key: key.to_string(),
            reason: LossReason::NodeDeleted,
        })
    }

    /// Lists the leases and watches them (one request). `None` when the connection was lost
    /// and came back: the listing is unchanged, and no watch set.
    async fn list_and_watch(&mut self) -> Result<Option<OneshotWatcher>> {
        self.inner.count_requests(1);
        match self
            .session
            .client
            .list_and_watch_children(&self.path)
            .await
        {
            Ok((children, watcher)) => {
                self.children = children;
                Ok(Some(watcher))
            }
            Err(err) => self.failed(err).await.map(|()| None),
        }
    }

    /// Lists the leases again (one request) after the watch fired. When the connection was
    /// lost and came back, the listing is unchanged.
    async fn list(&mut self) -> Result<()> {
        self.inner.count_requests(1);
        match self.session.client.list_children(&self.path).await {
            Ok(children) => {
                self.children = children;
                Ok(())
            }
            Err(err) => self.failed(err).await,
        }
    }

    /// A listing failed: on a lost connection, waits until the session is connected again;
    /// anything else is the acquire's error.
    async fn failed(&self, err: zookeeper_client::Error) -> Result<()> {
        if !connection_lost(&err) {
            return Err(zk_error("list the leases", &self.path, err));
        }
        self.session.wait_connected().await
    }

    /// Waits for the leases' watch to fire: the session's end fails with
    /// [`Error::SessionExpired`]. Past the wait's deadline the recipe drops the acquire.
    async fn changed(&self, watcher: OneshotWatcher) -> Result<()> {
        let event = watcher.changed().await;
        if event.event_type == EventType::Session {
            return Err(Error::SessionExpired);
        }
        Ok(())
    }

    /// The leases, handed to the layers above: this acquire is complete.
    fn granted(self) -> Vec<SharedHold> {
        let key = self.key;
        let Leases { holds, .. } = self;
        holds
            .into_iter()
            .map(|hold| {
                tracing::debug!(%key, node = %hold.node, "semaphore lease acquired");
                Arc::new(hold) as Arc<dyn BackendHold>
            })
            .collect()
    }
}

/// Gives up the gate once the leases are made and counted, waiting for the answer.
///
/// Given up before returning, not in the background: an acquirer that comes right after
/// this one returned (a `try_acquire` above all) must find the gate free. Cancel safe: a
/// drop here deletes the gate in the background, and the leases with it (the acquire did
/// not complete). A failure means the gate's session ended: so did the leases, and their
/// holds report it.
async fn release_gate(gate: &Hold, key: &Arc<str>) {
    if let Err(err) = gate.release().await {
        tracing::debug!(%key, %err, "semaphore gate release failed");
    }
}
