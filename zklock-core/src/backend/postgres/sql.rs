//! The schema and the statements of the PostgreSQL backend. Each step of the protocol is one
//! statement, so one round trip. Where the order of a statement's effects matters (take the
//! lock, then read the row under it; unlock, then look for waiters), the step is a PL/pgSQL
//! function whose statements run in order, each with a snapshot of its own.
//!
//! ## The key table
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS zklock_keys (
//!     id        serial PRIMARY KEY,     -- the advisory lock's object id
//!     path      text NOT NULL UNIQUE,   -- the lock path (namespace + encoded key)
//!     fence     bigint NOT NULL DEFAULT 0,  -- the end of the last block of tokens reserved
//!     run_after timestamptz,            -- a job's at_least window (claim_run)
//!     block     bigint                  -- the tag of the last block reserved
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
//! The fencing token comes from the row's `fence`, under the lock, in blocks of [`BLOCK`]
//! values. An acquire that has no block of its own reserves one: it raises `fence` to
//! `max(fence + 1, server time in µs) + BLOCK - 1` and records the block's random tag in the
//! row, and that commit waits for the WAL flush (`synchronous_commit`) before the grant and its
//! token (the block's first value) are reported, so a token never goes backwards across a
//! server crash. The next acquire of the same process, while the row still carries its block's
//! tag (nobody reserved a block since), takes the block's next value and writes nothing: the
//! row is read under the lock by a statement of its own, so with a snapshot taken after the
//! lock was granted, which sees every block an earlier holder reserved. The backend sends each
//! block's values in order, one attempt at a time (see `Blocks` in the backend), so two grants
//! never share a token and a block's tokens only go up. A process that alternates with another
//! reserves a block at each of its grants: one flush per handoff, as before.
//!
//! The floor at the server's clock keeps tokens above every earlier one even if the table is
//! ever dropped and re-created.
//!
//! ## Waking waiters
//!
//! A release notifies only when someone waits. Each process's listening connection holds the
//! shared lock `(WAIT_CLASS, id)` while any of its tasks waits for `id`, and a release, after
//! its unlock, tries `pg_try_advisory_xact_lock(WAIT_CLASS, id)`: it notifies only if that
//! fails. A waiter has its registration confirmed before its next attempt, so a release that
//! follows that attempt sees it. Locks take no transaction id, so a release with nobody waiting
//! writes no WAL; a notifying release commits asynchronously (a notification is not durable
//! anyway, and a lost one costs a waiter its fallback poll, never a wrong grant).

/// The values a reserved block of tokens spans (spelled as a literal in [`CREATE_SCHEMA`]).
#[allow(dead_code)] // the statements spell it as a literal; the tests check it
pub(crate) const BLOCK: i64 = 1 << 20;

/// The class (first key) of every advisory lock zklock takes: `zkLK` in ASCII.
pub(crate) const LOCK_CLASS: i32 = 0x7A6B_4C4B;
/// The class of a waiting writer's intent (`zkIN`): held while a writer waits, so that new
/// readers queue behind it.
#[allow(dead_code)] // the statements spell it as a literal; the tests check it
pub(crate) const INTENT_CLASS: i32 = 0x7A6B_494E;
/// The class of a waiter's registration (`zkWI`): a shared lock held by the listening
/// connection of each process with a task waiting for the id.
#[allow(dead_code)] // the statements spell it as a literal; the tests check it
pub(crate) const WAIT_CLASS: i32 = 0x7A6B_5749;
/// The channel every release notifies, with the lock id as payload.
pub(crate) const CHANNEL: &str = "zklock_release";

/// Creates the key table and this version's functions, once, even when many processes start at
/// the same moment: `CREATE TABLE IF NOT EXISTS` alone can fail in a race on the catalog's
/// unique index, so creators take turns on a transaction-level advisory lock (object id 0: no
/// lock path has it). A table made by an earlier version gains the `block` column.
pub(crate) const CREATE_SCHEMA: &str = r#"BEGIN;
SELECT pg_advisory_xact_lock(2053852235, 0);
CREATE TABLE IF NOT EXISTS zklock_keys (
    id serial PRIMARY KEY,
    path text NOT NULL UNIQUE,
    fence bigint NOT NULL DEFAULT 0,
    run_after timestamptz,
    block bigint
);
ALTER TABLE zklock_keys ADD COLUMN IF NOT EXISTS block bigint;
CREATE OR REPLACE FUNCTION zklock_try_v2(lock_id integer, lock_path text, shared boolean,
    tag bigint, next_token bigint, new_tag bigint,
    OUT got boolean, OUT token bigint, OUT fresh boolean)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    row_path text;
    row_fence bigint;
    row_block bigint;
BEGIN
    fresh := false;
    IF shared THEN
        -- A waiting writer's intent refuses new readers. (No AND: SQL may evaluate both.)
        got := false;
        IF pg_try_advisory_xact_lock_shared(2053851470, lock_id) THEN
            got := pg_try_advisory_lock_shared(2053852235, lock_id);
        END IF;
    ELSE
        got := pg_try_advisory_lock(2053852235, lock_id);
    END IF;
    IF NOT got THEN
        RETURN;
    END IF;
    -- A statement of its own, so a snapshot taken under the lock: it sees every block an
    -- earlier holder reserved.
    SELECT k.path, k.fence, k.block INTO row_path, row_fence, row_block
        FROM zklock_keys k WHERE k.id = lock_id;
    IF row_path IS DISTINCT FROM lock_path THEN
        RETURN;
    END IF;
    IF tag <> 0 AND row_block = tag
            AND next_token BETWEEN row_fence - 1048575 AND row_fence THEN
        token := next_token;
        RETURN;
    END IF;
    UPDATE zklock_keys SET
        fence = GREATEST(fence + 1,
            (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) + 1048575,
        block = new_tag
        WHERE id = lock_id
        RETURNING fence - 1048575 INTO token;
    fresh := true;
END
$fn$;
CREATE OR REPLACE FUNCTION zklock_release_v2(lock_id integer, shared boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    held boolean;
BEGIN
    IF shared THEN
        held := pg_advisory_unlock_shared(2053852235, lock_id);
    ELSE
        held := pg_advisory_unlock(2053852235, lock_id);
    END IF;
    -- A listening connection holds its share while someone waits: wake them. A notification
    -- is not durable, so its commit need not wait for the disk.
    IF NOT pg_try_advisory_xact_lock(2053854537, lock_id) THEN
        PERFORM set_config('synchronous_commit', 'off', true);
        PERFORM pg_notify('zklock_release', lock_id::text);
    END IF;
    RETURN held;
END
$fn$;
COMMIT;"#;

/// Whether the key table and this version's functions are there (no lock, no write: a role
/// that may not create them can still use what an administrator made).
pub(crate) const SCHEMA_EXISTS: &str = "SELECT to_regclass('zklock_keys') IS NOT NULL \
     AND to_regprocedure('zklock_try_v2(integer,text,boolean,bigint,bigint,bigint)') IS NOT NULL \
     AND to_regprocedure('zklock_release_v2(integer,boolean)') IS NOT NULL";

/// `$1` path -> id, if it has one.
pub(crate) const FIND_ID: &str = "SELECT id FROM zklock_keys WHERE path = $1";

/// Gives `$1` path an id (a row) unless it has one.
pub(crate) const ADD_PATH: &str =
    "INSERT INTO zklock_keys (path) VALUES ($1) ON CONFLICT (path) DO NOTHING";

/// One attempt (`$1` id, `$2` path, `$3` shared, `$4` the caller's block tag or 0, `$5` its
/// next token, `$6` a new tag): `(got, token, fresh)`. `got` without a token: the lock is held
/// but the row no longer names the path (unlock and look the id up again). `fresh`: a block
/// tagged `$6` was reserved and starts at `token`. Readers take a shared lock, and only while
/// no writer waits (a writer's intent, `(INTENT_CLASS, id)`, refuses their shared check).
pub(crate) const TRY: &str = "SELECT got, token, fresh FROM zklock_try_v2($1, $2, $3, $4, $5, $6)";

/// A waiting writer's intent: `true` when this session took it (one writer's is enough).
pub(crate) const TAKE_INTENT: &str = "SELECT pg_try_advisory_lock(2053851470, $1)";

/// Releases a hold (`$1` id, `$2` shared) and wakes waiters, if any wait: `true` when it was
/// held.
pub(crate) const RELEASE: &str = "SELECT zklock_release_v2($1, $2)";

/// Registers this process's waiters for `$1` (on the listening connection).
pub(crate) const WAIT: &str = "SELECT pg_advisory_lock_shared(2053854537, $1)";

/// Ends a registration of [`WAIT`].
pub(crate) const UNWAIT: &str = "SELECT pg_advisory_unlock_shared(2053854537, $1)";

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

    /// The literals in the statements are the classes' and the block's values.
    #[test]
    fn constants_match_the_literals() {
        assert_eq!(LOCK_CLASS, 2053852235);
        assert_eq!(INTENT_CLASS, 2053851470);
        assert_eq!(WAIT_CLASS, 2053854537);
        assert_eq!(BLOCK - 1, 1048575);
        assert!(CREATE_SCHEMA.contains(&(BLOCK - 1).to_string()));
        for s in [CREATE_SCHEMA, UNDO, DOWNGRADE] {
            assert!(s.contains(&LOCK_CLASS.to_string()), "{s}");
            assert!(s.contains(CHANNEL) || !s.contains("pg_notify"), "{s}");
        }
        for s in [CREATE_SCHEMA, TAKE_INTENT, DROP_INTENT, UNDO] {
            assert!(s.contains(&INTENT_CLASS.to_string()), "{s}");
        }
        for s in [CREATE_SCHEMA, WAIT, UNWAIT] {
            assert!(s.contains(&WAIT_CLASS.to_string()), "{s}");
        }
    }
}
