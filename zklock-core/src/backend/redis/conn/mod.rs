//! The Redis backend's connections, and what the backend's parts share about them ([`Inner`]).
//!
//! - `links.rs`: the command connections ([`Conn`]): one multiplexed connection per server,
//!   replaced when it breaks.
//! - `servers.rs`: where connections go: the one server, the Sentinels' primary, a Cluster node.
//! - `dial.rs`: how every connection is opened (TCP or a Unix socket, TLS).
//! - `role.rs`: what kind of server a `redis://` URL reaches, asked at connect.
//! - `sentinel/`: Redis under Sentinel (`failover.rs`: the watch for its failovers).
//! - `cluster.rs`: Redis Cluster's slot map.
//! - `breaks.rs`: the count of connection breaks (and failovers) holds are confirmed against.
//! - `hub/`: the pub/sub connections that wake waiters (`task.rs`: the task that owns them).
//! - `lease.rs`: a hold's lease as this process knows it.
//! - `watchdog.rs`: the one task that renews every hold's lease.

pub(super) mod breaks;
pub(super) mod cluster;
pub(super) mod dial;
pub(super) mod hub;
pub(super) mod lease;
mod links;
pub(super) mod role;
pub(super) mod sentinel;
pub(super) mod servers;
pub(super) mod watchdog;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::options;
use super::wire::keys;
use crate::backend::undos::Undos;
use crate::background::Background;
use breaks::Breaks;
use hub::Hub;
pub(super) use links::Conn;

/// The longest a queued mutex waiter stays in the queue without refreshing its liveness.
const MAX_WAITER_TTL: Duration = Duration::from_secs(1);

/// How long a queued mutex waiter stays alive in the queue without an attempt: lease/3, at
/// most [`MAX_WAITER_TTL`]. A waiter attempts again every third of it, so a crashed or cut-off
/// waiter holds up the processes behind it for at most about 4/3 of it.
pub(super) fn waiter_ttl(lease: Duration) -> Duration {
    (lease / 3).min(MAX_WAITER_TTL)
}

/// What the backend's holds and tasks share.
pub(crate) struct Inner {
    pub(super) conn: Conn,
    /// The epoch of this backend's connections: a hold is held only while no connection broke
    /// since its last confirmation (see [`Breaks`]).
    pub(super) breaks: Breaks,
    pub(super) hub: Hub,
    pub(super) lease: Duration,
    /// See [`RedisConfig::tokens`](super::RedisConfig::tokens).
    pub(super) tokens: bool,
    /// See [`RedisConfig::acks`](super::RedisConfig::acks).
    pub(super) acks: Option<options::Acks>,
    /// Taken off every deadline; see [`margin`](Self::margin).
    pub(super) margin: Duration,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) background: Arc<Background>,
    /// Holder ids: `<uuid> host=<host> pid=<pid> hub=<hub id>[ id=<identity>]`.
    pub(super) ids: keys::HolderIds,
    /// The keys of the paths acquired lately.
    pub(super) keys: keys::KeysCache,
    /// See [`waiter_ttl`].
    pub(super) waiter_ttl: Duration,
    /// Renews every hold's lease.
    pub(super) watchdog: watchdog::Watchdog,
    /// Undos of dropped acquires under way, per lock (its exclusive key's name): a later
    /// acquire of the lock in this process waits for them, so that it never finds what an
    /// acquire it gave up on left (a place in a mutex's queue, a hand-over to it, an intent).
    pub(super) undos: Arc<Undos>,
    /// Ends the Sentinel watch (see [`sentinel::watch`]) when the backend goes: dropped with
    /// it.
    pub(super) _sentinel_stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Inner {
    /// A fresh holder id: `<uuid-v4> host=<host> pid=<pid> hub=<hub id>[ id=<identity>]`,
    /// what the keys hold (`GET zklock:lock:<path>` shows who holds it). The hub id names the
    /// channel on which a first waiter tells the holder's process it wants the lock.
    pub(super) fn new_id(&self) -> String {
        self.ids.next()
    }

    /// Whether the writes sent so far on `c` are on enough replicas: always without
    /// [`RedisOptions::replica_acks`](super::RedisOptions::replica_acks); else `WAIT replicas timeout` on the same connection.
    /// `Ok(false)` with how many acknowledged in time.
    pub(super) async fn acked(
        acks: Option<options::Acks>,
        c: &mut redis::aio::MultiplexedConnection,
    ) -> redis::RedisResult<std::result::Result<(), i64>> {
        let Some(acks) = acks else { return Ok(Ok(())) };
        let n: i64 = redis::cmd("WAIT")
            .arg(acks.replicas)
            .arg(acks.timeout.as_millis().max(1) as u64)
            .query_async(c)
            .await?;
        Ok(if n >= i64::from(acks.replicas) {
            Ok(())
        } else {
            Err(n)
        })
    }

    /// How long a request that may wait for replicas' acknowledgements may take.
    pub(super) fn write_timeout(&self) -> Duration {
        self.conn.reply_timeout + self.acks.map_or(Duration::ZERO, |a| a.timeout)
    }

    pub(super) fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }

    /// How long before the lease could run out on the server a hold is reported lost: 1% of
    /// the lease + 2 ms for clock drift between this host and the server (Redlock's
    /// allowance), and 5% for this process to notice the loss and stop its critical section
    /// before the next holder starts (timers fire late on a busy machine).
    pub(super) fn margin(lease: Duration) -> Duration {
        lease / 100 + Duration::from_millis(2) + lease / 20
    }

    /// When a lease granted or renewed by a request sent at `sent` is reported lost unless
    /// renewed again: the server lets it go at `sent + lease` at the earliest.
    pub(super) fn deadline(&self, sent: Instant) -> Instant {
        sent + self.lease - self.margin
    }

    /// [`deadline`](Self::deadline) for a lease of `lease` (a hand-over's short first lease).
    pub(super) fn deadline_for(sent: Instant, lease: Duration) -> Instant {
        sent + lease - Self::margin(lease)
    }
}
