//! An acquire on etcd, in the wire format of etcd's own recipes: a contender's key under the
//! lock's prefix, attached to the session's lease; the lowest create revision goes first; a
//! waiter watches the deletion of the last key created before its own that it must wait for
//! (no herd).
//!
//! 1. [`Entry::put`]: one transaction puts the contender's key unless it exists and reads the
//!    first key it would wait for. When there is none before it, it holds (the uncontended
//!    acquire is this one request).
//! 2. [`Acquire::wait_for_predecessors`] (the driver's wait): otherwise it reads the last key
//!    created before its own among those it waits for and watches it until it is deleted,
//!    then reads again, until none is left.
//! 3. It reads its own key once more (it may have gone with the lease, or been deleted from
//!    outside, while it waited) and holds.
//!
//! An acquire that ends without a hold (a try that found the lock taken, a deadline, an error,
//! a drop) deletes its key: at once where it can wait for the answer, else in the background
//! (an undo that the process's next acquire of the lock waits for).
//!
//! The driver's loop over leases ([`EtcdAcquisition`]) is the semaphore's too: its keys are
//! another [`AttemptKeys`] ([`semaphore`](super::semaphore)).

use std::sync::Arc;

use etcd_client::{EventType, GetOptions, SortOrder, SortTarget, TxnOpResponse};
use tokio::time::Instant;

use super::error::bounded;
use super::hold::EtcdHold;
use super::session::Inner;
use super::session::{lease_ended, LeaseState};
use crate::backend::backoff::Backoff;
use crate::backend::undos::Undos;
use crate::backend::{Acquisition, BoxFuture, LockTarget, SharedHold, Step};
use crate::types::error::Result;
use crate::types::mode::{LockMode, Wait};

use super::wire::{
    backoff, delete, put_contender, put_tracked, undo, Layout, RequestError, Settled, RETRY_MAX,
    RETRY_MIN,
};

/// What one attempt, or one wait, came to.
pub(super) enum Attempt {
    /// Held, with the keys' create revision.
    Held(i64),
    /// The lock is taken: a try gives up, a waiter waits.
    Busy,
    /// The lease ended (or the keys went) meanwhile: start again on a new one.
    Again,
}

/// The keys one acquire puts on a lease (a contender's key, a semaphore's keys), as the driver
/// sees them through [`EtcdAcquisition`]: attempted, waited on, then granted or deleted.
pub(super) trait AttemptKeys: Send {
    /// One attempt of `acquire` on `lease` with these keys: put them, and see whether they hold.
    fn attempt<'s>(
        &'s mut self,
        acquire: &'s Acquire<'_>,
        lease: &'s LeaseState,
    ) -> impl std::future::Future<Output = Result<Attempt>> + Send + 's;

    /// After [`Attempt::Busy`]: waits until what blocked the keys changed, and sees again.
    fn wait<'s>(
        &'s mut self,
        acquire: &'s Acquire<'_>,
        lease: &'s LeaseState,
    ) -> impl std::future::Future<Output = Result<Attempt>> + Send + 's;

    /// What the keys became, holding since `rev` on `lease`.
    fn grant(self, rev: i64, lease: LeaseState) -> Vec<SharedHold>;

    /// Deletes the keys and waits for the answer (in the background if it is dropped first).
    fn undo_now(self) -> impl std::future::Future<Output = ()> + Send;
}

/// An acquire of `target` within `wait`: what every request of it is made with.
pub(super) struct Acquire<'a> {
    pub(super) inner: &'a Arc<Inner>,
    pub(super) target: &'a LockTarget,
    pub(super) wait: Wait,
}

/// An acquire for the driver ([`drive`](crate::backend::drive)): the keys `start` makes on
/// each live lease. Keys that did not come to hold are deleted (when dropped, in the
/// background, as an undo of the lock).
pub(super) struct EtcdAcquisition<'a, K, F> {
    pub(super) acquire: Acquire<'a>,
    pub(super) start: F,
    entry: Option<(K, LeaseState)>,
}

impl<'a, K, F> EtcdAcquisition<'a, K, F>
where
    K: AttemptKeys + 'a,
    F: FnMut(&LeaseState) -> K + Send + 'a,
{
    pub(super) fn new(acquire: Acquire<'a>, start: F) -> Self {
        EtcdAcquisition {
            acquire,
            start,
            entry: None,
        }
    }

    /// What an attempt or a wait came to, for the driver: held keys become holds.
    fn step(&mut self, attempt: Attempt) -> Step {
        match attempt {
            Attempt::Held(rev) => {
                let (keys, lease) = self.entry.take().expect("entered");
                Step::Held(keys.grant(rev, lease))
            }
            Attempt::Busy => Step::Busy,
            Attempt::Again => Step::Restart,
        }
    }
}

