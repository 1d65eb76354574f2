//! The schema and the statements of the PostgreSQL backend. Each statement is its own
//! transaction, and so reads with a snapshot taken when it starts. Where the order of effects
//! matters within one step, either the step is two statements sent together (one round trip:
//! the server runs them in order, so the second one's snapshot is taken after the first one
//! finished), or one statement whose order is forced by a `MATERIALIZED` CTE that the rest
//! reads.
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
//! values. An acquire that has no block of its own reserves one ([`RESERVE`]): it raises
//! `fence` to `max(fence + 1, server time in µs) + BLOCK - 1` and records the block's random tag
//! in the row; that commit waits for the WAL flush (`synchronous_commit`) before the grant and
//! its token (the block's first value) are reported, so a token never goes backwards across a
//! server crash. The next acquire of the same process, while the row still carries its block's
//! tag (nobody reserved a block since), takes the block's next value and writes nothing.
//!
//! Reading the row under the lock: the attempt ([`TRY_EXCLUSIVE`]) takes the lock in a
//! `MATERIALIZED` CTE and then reads the row in a `LATERAL` subquery that depends on it, so
//! the read comes after the lock. But the statement's snapshot was taken before the lock: a
//! holder that reserved a block, committed and released in between would be missed. So the
//! attempt also reads whether its version of the row is the latest, by the version's `xmax`
//! (set on a row version as soon as an update of it starts, and never unset by a commit): unset
//! means no update of the row has begun, so the version read carries every reservation. When
//! it is set (someone updated the row: a reservation, a job's record, an aborted update), the
//! row is read again by [`READ_ROW`], a statement of its own whose snapshot is taken after the
//! lock was granted. An earlier holder commits its reservation before it can release.
//!
//! The backend sends each block's values in order, one attempt at a time (see `Blocks` in the
//! backend), so two grants never share a token and a block's tokens only go up. A process that
//! alternates with another reserves a block at each of its grants: one flush per handoff, as
//! before.
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
//!
//! Holders learn of waiters the same way: an attempt that takes the lock also reads whether a
//! waiter is registered, and a process that registers notifies [`WAIT_CHANNEL`], which every
//! process's listening connection hears. That tells a holder whether another contender
//! appeared (when the listening connection was down meanwhile: in doubt, yes): what bounds the
//! local queue's handoffs and ends a linger.

/// The values a reserved block of tokens spans (spelled as a literal in [`RESERVE`]).
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
/// The channel a process notifies when it starts waiting for a lock id (the payload): a holder
/// learns that another contender appeared (what ends a linger, and bounds local handoffs).
pub(crate) const WAIT_CHANNEL: &str = "zklock_wait";

/// Creates the key table, once, even when many processes start at the same moment: `CREATE
/// TABLE IF NOT EXISTS` alone can fail in a race on the catalog's unique index, so creators
/// take turns on a transaction-level advisory lock (object id 0: no lock path has it). A table
/// made by an earlier version gains the `block` column.
pub(crate) const CREATE_SCHEMA: &str = "BEGIN;
SELECT pg_advisory_xact_lock(2053852235, 0);
CREATE TABLE IF NOT EXISTS zklock_keys (
    id serial PRIMARY KEY,
    path text NOT NULL UNIQUE,
    fence bigint NOT NULL DEFAULT 0,
    run_after timestamptz,
    block bigint
);
ALTER TABLE zklock_keys ADD COLUMN IF NOT EXISTS block bigint;
COMMIT;";

/// Whether the key table is there, as this version uses it (no lock, no write: a role that
/// may not create it can still use one an administrator made).
pub(crate) const SCHEMA_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM pg_attribute \
     WHERE attrelid = to_regclass('zklock_keys') AND attname = 'block' AND NOT attisdropped)";

/// `$1` path -> id, if it has one.
pub(crate) const FIND_ID: &str = "SELECT id FROM zklock_keys WHERE path = $1";

/// Gives `$1` path an id (a row) unless it has one.
pub(crate) const ADD_PATH: &str =
    "INSERT INTO zklock_keys (path) VALUES ($1) ON CONFLICT (path) DO NOTHING";

