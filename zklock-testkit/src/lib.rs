//! Real ZooKeeper for zklock's tests: the project's Curator `TestingServer` and `TestingCluster`.
//!
//! - [`ZkServer`]: one standalone server on a free loopback port with a temporary data directory; stop,
//!   restart (same port, same data), pause (SIGSTOP) and resume (SIGCONT) it.
//! - [`ZkCluster`]: an ensemble (3 members is typical) on loopback; find the leader, stop, restart, pause
//!   and resume members, wait for a quorum.
//! - [`CuratorHold`]: an Apache Curator client holding a lock, to prove interoperability.
//! - [`KazooPeer`]: a kazoo (Python) client taking and releasing locks on command, the same for kazoo.
//! - [`Proxy`]: a fault-injecting TCP proxy between a client and a server that understands ZooKeeper's
//!   framing: partitions (blackhole), resets, delays, and the lost reply to the Nth create.
//! - [`Relay`]: its protocol-blind counterpart for Redis and PostgreSQL: the same faults, and the
//!   adversary's cut after the Nth request (the server acts, the client never hears the answer).
//! - [`Delay`]: network distance on loopback: a relay that delays each direction of every
//!   connection by half a round trip, precisely (0.5 ms is fine), and counts the round trips it
//!   carries; the bench's `--rtt`.
//! - [`History`]: what lock workers did (acquire, grant with fencing token, release, loss), and
//!   [`check`] to find two holders at once, tokens that do not increase, and holds that never end.
//! - TLS: [`Certs`] mints a private CA and certificates in-process (good, wrong name, expired,
//!   a client's, another CA's client), and the servers serve TLS with them:
//!   [`RedisServerBuilder::tls`] (`rediss://`), [`RedisSentinelBuilder::tls`] and
//!   [`RedisClusterBuilder::tls`] (`rediss+sentinel://`, `rediss+cluster://`: every node and
//!   Sentinel TLS-only, replication and the cluster bus over TLS too),
//!   [`PostgresServerBuilder::tls`] (`ssl = on`,
//!   plaintext TCP refused), [`EtcdServerBuilder::tls`] and [`EtcdClusterBuilder::tls`]
//!   (`etcds://`, `https://` client URLs) and [`ZkServerBuilder::tls_with`] (the secure port),
//!   each asking for client certificates or not ([`ClientAuth`]) and presenting the
//!   certificate a test picks ([`ServerCert`]). [`ZkServerBuilder::tls`] alone serves a
//!   `secureClientPort` with a throwaway `keytool` certificate.
//! - [`RedisServer`]: Debian's `redis-server` on a free loopback port with a throwaway directory, for
//!   the Redis backend and the inventory demo; stop, restart, pause and resume it.
//! - [`PostgresServer`]: Debian's `postgresql` on a free loopback port with a throwaway data
//!   directory, run as an unprivileged user; stop (as in a crash), restart, pause and resume it.
//! - [`MariaDbServer`]: Debian's `mariadb-server` on a free loopback port with a throwaway data
//!   directory, run as an unprivileged user, with a `zklock` database, a `zklock` account and a
//!   narrow `zklock_narrow` one; stop (as in a crash), restart, pause and resume it, end a session.
//! - [`EtcdServer`] and [`EtcdCluster`]: Debian's `etcd` (3.4) on free loopback ports with
//!   throwaway data, one member or a cluster (3 is typical); find the leader, kill, restart, pause
//!   and resume members, run `etcdctl` against them.
//! - [`RedisSentinel`]: a Redis primary with 2 replicas and 3 Sentinels (Debian's
//!   `redis-sentinel`) on loopback, with short timeouts; ask the Sentinels for the primary, kill
//!   it or fail it over and wait for the new one, pause and resume nodes.
//! - [`RedisCluster`]: a Redis Cluster of 3 primaries with a replica each, made with
//!   `redis-cli --cluster create`; find the node serving a key, kill, pause and fail over nodes.
//!
//! Servers are Debian's ZooKeeper 3.8 (`/usr/share/java/zookeeper.jar`, installed on first use by
//! [`ensure_zookeeper_installed`]), each in its own small JVM launched directly (`QuorumPeerMain`), logging
//! to a file in its directory. Ports are claimed across processes, so tests may run in parallel in any
//! number of test binaries. Everything is synchronous and blocking: these are tools for tests.
//!
//! The peers (Curator and kazoo programs, run by [`CuratorHold`] and the bench) are this crate's own, in
//! `peers/` ([`peers_dir`]).
//!
//! Environment: `ZKLOCK_ZK_CLASSPATH` replaces the server's class path, `JAVA_HOME` picks the JVM.
//!
//! # Examples
//!
//! ```no_run
//! use zklock_testkit::ZkServer;
//!
//! let mut server = ZkServer::start()?;
//! let connect = server.connect_string();
//! // ... connect a client to `connect`, take locks ...
//! server.stop()?; // clients see connection loss
//! server.restart()?; // same port, same data
//! # let _ = connect;
//! # Ok::<(), std::io::Error>(())
//! ```

