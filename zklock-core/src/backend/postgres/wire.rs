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
//!     fence     bigint NOT NULL DEFAULT 0,  -- the last token granted
//!     run_after timestamptz,            -- a job's at_least window (claim_run)
//!     block     bigint                  -- NULL; earlier versions' tag of a reserved block
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
//! Each grant of the server's lock to a process takes its token in the statement that takes
//! the lock ([`TRY_EXCLUSIVE`], [`TRY_SHARED`]): once the lock is got, it raises the row's
//! `fence` to `GREATEST(fence + 1, now)`, `now` being the server's clock in µs
//! (`clock_timestamp()`, read by the statement as it takes the lock), and the new `fence` is
//! the token. (A local handoff within a process takes no token from the server: it extends
//! the process's one with `.n`.) The raise is an `UPDATE` in read committed: it raises the
//! row's latest version, whatever the statement's snapshot (taken before the lock) saw, so a
//! token is above every token an earlier holder committed, and it is handed out only once the
//! statement has committed. Nothing about tokens is cached on the client side: a process that
//! took a key before gets its next token from the row like any other.
//!
//! Why a token never repeats or goes back, even when a crash or a failover to an asynchronous
//! replica loses the last commits (the row goes back to an older `fence`), given that the
//! server's clock moves forward (and a promoted replica's clock is not behind the old
//! primary's by more than the failover took):
//!
//! - A token that is its grant's clock reading `now` is below the clock reading of every
//!   grant that runs after it, and so below that grant's token, whatever `fence` the server
//!   then has: whether the earlier commit survived does not matter. So its commit need not
//!   wait for the WAL flush, and does not: the statement sets `synchronous_commit` to `off`
//!   for its own transaction (the commit is in the WAL's buffers, visible to the next grant,
//!   and reaches the disk within the WAL writer's delay, or with the next commit that is
//!   flushed). A crash that loses it loses a token that every later grant is above anyway.
//! - A token above its clock reading (the counter was ahead of the clock: an earlier version
//!   of zklock reserved blocks of 2^20 tokens, about a second each; the server's clock was
//!   stepped back; two grants within one µs) is flushed before it is handed out: the statement
//!   raises `synchronous_commit` from `off` to `local` for its own transaction, so a crash of
//!   the server does not lose it (any other setting flushes already). A failover to an
//!   asynchronous replica can still lose such a commit, and a later grant repeat its token:
//!   the one case left, and a passing one, since a counter stays ahead only until the clock
//!   catches up with it (grants raise it by 1 while ahead); from then on the first case holds.
//!
//! So a lost commit can only lose a token that later grants are above anyway, and the counter
//! runs ahead of the clock only by grants less than a µs apart. (One more case is not covered:
//! a crash that loses a clock token's commit *and* a clock stepped back across it, so that the
//! next grant's clock reading is below the lost token. With every commit flushed it would
//! take the clock's step alone, and be covered by the second case; the asynchronous commit of
//! clock tokens gives that up for a grant that costs no flush.) The cost: every grant of the
//! server's lock writes the row, one commit in the same round trip as the lock, which does
//! not wait for the WAL flush unless its token is above the clock; readers granted together
//! take turns at the row.
//! A transaction that holds the row's lock (an administrator's open update of `zklock_keys`)
//! holds up the key's grants until it ends. A process that takes one key again and again
//! without another process in between can keep the lock instead (the linger), with no request.
//!
//! Each grant sets the row's `block` to `NULL`: a process of an earlier version, which took
//! tokens from its reserved block without writing while the row still carried the block's tag,
//! reserves a new block above the row's `fence` instead.
//!
//! The floor at the server's clock also keeps tokens above every earlier one if the table is
//! ever dropped and re-created.
//!
//! A backend without tokens ([`Builder::fencing_tokens`](crate::Builder::fencing_tokens) off)
//! prepares the `_UNFENCED` forms of the attempts and waits instead: the same lock, the same
//! check that the row names the path ([`check_under_lock`]), no write, token 0 (none). Its
//! grants leave `fence` as it was, which the grants of processes with tokens raise as before:
//! their tokens still increase in grant order.
//!
//! ## Waiting in the server's queue
//!
//! A waiter blocks in the server ([`BLOCK_EXCLUSIVE`], [`BLOCK_SHARED`]) on a connection given
//! to the wait, at most a few per process (see the backend's `QUEUED_WAITS`); the server
//! queues the waiters of a lock in order and grants the lock to the first of them inside the
//! release (no round trip, no herd, and the releaser's next try finds the lock granted: it
//! cannot get in ahead of the queue). An acquire of a free key is one try ([`TRY_EXCLUSIVE`],
//! which costs the server less than a wait's statement); one that found the key taken, or of a
//! key the process found taken within the last second, sends the wait's statement, which is
//! then also its attempt (a try would most likely be refused first, a round trip lost). A try
//! is refused while others are queued, so it never gets in ahead of the server's queue either.
//! The wait's statement sets its own `lock_timeout` (the caller's deadline, at most a slice)
//! so that the server ends the wait by itself; an acquire dropped
//! earlier cancels it from another of the process's sessions ([`CANCEL`]: one signal, sent
//! before the statement returns, so it cannot reach a later statement of the waiting session),
//! then sends [`UNDO`] on the connection, which runs once the wait ended, granted or not: a
//! lock granted just as the acquire was dropped is released there.
//! The waits are registered by each process's listening connection ([`QUEUE`], a class of its
//! own so that releases do not notify for them) once one lasted a few ms, which tells holders
//! that someone waits, as a retrying waiter's registration does.
//!
//! ## Waking waiters
//!
//! Waiters beyond the bound on waits in the server's queue retry on notified releases.
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

