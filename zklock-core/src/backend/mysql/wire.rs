//! The protocol as the server sees it: the lock names `GET_LOCK` takes, zklock's one table and
//! the statements on it.
//!
//! A lock is the user lock (`GET_LOCK`) of its [`name`]: at most 64 characters, the server's
//! limit, made of the lock path's last characters kept readable and a hash of the whole path,
//! so that no two paths share a name. Another client that runs `SELECT GET_LOCK('<name>', …)`
//! on that name excludes zklock's holders, and is excluded by them.
//!
//! The table `zklock_locks` keeps, per lock name, its path, its fencing token (raised at every
//! grant, under the lock, to at least the server's clock in microseconds: a token survives a
//! crash that lost the last commits), who holds it since when (for inspection), and a job's
//! `at_least` window.

use crate::types::error::{Error, Result};

/// The server's longest user-lock name.
pub(super) const MAX_NAME: usize = 64;
/// What every lock name starts with.
const NAME_PREFIX: &str = "zklock:";
/// Hex digits of the path's hash in a name: 96 bits.
const HASH_HEX: usize = 24;

/// The user-lock name of the lock at `path`: `zklock:<readable tail of the path>:<hash>`.
/// Characters of the path other than letters, digits and `_ - . /` show as `_` in the readable
/// part (the hash is of the path itself).
///
/// ```text
/// /zklock/locks/orders/42  ->  zklock:locks/orders/42:<24 hex digits>
/// ```
pub(crate) fn name(path: &str) -> String {
    let digest = sha1_smol::Sha1::from(path).digest().to_string();
    let room = MAX_NAME - NAME_PREFIX.len() - 1 - HASH_HEX;
    let readable: Vec<char> = path
        .trim_start_matches('/')
        .trim_start_matches("zklock/")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let tail: String = readable[readable.len().saturating_sub(room)..]
        .iter()
        .collect();
    format!("{NAME_PREFIX}{tail}:{}", &digest[..HASH_HEX])
}

/// The server's clock, in microseconds since the epoch.
const NOW_US: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)";