#![warn(missing_docs)]

mod certs;
mod clock;
mod cluster;
mod curator;
mod daemon;
mod delay;
mod env;
mod etcd;
mod fault_switch;
mod four_letter;
mod history;
mod install;
mod kazoo;
mod late_cancel;
mod listening;
mod mariadb;
mod member;
mod ports;
mod postgres;
mod process;
mod proxy;
mod redis;
mod redis_ha;
mod relay;
mod server;
mod tls;
mod tls_probe;
mod workdir;

pub use certs::{Certs, ClientAuth, ServerCert};
pub use clock::ServerClock;
pub use cluster::{ZkCluster, ZkClusterBuilder};
pub use curator::CuratorHold;
pub use delay::{Delay, DelayStats};
pub use env::{now_epoch_ms, peers_dir};
pub use etcd::{EtcdCluster, EtcdClusterBuilder, EtcdServer, EtcdServerBuilder};
pub use history::{
    check, epoch_ms_to_ns, now_ns, Event, History, HoldEnd, HoldSpan, JobRun, Mode, Op, Overlap,
    Recorder, Report, Violation, JOB_WINDOW_TOLERANCE, NO_TOKEN,
};
pub use install::ensure_zookeeper_installed;
pub use kazoo::{KazooEvent, KazooPeer};
pub use late_cancel::{LateCancel, LateCancelStats};
pub use mariadb::{MariaDbServer, MariaDbServerBuilder};
pub use postgres::{BaseBackup, PostgresServer, PostgresServerBuilder};
pub use proxy::{AfterDrop, Proxy, ProxyStats, CREATE_OPCODES};
pub use redis::{RedisServer, RedisServerBuilder};
pub use redis_ha::{
    RedisCluster, RedisClusterBuilder, RedisReply, RedisSentinel, RedisSentinelBuilder,
};
pub use relay::{After, Relay, RelayStats};
pub use server::{ZkServer, ZkServerBuilder};

#[cfg(test)]
mod tests {
    #[test]
    fn bounds() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<crate::ZkServer>();
        send_sync::<crate::RedisServer>();
        send_sync::<crate::PostgresServer>();
        send_sync::<crate::Certs>();
        send_sync::<crate::RedisServerBuilder>();
        send_sync::<crate::PostgresServerBuilder>();
        send_sync::<crate::MariaDbServer>();
        send_sync::<crate::MariaDbServerBuilder>();
        send_sync::<crate::EtcdServer>();
        send_sync::<crate::EtcdServerBuilder>();
        send_sync::<crate::ZkCluster>();
        send_sync::<crate::ZkServerBuilder>();
        send_sync::<crate::ZkClusterBuilder>();
        send::<crate::CuratorHold>();
        send::<crate::KazooPeer>();
        send_sync::<crate::Proxy>();
        send_sync::<crate::Relay>();
        send_sync::<crate::Delay>();
        send_sync::<crate::History>();
        send_sync::<crate::Recorder>();
    }
}