impl<'a, K, F> Acquisition for EtcdAcquisition<'a, K, F>
where
    K: AttemptKeys + 'a,
    F: FnMut(&LeaseState) -> K + Send + 'a,
{
    fn undos(&self) -> Option<&Undos> {
        Some(&self.acquire.inner.undos)
    }

    fn enter(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            // The keys of an earlier lease, dropped armed, are deleted in the background.
            self.entry = None;
            let lease = self.acquire.inner.session.live().await?;
            self.entry = Some(((self.start)(&lease), lease));
            Ok(())
        })
    }

    fn attempt(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(async move {
            let (keys, lease) = self.entry.as_mut().expect("entered");
            let attempt = keys.attempt(&self.acquire, lease).await?;
            Ok(self.step(attempt))
        })
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(async move {
            let (keys, lease) = self.entry.as_mut().expect("entered");
            let attempt = keys.wait(&self.acquire, lease).await?;
            Ok(self.step(attempt))
        })
    }

    fn give_up(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some((keys, _)) = self.entry.take() {
                keys.undo_now().await;
            }
        })
    }
}

impl Acquire<'_> {
    /// Puts the key of `entry` on `lease` (again after a failure the request may survive): its
    /// create revision and the first it waits for; `None` when the lease ended before the
    /// session heard.
    async fn put(
        &self,
        entry: &mut Entry,
        layout: &Layout,
        lease: &LeaseState,
    ) -> Result<Option<(i64, Option<i64>)>> {
        let mut backoff = backoff();
        loop {
            let failed = match entry.put(layout).await {
                Ok(put) => return Ok(Some(put)),
                Err(e) => e,
            };
            // The lease ended before the session heard: every hold on it is lost; again on
            // the next.
            if super::error::is_lease_gone(&failed.error) {
                self.inner.session.lease_gone(lease.id);
                return Ok(None);
            }
            self.pause_after(failed, &mut backoff).await?;
        }
    }

    /// Waits until no key under the layout's blockers was created before `rev`: `Ok(false)`
    /// when the lease ended meanwhile.
    async fn wait_for_predecessors(
        &self,
        layout: &Layout,
        rev: i64,
        lease: &LeaseState,
    ) -> Result<bool> {
        loop {
            let last = self
                .retrying(|| last_before(self.inner, &layout.blockers, rev))
                .await?;
            let Some((key, created, seen)) = last else {
                return Ok(true);
            };
            let deleted = watch_deletion(self.inner, key, created, seen);
            let ended = lease_ended(self.inner.session.watch(), lease.epoch);
            tokio::select! {
                () = deleted => {}
                () = ended => return Ok(false),
            }
        }
    }

    /// Runs `request` until it succeeds or fails for good; a try gets one attempt. The wait's
    /// deadline is the caller's: the recipe drops the acquire then, and reports the timeout.
    pub(super) async fn retrying<T, F, Fut>(&self, mut request: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, RequestError>>,
    {
        let mut backoff = backoff();
        loop {
            let failed = match request().await {
                Ok(t) => return Ok(t),
                Err(e) => e,
            };
            self.pause_after(failed, &mut backoff).await?;
        }
    }

    /// After `failed`: `Err` when it is for good (or a try's), else waits `backoff`'s next
    /// pause for the request to be sent again.
    pub(super) async fn pause_after(
        &self,
        failed: RequestError,
        backoff: &mut Backoff,
    ) -> Result<()> {
        if !failed.transient || matches!(self.wait, Wait::Never) {
            return Err(failed.error);
        }
        tracing::debug!(key = %self.target.key, error = %failed.error, "an etcd request of an acquire failed; retrying");
        backoff.wait().await;
        Ok(())
    }
}

/// Whether `lease` is still the session's live lease.
pub(super) fn lease_live(inner: &Inner, lease: &LeaseState) -> bool {
    inner
        .session
        .watch()
        .borrow()
        .reason_for(lease.epoch, Instant::now())
        .is_none()
}

/// The last key under `prefix` created before `rev`, if there is one: its name, its create
/// revision, and the revision of the read.
async fn last_before(
    inner: &Inner,
    prefix: &str,
    rev: i64,
) -> std::result::Result<Option<(Vec<u8>, i64, i64)>, RequestError> {
    inner.count_request();
    let mut client = inner.client.clone();
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Descend)
        .with_limit(1)
        .with_keys_only()
        .with_max_create_revision(rev - 1);
    let got = bounded(
        "read the contender ahead",
        inner.config.reply_timeout,
        client.get(prefix, Some(options)),
    )
    .await?;
    let seen = got.header().map(|h| h.revision()).unwrap_or(rev);
    Ok(got
        .kvs()
        .first()
        .map(|kv| (kv.key().to_vec(), kv.create_revision(), seen)))
}

