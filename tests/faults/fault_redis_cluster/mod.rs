//! Faults of the Redis backend on Redis Cluster (`redis+cluster://`), against the test kit's
//! Cluster of 3 primaries with a replica each on loopback (`cluster-node-timeout` 1 s), under
//! contended load from several managers on keys spread over the primaries' slots, each judged by
//! the history checker (no two believed holders of a key at any moment, tokens strictly
//! increasing in grant order); where stale writes are the point, by the Redis fence on a plain
//! Redis of its own (it survives the lock store's failovers).
//!
//! a. A slot's primary killed (SIGKILL) mid-hold: its replica takes over after the node
//!    timeout; no two believed holders (nothing excused); every grant of a key after the kill
//!    has a token above every earlier one; the holds on the killed node are reported lost
//!    (`Failover` or `Disconnected`); holds on the other primaries are not reached by it
//!    (their renewals, refused with `-CLUSTERDOWN` until the promotion, are tried again until
//!    their deadline).
//! b. A manual failover (`CLUSTER FAILOVER` on the replica): the same, and the old holders are
//!    told `Failover` (the old primary answers `-MOVED`).
//! c. A primary frozen (SIGSTOP) past the node timeout, its replica promoted, then the old one
//!    woken. A holder whose grant the replica lacks (deleted on the promoted replica, as a write
//!    not replicated) cannot know: the overlap of believed holds is measured, reported, bounded
//!    by the lease, and every write of the old holder once the new holder wrote is refused by
//!    the fence. A holder whose grant was replicated is told before anyone else gets in.
//! d. A slot migrated (`CLUSTER SETSLOT IMPORTING/MIGRATING`, `MIGRATE`, `SETSLOT NODE`, the
//!    Redis Cluster docs' resharding steps) while a lock in it is held and another key of the
//!    slot is contended: no two believed holders during and after; the hold is reported lost
//!    as `Failover` (a `-MOVED` from the old owner once the slot is the target's); every
//!    acquire made during the migration is granted (after `-ASK` / `-TRYAGAIN`); after it, the
//!    keys of the slot are granted with larger tokens.
//! e. A primary partitioned from one manager (the victim, which reaches every primary through
//!    a relay its primary announces; the others connect directly, and the Cluster's bus stays
//!    whole, so the node stays primary): no two believed holders (nothing excused); the
//!    victim's hold on the partitioned node is reported lost before another manager is granted
//!    its key (once its lease ran out there); the others are granted keys on every primary
//!    all along and lose nothing; once healed, the victim locks that node's keys again with
//!    larger tokens; its hold on another primary is kept (a break reaches one node's holds).
//! f. A primary frozen (SIGSTOP) past the node timeout while managers with leases of 3, 4 and
//!    6 s (one without the local queue) contend on keys of every primary, some of their
//!    acquires cut short by a timeout of a few hundred ms; its replica promoted, then the old
//!    primary woken: no two believed holders (nothing excused), tokens above across the freeze.
//!
//! The tests take turns (one Cluster at a time): their timing (node timeout, leases) must not
//! depend on how busy two cores are with another test's nodes.
//!
//! One file per fault: `killed_primary` (a), `manual_failover` (b), `split_brain` (c),
//! `slot_migration` (d), `partition` (e), `frozen_primary` (f); this one holds the steps they
//! share (the managers, watched holds and what became of them, the grants recorded).

use crate::cluster;
use crate::common;
use crate::failover;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cluster::*;
use common::{eventually, say};
use failover::*;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use zklock::{LockGuard, LockManager, LossReason};
use zklock_testkit::{now_ns, History, HoldEnd, Op, Recorder, RedisCluster};

mod frozen_primary;
mod killed_primary;
mod manual_failover;
mod partition;
mod slot_migration;
mod split_brain;

/// The lease of the contending managers: renewed every second.
const LEASE: Duration = Duration::from_secs(3);
/// The bound of every wait for progress after a fault.
const PROGRESS: Duration = Duration::from_secs(30);
/// The Cluster's `cluster-node-timeout`.
const NODE_TIMEOUT_MS: u32 = 1000;

/// One Cluster at a time in this binary.
static TURNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn managers(cluster: &RedisCluster, n: usize, lease: Duration) -> Vec<(String, LockManager)> {
    let mut out = Vec::new();
    for i in 0..n {
        // Each lists the nodes from another one (as services configured each in its own way).
        let url = cluster_url(cluster, 2 * i);
        out.push((format!("m{i}"), cluster_manager(&url, lease).await));
    }
    out
}

/// A hold that is either reported lost (recorded; answers the reason) or, once told to end
/// (`end`), released (which must succeed: answers `None`).
fn watched(
    guard: LockGuard,
    key: String,
    rec: Recorder,
) -> (oneshot::Sender<()>, JoinHandle<Option<LossReason>>) {
    let (end, ended) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        tokio::select! {
            biased;
            reason = guard.lost() => {
                rec.lost(&key, reason);
                assert!(release(guard, &key, &rec).await.is_err(), "releasing a lost hold says so");
                Some(reason)
            }
            _ = ended => {
                release(guard, &key, &rec).await.expect("a hold never reported lost is released");
                None
            }
        }
    });
    (end, task)
}

