//! A scheduled job's run record on ZooKeeper: [`claim_run`], the `at_least` window kept by
//! the server's clock in a persistent node beside the job's lock path.

use std::sync::Arc;
use std::time::Duration;

use super::error::zk_error;
use super::path::ensure_parents;
use super::wire::{PERSISTENT, PERSISTENT_PROTECTED};
use super::Inner;
use crate::backend::LockTarget;
use crate::types::error::Result;
use crate::types::layout::run_record;

/// The data of a run record: no run may start before this server time (ms since the epoch).
fn not_before(data: &[u8]) -> Option<i64> {
    std::str::from_utf8(data)
        .ok()?
        .strip_prefix("not-before=")?
        .parse()
        .ok()
}

/// [`Backend::claim_run`](crate::backend::Backend::claim_run) on ZooKeeper, by the server's
/// clock: a write to the run record returns the server's time of that write (its mtime), which
/// is compared with the `not-before` an earlier run left there.
///
/// No write ever weakens a recorded window: the write that learns the server's time puts back
/// the very data it read (a conditional write on the version read), so a claim cancelled,
/// killed or cut off after any of its requests leaves the record as strong as it found it;
/// only a claim that runs writes a new `not-before`, later than both the old one and now.
/// Two requests and one write when the job is skipped, three and two when it runs.
pub(super) async fn claim_run(
    inner: &Arc<Inner>,
    target: &LockTarget,
    at_least: Duration,
) -> Result<bool> {
    let session = inner.live_session().await?;
    let client = &session.client;
    let record = run_record(&target.path);
    let fail = |op, err| zk_error(op, &record, err);
    let persistent = if inner.config.protected {
        &PERSISTENT_PROTECTED
    } else {
        &PERSISTENT
    };
    loop {
        inner.count_requests(1);
        let (data, version) = match client.get_data(&record).await {
            Ok((data, stat)) => (data, Some(stat.version)),
            Err(zookeeper_client::Error::NoNode) => (Vec::new(), None),
            Err(err) => return Err(fail("read the job's last run", err)),
        };
        // A write whose stat tells the server's time now, and that changes nothing: the same
        // data, or a new record with none.
        inner.count_requests(1);
        let stamped = match version {
            Some(version) => client.set_data(&record, &data, Some(version)).await,
            None => match client.create(&record, &data, persistent).await {
                Ok((stat, _)) => Ok(stat),
                Err(zookeeper_client::Error::NodeExists) => continue,
                Err(zookeeper_client::Error::NoNode) => {
                    ensure_parents(inner, client, &target.path).await?;
                    continue;
                }
                Err(err) => Err(err),
            },
        };
        let stat = match stamped {
            Ok(stat) => stat,
            // Someone else (not under the job's lock) wrote meanwhile: look again.
            Err(zookeeper_client::Error::BadVersion) => continue,
            Err(err) => return Err(fail("record the job's run", err)),
        };
        let now = stat.mtime;
        if not_before(&data).is_some_and(|before| before > now) {
            return Ok(false);
        }
        let window = format!("not-before={}", now + at_least.as_millis() as i64);
        inner.count_requests(1);
        match client
            .set_data(&record, window.as_bytes(), Some(stat.version))
            .await
        {
            Ok(_) => return Ok(true),
            Err(zookeeper_client::Error::BadVersion) => continue,
            Err(err) => return Err(fail("record the job's run", err)),
        }
    }
}
