//! A scheduled job's run record on Redis: `claim_run` records a run in the job's run key
//! unless one was recorded within the `at_least` window (see `CLAIM_RUN` in [`scripts`]).

use std::time::Duration;

use super::conn::Inner;
use super::error::{server_error, unacked};
use super::wire::keys::Keys;
use super::wire::scripts;
use crate::backend::LockTarget;
use crate::types::error::Result;

/// Records a run of the job at `target` unless one was recorded less than `at_least` ago:
/// whether this run may start.
pub(super) async fn claim_run(
    inner: &Inner,
    target: &LockTarget,
    at_least: Duration,
) -> Result<bool> {
    let keys = Keys::new(&target.path);
    let ms = at_least.as_millis() as u64;
    let acks = inner.acks;
    let (claimed, acked) = inner
        .conn
        .run(&keys.run, Some(inner.write_timeout()), |mut c| {
            let mut invocation = scripts::CLAIM_RUN.key(&keys.run);
            invocation.arg(ms);
            async move {
                let claimed = invocation.invoke_async::<i64>(&mut c).await?;
                let acked = match claimed {
                    1 => Inner::acked(acks, &mut c).await?,
                    _ => Ok(()),
                };
                Ok((claimed, acked))
            }
        })
        .await
        .map_err(|e| server_error("record the job's run", e))?;
    // A run record that too few replicas have could be lost to a failover, and the job
    // run again inside its window: the run does not start.
    if let Err(n) = acked {
        return Err(unacked(
            inner.acks,
            n,
            "recorded the job's run (the job does not start)",
        ));
    }
    Ok(claimed == 1)
}
