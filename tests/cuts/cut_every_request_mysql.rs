//! The adversary made systematic on MySQL / MariaDB: every protocol the backend has — mutex
//! acquire and release, the hand-over to a waiter of another process (the victim waits in the
//! server's queue, blocked in `GET_LOCK`), the same wait abandoned at its deadline (its session
//! killed from a sibling), a job's claim with its `at_least` window, a leader's election, and
//! the mutex and the hand-over of a victim without fencing tokens (whose grants write nothing)
//! — run once per request boundary k, cut there, and judged by the history checker.
//! (Read/write locks and semaphores answer `Unsupported` on MySQL: not here.)
//!
//! A victim process (a manager whose every session goes through a [`Relay`], as its own
//! account, `zklock_victim`, so that the server's process list tells its sessions apart) runs
//! the protocol: take, hold a moment (stopping at once when told the hold is lost), release.
//! The relay lets the server receive the victim's k-th request and withholds the answer, then
//! resets that connection (`Reset`), resets it and cuts the victim off while its future is
//! dropped (`Cancel`), or cuts the victim off for good without a reset (`Kill`, a partition: only
//! the sessions' `wait_timeout`, the lease, ends them on the server).
//!
//! Then another process takes the same lock, within the lease (plus its own retries) of the
//! cut. The checker decides: no two believed holders at any moment, tokens strictly increasing
//! in grant order. And nothing stuck: no session holds or waits for the lock once the victim is
//! gone or done, and after `Kill` no session of the victim is left at all.
//!
//! `ZKLOCK_CUTS=all cargo test --test cuts -- cut_every_request_mysql::` runs every kind of cut
//! at every k.

use crate::common;
use crate::cuts;

use std::sync::Arc;
use std::time::Duration;

use common::MYSQL_LEASE;
use cuts::{sweep_through_relay, LeaseServer, Protocol};
use zklock::LockManager;
use zklock_testkit::{MariaDbServer, Relay};

/// The victim's own account, so that its sessions show apart in the process list.
const VICTIM: &str = "zklock_victim";

/// The test kit's MariaDB.
struct My {
    server: MariaDbServer,
}

impl My {
    /// `sql` as the server's root, its output trimmed.
    fn sql(&self, sql: &str) -> String {
        tokio::task::block_in_place(|| self.server.root_sql(sql)).expect("run SQL on MariaDB")
    }

    /// The sessions that hold, and wait in `GET_LOCK` for, the user lock of the lock at `path`.
    fn sessions(&self, path: &str) -> (Option<String>, Vec<String>) {
        let name = zklock::mysql_lock_name(path);
        let holder = self.sql(&format!("SELECT IS_USED_LOCK('{name}')"));
        let holder = (holder != "NULL").then_some(holder);
        let waiters = self
            .sql(&format!(
                "SELECT ID, USER FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' \
                 AND INFO LIKE 'SELECT GET_LOCK(''{name}'',%'"
            ))
            .lines()
            .filter(|l| holder.as_deref() != l.split('\t').next())
            .map(str::to_string)
            .collect();
        (holder, waiters)
    }
}

impl LeaseServer for My {
    /// The server ends a holding session idle this long.
    const LEASE: Duration = MYSQL_LEASE;

    fn url(&self) -> String {
        self.server.url()
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.server.port())
    }

    fn lock_path(&self, m: &LockManager, _: Protocol, key: &str) -> String {
        m.path_of(key).unwrap()
    }

    /// A session waits in `GET_LOCK` for the lock.
    async fn waiting(&self, path: &str) -> bool {
        !self.sessions(path).1.is_empty()
    }

    async fn window(&self, path: &str) -> Option<i64> {
        let name = zklock::mysql_lock_name(path);
        self.sql(&format!(
            "SELECT run_until_us FROM zklock.zklock_locks WHERE name = '{name}' \
             AND run_until_us > 0"
        ))
        .parse()
        .ok()
    }

    /// The session that holds the lock and those that wait for it.
    async fn left(&self, path: &str) -> Vec<String> {
        let (holder, waiters) = self.sessions(path);
        holder
            .map(|h| format!("held by session {h}"))
            .into_iter()
            .chain(waiters.into_iter().map(|w| format!("waited for by {w}")))
            .collect()
    }

    /// Every session of the victim's account (the victim alone uses it).
    async fn sessions_left(&self, _identity: &str) -> Vec<String> {
        self.sql(&format!(
            "SELECT ID, COMMAND, STATE, INFO FROM information_schema.PROCESSLIST \
             WHERE USER = '{VICTIM}'"
        ))
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// Through a relay, as the victim's own account.
    async fn victim_route(&self) -> (Arc<Vec<Relay>>, String) {
        let relay = Relay::start(&self.addr()).unwrap();
        let url =
            relay
                .url(&self.url())
                .replacen("zklock:zklock@", &format!("{VICTIM}:zklock@"), 1);
        (Arc::new(vec![relay]), url)
    }
}

/// Sweeps `protocol` on a server of its own, with the victim's account made.
///
/// A session cut off right after its handshake, before its first statement, keeps the
/// server's own `wait_timeout` (zklock sets the lease as the session's with that first
/// statement; MySQL has no way to set it in the handshake, as PostgreSQL's startup options
/// do). It holds nothing, but lingers: the server here bounds such sessions at two leases, as
/// an operator would with `wait_timeout` in the server's configuration. zklock's own sessions
/// are held to one lease by zklock (see `mysql_backend::a_partitioned_holder_is_freed_by_the_server`).
async fn sweep_mysql(protocol: Protocol, offset: usize) {
    let server = MariaDbServer::start().expect("start MariaDB (test kit)");
    let my = My { server };
    let global = (MYSQL_LEASE * 2).as_secs();
    my.sql(&format!("SET GLOBAL wait_timeout = {global}"));
    for host in ["127.0.0.1", "localhost"] {
        my.sql(&format!(
            "CREATE USER '{VICTIM}'@'{host}' IDENTIFIED BY 'zklock'; \
             GRANT ALL ON zklock.* TO '{VICTIM}'@'{host}'"
        ));
    }
    sweep_through_relay(&my, protocol, offset).await;
}

cuts::sweep_tests!(sweep_mysql {
    mutex_cut_at_every_request: Mutex, 0;
    handover_cut_at_every_request: Handover, 1;
    abandoned_wait_cut_at_every_request: Abandon, 0;
    job_cut_at_every_request: Job, 1;
    leader_cut_at_every_request: Leader, 2;
    untokened_mutex_cut_at_every_request: Untokened, 1;
    untokened_handover_cut_at_every_request: UntokenedHandover, 2;
});
