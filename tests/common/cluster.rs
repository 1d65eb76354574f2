//! Shared by the Redis Cluster fault and fence tests: the test kit's Cluster started off the
//! async runtime, managers on it, where a lock's keys live (their hash tag and slot, computed as
//! zklock and Redis compute them, checked against the servers), and one client routed through
//! the test kit's relays (each primary announcing its relay's port). The fault tests' recorded
//! holds and checks are in `failover.rs`, shared with the Sentinel's.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use zklock::LockManager;
use zklock_testkit::{RedisCluster, RedisReply, Relay};

/// Runs blocking test-kit calls (they poll the nodes) without stalling the runtime.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A Cluster of 3 primaries with `replicas` replicas each, `cluster-node-timeout` of
/// `node_timeout_ms`.
pub fn start_cluster(replicas: usize, node_timeout_ms: u32) -> RedisCluster {
    blocking(|| {
        RedisCluster::builder()
            .replicas(replicas)
            .node_timeout(node_timeout_ms)
            .start()
    })
    .expect("start a Redis Cluster (test kit)")
}

/// The `redis+cluster://` URL listing every node, the first from the `first`-th on.
pub fn cluster_url(cluster: &RedisCluster, first: usize) -> String {
    let mut addrs = cluster.addrs();
    let n = addrs.len();
    addrs.rotate_left(first % n);
    format!("redis+cluster://{}", addrs.join(","))
}

/// A manager on the Cluster with `lease`.
pub async fn cluster_manager(url: &str, lease: Duration) -> LockManager {
    LockManager::builder(url)
        .redis(|r| r.lease(lease))
        .connect()
        .await
        .expect("connect to the Redis Cluster")
}

/// The hash tag zklock gives every key of `path` on a Cluster: FNV-1a 64 of the path, 16 hex
/// digits, in braces.
pub fn tag(path: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{{{h:016x}}}")
}

