//! One local holder's grant of a backend hold.

use std::sync::Arc;

use super::LocalTurn;
use crate::backend::{BackendHold, LockTarget};
use crate::metrics::{HoldMeter, Labels, Recipe};
use crate::types::error::Result;
use crate::types::loss::LossReason;
use crate::types::mode::HoldMode;
use crate::types::token::FencingToken;

/// One local holder's grant: a hold (shared with the local holders it is handed on to), the
/// token of this grant, and the local queue to hand it to on release.
pub(crate) struct Grant {
    hold: Option<Arc<dyn BackendHold>>,
    /// A second hold this grant keeps until it ends (a downgrade that could not let go of its
    /// write hold yet).
    extra: Option<Arc<dyn BackendHold>>,
    pub(crate) token: FencingToken,
    pub(crate) mode: HoldMode,
    /// The local table (so the manager) this grant belongs to.
    pub(crate) table: u64,
    pub(crate) path: Arc<str>,
    local: Option<LocalTurn>,
    since: std::time::Instant,
    /// The metrics' labels of this hold (a local handoff gives them to the next holder).
    labels: Labels,
    /// Counts this hold in the metrics until it ends.
    meter: HoldMeter,
    /// Why the layers above ended the hold though the backend still held it (a job's
    /// `at_most`): what the metrics count it lost for.
    ended_by: std::sync::OnceLock<LossReason>,
    /// Guards on this grant (re-entries included).
    pub(crate) guards: std::sync::atomic::AtomicUsize,
}

impl Grant {
    pub(crate) fn new(
        table: u64,
        hold: Arc<dyn BackendHold>,
        token: FencingToken,
        mode: HoldMode,
        path: Arc<str>,
        local: Option<LocalTurn>,
        labels: &Labels,
    ) -> Grant {
        let since = std::time::Instant::now();
        Grant {
            meter: labels.hold(since),
            ended_by: std::sync::OnceLock::new(),
            labels: labels.clone(),
            hold: Some(hold),
            extra: None,
            token,
            mode,
            table,
            path,
            local,
            since,
            guards: Default::default(),
        }
    }

    pub(crate) fn hold(&self) -> &Arc<dyn BackendHold> {
        self.hold
            .as_ref()
            .expect("a grant has its hold until it ends")
    }

    /// The local queue this grant hands on to, if any.
    pub(crate) fn local_lock(&self) -> Option<LocalTurn> {
        self.local.clone()
    }

    /// Keeps `hold` until this grant ends.
    pub(crate) fn keep(&mut self, hold: Arc<dyn BackendHold>) {
        self.extra = Some(hold);
    }

    /// Takes the hold out without releasing it (used when a handoff found no taker: the hold
    /// never started, and its metrics say so).
    pub(crate) fn defuse(mut self) -> Arc<dyn BackendHold> {
        self.meter.discard();
        self.extra = None;
        self.local = None;
        self.hold
            .take()
            .expect("a grant has its hold until it ends")
    }

    /// The layers above end this hold for `reason` though the backend still holds it (a job's
    /// `at_most`): its metrics count it lost for that reason.
    pub(crate) fn end_for(&self, reason: LossReason) {
        let _ = self.ended_by.set(reason);
    }

    /// How the hold ended, for its metrics: lost as the backend knows it, or as the layers
    /// above ended it.
    fn ended_lost(&self, hold: &Arc<dyn BackendHold>) -> Option<LossReason> {
        hold.loss_known().or_else(|| self.ended_by.get().copied())
    }

    pub(crate) fn loss_reason(&self) -> Option<LossReason> {
        self.hold().loss_reason()
    }

    pub(crate) async fn lost(&self) -> LossReason {
        self.hold().loss().lost().await
    }

    /// Ends the grant: hands the hold to the next local waiter, or deletes it and waits.
    pub(crate) async fn release(mut self) -> Result<()> {
        let hold = self
            .hold
            .take()
            .expect("a grant has its hold until it ends");
        let extra = self.extra.take();
        let lost = self.ended_lost(&hold);
        self.meter.end(lost);
        let to_delete = match self.local.take() {
            Some(local) => local.release(hold, &self.labels),
            None => Some(hold),
        };
        let mut result = Ok(());
        if let Some(hold) = to_delete {
            result = hold.release().await;
        }
        if let Some(extra) = extra {
            let _ = extra.release().await;
        }
        result
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(hold) = self.hold.take() {
            let held = self.since.elapsed();
            let held_ms = held.as_millis() as u64;
            tracing::debug!(path = %self.path, token = %self.token, held_ms, "zklock: released");
            let lost = self.ended_lost(&hold);
            self.meter.end_after(lost, held);
            match self.local.take() {
                // The returned hold (if any) is deleted by its own Drop.
                Some(local) => drop(local.release(hold, &self.labels)),
                None => drop(hold),
            }
        }
    }
}

impl Grant {
    /// Turns this write grant into a read grant of `target` without letting another writer in
    /// (see [`BackendHold::downgrade`]): the write hold is let go unless a writer queued in
    /// between, then kept until the read grant ends. The local queue moves on: the next local
    /// writer takes a hold of its own.
    ///
    /// The read grant continues the write grant, so its token is the write token extended by
    /// one: above every holder before it, below every writer after it.
    pub(crate) async fn downgrade(self, target: LockTarget) -> Result<Grant> {
        let hold = self.hold().clone();
        let down = hold.downgrade(target).await?;
        let token = FencingToken::new(self.token.grant(), self.token.local() + 1);
        let path = self.path.clone();
        let table = self.table;
        let local = self.local_lock();
        let labels = self.labels.with_recipe(Recipe::Read);
        labels.backend_grants(1);
        let mut write = self;
        write.meter.end(None);
        let write = write.defuse();
        let write = match local {
            Some(local) => local.give_up(write),
            None => write,
        };
        let mut grant = Grant::new(table, down.read, token, HoldMode::Read, path, None, &labels);
        if down.keep_write {
            grant.keep(write);
        } else {
            write.release().await?;
        }
        Ok(grant)
    }
}