/// Completes once `key` (created at `created`, seen at revision `seen`) is deleted, or may have
/// been (its watch cannot say: the caller reads again).
///
/// The watch starts at the server's current revision, never at an older one: etcd catches a
/// watch that starts in the past up with the others only every 100 ms, which would hold every
/// hand-over up by as much. What happened between the read and the watch, the watch's first
/// answer tells: if the store moved on since the read, one read of the key says whether it is
/// still the one ahead.
async fn watch_deletion(inner: &Inner, key: Vec<u8>, created: i64, seen: i64) {
    let mut client = inner.client.clone();
    inner.count_request();
    let Ok(Ok(mut stream)) =
        tokio::time::timeout(inner.config.reply_timeout, client.watch(key.clone(), None)).await
    else {
        tokio::time::sleep(RETRY_MIN).await;
        return;
    };
    let mut checked = false;
    loop {
        match stream.message().await {
            Ok(Some(resp)) => {
                if resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    inner.count_event();
                    return;
                }
                if resp.canceled() {
                    return;
                }
                let from = resp.header().map_or(seen, |h| h.revision());
                if !checked && resp.created() && from > seen {
                    checked = true;
                    inner.count_request();
                    let still = tokio::time::timeout(
                        inner.config.reply_timeout,
                        client.get(key.clone(), Some(GetOptions::new().with_keys_only())),
                    )
                    .await;
                    match still {
                        Ok(Ok(got))
                            if got
                                .kvs()
                                .first()
                                .is_some_and(|kv| kv.create_revision() == created) => {}
                        // Gone, another incarnation, or no answer: read again.
                        _ => return,
                    }
                }
            }
            Ok(None) | Err(_) => {
                tokio::time::sleep(RETRY_MIN).await;
                return;
            }
        }
    }
}

/// A contender's key while its acquire runs: deleted when the acquire ends without a hold.
pub(super) struct Entry {
    inner: Arc<Inner>,
    user_key: Arc<str>,
    path: Arc<str>,
    mode: LockMode,
    /// The key in etcd.
    key: String,
    value: String,
    lease: i64,
    /// Whether the key may exist and is still this entry's to delete.
    armed: bool,
    /// The puts sent: an undo waits for their answers first, so that no put lands after the
    /// delete (the two go on different streams, which etcd may apply in either order).
    sent: Vec<tokio::sync::watch::Receiver<Settled>>,
    /// The keys it waits for.
    layout: Layout,
    /// Its create revision, once put.
    rev: i64,
}

impl Entry {
    pub(super) fn new(
        inner: &Arc<Inner>,
        target: &LockTarget,
        mode: LockMode,
        lease: &LeaseState,
    ) -> Entry {
        let key = inner.reserve(&target.path, mode, lease.id);
        let value = match (&target.participant, mode) {
            // etcd's Election keeps the candidate's proposal as the value; a latch's is its id.
            (Some(id), LockMode::Leader) => id.to_string(),
            _ => inner.owner_value(),
        };
        Entry {
            inner: inner.clone(),
            user_key: target.key.clone(),
            path: target.path.clone(),
            mode,
            key,
            value,
            lease: lease.id,
            armed: true,
            sent: Vec::new(),
            layout: Layout::of(&target.path, mode),
            rev: 0,
        }
    }

    /// Puts the key unless it exists (a retry after a lost reply finds it), and reads the
    /// create revision of the first key it waits for: its own create revision and that one.
    async fn put(
        &mut self,
        layout: &Layout,
    ) -> std::result::Result<(i64, Option<i64>), RequestError> {
        loop {
            let put = put_contender(&self.key, &self.value, self.lease, &layout.blockers);
            let resp =
                put_tracked(&self.inner, &mut self.sent, "put the contender's key", put).await?;
            let ranges: Vec<_> = resp
                .op_responses()
                .into_iter()
                .filter_map(|r| match r {
                    TxnOpResponse::Get(g) => Some(g),
                    _ => None,
                })
                .collect();
            let first = ranges
                .last()
                .and_then(|g| g.kvs().first())
                .map(|kv| kv.create_revision());
            if resp.succeeded() {
                let rev = resp.header().map(|h| h.revision()).unwrap_or_default();
                return Ok((rev, first));
            }
            match ranges.first().and_then(|g| g.kvs().first()) {
                // Its own key, put by an earlier send whose reply was lost.
                Some(kv) if kv.lease() == self.lease => return Ok((kv.create_revision(), first)),
                // Another process's read/write key of the same name: another name.
                _ => {
                    self.inner.unreserve(&self.key);
                    self.key = self.inner.reserve(&self.path, self.mode, self.lease);
                }
            }
        }
    }

