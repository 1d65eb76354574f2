//! The fence on MySQL / MariaDB: a token table, and your statement run in the same transaction
//! as the token's advance, committed only when the token passed.

use std::future::Future;

use mysql_async::prelude::Queryable;

use super::error::FenceError;
use super::{check_write, Fence, Outcome};
use crate::types::token::FencingToken;

/// The default name of the token table.
pub(crate) const DEFAULT_TABLE: &str = "zklock_fence_tokens";

/// Fencing on MySQL / MariaDB: a table of last accepted tokens, one row per resource, and
/// writes run in a transaction that advances the resource's token first.
///
/// The table (made by [`create_table`](Self::create_table)) is
/// `(resource VARCHAR(255) PRIMARY KEY, token VARBINARY(12) NOT NULL)`, the token in
/// [`FencingToken::to_sortable_bytes`]'s 12 bytes, which binary strings compare in the token's
/// order. The advance is one `INSERT .. ON DUPLICATE KEY UPDATE token = IF(token <= new, new,
/// token)`: it locks the row until the transaction ends, so concurrent writers of one resource
/// take turns, and each compares with the token the one before it committed. Then a read of the
/// row says whether the token passed: your statement runs and the transaction commits only
/// then; a stale token rolls it back.
///
/// Two ways to guard a write:
///
/// - [`MySqlFenceOn::execute`] (or [`Fence::fenced_write`] with a [`MySqlWrite`], what
///   `guard.fenced(&fence.on(&pool))` uses): a transaction on a session of your
///   `mysql_async::Pool`, the advance, your statement, the commit.
/// - In your own transaction, with any client: run [`advance_sql`](Self::advance_sql) and then
///   [`token_sql`](Self::token_sql); go on and commit only when the token read back is yours.
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager, pool: zklock_core::mysql_async::Pool) -> Result<(), Box<dyn std::error::Error>> {
/// use zklock_core::fence::{MySqlFence, MySqlWrite};
///
/// let fence = MySqlFence::new("zklock_fence_tokens")?;
/// fence.create_table(&pool).await?;
/// let guard = manager.lock("sku_7").await?;
/// let outcome = guard
///     .fenced(&fence.on(&pool))
///     .write(MySqlWrite::new("UPDATE stock SET units = ? WHERE sku = ?").bind(41i64).bind("sku_7"))
///     .await?;
/// assert_eq!(outcome.accepted(), Some(1)); // one row updated
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MySqlFence {
    table: String,
}

/// A [`MySqlFence`] with a pool: what fenced writes run on.
#[derive(Debug)]
pub struct MySqlFenceOn<'a> {
    fence: &'a MySqlFence,
    pool: &'a mysql_async::Pool,
}

/// Your statement and its parameters (`?`), for [`Fence::fenced_write`] on MySQL.
///
/// ```
/// let write = zklock_core::fence::MySqlWrite::new("INSERT INTO orders (id, sku) VALUES (?, ?)")
///     .bind("order-9")
///     .bind("sku_7");
/// # let _ = write;
/// ```
#[derive(Debug, Clone)]
pub struct MySqlWrite {
    sql: String,
    params: Vec<mysql_async::Value>,
}

impl MySqlWrite {
    /// A statement without parameters yet.
    ///
    /// ```
    /// let w = zklock_core::fence::MySqlWrite::new("DELETE FROM carts WHERE expired");
    /// # let _ = w;
    /// ```
    pub fn new(sql: impl Into<String>) -> MySqlWrite {
        MySqlWrite {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    /// Binds the next `?`.
    ///
    /// ```
    /// let w = zklock_core::fence::MySqlWrite::new("UPDATE t SET v = ? WHERE id = ?").bind(5i32).bind(1u64);
    /// # let _ = w;
    /// ```
    pub fn bind(mut self, value: impl Into<mysql_async::Value>) -> MySqlWrite {
        self.params.push(value.into());
        self
    }
}

impl MySqlFence {
    /// A fence whose tokens live in `table` (a name, or `database.name`, of letters, digits
    /// and `_`).
    ///
    /// # Errors
    /// [`FenceError::Invalid`] when `table` is no plain SQL identifier.
    ///
    /// ```
    /// use zklock_core::fence::MySqlFence;
    /// assert!(MySqlFence::new("billing.fence_tokens").is_ok());
    /// assert!(MySqlFence::new("tokens; DROP TABLE users").is_err());
    /// ```
    pub fn new(table: &str) -> Result<MySqlFence, FenceError> {
        super::check_table_name(table, 64, "database.table")?;
        Ok(MySqlFence {
            table: table.to_string(),
        })
    }

    /// The token table's name.
    ///
    /// ```
    /// assert_eq!(zklock_core::fence::MySqlFence::default().table(), "zklock_fence_tokens");
    /// ```
    pub fn table(&self) -> &str {
        &self.table
    }

    /// `CREATE TABLE IF NOT EXISTS` of the token table, for your migrations.
    ///
    /// ```
    /// let sql = zklock_core::fence::MySqlFence::default().create_table_sql();
    /// assert!(sql.starts_with("CREATE TABLE IF NOT EXISTS zklock_fence_tokens"));
    /// ```
    pub fn create_table_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\
             resource VARCHAR(255) NOT NULL PRIMARY KEY, \
             token VARBINARY(12) NOT NULL) ENGINE=InnoDB",
            self.table
        )
    }

    /// Creates the token table if it does not exist.
    ///
    /// # Errors
    /// [`FenceError::MySql`] when the server refuses (no right to create it, ...).
    ///
    /// ```no_run
    /// # async fn run(pool: zklock_core::mysql_async::Pool) -> Result<(), zklock_core::fence::FenceError> {
    /// zklock_core::fence::MySqlFence::default().create_table(&pool).await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_table(&self, pool: &mysql_async::Pool) -> Result<(), FenceError> {
        let mut conn = pool.get_conn().await?;
        conn.query_drop(self.create_table_sql()).await?;
        Ok(())
    }

    /// The statement that advances the token of a resource, in your transaction: parameters
    /// the resource, then the token as [`FencingToken::to_sortable_bytes`]. It locks the row
    /// until the transaction ends; [`token_sql`](Self::token_sql) then says whether the token
    /// passed.
    ///
    /// ```
    /// let sql = zklock_core::fence::MySqlFence::default().advance_sql();
    /// assert!(sql.contains("ON DUPLICATE KEY UPDATE"));
    /// ```
    pub fn advance_sql(&self) -> String {
        format!(
            "INSERT INTO {t} (resource, token) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE token = IF(token <= VALUES(token), VALUES(token), token)",
            t = self.table
        )
    }

    /// The statement that reads a resource's token (parameter: the resource): after
    /// [`advance_sql`](Self::advance_sql) in the same transaction, your token when it passed,
    /// a newer one when it was stale.
    ///
    /// ```
    /// let sql = zklock_core::fence::MySqlFence::default().token_sql();
    /// assert!(sql.starts_with("SELECT token FROM zklock_fence_tokens"));
    /// ```
    pub fn token_sql(&self) -> String {
        format!("SELECT token FROM {} WHERE resource = ?", self.table)
    }

    /// The fence with `pool`, for fenced writes.
    ///
    /// ```no_run
    /// # fn run(pool: zklock_core::mysql_async::Pool) {
    /// let fence = zklock_core::fence::MySqlFence::default();
    /// let on = fence.on(&pool);
    /// # let _ = on; }
    /// ```
    pub fn on<'a>(&'a self, pool: &'a mysql_async::Pool) -> MySqlFenceOn<'a> {
        MySqlFenceOn { fence: self, pool }
    }
}

