//! The schema and the statements of the PostgreSQL backend. Each step of the protocol is one
//! statement, so one round trip, and each statement's order of effects is forced by
//! `MATERIALIZED` CTEs that read each other (not left to the planner).
//!
//! ## The key table
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS zklock_keys (
//!     id        serial PRIMARY KEY,     -- the advisory lock's object id
//!     path      text NOT NULL UNIQUE,   -- the lock path (namespace + encoded key)
//!     fence     bigint NOT NULL DEFAULT 0,  -- the last fencing token handed out
//!     run_after timestamptz             -- a job's at_least window (claim_run)
//! );
//! ```
//!
//! A lock path gets a row, and so an id, on first use; rows are never deleted, so a path keeps
//! its id. Ids come from a sequence: two paths never share one (no hash, no collision). The
//! lock is the two-key advisory lock `(LOCK_CLASS, id)`: the two-key form lives in a space of
//! its own (`pg_locks.objsubid = 2`), apart from the one-`bigint` form that most other tools
//! use (migrations, job queues), and the class keeps it apart from other users of the two-key
//! form. Every acquire checks, under the lock and in the same statement, that the row of its
//! id still names its path: an id cached before someone dropped and re-created the table is
//! noticed and looked up again, never trusted.
//!
//! ## Tokens
//!
//! The fencing token is the row's `fence`, raised under the lock by the acquire itself to
//! `max(fence + 1, server time in µs)`: committed before the grant is reported, and so durable
//! as the server's commits are (`synchronous_commit`). The floor at the server's clock keeps
//! tokens above every earlier one even if the table is ever dropped and re-created.

/// The class (first key) of every advisory lock zklock takes: `zkLK` in ASCII.
pub(crate) const LOCK_CLASS: i32 = 0x7A6B_4C4B;
/// The class of a waiting writer's intent (`zkIN`): held while a writer waits, so that new
/// readers queue behind it.
#[allow(dead_code)] // the statements spell it as a literal; the tests check it
pub(crate) const INTENT_CLASS: i32 = 0x7A6B_494E;
/// The channel every release notifies, with the lock id as payload.
pub(crate) const CHANNEL: &str = "zklock_release";

/// Creates the key table, once, even when many processes start at the same moment: `CREATE
/// TABLE IF NOT EXISTS` alone can fail in a race on the catalog's unique index, so creators
/// take turns on a transaction-level advisory lock (object id 0: no lock path has it).
pub(crate) const CREATE_SCHEMA: &str = "BEGIN;
SELECT pg_advisory_xact_lock(2053852235, 0);
CREATE TABLE IF NOT EXISTS zklock_keys (
    id serial PRIMARY KEY,
    path text NOT NULL UNIQUE,
    fence bigint NOT NULL DEFAULT 0,
    run_after timestamptz
);
COMMIT;";

/// Whether the key table is there (no lock, no write: a role that may not create it can still
/// use one an administrator made).
pub(crate) const SCHEMA_EXISTS: &str = "SELECT to_regclass('zklock_keys') IS NOT NULL";

/// `$1` path -> id, if it has one.
pub(crate) const FIND_ID: &str = "SELECT id FROM zklock_keys WHERE path = $1";

/// Gives `$1` path an id (a row) unless it has one.
pub(crate) const ADD_PATH: &str =
    "INSERT INTO zklock_keys (path) VALUES ($1) ON CONFLICT (path) DO NOTHING";

/// The token raised under the lock; see the module's docs.
macro_rules! raise_fence {
    () => {
        "UPDATE zklock_keys k SET fence = GREATEST(k.fence + 1, \
         (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) \
         FROM l WHERE l.got AND k.id = $1 AND k.path = $2 RETURNING k.fence"
    };
}

/// A mutex's or a writer's attempt, `$1` id, `$2` path: `(got, fence)`. `got` without a fence:
/// the lock is held but the row no longer names the path (unlock and look the id up again).
pub(crate) const TRY_EXCLUSIVE: &str = concat!(
    "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock(2053852235, $1) AS got), u AS (",
    raise_fence!(),
    ") SELECT l.got, (SELECT u.fence FROM u) FROM l"
);

/// A reader's attempt: as [`TRY_EXCLUSIVE`], but shared, and only while no writer waits (a
/// writer's intent, `(INTENT_CLASS, id)`, refuses the reader's shared check).
pub(crate) const TRY_SHARED: &str = concat!(
    "WITH i AS MATERIALIZED (SELECT pg_try_advisory_xact_lock_shared(2053851470, $1) AS free), ",
    "l AS MATERIALIZED (SELECT CASE WHEN i.free THEN pg_try_advisory_lock_shared(2053852235, $1) \
     ELSE false END AS got FROM i), u AS (",
    raise_fence!(),
    ") SELECT l.got, (SELECT u.fence FROM u) FROM l"
);

/// A waiting writer's intent: `true` when this session took it (one writer's is enough).
pub(crate) const TAKE_INTENT: &str = "SELECT pg_try_advisory_lock(2053851470, $1)";

/// Releases an exclusive hold (`$1` id) and wakes waiters: `true` when it was held.
pub(crate) const RELEASE_EXCLUSIVE: &str =
    "SELECT pg_advisory_unlock(2053852235, $1), pg_notify('zklock_release', $1::text)";

/// Releases a shared hold and wakes waiters.
pub(crate) const RELEASE_SHARED: &str =
    "SELECT pg_advisory_unlock_shared(2053852235, $1), pg_notify('zklock_release', $1::text)";

/// Undoes whatever an acquire that ended without a hold may have left on its connection: the
/// lock (`$2`: shared), the intent (`$3`), and wakes waiters (readers held back by the intent).
/// Unlocking what is not held only draws a warning from the server.
pub(crate) const UNDO: &str = "SELECT \
     CASE WHEN $2 THEN pg_advisory_unlock_shared(2053852235, $1) \
     ELSE pg_advisory_unlock(2053852235, $1) END, \
     CASE WHEN $3 THEN pg_advisory_unlock(2053851470, $1) END, \
     pg_notify('zklock_release', $1::text)";

/// Drops a granted writer's intent (`$1` id).
pub(crate) const DROP_INTENT: &str = "SELECT pg_advisory_unlock(2053851470, $1)";

/// Turns the exclusive hold of `$1` into a shared one on the same session (it cannot block:
/// the session holds the lock) and lets waiting readers know. `true` when it was held.
pub(crate) const DOWNGRADE: &str = "WITH s AS MATERIALIZED \
     (SELECT pg_try_advisory_lock_shared(2053852235, $1) AS got) \
     SELECT CASE WHEN s.got THEN pg_advisory_unlock(2053852235, $1) ELSE false END, \
     pg_notify('zklock_release', $1::text) FROM s";

/// The liveness check of a holding connection: the session answers.
pub(crate) const PING: &str = "SELECT 1";

/// Whether a job's `at_least` window (`$1` id, `$2` path) no longer covers now; `NULL` (no
/// row) when the row no longer names the path.
pub(crate) const RUN_DUE: &str = "SELECT run_after IS NULL OR run_after <= clock_timestamp() \
     FROM zklock_keys WHERE id = $1 AND path = $2";

/// Records that no run of the job may start before now + `$3` ms.
pub(crate) const RECORD_RUN: &str =
    "UPDATE zklock_keys SET run_after = clock_timestamp() + $3::bigint * interval '1 millisecond' \
     WHERE id = $1 AND path = $2";

#[cfg(test)]
mod tests {
    use super::*;

    /// The literals in the statements are the classes' values.
    #[test]
    fn classes_match_the_literals() {
        assert_eq!(LOCK_CLASS, 2053852235);
        assert_eq!(INTENT_CLASS, 2053851470);
        assert!(CREATE_SCHEMA.contains(&LOCK_CLASS.to_string()));
        for s in [
            TRY_EXCLUSIVE,
            TRY_SHARED,
            RELEASE_EXCLUSIVE,
            DOWNGRADE,
            UNDO,
        ] {
            assert!(s.contains(&LOCK_CLASS.to_string()), "{s}");
            assert!(s.contains(CHANNEL) || !s.contains("pg_notify"), "{s}");
        }
        for s in [TRY_SHARED, TAKE_INTENT, DROP_INTENT, UNDO] {
            assert!(s.contains(&INTENT_CLASS.to_string()), "{s}");
        }
    }
}