    /// The create revision of the key now, `None` when it is gone.
    async fn create_revision(&self) -> std::result::Result<Option<i64>, RequestError> {
        self.inner.count_request();
        let mut client = self.inner.client.clone();
        let got = bounded(
            "read the contender's key",
            self.inner.config.reply_timeout,
            client.get(self.key.as_str(), None),
        )
        .await?;
        Ok(got
            .kvs()
            .first()
            .filter(|kv| kv.lease() == self.lease)
            .map(|kv| kv.create_revision()))
    }
}

impl AttemptKeys for Entry {
    /// Puts the key; it holds when no key it waits for was created before it.
    async fn attempt(&mut self, acquire: &Acquire<'_>, lease: &LeaseState) -> Result<Attempt> {
        let layout = self.layout.clone();
        let Some((rev, first)) = acquire.put(self, &layout, lease).await? else {
            return Ok(Attempt::Again);
        };
        self.rev = rev;
        if first.is_none_or(|first| first >= rev) {
            // Held while the lease is: one that could have run out meanwhile is no grant.
            return Ok(if lease_live(acquire.inner, lease) {
                Attempt::Held(rev)
            } else {
                Attempt::Again
            });
        }
        Ok(Attempt::Busy)
    }

    /// Waits for the keys before it to go, then reads its own once more: it may have gone with
    /// the lease, or been deleted from outside, meanwhile.
    async fn wait(&mut self, acquire: &Acquire<'_>, lease: &LeaseState) -> Result<Attempt> {
        let rev = self.rev;
        if !acquire
            .wait_for_predecessors(&self.layout, rev, lease)
            .await?
        {
            return Ok(Attempt::Again);
        }
        let still = acquire.retrying(|| self.create_revision()).await?;
        Ok(if still == Some(rev) && lease_live(acquire.inner, lease) {
            Attempt::Held(rev)
        } else {
            Attempt::Again
        })
    }

    fn grant(mut self, rev: i64, lease: LeaseState) -> Vec<SharedHold> {
        self.armed = false;
        vec![Arc::new(EtcdHold::new(
            self.inner.clone(),
            self.user_key.clone(),
            self.path.clone(),
            std::mem::take(&mut self.key),
            rev,
            lease,
            self.mode,
        ))]
    }
    async fn undo_now(mut self) {
        self.armed = false;
        let keys = vec![std::mem::take(&mut self.key)];
        let sent = std::mem::take(&mut self.sent);
        let _ = undo_counted(&self.inner, &self.path, keys, self.lease, sent).await;
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if self.armed {
            let keys = vec![std::mem::take(&mut self.key)];
            let sent = std::mem::take(&mut self.sent);
            drop(undo_counted(
                &self.inner,
                &self.path,
                keys,
                self.lease,
                sent,
            ));
        }
    }
}

/// Starts the undo of an acquire's `keys` in the background, counted (a flush waits for it)
/// and registered as an undo of `path` (the process's next acquire of the lock waits for it,
/// even when the acquire that started it is dropped while it runs); the receiver says when it
/// is done.
pub(super) fn undo_counted(
    inner: &Arc<Inner>,
    path: &Arc<str>,
    keys: Vec<String>,
    lease: i64,
    sent: Vec<tokio::sync::watch::Receiver<Settled>>,
) -> tokio::sync::oneshot::Receiver<()> {
    let undoing = inner.undos.start(path);
    let undo = undo_sent(inner.clone(), keys, lease, sent);
    let (done, finished) = tokio::sync::oneshot::channel();
    inner.background.spawn(&inner.runtime, async move {
        undo.await;
        drop(undoing);
        let _ = done.send(());
    });
    finished
}

/// The undo of an acquire whose puts of `key` are `sent`: waits for their answers, deletes the
/// key, and when a put got none (it may still land), deletes it once more after the longest a
/// request can take; the name stays taken until then.
async fn undo_sent(
    inner: Arc<Inner>,
    keys: Vec<String>,
    lease: i64,
    sent: Vec<tokio::sync::watch::Receiver<Settled>>,
) {
    let mut unknown = false;
    for mut rx in sent {
        let answered = tokio::time::timeout(
            inner.config.reply_timeout + RETRY_MAX,
            rx.wait_for(|s| *s != Settled::Pending),
        )
        .await;
        unknown |= !matches!(answered, Ok(Ok(s)) if *s == Settled::Answered);
    }
    if unknown {
        for key in &keys {
            delete(&inner, key, lease, None).await;
        }
        tokio::time::sleep(inner.config.reply_timeout).await;
    }
    for key in keys {
        undo(inner.clone(), key, lease).await;
    }
}