/// Each manager `i` holds `on[i]`, watched.
async fn hold_each(
    managers: &[(String, LockManager)],
    on: &[String],
    history: &History,
    what: &str,
) -> Vec<(oneshot::Sender<()>, JoinHandle<Option<LossReason>>)> {
    let mut out = Vec::new();
    for ((name, m), key) in managers.iter().zip(on) {
        let rec = history.recorder(&format!("{name}/{what}"));
        let guard = hold(m, key, &rec, PROGRESS).await;
        out.push(watched(guard, key.clone(), rec));
    }
    out
}

/// What became of watched holds: each is lost (its reason) or, if not lost within `within`,
/// released.
async fn outcomes(
    holds: Vec<(oneshot::Sender<()>, JoinHandle<Option<LossReason>>)>,
    within: Duration,
) -> Vec<Option<LossReason>> {
    let deadline = tokio::time::Instant::now() + within;
    let mut out = Vec::new();
    for (end, mut task) in holds {
        let reason = match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(r) => r.unwrap(),
            Err(_) => {
                let _ = end.send(());
                task.await.unwrap()
            }
        };
        out.push(reason);
    }
    out
}

/// The grants of `key` recorded after `since_ns`.
fn grants_after(history: &History, key: &str, since_ns: u64) -> usize {
    history
        .events()
        .iter()
        .filter(|e| e.key == key && e.at_ns > since_ns && matches!(e.op, Op::AcquireOk { .. }))
        .count()
}

/// Waits until `key` is granted `n` times after `since_ns`; fails with what was recorded of
/// `key` since `from_ns`.
async fn until_granted(history: &History, key: &str, n: usize, since_ns: u64, from_ns: u64) {
    let deadline = tokio::time::Instant::now() + PROGRESS;
    while grants_after(history, key, since_ns) < n {
        if tokio::time::Instant::now() >= deadline {
            let seen: Vec<String> = history
                .events()
                .iter()
                .filter(|e| (e.key == key || e.key.is_empty()) && e.at_ns > from_ns)
                .map(|e| {
                    format!(
                        "{:.3} {} {:?}",
                        (e.at_ns - from_ns) as f64 / 1e9,
                        e.worker,
                        e.op
                    )
                })
                .collect();
            panic!(
                "{key} not granted {n} times within {PROGRESS:?}; since the fault:\n{}",
                seen.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long after `fault_ns` the holds of workers named `*/<what>` ended (their loss reported).
fn told_after(report: &zklock_testkit::Report, what: &str, fault_ns: u64) -> Vec<Duration> {
    report
        .holds
        .iter()
        .filter(|h| h.worker.ends_with(&format!("/{what}")) && h.start_ns < fault_ns)
        .filter_map(|h| h.end_ns)
        .map(|e| Duration::from_nanos(e.saturating_sub(fault_ns)))
        .collect()
}

/// The failed acquires recorded, with their errors.
fn failed_acquires(history: &History) -> Vec<String> {
    history
        .events()
        .iter()
        .filter_map(|e| match &e.op {
            Op::AcquireFailed { error } => Some(format!("{} {}: {error}", e.worker, e.key)),
            _ => None,
        })
        .collect()
}

/// The load of tests a and b: three managers contend on keys spread over every primary (two
/// per primary, and a read/write lock), each also holding a key on the first primary (`node`,
/// the one the fault strikes) and one on the second (`other`).
struct Load {
    managers: Vec<(String, LockManager)>,
    spread: BTreeMap<usize, Vec<String>>,
    node: usize,
    other: usize,
    replica: usize,
    contention: Contention,
    on_node: Vec<(oneshot::Sender<()>, JoinHandle<Option<LossReason>>)>,
    elsewhere: Vec<(oneshot::Sender<()>, JoinHandle<Option<LossReason>>)>,
}

impl Load {
    /// Starts the load and waits for 30 grants.
    async fn start(cluster: &RedisCluster) -> Load {
        let managers = managers(cluster, 3, LEASE).await;
        let m0 = &managers[0].1;
        let spread = blocking(|| keys_per_primary(cluster, m0, "k", 2));
        let own = blocking(|| keys_per_primary(cluster, m0, "own", 3));
        let node = *spread.keys().next().unwrap();
        let other = *spread.keys().nth(1).unwrap();
        let replica = blocking(|| replica_of(cluster, node));
        let keys: Vec<String> = spread.values().flatten().cloned().collect();
        let contention = Contention::start(&managers, &keys, true);
        let history = &contention.history;
        let on_node = hold_each(&managers, &own[&node], history, "own").await;
        let elsewhere = hold_each(&managers, &own[&other], history, "far").await;
        contention.crew.until_grants(0, 30, PROGRESS).await;
        Load {
            managers,
            spread,
            node,
            other,
            replica,
            contention,
            on_node,
            elsewhere,
        }
    }
}