impl Default for MySqlFence {
    /// The fence on the table `zklock_fence_tokens`.
    fn default() -> Self {
        MySqlFence {
            table: DEFAULT_TABLE.to_string(),
        }
    }
}

impl MySqlFenceOn<'_> {
    /// Runs `write` if `token` is not older than the last token of `resource`, in one
    /// transaction with the token's advance: [`Outcome::Accepted`] with the rows your
    /// statement changed, or [`Outcome::Stale`] with the newer token (nothing written).
    ///
    /// # Errors
    /// [`FenceError::MySql`] when the server fails (the transaction is then rolled back);
    /// [`FenceError::Invalid`] or [`FenceError::NoToken`] for a refused argument.
    ///
    /// ```no_run
    /// # async fn run(pool: zklock_core::mysql_async::Pool, token: zklock_core::FencingToken) -> Result<(), zklock_core::fence::FenceError> {
    /// use zklock_core::fence::{MySqlFence, MySqlWrite};
    ///
    /// let fence = MySqlFence::default();
    /// let write = MySqlWrite::new("UPDATE stock SET units = units - 1 WHERE sku = ?").bind("sku_7");
    /// let outcome = fence.on(&pool).execute("/zklock/locks/sku_7", token, write).await?;
    /// # let _ = outcome; Ok(()) }
    /// ```
    pub async fn execute(
        &self,
        resource: &str,
        token: FencingToken,
        write: MySqlWrite,
    ) -> Result<Outcome<u64>, FenceError> {
        check_write(resource, token)?;
        let mut conn = self.pool.get_conn().await?;
        let mut tx = conn
            .start_transaction(mysql_async::TxOpts::default())
            .await?;
        let mine = token.to_sortable_bytes().to_vec();
        tx.exec_drop(self.fence.advance_sql(), (resource, mine.clone()))
            .await?;
        let now: Option<Vec<u8>> = tx.exec_first(self.fence.token_sql(), (resource,)).await?;
        let now = now.unwrap_or_default();
        if now != mine {
            tx.rollback().await?;
            return Ok(Outcome::Stale {
                last: FencingToken::from_sortable_bytes(&now)?,
            });
        }
        let params = if write.params.is_empty() {
            mysql_async::Params::Empty
        } else {
            mysql_async::Params::Positional(write.params)
        };
        tx.exec_drop(write.sql, params).await?;
        let rows = tx.affected_rows();
        tx.commit().await?;
        Ok(Outcome::Accepted(rows))
    }

    async fn last(&self, resource: &str) -> Result<Option<FencingToken>, FenceError> {
        let mut conn = self.pool.get_conn().await?;
        let token: Option<Vec<u8>> = conn.exec_first(self.fence.token_sql(), (resource,)).await?;
        token
            .map(|t| FencingToken::from_sortable_bytes(&t))
            .transpose()
    }
}

impl Fence for MySqlFenceOn<'_> {
    type Write = MySqlWrite;
    type Applied = u64;

    fn fenced_write(
        &self,
        resource: &str,
        token: FencingToken,
        write: MySqlWrite,
    ) -> impl Future<Output = Result<Outcome<u64>, FenceError>> + Send {
        self.execute(resource, token, write)
    }

    fn last_token(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<FencingToken>, FenceError>> + Send {
        self.last(resource)
    }
}