use std::time::Duration;

use crate::types::error::{Error, Result};

/// What a holding connection runs first: statements read with a snapshot taken when they
/// start, whatever the server's default (a reservation must not fail to serialize with a job's
/// record); and the session's process id and start, which a cancel of its statements names
/// ([`CANCEL`]); whether the server is a standby; and a primary's timeline (the first 8 hex
/// digits of its current WAL file's name), which every promotion raises.
pub(super) const OPEN_SESSION: &str = "SET default_transaction_isolation = 'read committed'; \
     SELECT pid::text, backend_start::text, pg_is_in_recovery()::text, \
     CASE WHEN pg_is_in_recovery() THEN NULL \
     ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END \
     FROM pg_stat_activity WHERE pid = pg_backend_pid()";

/// Cancels the statement that the session `$1` (process id) started at `$2` (its
/// `backend_start`, as text) runs now, from another session: `pg_cancel_backend` signals the
/// process once, before it returns. No row, or `false`, when no such session is there.
pub(super) const CANCEL: &str = "SELECT pg_cancel_backend(pid) FROM pg_stat_activity \
     WHERE pid = $1 AND backend_start::text = $2";

/// The class (first key) of every advisory lock zklock takes: `zkLK` in ASCII.
pub(super) const LOCK_CLASS: i32 = 0x7A6B_4C4B;
/// The class of a waiting writer's intent (`zkIN`): held while a writer waits, so that new
/// readers queue behind it.
#[allow(dead_code)] // the statements spell it as a literal; the tests check it
pub(super) const INTENT_CLASS: i32 = 0x7A6B_494E;
/// The class of a waiter's registration (`zkWI`): a shared lock held by the listening
/// connection of each process with a task waiting for the id.
#[allow(dead_code)] // the statements spell it as a literal; the tests check it
pub(super) const WAIT_CLASS: i32 = 0x7A6B_5749;
/// The class of a process's registration of waiters queued in the server (`zkQU`): a shared
/// lock held by the listening connection of each process with a task blocked in
/// `pg_advisory_lock` for the id, and for a moment after (see [`QUEUE`]).
#[allow(dead_code)] // the statements spell it as a literal; the tests check it
pub(super) const QUEUE_CLASS: i32 = 0x7A6B_5155;
/// The channel every release notifies, with the lock id as payload.
pub(super) const CHANNEL: &str = "zklock_release";
/// The channel a process notifies when it starts waiting for a lock id (the payload): a holder
/// learns that another contender appeared (what ends a linger, and bounds local handoffs).
pub(super) const WAIT_CHANNEL: &str = "zklock_wait";

