//! Semaphores on etcd: `n` leases of a semaphore of `max` are `n` keys under its path, put in
//! one transaction (so they share one create revision: all or none), each on the manager's
//! lease. The groups of keys, in create order, are admitted first come first served: a group
//! holds when every group before it holds and the units of all of them, its own included, are
//! at most `max`. A waiting group watches the deletions under the path (any release may make
//! room) and reads the path again.
//!
//! etcd's own tools have no semaphore to share a format with; each key's value carries the
//! size its process asked (`max=N`), for inspection.

use std::sync::Arc;

use etcd_client::{EventType, TxnOpResponse, WatchFilterType, WatchOptions};

use super::acquire::{lease_live, undo_counted, Acquire, Attempt, AttemptKeys};
use super::error::bounded;
use super::hold::EtcdHold;
use super::session::Inner;
use super::session::{lease_ended, LeaseState};
use super::wire::{backoff, listing, put_leases, put_tracked, RequestError, Settled, RETRY_MIN};
use crate::backend::{LockTarget, SharedHold};
use crate::types::error::{Error, Result};
use crate::types::mode::LockMode;

/// Whether the group created at `rev` holds, given the create revisions of every key under
/// the path in create order (one per unit).
pub(super) fn admitted(revisions: &[i64], rev: i64, max: u32) -> bool {
    let (mut used, mut waiting) = (0u64, false);
    let mut i = 0;
    while i < revisions.len() {
        let group = revisions[i];
        let size = revisions[i..].iter().take_while(|r| **r == group).count() as u64;
        let fits = !waiting && used + size <= u64::from(max);
        if group == rev {
            return fits;
        }
        if fits {
            used += size;
        } else {
            waiting = true;
        }
        i += size as usize;
    }
    false
}

/// An acquire's keys while it runs: deleted when it ends without the leases.
pub(super) struct Leases {
    inner: Arc<Inner>,
    user_key: Arc<str>,
    path: Arc<str>,
    keys: Vec<String>,
    value: String,
    lease: i64,
    /// The semaphore's size.
    max: u32,
    armed: bool,
    sent: Vec<tokio::sync::watch::Receiver<Settled>>,
    /// Once put: the keys' create revision, the create revisions of every key under the path
    /// in create order, and the revision of that read.
    listed: (i64, Vec<i64>, i64),
}

impl Leases {
    pub(super) fn new(
        inner: &Arc<Inner>,
        target: &LockTarget,
        n: u32,
        max: u32,
        lease: &LeaseState,
    ) -> Leases {
        let keys = (0..n)
            .map(|_| inner.reserve(&target.path, LockMode::Exclusive, lease.id))
            .collect();
        Leases {
            inner: inner.clone(),
            user_key: target.key.clone(),
            path: target.path.clone(),
            keys,
            value: format!("{} max={max}", inner.owner_value()),
            lease: lease.id,
            max,
            armed: true,
            sent: Vec::new(),
            listed: (0, Vec::new(), 0),
        }
    }

    fn prefix(&self) -> String {
        format!("{}/", self.path)
    }

    /// Puts the keys unless the first exists (a retry after a lost reply finds them), and lists
    /// the path: the keys' create revision, every key's under the path, the read's revision.
    async fn put(&mut self) -> std::result::Result<(i64, Vec<i64>, i64), RequestError> {
        let put = put_leases(&self.keys, &self.value, self.lease, self.prefix());
        let resp =
            put_tracked(&self.inner, &mut self.sent, "put the semaphore's keys", put).await?;
        let seen = resp.header().map(|h| h.revision()).unwrap_or_default();
        let ranges: Vec<_> = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let revisions = ranges
            .last()
            .map(|g| g.kvs().iter().map(|kv| kv.create_revision()).collect())
            .unwrap_or_default();
        let rev = if resp.succeeded() {
            seen
        } else {
            match ranges.first().and_then(|g| g.kvs().first()) {
                Some(kv) if kv.lease() == self.lease => kv.create_revision(),
                // Not ours (cannot be: the names carry this lease): refused for good.
                _ => {
                    return Err(RequestError::from(Error::Config(format!(
                        "the etcd key {} is taken by another lease",
                        self.keys[0]
                    ))))
                }
            }
        };
        Ok((rev, revisions, seen))
    }
}

impl AttemptKeys for Leases {
    /// Puts the keys and sees whether their group is admitted.
    async fn attempt(&mut self, acquire: &Acquire<'_>, lease: &LeaseState) -> Result<Attempt> {
        let inner = acquire.inner;
        let mut backoff = backoff();
        self.listed = loop {
            let failed = match self.put().await {
                Ok(put) => break put,
                Err(e) => e,
            };
            if super::error::is_lease_gone(&failed.error) {
                inner.session.lease_gone(lease.id);
                return Ok(Attempt::Again);
            }
            acquire.pause_after(failed, &mut backoff).await?;
        };
        Ok(self.admitted(inner, lease))
    }