/// The table, made at connect unless it exists.
pub(super) const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS zklock_locks (
    name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    path VARCHAR(1024) NOT NULL,
    fence BIGINT NOT NULL DEFAULT 0,
    holder VARCHAR(512) NOT NULL DEFAULT '',
    since_us BIGINT NOT NULL DEFAULT 0,
    run_until_us BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB";

/// Whether the table is there, for a role that may not create it.
pub(super) const TABLE_EXISTS: &str = "SELECT COUNT(*) FROM information_schema.TABLES \
     WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'zklock_locks'";

/// Whether the server takes writes: a replica (`read_only`) is refused.
pub(super) const READ_ONLY: &str = "SELECT @@global.read_only";

/// The grant's token, written under the lock (params: name, path, holder): the row's fence
/// raised by one, to at least the server's clock in µs; read back as `LAST_INSERT_ID()`.
pub(super) fn raise_fence() -> String {
    format!(
        "INSERT INTO zklock_locks (name, path, fence, holder, since_us) \
         VALUES (?, ?, LAST_INSERT_ID(GREATEST(1, {NOW_US})), ?, {NOW_US}) \
         ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(GREATEST(fence + 1, {NOW_US})), \
         path = VALUES(path), holder = VALUES(holder), since_us = VALUES(since_us)"
    )
}

/// A job's window (params: name): the end of the last run's `at_least` window and the
/// server's clock, both in µs.
pub(super) fn run_window() -> String {
    format!("SELECT COALESCE(MAX(run_until_us), 0), {NOW_US} FROM zklock_locks WHERE name = ?")
}

/// Records a run's window (params: name, path, its end in µs).
pub(super) const RECORD_RUN: &str = "INSERT INTO zklock_locks (name, path, run_until_us) \
     VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE run_until_us = VALUES(run_until_us)";

/// The lock rows under a namespace (param: the path prefix, as a `LIKE` pattern).
pub(super) const ROWS_UNDER: &str = "SELECT name, path, fence, holder, since_us FROM zklock_locks \
     WHERE path LIKE ? ORDER BY path";

/// One lock's row (param: name).
pub(super) const ROW: &str = "SELECT fence, holder, since_us FROM zklock_locks WHERE name = ?";

/// A `GET_LOCK` of `name`, as text, with who asks (`zklock host=… pid=…`) in a comment: a name
/// is made of characters that need no quoting (see [`name`]), and the text shows in the
/// process list, which is what inspection reads waiters, and who they are, from.
pub(super) fn get_lock(name: &str, seconds: u64, who: &str) -> String {
    let who = who.replace("*/", "* /");
    format!("SELECT GET_LOCK('{name}', {seconds}) /* {who} */")
}

/// Who asked, from a `GET_LOCK`'s text in the process list (see [`get_lock`]).
pub(super) fn who_asked(info: &str) -> &str {
    info.split_once("/* ")
        .and_then(|(_, rest)| rest.rsplit_once(" */"))
        .map_or("", |(who, _)| who)
}

/// The `RELEASE_LOCK` of `name`: 1 released, 0 held by another session, NULL held by none.
pub(super) fn release_lock(name: &str) -> String {
    format!("SELECT RELEASE_LOCK('{name}')")
}

/// The session that holds `name`, if any.
pub(super) fn is_used_lock(name: &str) -> String {
    format!("SELECT IS_USED_LOCK('{name}')")
}

/// The sessions waiting in `GET_LOCK` for `name`, first come first, with how long they wait
/// (seconds) and their statement: from the process list (all sessions with the `PROCESS`
/// privilege, else the account's own).
pub(super) fn waiters(name: &str) -> String {
    format!(
        "SELECT ID, TIME, INFO FROM information_schema.PROCESSLIST \
         WHERE COMMAND = 'Query' AND INFO LIKE 'SELECT GET_LOCK(''{name}'',%' \
         ORDER BY TIME DESC, ID"
    )
}

/// What an administrator runs once where the account zklock uses may not create tables: the
/// table, and (with `grant_to`, an account as `'user'@'host'`) exactly the rights zklock uses
/// on it. `PROCESS` (to see other accounts' waiters in `zklock status`) is left to the
/// administrator: zklock works without it.
pub(crate) fn setup_sql(grant_to: Option<&str>) -> Result<String> {
    let mut sql = format!("{CREATE_TABLE};");
    if let Some(account) = grant_to {
        if account.contains(['\0', ';', '`']) {
            return Err(Error::InvalidArgument(format!(
                "{account:?} is not an account name; write it as 'user'@'host'"
            )));
        }
        sql.push_str(&format!(
            "\nGRANT SELECT, INSERT, UPDATE ON zklock_locks TO {account};"
        ));
    }
    sql.push('\n');
    Ok(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_the_server_and_keep_the_path_readable() {
        let n = name("/zklock/locks/orders/42");
        assert!(n.starts_with("zklock:locks/orders/42:"), "{n}");
        assert_eq!(n.len(), "zklock:locks/orders/42:".len() + HASH_HEX);
        let long = format!("/zklock/locks/{}", "x".repeat(500));
        assert_eq!(name(&long).len(), MAX_NAME);
        let asked = get_lock(&n, 30, "zklock host=h pid=1 id=a*/b");
        assert_eq!(who_asked(&asked), "zklock host=h pid=1 id=a* /b");
        // Quotes and other characters never reach the SQL text.
        let odd = name("/zklock/locks/it's 'quoted'");
        assert!(!odd.contains('\''), "{odd}");
        // Paths that read alike still differ by their hash.
        assert_ne!(name("/zklock/locks/a b"), name("/zklock/locks/a_b"));
        assert_ne!(name(&long), name(&format!("{long}y")));
    }
}
