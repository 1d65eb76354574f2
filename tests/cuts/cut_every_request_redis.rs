//! The adversary made systematic on Redis: every protocol — mutex acquire and release, the
//! FIFO hand-over to a waiter of another process, read and write locks, a semaphore lease, a
//! job's claim with its `at_least` window, a leader's election, and the mutex and the
//! hand-over of a victim without fencing tokens (a bare `SET NX PX` first) — run once per
//! request boundary k, cut there, and judged by the history checker.
//!
//! A victim process (a manager whose every connection, commands and pub/sub, goes through the
//! test kit's [`Relay`]) runs the protocol: take, hold a moment (stopping at once when told the
//! hold is lost), release. The relay lets the server receive the victim's k-th request (a chunk
//! of bytes the client wrote, counted over all its connections) and withholds the answer, then
//! - `Reset`: resets that connection (the client reconnects at once and carries on; a break of
//!   a connection is the loss of every hold granted before it);
//! - `Cancel`: resets it and cuts the victim off, and the victim's future is dropped while it
//!   waits; the network comes back after;
//! - `Kill`: cuts the victim off for good without a reset, as a partition or a dead host: the
//!   server hears nothing, and only the lease ends the victim's hold. The victim lives on, cut
//!   off, and holds until it is told its hold is lost, while the other process waits; then it
//!   is killed.
//!
//! Then another process takes the same lock. The checker decides: no two believed holders at
//! any moment (a hold counts from its grant to its release or its reported loss), tokens
//! strictly increasing in grant order; nothing stuck (the other process gets the lock within
//! the lease of the cut, and no holder key of the lock is left once everyone let go or its lease
//! ran out); a job's window never shrinks and at most one body runs within it.
//!
//! k runs over every request the protocol sends (counted on an uncut run). In CI each k gets
//! one kind of cut, rotating, and the last k also `Kill`;
//! `ZKLOCK_CUTS=all cargo test --test cuts -- cut_every_request_redis::` runs every kind at
//! every k.

use crate::cuts;

use std::time::Duration;

use cuts::{sweep_through_relay, LeaseServer, Protocol};
use zklock::LockManager;
use zklock_testkit::RedisServer;

/// A plain connection for looking at the server.
async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .expect("connect to the test Redis")
}

/// The lock path of `key` in `protocol` (where its holder keys live).
fn lock_path(m: &LockManager, protocol: Protocol, key: &str) -> String {
    match protocol {
        Protocol::Read | Protocol::Write => m.rwlock(key).unwrap().path().to_string(),
        Protocol::Semaphore => format!("{}/%SEM/{key}", m.namespace()),
        Protocol::Leader => m.leader_latch(key, "look").unwrap().path().to_string(),
        _ => m.path_of(key).unwrap(),
    }
}

/// The holder keys (exclusive, shared, a writer's intent) of the lock at `path` that exist.
async fn holder_keys(admin: &mut redis::aio::MultiplexedConnection, path: &str) -> Vec<String> {
    let mut left = vec![];
    for kind in ["lock", "shared", "intent"] {
        // A semaphore's leases and its gate share the semaphore's path on Redis.
        let name = format!("zklock:{kind}:{path}");
        let exists: bool = redis::cmd("EXISTS")
            .arg(&name)
            .query_async(admin)
            .await
            .unwrap();
        if exists {
            left.push(name);
        }
    }
    left
}

/// A job's recorded window end (server ms), if any.
async fn run_after(admin: &mut redis::aio::MultiplexedConnection, path: &str) -> Option<i64> {
    redis::cmd("GET")
        .arg(format!("zklock:run:{path}"))
        .query_async::<Option<i64>>(admin)
        .await
        .unwrap()
}

/// The test kit's Redis, and a plain connection to look at it.
struct Redis {
    server: RedisServer,
    admin: redis::aio::MultiplexedConnection,
}

impl LeaseServer for Redis {
    const LEASE: Duration = Duration::from_secs(2);

    fn url(&self) -> String {
        self.server.url()
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.server.port())
    }

    fn lock_path(&self, m: &LockManager, protocol: Protocol, key: &str) -> String {
        lock_path(m, protocol, key)
    }

    /// The mutex's queue of waiting processes is not empty.
    async fn waiting(&self, path: &str) -> bool {
        let queued: i64 = redis::cmd("ZCARD")
            .arg(format!("zklock:queue:{path}"))
            .query_async(&mut self.admin.clone())
            .await
            .unwrap();
        queued > 0
    }

    async fn window(&self, path: &str) -> Option<i64> {
        run_after(&mut self.admin.clone(), path).await
    }

    async fn left(&self, path: &str) -> Vec<String> {
        holder_keys(&mut self.admin.clone(), path).await
    }

    /// Redis keeps no session of a client that went silent: its lease is what ends.
    async fn sessions_left(&self, _: &str) -> Vec<String> {
        vec![]
    }
}

/// Sweeps `protocol` on a server of its own.
async fn sweep_redis(protocol: Protocol, offset: usize) {
    let server = RedisServer::start().expect("start redis-server (see the test kit's error)");
    let redis = Redis {
        admin: admin(&server.url()).await,
        server,
    };
    sweep_through_relay(&redis, protocol, offset).await;
}

cuts::sweep_tests!(sweep_redis {
    mutex_cut_at_every_request: Mutex, 0;
    handover_cut_at_every_request: Handover, 1;
    read_lock_cut_at_every_request: Read, 2;
    write_lock_cut_at_every_request: Write, 0;
    semaphore_cut_at_every_request: Semaphore, 1;
    job_cut_at_every_request: Job, 2;
    leader_cut_at_every_request: Leader, 0;
    untokened_mutex_cut_at_every_request: Untokened, 1;
    untokened_handover_cut_at_every_request: UntokenedHandover, 2;
});