/// Creates the key table, once, even when many processes start at the same moment: `CREATE
/// TABLE IF NOT EXISTS` alone can fail in a race on the catalog's unique index, so creators
/// take turns on a transaction-level advisory lock (object id 0: no lock path has it). A table
/// made by an earlier version gains the `block` column.
pub(super) const CREATE_SCHEMA: &str = "BEGIN;
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
pub(super) const SCHEMA_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM pg_attribute \
     WHERE attrelid = to_regclass('zklock_keys') AND attname = 'block' AND NOT attisdropped)";

/// `$1` path -> id, if it has one.
pub(super) const FIND_ID: &str = "SELECT id FROM zklock_keys WHERE path = $1";

/// Gives `$1` path an id (a row) unless it has one.
pub(super) const ADD_PATH: &str =
    "INSERT INTO zklock_keys (path) VALUES ($1) ON CONFLICT (path) DO NOTHING";

/// What an attempt does once its lock is got (`l.got`, with the server's clock `l.now` in µs
/// read then): raises the token of `$1` id in its row, while the row names `$2` path, commits
/// it asynchronously when the token is the clock's reading and flushes it when the token is
/// above the clock (see "Tokens" in the module's docs); and reads whether a waiter is
/// registered for the lock now, or queued in the server (see "Waking waiters"). Answers
/// `(got, token, waiting)`: no token when the row no longer names the path (nothing written).
macro_rules! grant_under_lock {
    () => {
        ", r AS (UPDATE zklock_keys k SET fence = GREATEST(k.fence + 1, l.now), block = NULL \
         FROM l WHERE l.got AND k.id = $1 AND k.path = $2 \
         RETURNING k.fence, CASE WHEN k.fence <= l.now \
         THEN set_config('synchronous_commit', 'off', true) \
         WHEN current_setting('synchronous_commit') = 'off' \
         THEN set_config('synchronous_commit', 'local', true) END AS flush) \
         SELECT l.got, r.fence, CASE WHEN l.got \
         THEN NOT (pg_try_advisory_xact_lock(2053855049, $1) \
         AND pg_try_advisory_xact_lock(2053853525, $1)) END AS waiting \
         FROM l LEFT JOIN r ON true"
    };
}

/// What an attempt of a backend without tokens does once its lock is got
/// ([`Builder::fencing_tokens`](crate::Builder::fencing_tokens) off): it checks that the row
/// of `$1` id still names `$2` path and writes nothing, answering `0` for the token (no token
/// when the row no longer names the path), and reads whether a waiter is registered as
/// [`grant_under_lock`] does. The check reads the statement's snapshot, taken when it started:
/// a table dropped and re-created before is seen (a drop waits for the statement, which has
/// the table open), but a row an administrator renames while the statement waits in the
/// server's queue is not, where the token's `UPDATE` re-reads the row's latest version.
macro_rules! check_under_lock {
    () => {
        ", r AS (SELECT 0::bigint AS fence FROM zklock_keys k, l \
         WHERE l.got AND k.id = $1 AND k.path = $2) \
         SELECT l.got, r.fence, CASE WHEN l.got \
         THEN NOT (pg_try_advisory_xact_lock(2053855049, $1) \
         AND pg_try_advisory_xact_lock(2053853525, $1)) END AS waiting \
         FROM l LEFT JOIN r ON true"
    };
}

/// The server's clock in µs, as a column `now` of the attempt's lock CTE.
macro_rules! now_us {
    () => {
        ", floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now) "
    };
}

/// A mutex's or a writer's attempt at the lock of `$1` id, and its grant (`$2` path):
/// `(got, token, waiting)`.
pub(super) const TRY_EXCLUSIVE: &str = concat!(try_exclusive!(), grant_under_lock!());

/// [`TRY_EXCLUSIVE`] without a token (see [`check_under_lock`]): `(got, 0, waiting)`.
pub(super) const TRY_EXCLUSIVE_UNFENCED: &str = concat!(try_exclusive!(), check_under_lock!());

