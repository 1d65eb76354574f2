//! A scheduled job's run record: [`claim_run`] keeps the `at_least` window in the key table's
//! row of the job's lock (`run_after`, by the server's clock).

use std::time::Duration;

use tokio_postgres::types::Type;

use super::error::{pg_error, row_keeps_changing};
use super::keys::STALE_ID_RETRIES;
use super::wire;
use super::Inner;
use crate::backend::LockTarget;
use crate::types::error::Result;

/// [`Backend::claim_run`](crate::backend::Backend::claim_run): `false` while an earlier run's
/// window still covers now, else records the window from now and answers `true`, in one
/// statement ([`wire::CLAIM_RUN`]); the id is looked up again when the row no longer names
/// the path.
pub(super) async fn claim_run(
    inner: &Inner,
    target: &LockTarget,
    at_least: Duration,
) -> Result<bool> {
    let ms = at_least.as_millis().min(i64::MAX as u128) as i64;
    let path: &str = &target.path;
    for _ in 0..=STALE_ID_RETRIES {
        let claimed = async {
            let id = inner.id_of(&target.path).await?;
            let conn = inner.pool.any().await?;
            let claimed = conn
                .run(conn.client().query_typed(
                    wire::CLAIM_RUN,
                    &[(&id, Type::INT4), (&path, Type::TEXT), (&ms, Type::INT8)],
                ))
                .await?;
            Ok(claimed.first().map(|r| r.get::<_, bool>(0)))
        };
        match claimed.await.map_err(pg_error("record the job's run"))? {
            Some(run) => return Ok(run),
            None => inner.forget(path),
        }
    }
    Err(row_keeps_changing(&target.key))
}
