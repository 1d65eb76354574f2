//! The fence on PostgreSQL: a token table, and your statement guarded by it in the same
//! statement or the same transaction.

use std::future::Future;

use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

use super::error::FenceError;
use super::{check_write, Fence, Outcome};
use crate::types::token::FencingToken;

/// The condition your guarded statement must contain: true when the fence accepted the token
/// (the name `zklock_fence` is the guard's common table expression).
///
/// ```
/// assert_eq!(zklock_core::fence::ACCEPTED, "EXISTS (SELECT 1 FROM zklock_fence)");
/// ```
pub const ACCEPTED: &str = "EXISTS (SELECT 1 FROM zklock_fence)";

/// The default name of the token table.
pub(crate) const DEFAULT_TABLE: &str = "zklock_fence_tokens";

/// Fencing on PostgreSQL: a table of last accepted tokens, one row per resource, and writes
/// guarded by it.
///
/// The table (made by [`create_table`](Self::create_table)) is
/// `(resource text PRIMARY KEY, token bytea NOT NULL)`, the token in
/// [`FencingToken::to_sortable_bytes`]'s 12 bytes, which `bytea` compares in the token's
/// order. Advancing a row is one `INSERT .. ON CONFLICT (resource) DO UPDATE .. WHERE
/// token <= new`: it locks the row, so concurrent writers of one resource take turns, and each
/// compares with the token the one before it committed.
///
/// Three ways to guard a write:
///
/// - One statement, through tokio-postgres: [`PgFenceOn::execute`] (or [`Fence::fenced_write`]
///   with a [`PgWrite`], what `guard.fenced(&fence.on(&client))` uses). Your statement
///   contains [`ACCEPTED`] in its `WHERE`, and the guard is put in front of it as a common
///   table expression, so the check, the token and your write commit together.
/// - In your own transaction: [`PgFenceOn::advance`] first, then your statements, then
///   commit. The token row stays locked until the transaction ends.
/// - With another client (sqlx, diesel, ...): [`guarded_sql`](Self::guarded_sql) gives the
///   statement text; bind the resource and [`FencingToken::to_sortable_bytes`] after your own
///   parameters.
///
/// ```no_run
/// # async fn run(manager: zklock_core::LockManager, client: zklock_core::tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use zklock_core::fence::{PgFence, PgWrite, ACCEPTED};
///
/// let fence = PgFence::new("zklock_fence_tokens")?;
/// fence.create_table(&client).await?;
/// let guard = manager.lock("sku_7").await?;
/// let outcome = guard
///     .fenced(&fence.on(&client))
///     .write(
///         PgWrite::new(format!("UPDATE stock SET units = $1 WHERE sku = $2 AND {ACCEPTED}"))
///             .bind(41i64)
///             .bind("sku_7"),
///     )
///     .await?;
/// assert_eq!(outcome.accepted(), Some(1)); // one row updated
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgFence {
    table: String,
}

/// A [`PgFence`] with a client (a `Client` or a `Transaction`): what fenced writes run on.
#[derive(Debug)]
pub struct PgFenceOn<'a, C> {
    fence: &'a PgFence,
    client: &'a C,
}

/// Your statement and its parameters, for [`Fence::fenced_write`] on PostgreSQL. The statement
/// must contain [`ACCEPTED`]; its parameters are `$1 ..`, and the fence's two come after them.
///
/// ```
/// use zklock_core::fence::{PgWrite, ACCEPTED};
///
/// let write = PgWrite::new(format!(
///     "INSERT INTO orders (id, sku) SELECT $1, $2 WHERE {ACCEPTED}"
/// ))
/// .bind("order-9")
/// .bind("sku_7");
/// # let _ = write;
/// ```
#[derive(Debug)]
pub struct PgWrite {
    sql: String,
    params: Vec<Box<dyn ToSql + Send + Sync>>,
}

impl PgWrite {
    /// A statement without parameters yet.
    ///
    /// ```
    /// let w = zklock_core::fence::PgWrite::new("DELETE FROM carts WHERE EXISTS (SELECT 1 FROM zklock_fence)");
    /// # let _ = w;
    /// ```
    pub fn new(sql: impl Into<String>) -> PgWrite {
        PgWrite {
            sql: sql.into(),
            params: Vec::new(),
        }
    }