macro_rules! try_exclusive {
    () => {
        concat!(
            "WITH l AS MATERIALIZED (SELECT pg_try_advisory_lock(2053852235, $1) AS got",
            now_us!()
        )
    };
}
use try_exclusive;

/// A reader's attempt, as [`TRY_EXCLUSIVE`] but shared, and only while no writer waits (a
/// writer's intent, `(INTENT_CLASS, id)`, refuses the reader's shared check; `CASE` evaluates
/// the lock only after the check passed).
pub(super) const TRY_SHARED: &str = concat!(try_shared!(), grant_under_lock!());

/// [`TRY_SHARED`] without a token (see [`check_under_lock`]): `(got, 0, waiting)`.
pub(super) const TRY_SHARED_UNFENCED: &str = concat!(try_shared!(), check_under_lock!());

macro_rules! try_shared {
    () => {
        concat!(
            "WITH l AS MATERIALIZED (SELECT CASE WHEN \
             pg_try_advisory_xact_lock_shared(2053851470, $1) \
             THEN pg_try_advisory_lock_shared(2053852235, $1) ELSE false END AS got",
            now_us!()
        )
    };
}
use try_shared;

/// A wait in the server's queue for the lock of `$1` id, and its grant (`$2` path), as one
/// statement on a connection given to it: `pg_advisory_lock` blocks until the server grants
/// the lock (in the order the server queued its waiters), then the token is taken as in
/// [`TRY_EXCLUSIVE`]: `(got, token, waiting)`, `got` always true. `$3` is the statement's
/// `lock_timeout` (text, e.g. `1500ms`): past it the server ends the wait with
/// `lock_not_available` and nothing is taken, unless the time ran out in the row's update,
/// after the advisory lock was got (the caller undoes the lock after any error).
pub(super) const BLOCK_EXCLUSIVE: &str = concat!(block_exclusive!(), grant_under_lock!());

/// [`BLOCK_EXCLUSIVE`] without a token (see [`check_under_lock`]): `(true, 0, waiting)`.
pub(super) const BLOCK_EXCLUSIVE_UNFENCED: &str = concat!(block_exclusive!(), check_under_lock!());

macro_rules! block_exclusive {
    () => {
        "WITH t AS MATERIALIZED (SELECT set_config('lock_timeout', $3, true) AS s), \
         w AS MATERIALIZED (SELECT pg_advisory_lock(2053852235, $1) FROM t), \
         l AS MATERIALIZED (SELECT true AS got, \
         floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now FROM w)"
    };
}
use block_exclusive;

/// A reader's wait in the server's queue, as [`BLOCK_EXCLUSIVE`] but shared, and behind a
/// writer's intent (a writer that waits by retrying holds one): the reader first waits for
/// `(INTENT_CLASS, id)` shared for the statement, then for the lock.
pub(super) const BLOCK_SHARED: &str = concat!(block_shared!(), grant_under_lock!());

/// [`BLOCK_SHARED`] without a token (see [`check_under_lock`]): `(true, 0, waiting)`.
pub(super) const BLOCK_SHARED_UNFENCED: &str = concat!(block_shared!(), check_under_lock!());

macro_rules! block_shared {
    () => {
        "WITH t AS MATERIALIZED (SELECT set_config('lock_timeout', $3, true) AS s), \
         i AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(2053851470, $1) FROM t), \
         w AS MATERIALIZED (SELECT pg_advisory_lock_shared(2053852235, $1) FROM i), \
         l AS MATERIALIZED (SELECT true AS got, \
         floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now FROM w)"
    };
}
use block_shared;

/// A waiting writer's intent: `true` when this session took it (one writer's is enough).
pub(super) const TAKE_INTENT: &str = "SELECT pg_try_advisory_lock(2053851470, $1)";

/// Releases a hold (`$1` id, `$2` shared), then wakes waiters if any wait (see the module's
/// docs): `(held, notified)`.
pub(super) const RELEASE: &str = "WITH u AS MATERIALIZED (SELECT CASE WHEN $2 \
     THEN pg_advisory_unlock_shared(2053852235, $1) \
     ELSE pg_advisory_unlock(2053852235, $1) END AS held) \
     SELECT u.held, CASE WHEN pg_try_advisory_xact_lock(2053855049, $1) THEN false \
     ELSE (set_config('synchronous_commit', 'off', true) \
     || pg_notify('zklock_release', $1::text)::text) IS NOT NULL END FROM u";