/// A key's hash slot as Redis Cluster computes it (CRC16/XMODEM of the hash tag, or of the key).
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &b in hashed {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// The Redis key of kind `kind` (`lock`, `fence`, `queue`, ...) of the lock `key` as `m` names
/// it on a Cluster: `zklock:<kind>:{<tag>}<path>`.
pub fn lock_key(m: &LockManager, kind: &str, key: &str) -> String {
    let path = m.path_of(key).expect("a valid key");
    format!("zklock:{kind}:{}{path}", tag(&path))
}

/// The slot of the lock `key`'s keys.
pub fn lock_slot(m: &LockManager, key: &str) -> u16 {
    slot(&lock_key(m, "lock", key))
}

/// `per` keys named `<prefix>-<n>` on each primary, in the primaries' order (the owner as the
/// Cluster says, checked against the slot computed here).
pub fn keys_per_primary(
    cluster: &RedisCluster,
    m: &LockManager,
    prefix: &str,
    per: usize,
) -> BTreeMap<usize, Vec<String>> {
    let primaries = cluster.primaries().unwrap();
    let mut found: BTreeMap<usize, Vec<String>> =
        primaries.iter().map(|&p| (p, Vec::new())).collect();
    for n in 0.. {
        if found.values().all(|v| v.len() >= per) {
            break;
        }
        assert!(n < 10_000, "no keys on every primary: {found:?}");
        let key = format!("{prefix}-{n}");
        let name = lock_key(m, "lock", &key);
        assert_eq!(cluster.slot(&name).unwrap(), slot(&name), "{name}");
        let owner = cluster.node_for_key(&name).unwrap();
        let keys = found.get_mut(&owner).expect("a primary");
        if keys.len() < per {
            keys.push(key);
        }
    }
    found
}

/// A key named `<prefix>-<n>` whose lock keys are in `slot`.
pub fn key_in_slot(m: &LockManager, prefix: &str, slot_wanted: u16) -> String {
    (0..2_000_000)
        .map(|n| format!("{prefix}-{n}"))
        .find(|k| lock_slot(m, k) == slot_wanted)
        .expect("a key in the slot")
}

/// The replica of primary `primary`.
pub fn replica_of(cluster: &RedisCluster, primary: usize) -> usize {
    cluster
        .replicas()
        .unwrap()
        .into_iter()
        .find(|&r| cluster.primary_of(r).unwrap() == Some(primary))
        .expect("a replica of the primary")
}

/// How long every node may take to learn the ports the primaries announce (gossip: a node
/// pings each other node at least every half `cluster-node-timeout`).
pub const ANNOUNCED_WITHIN: Duration = Duration::from_secs(10);

/// Node `i`'s own port.
pub fn port_of(cluster: &RedisCluster, i: usize) -> u16 {
    let addr = cluster.addr(i);
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

/// Node `i`'s cluster bus port.
pub fn bus_port_of(cluster: &RedisCluster, i: usize) -> String {
    let reply = cluster
        .command(i, &["CONFIG", "GET", "cluster-port"])
        .expect("CONFIG GET cluster-port");
    reply.array().and_then(|kv| kv.get(1)?.text()).unwrap()
}

/// The ports of the primaries that node `i`'s `CLUSTER SLOTS` names (`None`: it did not
/// answer).
pub fn primary_ports(cluster: &RedisCluster, i: usize) -> Option<BTreeSet<u16>> {
    let reply = cluster.command(i, &["CLUSTER", "SLOTS"]).ok()?;
    let mut ports = BTreeSet::new();
    for range in reply.array()? {
        let primary = range.array()?.get(2)?.array()?;
        let port = match primary.get(1)? {
            RedisReply::Int(p) => u16::try_from(*p).ok()?,
            _ => return None,
        };
        ports.insert(port);
    }
    Some(ports)
}

/// Each primary announces `port(primary)` (0: its own; `CONFIG SET cluster-announce-port`,
/// the cluster bus stays direct), and every node's `CLUSTER SLOTS` names those ports before
/// this returns (within [`ANNOUNCED_WITHIN`]). A client that asks for the slots from then on
/// goes to the announced ports; one that asked before keeps what it learned until it asks
/// again (after a failed connection or a `-MOVED`).
pub fn announce(cluster: &RedisCluster, port: impl Fn(usize) -> u16) {
    blocking(|| {
        let primaries = cluster.primaries().expect("the Cluster's primaries");
        let want: BTreeSet<u16> = primaries
            .iter()
            .map(|&p| match port(p) {
                0 => port_of(cluster, p),
                relay => relay,
            })
            .collect();
        for &p in &primaries {
            let announced = port(p).to_string();
            cluster
                .command(p, &["CONFIG", "SET", "cluster-announce-port", &announced])
                .expect("CONFIG SET cluster-announce-port");
        }
        // Every other node meets each primary again: the primary's answer carries the port it
        // announces now, and the node takes it at once (else it learns it from the primary's
        // next ping, within half a node timeout).
        for i in 0..cluster.len() {
            for &p in primaries.iter().filter(|&&p| p != i) {
                let (own, bus) = (port_of(cluster, p).to_string(), bus_port_of(cluster, p));
                cluster
                    .command(i, &["CLUSTER", "MEET", "127.0.0.1", &own, &bus])
                    .expect("CLUSTER MEET");
            }
        }
        let since = Instant::now();
        loop {
            let seen: Vec<_> = (0..cluster.len())
                .map(|i| primary_ports(cluster, i))
                .collect();
            // And the meetings are over: no node keeps a second entry of a primary.
            let meeting = (0..cluster.len()).any(|i| {
                let nodes = cluster.command(i, &["CLUSTER", "NODES"]);
                nodes.map_or(true, |n| n.text().unwrap_or_default().contains("handshake"))
            });
            if !meeting && seen.iter().all(|s| s.as_ref() == Some(&want)) {
                return;
            }
            assert!(
                since.elapsed() < ANNOUNCED_WITHIN,
                "the nodes do not all name the primaries at {want:?} within \
                 {ANNOUNCED_WITHIN:?}: {seen:?} (a meeting still going on: {meeting})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

/// A relay in front of each primary (each on its own: its faults and counts are its
/// primary's alone), each primary announcing its relay's port (see [`announce`]); the
/// primaries' relays, and the `redis+cluster://` URL whose seeds are the relays: a manager
/// connected with it from now on reaches every primary through its relay (its `CLUSTER SLOTS`
/// names the relays), while managers connected before keep the nodes' own ports. The replicas
/// follow their primary's announced port too (they replicate through the relay).
pub fn relayed_primaries(cluster: &RedisCluster) -> (BTreeMap<usize, Relay>, String) {
    let primaries = blocking(|| cluster.primaries()).expect("the Cluster's primaries");
    let relays: BTreeMap<usize, Relay> = primaries
        .iter()
        .map(|&p| (p, Relay::start(&cluster.addr(p)).expect("start a relay")))
        .collect();
    announce(cluster, |p| relays[&p].port());
    let seeds: Vec<String> = relays.values().map(|r| r.addr().to_string()).collect();
    (relays, format!("redis+cluster://{}", seeds.join(",")))
}
