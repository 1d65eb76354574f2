//! The adversary made systematic on PostgreSQL: every protocol — mutex acquire and release,
//! the hand-over to a waiter of another process (the victim waits in the server's lock queue,
//! blocked in `pg_advisory_lock`, and the server hands it the lock), the same wait abandoned at
//! its deadline, read and write locks, a job's claim with its `at_least` window, a leader's
//! election, and the mutex and the hand-over of a victim without fencing tokens (whose grants
//! write nothing) — run once per request boundary k, cut there, and judged by the history
//! checker. (Semaphores answer `Unsupported` on PostgreSQL: not here.)
//!
//! A victim process (a manager whose every connection goes through a [`Relay`]) runs the
//! protocol: take, hold a moment (stopping at once when told the hold is lost), release. The
//! relay lets the server receive the victim's k-th request (a chunk of bytes the client wrote,
//! counted over all its connections: PostgreSQL clients pipeline each round trip in one write)
//! and withholds the answer, then
//! - `Reset`: resets that connection (the client reconnects at once and carries on);
//! - `Cancel`: resets it and cuts the victim off, and the victim's future is dropped while it
//!   waits; the network comes back after;
//! - `Kill`: cuts the victim off for good without a reset, as a partition or a dead host: the
//!   server hears nothing, so only its `idle_session_timeout` (which zklock sets to the lease
//!   on every holding session) ends the victim's sessions. The victim lives on, cut off, and
//!   holds until told its hold is lost, while the other process waits for the lock; then it is
//!   killed.
//!
//! Then another process takes the same lock, within the lease (plus its own retries) of the
//! cut. The checker decides: no two believed holders at any moment (a hold counts from its
//! grant to its release or its reported loss), tokens strictly increasing in grant order. And
//! nothing stuck: no advisory lock of the key is left on the server once the victim is gone or
//! done, and after `Kill` no session of the victim is left at all.
//!
//! k runs over every request the protocol sends (counted on an uncut run). In CI each k gets
//! one kind of cut, rotating, and the last k also `Kill` (a partition while the victim holds:
//! the one that checks its loss deadline against the server's);
//! `ZKLOCK_CUTS=all cargo test --test cuts -- cut_every_request_postgres::` runs every kind at
//! every k.

use crate::common;
use crate::cuts;

use std::time::Duration;

use common::{pg_client, pg_server, PG_LEASE};
use cuts::{sweep_through_relay, LeaseServer, Protocol};
use zklock::LockManager;
use zklock_testkit::PostgresServer;

/// The classes of zklock's advisory locks (`zkLK`, `zkIN`, `zkWI`, `zkQU`): the lock, a waiting
/// writer's intent, a registration of waiters that retry, one of waits in the server's queue.
const CLASSES: [i64; 4] = [0x7A6B_4C4B, 0x7A6B_494E, 0x7A6B_5749, 0x7A6B_5155];

/// zklock's advisory locks on the lock of `key` (any class), held or waited for in the
/// server's queue: `(class, mode, granted, application)`.
async fn pg_locks(admin: &tokio_postgres::Client, path: &str) -> Vec<(i64, String, bool, String)> {
    admin
        .query(
            "SELECT l.classid::bigint, l.mode, l.granted, coalesce(a.application_name, '') \
             FROM pg_locks l \
             JOIN zklock_keys k ON l.objid::bigint = k.id \
             LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.objsubid = 2 \
             AND l.classid::bigint = ANY($1) AND k.path = $2",
            &[&CLASSES.to_vec(), &path],
        )
        .await
        .expect("query pg_locks")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// The sessions of the process whose identity is `identity`.
async fn sessions_of(admin: &tokio_postgres::Client, identity: &str) -> Vec<(i32, String)> {
    admin
        .query(
            "SELECT pid, coalesce(state, '') || ': ' || coalesce(query, '') FROM pg_stat_activity \
             WHERE application_name LIKE $1",
            &[&format!("% id={identity}")],
        )
        .await
        .expect("query pg_stat_activity")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// A job's recorded window end, in µs since the epoch (`None`: no run recorded).
async fn run_after(admin: &tokio_postgres::Client, path: &str) -> Option<i64> {
    admin
        .query_opt(
            "SELECT floor(extract(epoch FROM run_after) * 1000000)::bigint FROM zklock_keys \
             WHERE path = $1",
            &[&path],
        )
        .await
        .expect("query zklock_keys")
        .and_then(|r| r.get(0))
}

/// The test kit's PostgreSQL, and a plain client to look at it.
struct Pg {
    server: PostgresServer,
    admin: tokio_postgres::Client,
}

impl LeaseServer for Pg {
    /// The server ends a holding session idle this long.
    const LEASE: Duration = PG_LEASE;

    fn url(&self) -> String {
        self.server.url()
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.server.port())
    }

    fn lock_path(&self, m: &LockManager, _: Protocol, key: &str) -> String {
        m.path_of(key).unwrap()
    }

    /// A waiter's registration (an advisory lock of its class) is held, or a wait for the
    /// lock is in the server's queue.
    async fn waiting(&self, path: &str) -> bool {
        pg_locks(&self.admin, path)
            .await
            .iter()
            .any(|(class, _, granted, _)| {
                (*granted && CLASSES[2..].contains(class)) || (!granted && *class == CLASSES[0])
            })
    }

    async fn window(&self, path: &str) -> Option<i64> {
        run_after(&self.admin, path).await
    }

    /// Every advisory lock of the key, of any class, held or waited for.
    async fn left(&self, path: &str) -> Vec<String> {
        pg_locks(&self.admin, path)
            .await
            .into_iter()
            .map(|l| format!("{l:?}"))
            .collect()
    }

    async fn sessions_left(&self, identity: &str) -> Vec<String> {
        sessions_of(&self.admin, identity)
            .await
            .into_iter()
            .map(|s| format!("{s:?}"))
            .collect()
    }
}

/// Sweeps `protocol` on a server of its own.
async fn sweep_postgres(protocol: Protocol, offset: usize) {
    let server = pg_server();
    let pg = Pg {
        admin: pg_client(&server.url()).await,
        server,
    };
    sweep_through_relay(&pg, protocol, offset).await;
}

cuts::sweep_tests!(sweep_postgres {
    mutex_cut_at_every_request: Mutex, 0;
    handover_cut_at_every_request: Handover, 1;
    abandoned_wait_cut_at_every_request: Abandon, 0;
    read_lock_cut_at_every_request: Read, 2;
    write_lock_cut_at_every_request: Write, 0;
    job_cut_at_every_request: Job, 1;
    leader_cut_at_every_request: Leader, 2;
    untokened_mutex_cut_at_every_request: Untokened, 1;
    untokened_handover_cut_at_every_request: UntokenedHandover, 2;
});
