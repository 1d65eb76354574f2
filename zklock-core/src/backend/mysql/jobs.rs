//! A scheduled job's run record: [`claim_run`] keeps the `at_least` window in the lock's row of
//! `zklock_locks` (`run_until_us`), by the server's clock.

use std::time::Duration;

use mysql_async::prelude::Queryable;

use super::conn::{bounded, Inner};
use super::error::{mysql_error, MySqlError};
use super::wire;
use crate::backend::LockTarget;
use crate::types::error::Result;

/// [`Backend::claim_run`](crate::backend::Backend::claim_run): `false` while an earlier run's
/// window still covers now (by the server's clock), else records the window from now and
/// answers `true`. Called under the job's lock, so nobody else writes the row meanwhile.
pub(super) async fn claim_run(
    inner: &Inner,
    target: &LockTarget,
    at_least: Duration,
) -> Result<bool> {
    let name = wire::name(&target.path);
    let path: &str = &target.path;
    let us = at_least.as_micros().min(i64::MAX as u128) as i64;
    let claim = async {
        let mut conn = inner.take().await?;
        let within = inner.config.reply_timeout;
        inner.count();
        let window: Option<(i64, i64)> =
            bounded(within, conn.exec_first(wire::run_window(), (&name,))).await?;
        let (until, now) = window.unwrap_or((0, 0));
        if now < until {
            inner.give_back(conn);
            return Ok::<bool, MySqlError>(false);
        }
        inner.count();
        bounded(
            within,
            conn.exec_drop(wire::RECORD_RUN, (&name, path, now.saturating_add(us))),
        )
        .await?;
        inner.give_back(conn);
        Ok(true)
    };
    claim.await.map_err(mysql_error("record the job's run"))
}
