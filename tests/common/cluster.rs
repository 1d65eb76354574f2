//! Shared by the Redis Cluster fault and fence tests: the test kit's Cluster started off the
//! async runtime, managers on it, where a lock's keys live (their hash tag and slot, computed as
//! zklock and Redis compute them, checked against the servers), and the recorded holds and
//! checks of the fault scenarios.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::task::JoinHandle;
use zklock::{LockGuard, LockManager, LossReason};
use zklock_testkit::{HoldEnd, HoldSpan, Mode, Recorder, RedisCluster, Report};

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

/// `m` locks `key` for the worker `rec` within `within`, recorded.
pub async fn hold(m: &LockManager, key: &str, rec: &Recorder, within: Duration) -> LockGuard {
    rec.acquire_invoked(key, Mode::Exclusive);
    let guard = tokio::time::timeout(within, m.lock(key))
        .await
        .expect("granted in time")
        .expect("granted");
    rec.acquire_ok(key, Mode::Exclusive, guard.fencing_token().as_u128());
    guard
}

/// Releases `guard`, recorded: `Ok` when the release says the hold was still there.
pub async fn release(guard: LockGuard, key: &str, rec: &Recorder) -> zklock::Result<()> {
    rec.release_invoked(key);
    let result = guard.release().await;
    match &result {
        Ok(()) => rec.release_ok(key),
        Err(e) => rec.release_failed(key, e),
    }
    result
}

/// A hold kept until it is reported lost: the loss is recorded, then the release (which must
/// say the hold was lost). Answers the reason.
pub fn kept_until_lost(guard: LockGuard, key: String, rec: Recorder) -> JoinHandle<LossReason> {
    tokio::spawn(async move {
        let reason = guard.lost().await;
        rec.lost(&key, reason);
        assert!(
            release(guard, &key, &rec).await.is_err(),
            "releasing a lost hold says so"
        );
        reason
    })
}

/// Every key's holds, from the report.
pub fn holds_by_key(report: &Report) -> BTreeMap<&str, Vec<&HoldSpan>> {
    let mut by_key: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for h in &report.holds {
        by_key.entry(h.key.as_str()).or_default().push(h);
    }
    by_key
}

/// Every grant of a key after `fault_ns` has a token above every token of that key granted
/// before. Answers the keys granted on both sides.
pub fn assert_tokens_above_across(report: &Report, fault_ns: u64) -> Vec<String> {
    let mut keys = Vec::new();
    for (key, holds) in holds_by_key(report) {
        let before = holds
            .iter()
            .filter(|h| h.start_ns < fault_ns)
            .map(|h| h.token)
            .max();
        let after = holds
            .iter()
            .filter(|h| h.start_ns > fault_ns)
            .map(|h| h.token)
            .min();
        if let (Some(before), Some(after)) = (before, after) {
            keys.push(key.to_string());
            assert!(
                after > before,
                "{key}: a grant after the fault has token {after}, not above {before} granted \
                 before:\n{report}"
            );
        }
    }
    keys
}

/// The holds going on at `fault_ns` that ended by a loss, each reason counted.
pub fn losses_across(report: &Report, fault_ns: u64) -> BTreeMap<String, usize> {
    let mut lost = BTreeMap::new();
    for h in &report.holds {
        if h.start_ns < fault_ns && h.end_ns.is_some_and(|e| e > fault_ns) {
            if let HoldEnd::Lost(reason) = &h.end {
                *lost.entry(reason_name(reason)).or_default() += 1;
            }
        }
    }
    lost
}

/// The name of the loss reason whose text is `text` (as the history records it).
pub fn reason_name(text: &str) -> String {
    [
        LossReason::SessionExpired,
        LossReason::Disconnected,
        LossReason::NodeDeleted,
        LossReason::LeaseExpired,
        LossReason::Revoked,
        LossReason::Closed,
        LossReason::HoldLimit,
        LossReason::Failover,
    ]
    .into_iter()
    .find(|r| r.to_string() == text)
    .map_or_else(|| text.to_string(), |r| format!("{r:?}"))
}