    /// Waits for a release under the path (any may make room), then lists it again.
    async fn wait(&mut self, acquire: &Acquire<'_>, lease: &LeaseState) -> Result<Attempt> {
        let inner = acquire.inner;
        let prefix = self.prefix();
        let released = watch_releases(inner, &prefix, self.listed.2);
        let ended = lease_ended(inner.session.watch(), lease.epoch);
        tokio::select! {
            () = released => {}
            () = ended => return Ok(Attempt::Again),
        }
        let (revisions, seen) = acquire.retrying(|| list(inner, &prefix)).await?;
        self.listed = (self.listed.0, revisions, seen);
        Ok(self.admitted(inner, lease))
    }

    fn grant(mut self, rev: i64, lease: LeaseState) -> Vec<SharedHold> {
        self.armed = false;
        std::mem::take(&mut self.keys)
            .into_iter()
            .map(|key| {
                Arc::new(EtcdHold::new(
                    self.inner.clone(),
                    self.user_key.clone(),
                    self.path.clone(),
                    key,
                    rev,
                    lease.clone(),
                    LockMode::Exclusive,
                )) as SharedHold
            })
            .collect()
    }

    async fn undo_now(mut self) {
        self.armed = false;
        let keys = std::mem::take(&mut self.keys);
        let sent = std::mem::take(&mut self.sent);
        let _ = undo_counted(&self.inner, &self.path, keys, self.lease, sent).await;
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        if self.armed {
            let keys = std::mem::take(&mut self.keys);
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

impl Leases {
    /// What the last listing says of the keys' group: held (while the lease is), waiting, or
    /// gone (with the lease, or deleted from outside).
    fn admitted(&self, inner: &Inner, lease: &LeaseState) -> Attempt {
        let (rev, revisions, _) = &self.listed;
        if !revisions.contains(rev) {
            Attempt::Again
        } else if !admitted(revisions, *rev, self.max) {
            Attempt::Busy
        } else if lease_live(inner, lease) {
            Attempt::Held(*rev)
        } else {
            Attempt::Again
        }
    }
}

/// The create revisions of every key under `prefix`, in create order, and the read's revision.
async fn list(inner: &Inner, prefix: &str) -> std::result::Result<(Vec<i64>, i64), RequestError> {
    inner.count_request();
    let mut client = inner.client.clone();
    let got = bounded(
        "list the semaphore's leases",
        inner.config.reply_timeout,
        client.get(prefix, Some(listing())),
    )
    .await?;
    let seen = got.header().map(|h| h.revision()).unwrap_or_default();
    Ok((
        got.kvs().iter().map(|kv| kv.create_revision()).collect(),
        seen,
    ))
}

/// Completes once a key under `prefix` is deleted after the listing at revision `seen`, or may
/// have been (the caller lists again). The watch starts at the server's current revision (etcd
/// catches up a watch that starts in the past only every 100 ms); when the store moved on since
/// the listing, the caller lists again at once.
async fn watch_releases(inner: &Inner, prefix: &str, seen: i64) {
    let mut client = inner.client.clone();
    inner.count_request();
    let options = WatchOptions::new()
        .with_prefix()
        .with_filters([WatchFilterType::NoPut]);
    let Ok(Ok(mut stream)) = tokio::time::timeout(
        inner.config.reply_timeout,
        client.watch(prefix, Some(options)),
    )
    .await
    else {
        tokio::time::sleep(RETRY_MIN).await;
        return;
    };
    while let Ok(Some(resp)) = stream.message().await {
        if resp
            .events()
            .iter()
            .any(|e| e.event_type() == EventType::Delete)
        {
            inner.count_event();
            return;
        }
        if resp.canceled() || (resp.created() && resp.header().is_some_and(|h| h.revision() > seen))
        {
            return;
        }
    }
    tokio::time::sleep(RETRY_MIN).await;
}

#[cfg(test)]
mod tests {
    use super::admitted;

    #[test]
    fn groups_are_admitted_first_come_first_served_within_the_size() {
        // Two of 3 held (rev 5), one asking 2 (rev 7) waits, one asking 1 (rev 9) waits
        // behind it (no barging).
        let revs = [5, 5, 7, 7, 9];
        assert!(admitted(&revs, 5, 3));
        assert!(!admitted(&revs, 7, 3));
        assert!(!admitted(&revs, 9, 3));
        // Once the first group goes, both fit.
        let revs = [7, 7, 9];
        assert!(admitted(&revs, 7, 3) && admitted(&revs, 9, 3));
        assert!(!admitted(&revs, 11, 3), "not listed: not admitted");
    }
}