/// Registers this process's waiters for `$1` (on the listening connection), and tells the
/// holders (a lingering one gives the lock up; see [`WAIT_CHANNEL`]).
pub(super) const WAIT: &str = "SELECT pg_advisory_lock_shared(2053855049, $1), \
     set_config('synchronous_commit', 'off', true), pg_notify('zklock_wait', $1::text)";

/// Ends a registration of [`WAIT`].
pub(super) const UNWAIT: &str = "SELECT pg_advisory_unlock_shared(2053855049, $1)";

/// Registers this process's waiters queued in the server for `$1` (on the listening
/// connection) and tells the holders, as [`WAIT`] does but in a class of its own, so that a
/// release does not notify for them (the server hands the lock to them itself).
pub(super) const QUEUE: &str = "SELECT pg_advisory_lock_shared(2053853525, $1), \
     set_config('synchronous_commit', 'off', true), pg_notify('zklock_wait', $1::text)";

/// Ends a registration of [`QUEUE`].
pub(super) const UNQUEUE: &str = "SELECT pg_advisory_unlock_shared(2053853525, $1)";

/// Undoes whatever an acquire that ended without a hold may have left on its connection: the
/// lock (`$2`: shared), the intent (`$3`), and wakes waiters (readers held back by the intent).
/// Unlocking what is not held only draws a warning from the server.
pub(super) const UNDO: &str = "SELECT \
     CASE WHEN $2 THEN pg_advisory_unlock_shared(2053852235, $1) \
     ELSE pg_advisory_unlock(2053852235, $1) END, \
     CASE WHEN $3 THEN pg_advisory_unlock(2053851470, $1) END, \
     pg_notify('zklock_release', $1::text)";

/// Drops a granted writer's intent (`$1` id).
pub(super) const DROP_INTENT: &str = "SELECT pg_advisory_unlock(2053851470, $1)";

/// Turns the exclusive hold of `$1` into a shared one on the same session and lets waiting
/// readers know. `true` when it was held.
///
/// Not `pg_try_advisory_lock_shared`: PostgreSQL refuses a try while any conflicting request
/// waits, even to the session that holds the exclusive lock (a writer of another process
/// queued behind it made the downgrade fail). The blocking call is granted at once, ahead of
/// the waiters, to a session that holds a lock they wait for; it is made only when the session
/// holds the exclusive lock (`pg_locks`), so it never waits, and a session that does not hold
/// it answers false and takes nothing.
pub(super) const DOWNGRADE: &str = "WITH s AS MATERIALIZED \
     (SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
     AND pid = pg_backend_pid() AND classid = 2053852235::oid AND objid = ($1::int4)::oid \
     AND objsubid = 2 AND mode = 'ExclusiveLock' AND granted) \
     THEN pg_advisory_lock_shared(2053852235, $1) IS NOT NULL ELSE false END AS got) \
     SELECT CASE WHEN s.got THEN pg_advisory_unlock(2053852235, $1) ELSE false END, \
     pg_notify('zklock_release', $1::text) FROM s";

/// The liveness check of a holding connection: the session answers.
pub(super) const PING: &str = "SELECT 1";

/// Claims a job's run (`$1` id, `$2` path) in one statement: when no `at_least` window covers
/// now, records that no run may start before now + `$3` ms. Answers whether it did; no row
/// when the row no longer names the path. The update re-checks the window on the row's latest
/// version under the row's lock (read committed), so two claims — a holder's and a lost
/// holder's that has not noticed yet — never both find the window open, and no claim ever
/// shortens a recorded window.
pub(super) const CLAIM_RUN: &str = "WITH claimed AS (UPDATE zklock_keys \
     SET run_after = clock_timestamp() + $3::bigint * interval '1 millisecond' \
     WHERE id = $1 AND path = $2 AND (run_after IS NULL OR run_after <= clock_timestamp()) \
     RETURNING 1) \
     SELECT EXISTS (SELECT 1 FROM claimed) FROM zklock_keys WHERE id = $1 AND path = $2";