    /// Binds the next parameter (`$1`, then `$2`, ...).
    ///
    /// ```
    /// let w = zklock_core::fence::PgWrite::new("UPDATE t SET v = $1 WHERE EXISTS (SELECT 1 FROM zklock_fence)").bind(5i32);
    /// # let _ = w;
    /// ```
    pub fn bind(mut self, value: impl ToSql + Send + Sync + 'static) -> PgWrite {
        self.params.push(Box::new(value));
        self
    }
}

impl PgFence {
    /// A fence whose tokens live in `table` (a name, or `schema.name`, of letters, digits and
    /// `_`; unquoted, so PostgreSQL folds it to lower case).
    ///
    /// # Errors
    /// [`FenceError::Invalid`] when `table` is no plain SQL identifier.
    ///
    /// ```
    /// use zklock_core::fence::PgFence;
    /// assert!(PgFence::new("billing.fence_tokens").is_ok());
    /// assert!(PgFence::new("tokens; DROP TABLE users").is_err());
    /// ```
    pub fn new(table: &str) -> Result<PgFence, FenceError> {
        super::check_table_name(table, 63, "schema.table")?;
        Ok(PgFence {
            table: table.to_string(),
        })
    }

    /// The token table's name.
    ///
    /// ```
    /// assert_eq!(zklock_core::fence::PgFence::default().table(), "zklock_fence_tokens");
    /// ```
    pub fn table(&self) -> &str {
        &self.table
    }

    /// `CREATE TABLE IF NOT EXISTS` of the token table, for your migrations.
    ///
    /// ```
    /// let sql = zklock_core::fence::PgFence::default().create_table_sql();
    /// assert!(sql.starts_with("CREATE TABLE IF NOT EXISTS zklock_fence_tokens"));
    /// ```
    pub fn create_table_sql(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\
             resource text PRIMARY KEY, \
             token bytea NOT NULL CHECK (octet_length(token) = 12))",
            self.table
        )
    }

    /// Creates the token table if it does not exist.
    ///
    /// # Errors
    /// [`FenceError::Postgres`] when PostgreSQL refuses (no right to create it, ...).
    ///
    /// ```no_run
    /// # async fn run(client: zklock_core::tokio_postgres::Client) -> Result<(), zklock_core::fence::FenceError> {
    /// zklock_core::fence::PgFence::default().create_table(&client).await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_table<C: GenericClient + Sync>(
        &self,
        client: &C,
    ) -> Result<(), FenceError> {
        client.execute(&self.create_table_sql(), &[]).await?;
        Ok(())
    }

    /// The fence with `client` (a `Client` or a `Transaction`), for fenced writes.
    ///
    /// ```no_run
    /// # async fn run(client: zklock_core::tokio_postgres::Client) {
    /// let fence = zklock_core::fence::PgFence::default();
    /// let on = fence.on(&client);
    /// # let _ = on; }
    /// ```
    pub fn on<'a, C: GenericClient + Sync>(&'a self, client: &'a C) -> PgFenceOn<'a, C> {
        PgFenceOn {
            fence: self,
            client,
        }
    }

    /// The statement that advances the token of a resource: parameters `$1` the resource
    /// (`text`), `$2` the token ([`FencingToken::to_sortable_bytes`], `bytea`). It returns one
    /// row when the token was accepted (and locks the row until the transaction ends), none
    /// when a newer token is there. Run it first in your transaction with any client, and
    /// roll back when it returns no row.
    ///
    /// ```
    /// let sql = zklock_core::fence::PgFence::default().advance_sql();
    /// assert!(sql.contains("ON CONFLICT (resource) DO UPDATE"));
    /// ```
    pub fn advance_sql(&self) -> String {
        self.advance_at(1)
    }

    fn advance_at(&self, first: usize) -> String {
        format!(
            "INSERT INTO {t} AS zklock_last (resource, token) VALUES (${r}, ${k}) \
             ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token \
             WHERE zklock_last.token <= EXCLUDED.token RETURNING 1",
            t = self.table,
            r = first,
            k = first + 1,
        )
    }

    /// Your statement `write` guarded by the fence, as one statement for any client (sqlx,
    /// diesel, tokio-postgres). `write` uses parameters `$1 ..= $params` and contains
    /// [`ACCEPTED`] in its `WHERE`; the guard's parameters come after yours: `$params+1` the
    /// resource (`text`), `$params+2` the token as [`FencingToken::to_sortable_bytes`]
    /// (`bytea`). The statement's row count is your statement's: 0 when the token was stale
    /// (or when your `WHERE` matched nothing). A statement that starts with `WITH` gets the
    /// guard as its first common table expression, so the later ones can use it too.
    ///
    /// # Errors
    /// [`FenceError::Invalid`] when `write` does not contain [`ACCEPTED`] (it would then write
    /// whatever the token).
    ///
    /// With sqlx (which zklock does not depend on) the text goes to `sqlx::query` as is:
    ///
    /// ```
    /// use zklock_core::fence::{PgFence, ACCEPTED};
    /// use zklock_core::FencingToken;
    ///
    /// let fence = PgFence::default();
    /// let sql = fence.guarded_sql(
    ///     &format!("UPDATE stock SET units = $1 WHERE sku = $2 AND {ACCEPTED}"),
    ///     2,
    /// )?;
    /// assert!(sql.starts_with("WITH zklock_fence AS (INSERT INTO zklock_fence_tokens"));
    /// assert!(sql.contains("VALUES ($3, $4)"));
    /// let token = FencingToken::new(4294967301, 0);
    /// let token_param: Vec<u8> = token.to_sortable_bytes().to_vec();
    /// // sqlx::query(&sql).bind(41i64).bind("sku_7").bind("sku_7").bind(token_param)
    /// //     .execute(&pool).await?.rows_affected() == 1   when accepted
    /// # let _ = token_param;
    ///
    /// // A statement with CTEs of its own: the guard comes first, all of them may use it.
    /// let both = fence.guarded_sql(
    ///     &format!("WITH sold AS (UPDATE stock SET units = units - 1 WHERE sku = $1 AND {ACCEPTED} RETURNING sku) \
    ///               INSERT INTO orders (sku) SELECT sku FROM sold"),
    ///     1,
    /// )?;
    /// assert!(both.starts_with("WITH zklock_fence AS (INSERT"));
    /// assert!(both.contains("RETURNING 1), sold AS (UPDATE stock"));
    /// # Ok::<(), zklock_core::fence::FenceError>(())
    /// ```
    pub fn guarded_sql(&self, write: &str, params: usize) -> Result<String, FenceError> {
        if !write.contains("zklock_fence") {
            return Err(FenceError::Invalid(format!(
                "the fenced statement does not use the guard; put `{ACCEPTED}` in its WHERE (else it writes whatever the token): {write}"
            )));
        }
        let guard = format!("zklock_fence AS ({})", self.advance_at(params + 1));
        // A statement with common table expressions of its own gets the guard as the first.
        let trimmed = write.trim_start();
        if let Some(rest) = strip_word(trimmed, "WITH") {
            if let Some(rest) = strip_word(rest, "RECURSIVE") {
                return Ok(format!("WITH RECURSIVE {guard}, {rest}"));
            }
            return Ok(format!("WITH {guard}, {rest}"));
        }
        Ok(format!("WITH {guard} {write}"))
    }
}

