//! The key table's ids: a lock path's id, read from `zklock_keys` (adding the path, making the
//! table again if it was dropped) and cached; see [`wire`] for the table and its statements.

use std::sync::Arc;

use tokio_postgres::types::Type;

use super::conn::HoldConn;
use super::error::{is_undefined_table, PostgresError};
use super::{wire, Inner};

/// How many times an acquire looks a path's id up again after finding it stale before giving
/// up (someone keeps dropping the key table).
pub(super) const STALE_ID_RETRIES: u32 = 3;

impl Inner {
    /// Creates the key table unless it is there.
    pub(super) async fn ensure_schema(&self, conn: &HoldConn) -> Result<(), PostgresError> {
        let exists = conn
            .run(conn.client().query_typed(wire::SCHEMA_EXISTS, &[]))
            .await?;
        if exists.first().is_some_and(|r| r.get::<_, bool>(0)) {
            return Ok(());
        }
        conn.run(conn.client().batch_execute(wire::CREATE_SCHEMA))
            .await
    }

    /// The lock id of `path`: from the cache, else from the key table (adding the path).
    pub(super) async fn id_of(&self, path: &Arc<str>) -> Result<i32, PostgresError> {
        if let Some(id) = self.ids.lock().expect("not poisoned").get(path) {
            return Ok(*id);
        }
        let conn = self.pool.any().await?;
        let find = || async {
            conn.run(
                conn.client()
                    .query_typed(wire::FIND_ID, &[(&&**path, Type::TEXT)]),
            )
            .await
            .map(|rows| rows.first().map(|r| r.get::<_, i32>(0)))
        };
        let mut created = false;
        loop {
            let found = match find().await {
                Ok(Some(id)) => Some(id),
                Ok(None) => {
                    conn.run(
                        conn.client()
                            .query_typed(wire::ADD_PATH, &[(&&**path, Type::TEXT)]),
                    )
                    .await?;
                    find().await?
                }
                // The table was dropped since this backend started: make it again, once.
                Err(e) if is_undefined_table(&e) && !created => {
                    created = true;
                    self.ensure_schema(&conn).await?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(id) = found {
                self.ids
                    .lock()
                    .expect("not poisoned")
                    .insert(path.clone(), id);
                return Ok(id);
            }
        }
    }

    /// Forgets the id of `path` (its row no longer names it).
    pub(super) fn forget(&self, path: &str) {
        self.ids.lock().expect("not poisoned").remove(path);
    }
}