/// The row of `$1` as an attempt reads it once it took the lock: its path, fence and block,
/// whether a waiter is registered for the lock now (see "Waking waiters" in the module's docs),
/// and whether the version read is the row's latest (its `xmax` is unset: no update of it has
/// started, so no reservation committed since the statement's snapshot was taken; see the
/// module's docs).
macro_rules! read_row_under_lock {
    () => {
        "SELECT l.got, r.path, r.fence, r.block, r.latest, r.waiting FROM l LEFT JOIN LATERAL \
         (SELECT k.path, k.fence, k.block, k.xmax::text = '0' AS latest, \
         NOT pg_try_advisory_xact_lock(2053855049, $1) AS waiting FROM zklock_keys k \
         WHERE l.got AND k.id = $1) r ON true"
    };
}

/// A mutex's or a writer's attempt at the lock of `$1` id, and its row read once taken:
/// `(got, path, fence, block, latest)`.
pub(crate) const TRY_EXCLUSIVE: &str = concat!(
    "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock(2053852235, $1) AS got) ",
    read_row_under_lock!()
);

/// A reader's attempt, as [`TRY_EXCLUSIVE`] but shared, and only while no writer waits (a
/// writer's intent, `(INTENT_CLASS, id)`, refuses the reader's shared check; `CASE` evaluates
/// the lock only after the check passed).
pub(crate) const TRY_SHARED: &str = concat!(
    "WITH l AS MATERIALIZED (SELECT CASE WHEN \
     pg_try_advisory_xact_lock_shared(2053851470, $1) \
     THEN pg_try_advisory_lock_shared(2053852235, $1) ELSE false END AS got) ",
    read_row_under_lock!()
);

/// The row of `$1` id, `(path, fence, block)`, read with a snapshot of its own: what an
/// attempt reads again when the version it read under the lock may not be the latest.
pub(crate) const READ_ROW: &str = "SELECT path, fence, block FROM zklock_keys WHERE id = $1";

/// Reserves a block of tokens tagged `$2` for `$1` id, under the lock, while its row names
/// `$3` path: the block's first value, or no row (the row no longer names the path).
pub(crate) const RESERVE: &str = "UPDATE zklock_keys SET \
     fence = GREATEST(fence + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint) \
     + 1048575, block = $2 WHERE id = $1 AND path = $3 RETURNING fence - 1048575";

/// A waiting writer's intent: `true` when this session took it (one writer's is enough).
pub(crate) const TAKE_INTENT: &str = "SELECT pg_try_advisory_lock(2053851470, $1)";

/// Releases a hold (`$1` id, `$2` shared), then wakes waiters if any wait (see the module's
/// docs): `(held, notified)`.
pub(crate) const RELEASE: &str = "WITH u AS MATERIALIZED (SELECT CASE WHEN $2 \
     THEN pg_advisory_unlock_shared(2053852235, $1) \
     ELSE pg_advisory_unlock(2053852235, $1) END AS held) \
     SELECT u.held, CASE WHEN pg_try_advisory_xact_lock(2053855049, $1) THEN false \
     ELSE (set_config('synchronous_commit', 'off', true) \
     || pg_notify('zklock_release', $1::text)::text) IS NOT NULL END FROM u";

/// Registers this process's waiters for `$1` (on the listening connection), and tells the
/// holders (a lingering one gives the lock up; see [`WAIT_CHANNEL`]).
pub(crate) const WAIT: &str = "SELECT pg_advisory_lock_shared(2053855049, $1), \
     set_config('synchronous_commit', 'off', true), pg_notify('zklock_wait', $1::text)";

/// Ends a registration of [`WAIT`].
pub(crate) const UNWAIT: &str = "SELECT pg_advisory_unlock_shared(2053855049, $1)";

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
        assert_eq!(WAIT_CLASS, 2053855049);
        assert_eq!(BLOCK - 1, 1048575);
        assert_eq!(RESERVE.matches(&(BLOCK - 1).to_string()).count(), 2);
        for s in [
            CREATE_SCHEMA,
            TRY_EXCLUSIVE,
            TRY_SHARED,
            RELEASE,
            UNDO,
            DOWNGRADE,
        ] {
            assert!(s.contains(&LOCK_CLASS.to_string()), "{s}");
            assert!(s.contains(CHANNEL) || !s.contains("pg_notify"), "{s}");
        }
        for s in [TRY_SHARED, TAKE_INTENT, DROP_INTENT, UNDO] {
            assert!(s.contains(&INTENT_CLASS.to_string()), "{s}");
        }
        assert!(WAIT.contains(WAIT_CHANNEL));
        for s in [RELEASE, WAIT, UNWAIT] {
            assert!(s.contains(&WAIT_CLASS.to_string()), "{s}");
        }
    }
}