/// `text` without its leading keyword `word` (any case) and the blanks after it.
fn strip_word<'t>(text: &'t str, word: &str) -> Option<&'t str> {
    let head = text.get(..word.len())?;
    let rest = &text[word.len()..];
    (head.eq_ignore_ascii_case(word) && rest.starts_with(char::is_whitespace))
        .then(|| rest.trim_start())
}

impl Default for PgFence {
    /// The fence on the table `zklock_fence_tokens`.
    fn default() -> Self {
        PgFence {
            table: DEFAULT_TABLE.to_string(),
        }
    }
}

impl<C: GenericClient + Sync> PgFenceOn<'_, C> {
    /// Advances the token of `resource` in the client's transaction: [`Outcome::Accepted`]
    /// when `token` is not older than the last one (the row then stays locked until the
    /// transaction ends: write, then commit), [`Outcome::Stale`] otherwise (roll back).
    /// On a plain `Client` (no transaction) it only records the token.
    ///
    /// # Errors
    /// [`FenceError::Postgres`].
    ///
    /// ```no_run
    /// # async fn run(mut client: zklock_core::tokio_postgres::Client, token: zklock_core::FencingToken) -> Result<(), zklock_core::fence::FenceError> {
    /// use zklock_core::fence::{Outcome, PgFence};
    ///
    /// let fence = PgFence::default();
    /// let tx = client.transaction().await?;
    /// match fence.on(&tx).advance("/zklock/locks/sku_7", token).await? {
    ///     Outcome::Accepted(()) => {
    ///         tx.execute("UPDATE stock SET units = units - 1 WHERE sku = 'sku_7'", &[]).await?;
    ///         tx.commit().await?;
    ///     }
    ///     Outcome::Stale { .. } => tx.rollback().await?,
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn advance(
        &self,
        resource: &str,
        token: FencingToken,
    ) -> Result<Outcome, FenceError> {
        check_write(resource, token)?;
        let bytes = token.to_sortable_bytes().to_vec();
        let row = self
            .client
            .query_opt(&self.fence.advance_sql(), &[&resource, &bytes])
            .await?;
        match row {
            Some(_) => Ok(Outcome::Accepted(())),
            None => self.stale(resource, token).await.map(|o| o.map(|_| ())),
        }
    }

    /// Runs `write` (containing [`ACCEPTED`], parameters `$1 ..` bound from `params`) guarded
    /// by the fence, in one statement: [`Outcome::Accepted`] with the rows your statement
    /// changed, or [`Outcome::Stale`] when nothing was written because a newer token is
    /// recorded for `resource`.
    ///
    /// # Errors
    /// [`FenceError::Invalid`] when `write` does not use the guard; [`FenceError::Postgres`].
    ///
    /// ```no_run
    /// # async fn run(client: zklock_core::tokio_postgres::Client, token: zklock_core::FencingToken) -> Result<(), zklock_core::fence::FenceError> {
    /// use zklock_core::fence::{PgFence, ACCEPTED};
    ///
    /// let fence = PgFence::default();
    /// let outcome = fence
    ///     .on(&client)
    ///     .execute(
    ///         "/zklock/locks/sku_7",
    ///         token,
    ///         &format!("UPDATE stock SET units = $1 WHERE sku = $2 AND {ACCEPTED}"),
    ///         &[&41i64, &"sku_7"],
    ///     )
    ///     .await?;
    /// # let _ = outcome; Ok(()) }
    /// ```
    pub async fn execute(
        &self,
        resource: &str,
        token: FencingToken,
        write: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Outcome<u64>, FenceError> {
        check_write(resource, token)?;
        let sql = self.fence.guarded_sql(write, params.len())?;
        let bytes = token.to_sortable_bytes().to_vec();
        let mut all: Vec<&(dyn ToSql + Sync)> = params.to_vec();
        all.push(&resource);
        all.push(&bytes);
        let rows = self.client.execute(&sql, &all).await?;
        if rows > 0 {
            return Ok(Outcome::Accepted(rows));
        }
        // Nothing written: refused, or your WHERE matched nothing. A newer token recorded
        // now tells the first (or a newer holder came right after: nothing was written
        // either way).
        self.stale(resource, token).await
    }

    /// `Stale` with the recorded token if it is newer than `token`, else `Accepted(0)`.
    async fn stale(&self, resource: &str, token: FencingToken) -> Result<Outcome<u64>, FenceError> {
        match self.last(resource).await? {
            Some(last) if token < last => Ok(Outcome::Stale { last }),
            _ => Ok(Outcome::Accepted(0)),
        }
    }

    /// The last accepted token of `resource`.
    ///
    /// # Errors
    /// [`FenceError::Postgres`]; [`FenceError::Encoding`] when the row holds no token.
    ///
    /// ```no_run
    /// # async fn run(client: zklock_core::tokio_postgres::Client) -> Result<(), zklock_core::fence::FenceError> {
    /// let fence = zklock_core::fence::PgFence::default();
    /// println!("{:?}", fence.on(&client).last("/zklock/locks/sku_7").await?);
    /// # Ok(()) }
    /// ```
    pub async fn last(&self, resource: &str) -> Result<Option<FencingToken>, FenceError> {
        let row = self
            .client
            .query_opt(
                &format!("SELECT token FROM {} WHERE resource = $1", self.fence.table),
                &[&resource],
            )
            .await?;
        match row {
            Some(row) => {
                let bytes: Vec<u8> = row.try_get(0)?;
                Ok(Some(FencingToken::from_sortable_bytes(&bytes)?))
            }
            None => Ok(None),
        }
    }
}

impl<C: GenericClient + Sync> Fence for PgFenceOn<'_, C> {
    type Write = PgWrite;
    /// The rows your statement changed.
    type Applied = u64;

    async fn fenced_write(
        &self,
        resource: &str,
        token: FencingToken,
        write: PgWrite,
    ) -> Result<Outcome<u64>, FenceError> {
        let params: Vec<&(dyn ToSql + Sync)> = write
            .params
            .iter()
            .map(|p| &**p as &(dyn ToSql + Sync))
            .collect();
        self.execute(resource, token, &write.sql, &params).await
    }

    fn last_token(
        &self,
        resource: &str,
    ) -> impl Future<Output = Result<Option<FencingToken>, FenceError>> + Send {
        self.last(resource)
    }
}
