//! The adversary made systematic on Redis Cluster: the same protocols as on one Redis server —
//! mutex acquire and release, the FIFO hand-over to a waiter of another process, read and write
//! locks, a semaphore lease, a job's claim with its `at_least` window, a leader's election, and
//! the mutex and the hand-over of a victim without fencing tokens — run once per request
//! boundary k, cut there, and judged by the history checker, on a Cluster of 3 primaries
//! (`redis+cluster://`, every key of a lock in one slot by its hash tag).
//!
//! A Cluster client goes where the nodes say (`CLUSTER SLOTS` names each primary's announced
//! address), so the victim is routed through the test kit's relays by the nodes themselves: a
//! relay in front of each primary, all started beside each other (one count of the victim's
//! requests over every node it talks to, one cut, one partition: see
//! [`Relay::start_beside`](zklock_testkit::Relay::start_beside)), and each primary announcing
//! its relay's port (`CONFIG SET cluster-announce-port`; the cluster bus has a port of its own,
//! `cluster-port`, and stays direct). Each run:
//! 1. the nodes announce their own ports; the other process connects (it learns the direct
//!    addresses, and keeps them: it never loses a connection, so never asks again);
//! 2. the primaries announce their relays, and once every node's `CLUSTER SLOTS` says so, the
//!    victim connects through the relays (its seeds are the relays too): everything it sends
//!    from then on, to any node, a new connection after a reset and its `CLUSTER SLOTS` after a
//!    broken connection included, goes through a relay and counts;
//! 3. the run is judged as on one server (see `cut_every_request_redis.rs`: `Reset`, `Cancel`,
//!    `Kill`; the other process takes the lock after; no two believed holders, tokens
//!    increasing; nothing stuck, nothing left; a job's window never shrinks);
//! 4. the nodes announce their own ports again (a killed victim's relays stay partitioned, so
//!    what is left of it never learns them).
//!
//! The checker reads every node directly (the test kit's `command`).
//!
//! k runs over every request the protocol sends (counted on an uncut run). In CI each k gets
//! one kind of cut, rotating, and the last k also `Kill`;
//! `ZKLOCK_CUTS=all cargo test --test cuts -- cut_every_request_redis_cluster::` runs every kind at
//! every k.

use crate::cluster;
use crate::cuts;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{blocking, start_cluster, tag};
use cuts::{sweep_through_relay, LeaseServer, Protocol};
use zklock::LockManager;
use zklock_testkit::{RedisCluster, RedisReply, Relay};

/// The lock path of `key` in `protocol` (where its holder keys live).
fn lock_path(m: &LockManager, protocol: Protocol, key: &str) -> String {
    match protocol {
        Protocol::Read | Protocol::Write => m.rwlock(key).unwrap().path().to_string(),
        Protocol::Semaphore => format!("{}/%SEM/{key}", m.namespace()),
        Protocol::Leader => m.leader_latch(key, "look").unwrap().path().to_string(),
        _ => m.path_of(key).unwrap(),
    }
}

/// The key of kind `kind` of the lock at `path`, as zklock names it on a Cluster.
fn key_of(kind: &str, path: &str) -> String {
    format!("zklock:{kind}:{}{path}", tag(path))
}

/// The test kit's Cluster, its primaries, and which primary serves each lock path seen.
struct Cluster {
    cluster: RedisCluster,
    primaries: Vec<usize>,
    owners: Mutex<HashMap<String, usize>>,
}

impl Cluster {
    /// Each primary announces `port(primary)` (0: its own), and every node's `CLUSTER SLOTS`
    /// names those ports before this returns (see [`cluster::announce`]).
    fn announce(&self, port: impl Fn(usize) -> u16) {
        cluster::announce(&self.cluster, port);
    }

    /// The primary that serves the lock at `path`.
    fn owner(&self, path: &str) -> usize {
        let mut owners = self.owners.lock().unwrap();
        if let Some(&owner) = owners.get(path) {
            return owner;
        }
        let owner = blocking(|| self.cluster.node_for_key(&key_of("lock", path)))
            .expect("the primary of the lock's slot");
        owners.insert(path.to_string(), owner);
        owner
    }

    /// A command to the primary of the lock at `path`.
    fn command(&self, path: &str, args: &[&str]) -> RedisReply {
        let owner = self.owner(path);
        blocking(|| self.cluster.command(owner, args))
            .unwrap_or_else(|e| panic!("{args:?} on node {owner}: {e}"))
    }
}

impl LeaseServer for Cluster {
    const LEASE: Duration = Duration::from_secs(2);

    /// Every node, from the first: the other process connects with it, directly.
    fn url(&self) -> String {
        cluster::cluster_url(&self.cluster, 0)
    }

    fn addr(&self) -> String {
        self.cluster.addr(self.primaries[0])
    }

    fn lock_path(&self, m: &LockManager, protocol: Protocol, key: &str) -> String {
        lock_path(m, protocol, key)
    }

    /// The mutex's queue of waiting processes is not empty.
    async fn waiting(&self, path: &str) -> bool {
        let queued = self.command(path, &["ZCARD", &key_of("queue", path)]);
        queued.int().unwrap() > 0
    }

    async fn window(&self, path: &str) -> Option<i64> {
        self.command(path, &["GET", &key_of("run", path)])
            .text()
            .map(|ms| ms.parse().expect("a job's window end, in ms"))
    }

    /// The holder keys (exclusive, shared, a writer's intent) of the lock at `path` that exist.
    async fn left(&self, path: &str) -> Vec<String> {
        ["lock", "shared", "intent"]
            .iter()
            .map(|kind| key_of(kind, path))
            .filter(|name| self.command(path, &["EXISTS", name]).int() == Some(1))
            .collect()
    }

    /// Redis keeps no session of a client that went silent: its lease is what ends.
    async fn sessions_left(&self, _: &str) -> Vec<String> {
        vec![]
    }

    /// A relay in front of each primary, beside each other, announced by its primary; the
    /// victim's seeds are the relays.
    async fn victim_route(&self) -> (Arc<Vec<Relay>>, String) {
        let mut relays: Vec<Relay> = Vec::new();
        let mut ports = HashMap::new();
        for &p in &self.primaries {
            let upstream = self.cluster.addr(p);
            let relay = match relays.first() {
                None => Relay::start(&upstream),
                Some(first) => first.start_beside(&upstream),
            }
            .expect("start a relay");
            ports.insert(p, relay.port());
            relays.push(relay);
        }
        self.announce(|p| ports[&p]);
        let seeds: Vec<String> = relays.iter().map(|r| r.addr().to_string()).collect();
        let url = format!("redis+cluster://{}", seeds.join(","));
        (Arc::new(relays), url)
    }

    /// The primaries announce their own ports again.
    async fn victim_gone(&self) {
        self.announce(|_| 0);
    }
}

/// Sweeps `protocol` on a Cluster of its own (3 primaries, no replicas: no failover here).
async fn sweep_cluster(protocol: Protocol, offset: usize) {
    let cluster = start_cluster(0, 1000);
    let primaries = blocking(|| cluster.primaries()).expect("the Cluster's primaries");
    let cluster = Cluster {
        cluster,
        primaries,
        owners: Mutex::default(),
    };
    sweep_through_relay(&cluster, protocol, offset).await;
}

cuts::sweep_tests!(sweep_cluster {
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