/// For inspection: every advisory lock of zklock's classes on the lock `$1` path: `(class,
/// granted, shared, pid, application_name, since µs, fence, id)`, holders and the longest
/// waiting first.
pub(super) const LOCK_STATE: &str =
    "SELECT l.classid::bigint, l.granted, l.mode = 'ShareLock', l.pid, \
     coalesce(a.application_name, ''), \
     floor(extract(epoch FROM coalesce((to_jsonb(l) ->> 'waitstart')::timestamptz, \
     a.state_change, now())) * 1000000)::bigint, k.fence, k.id \
     FROM zklock_keys k JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 2 \
     AND l.objid::bigint = k.id AND l.database = (SELECT oid FROM pg_database \
     WHERE datname = current_database()) \
     LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE k.path = $1 AND l.classid::bigint IN (2053852235, 2053855049, 2053851470) \
     ORDER BY l.granted DESC, 6";

/// For inspection: the paths under `$1` (a `LIKE` pattern) with any advisory lock of
/// zklock's classes.
pub(super) const LOCKED_PATHS: &str = "SELECT DISTINCT k.path FROM zklock_keys k JOIN pg_locks l \
     ON l.locktype = 'advisory' AND l.objsubid = 2 AND l.objid::bigint = k.id \
     AND l.classid::bigint IN (2053852235, 2053855049, 2053851470) \
     WHERE k.path LIKE $1";

/// Asks the server to end the session once it hears nothing for `lease`
/// (`idle_session_timeout`, PostgreSQL 14 and later).
pub(super) fn set_idle_session_timeout(lease: Duration) -> String {
    format!("SET idle_session_timeout = {}", lease.as_millis())
}

/// Listens on the channels a listening connection hears: [`CHANNEL`] and [`WAIT_CHANNEL`].
pub(super) fn listen() -> String {
    format!("LISTEN {CHANNEL}; LISTEN {WAIT_CHANNEL}")
}

/// The SQL that creates zklock's table and, with `grant_to`, grants that role what zklock uses
/// of it: reading and writing its rows (never deleting them) and taking ids from its sequence.
/// Advisory locks, `LISTEN`/`NOTIFY`, `idle_session_timeout` and cancelling a statement of
/// another session of the same role need no grant.
pub(crate) fn setup_sql(grant_to: Option<&str>) -> Result<String> {
    let mut sql = CREATE_SCHEMA.to_string();
    if let Some(role) = grant_to {
        if role.contains('\0') {
            return Err(Error::InvalidArgument(
                "a role name cannot hold a NUL byte".to_string(),
            ));
        }
        let role = format!("\"{}\"", role.replace('"', "\"\""));
        sql.push_str(&format!(
            "\nGRANT SELECT, INSERT, UPDATE ON TABLE zklock_keys TO {role};\
             \nGRANT USAGE ON SEQUENCE zklock_keys_id_seq TO {role};"
        ));
    }
    sql.push('\n');
    Ok(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The literals in the statements are the classes' and the block's values.
    #[test]
    fn constants_match_the_literals() {
        assert_eq!(LOCK_CLASS, 2053852235);
        assert_eq!(INTENT_CLASS, 2053851470);
        assert_eq!(WAIT_CLASS, 2053855049);
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
        for s in [RELEASE, WAIT, UNWAIT, TRY_EXCLUSIVE, BLOCK_SHARED] {
            assert!(s.contains(&WAIT_CLASS.to_string()), "{s}");
        }
        assert_eq!(QUEUE_CLASS, 2053853525);
        for s in [QUEUE, UNQUEUE, TRY_SHARED, BLOCK_EXCLUSIVE] {
            assert!(s.contains(&QUEUE_CLASS.to_string()), "{s}");
        }
        assert!(QUEUE.contains(WAIT_CHANNEL));
        for s in [BLOCK_EXCLUSIVE, BLOCK_SHARED] {
            assert!(s.contains(&LOCK_CLASS.to_string()), "{s}");
        }
        assert!(BLOCK_SHARED.contains(&INTENT_CLASS.to_string()));
    }
}
