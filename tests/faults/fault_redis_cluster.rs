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

/// a. The primary of some slots killed (SIGKILL) while three managers contend on keys spread
/// over every primary (two per primary, and a read/write lock), each manager also holding a key
/// on the killed primary and one on another. Proves: the replica's promotion never gives two
/// believed holders (the checker, nothing excused); every hold on the killed node is reported
/// lost (`Failover` or `Disconnected`); every grant after the kill has a token above every
/// earlier token of its key, on the killed node's keys too (granted by the promoted replica);
/// the managers lock again.
///
/// Here the keys of the killed node's slots are granted again to a manager connected after
/// the promotion (the contending managers keep theirs going on the other primaries): see
/// test a2 for why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slots_primary_killed_mid_hold_loses_its_holds_and_tokens_stay_above() {
    killed_mid_hold(false).await;
}

/// a2. The same kill; proves that the managers that were running at the kill are granted the
/// killed node's keys again once its replica serves them. It failed (acquires timed out after
/// 20 s, again and again) while a refused connection to a slot's node was not taken as a node
/// failure: a manager whose map was asked for again before the promotion (the Cluster still
/// named the dead node) kept sending those keys to the dead node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slots_primary_killed_the_running_managers_lock_its_keys_again() {
    killed_mid_hold(true).await;
}

async fn killed_mid_hold(running_managers_recover: bool) {
    let _turn = TURNS.lock().await;
    let mut cluster = start_cluster(1, NODE_TIMEOUT_MS);
    let Load {
        managers,
        spread,
        node: victim,
        other,
        replica,
        contention,
        on_node: on_victim,
        elsewhere,
    } = Load::start(&cluster).await;
    let history = &contention.history;
    let m0 = &managers[0].1;

    history.fault(&format!("SIGKILL primary node {victim}"));
    let killed_ns = now_ns();
    let killed = Instant::now();
    blocking(|| cluster.kill(victim)).unwrap();
    let told = outcomes(on_victim, PROGRESS).await;
    blocking(|| cluster.wait_until_ok(PROGRESS)).expect("the replica takes over");
    let promoted = killed.elapsed();
    let victim_key = lock_key(m0, "lock", &spread[&victim][0]);
    assert_eq!(
        blocking(|| cluster.node_for_key(&victim_key)).unwrap(),
        replica,
        "the replica serves the killed primary's slots"
    );
    let far = outcomes(elsewhere, Duration::ZERO).await;
    let since_ns = now_ns();
    if running_managers_recover {
        for key in &spread[&victim] {
            until_granted(history, key, 3, since_ns, killed_ns).await;
        }
    } else {
        let late = cluster_manager(&cluster_url(&cluster, 1), LEASE).await;
        let rec = history.recorder("late");
        for key in &spread[&victim] {
            let guard = hold(&late, key, &rec, PROGRESS).await;
            release(guard, key, &rec).await.unwrap();
        }
        for key in &spread[&other] {
            until_granted(history, key, 3, since_ns, killed_ns).await;
        }
    }
    let recovered = killed.elapsed();
    let history = contention.stop().await;

    let report = checked(&history);
    for reason in &told {
        assert!(
            matches!(
                reason,
                Some(LossReason::Failover | LossReason::Disconnected)
            ),
            "a hold on the killed node: {reason:?}"
        );
    }
    let across = assert_tokens_above_across(&report, killed_ns);
    for key in &spread[&victim] {
        assert!(
            across.contains(key),
            "{key} granted on both sides of the kill: {across:?}"
        );
    }
    // The holds on the other primary: their renewals meet `-CLUSTERDOWN` until the replica
    // is promoted, and are tried again until their deadline; no break reaches them.
    for reason in &far {
        assert!(
            matches!(reason, None | Some(LossReason::LeaseExpired)),
            "a hold on node {other}, which was not killed: {reason:?}"
        );
    }
    // Lost across the kill: the killed node's holds, at the break or the failover; others only
    // if the Cluster refused their renewals past their deadline.
    let lost = assert_losses_across_among(
        &report,
        killed_ns,
        &[
            LossReason::Failover,
            LossReason::Disconnected,
            LossReason::LeaseExpired,
        ],
    );
    let told_after = told_after(&report, "own", killed_ns);
    say(&format!(
        "fault_redis_cluster (a: primary node {victim} killed, {}): holds on it told {told:?} after \
         {told_after:?}; holds on node {other} (not killed): {far:?}; replica node {replica} \
         serving by {promoted:?}; the killed node's keys granted again by {recovered:?}; holds \
         lost across the kill {lost:?}; tokens above across it on {} keys; {}",
        if running_managers_recover {
            "the running managers lock its keys again"
        } else {
            "a manager connected after the promotion locks its keys"
        },
        across.len(),
        report.summary()
    ));
}

/// b. A manual failover (`CLUSTER FAILOVER` on the replica of a primary) under the same load.
/// Proves: no two believed holders (nothing excused); every hold on the old primary is told
/// `Failover` (its next request is answered `-MOVED`); every later grant's token is above every
/// earlier token of its key; the managers lock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_tells_the_old_holders_failover_and_never_overlaps() {
    let _turn = TURNS.lock().await;
    let cluster = start_cluster(1, NODE_TIMEOUT_MS);
    let Load {
        managers: _managers,
        spread,
        node: old,
        other,
        replica,
        contention,
        on_node: on_old,
        elsewhere,
    } = Load::start(&cluster).await;
    let history = &contention.history;

    history.fault(&format!(
        "CLUSTER FAILOVER on node {replica} (replica of {old})"
    ));
    let failover_ns = now_ns();
    let started = Instant::now();
    blocking(|| cluster.failover(replica)).expect("a manual failover");
    let switched = started.elapsed();
    let told = outcomes(on_old, PROGRESS).await;
    let far = outcomes(elsewhere, Duration::ZERO).await;
    let old_role = blocking(|| cluster.role(old));
    let since_ns = now_ns();
    for key in &spread[&old] {
        until_granted(history, key, 3, since_ns, failover_ns).await;
    }
    let recovered = started.elapsed();
    let history = contention.stop().await;

    let report = checked(&history);
    for reason in &told {
        assert_eq!(
            *reason,
            Some(LossReason::Failover),
            "a hold on the old primary"
        );
    }
    let across = assert_tokens_above_across(&report, failover_ns);
    for key in &spread[&old] {
        assert!(
            across.contains(key),
            "{key} granted on both sides: {across:?}"
        );
    }
    let lost = losses_across(&report, failover_ns);
    let told_after = told_after(&report, "own", failover_ns);
    assert_eq!(
        old_role.as_deref(),
        Some("slave"),
        "the old primary follows"
    );
    say(&format!(
        "fault_redis_cluster (b: CLUSTER FAILOVER node {old} -> {replica}): switched in \
         {switched:?}; holds on the old primary told {told:?} after {told_after:?}; holds on node \
         {other} (not failed over): {far:?}; the failed-over keys granted again by \
         {recovered:?}; holds lost across it {lost:?}; tokens above across it on {} keys; {}",
        across.len(),
        report.summary()
    ));
}

/// c. Split brain. A holds k1 and A2 holds k2, both on one primary, both replicated to its
/// replica. The primary is frozen (SIGSTOP) past the node timeout; its replica is promoted; on
/// it, k1's lock key is deleted (A's grant as a write the replica never got: A cannot know);
/// B, a manager connected after the promotion, is granted k1 at once and k2 once A2's lease
/// ran out on the promoted replica; then the old primary is woken (it turns replica of the
/// new one). Proves: the overlap of A's and B's believed holds, measured and reported, is
/// bounded by the lease; A2 is told before B gets k2 (the checker, with no fault excusing
/// A2); every write A makes through the fence once B has written is refused, and so is a
/// late one after the wake; B's token is above A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_primary_overlap_is_bounded_by_the_lease_and_stale_writes_are_fenced() {
    let _turn = TURNS.lock().await;
    const SPLIT_LEASE: Duration = Duration::from_secs(6);
    let cluster = start_cluster(1, NODE_TIMEOUT_MS);
    let (_store, fence) = fence_store().await;
    let url = cluster_url(&cluster, 0);
    let a = cluster_manager(&url, SPLIT_LEASE).await;
    let a2 = cluster_manager(&url, SPLIT_LEASE).await;
    let on = blocking(|| keys_per_primary(&cluster, &a, "sku", 2));
    let old = *on.keys().next().unwrap();
    let (k1, k2) = (on[&old][0].clone(), on[&old][1].clone());
    let (lk1, lk2) = (lock_key(&a, "lock", &k1), lock_key(&a, "lock", &k2));
    let replica = blocking(|| replica_of(&cluster, old));
    let history = History::new();
    let (rec_a, rec_a2) = (history.recorder("A"), history.recorder("A2"));
    let (rec_b, rec_b2) = (history.recorder("B"), history.recorder("B2"));
    let guard_a = hold(&a, &k1, &rec_a, PROGRESS).await;
    let token_a = guard_a.fencing_token();
    assert!(fenced_set(&fence, token_a, "A".into()).await.accepted);
    let guard_a2 = hold(&a2, &k2, &rec_a2, PROGRESS).await;
    eventually(
        "the replica to have both grants",
        Duration::from_secs(10),
        || async {
            let replies = blocking(|| {
                cluster.commands(
                    replica,
                    &[&["READONLY"], &["EXISTS", &lk1], &["EXISTS", &lk2]],
                )
            })
            .unwrap();
            replies[1].int() == Some(1) && replies[2].int() == Some(1)
        },
    )
    .await;

    history.silent_fault(
        "A",
        "SIGSTOP k1's primary; A's grant is then taken off the promoted replica (not replicated)",
    );
    let paused = Instant::now();
    blocking(|| cluster.pause(old)).unwrap();
    let writer = writer_until_lost(guard_a, k1.clone(), rec_a.clone(), fence.clone());
    let kept2 = kept_until_lost(guard_a2, k2.clone(), rec_a2.clone());
    eventually("the replica to take over", PROGRESS, || async {
        blocking(|| cluster.node_for_key(&lk1)).ok() == Some(replica)
    })
    .await;
    blocking(|| cluster.wait_until_ok(PROGRESS)).expect("the others agree");
    let promoted = paused.elapsed();
    // A's grant, as the replica would lack it had replication not carried it yet.
    assert_eq!(
        blocking(|| cluster.command(replica, &["DEL", &lk1]))
            .unwrap()
            .int(),
        Some(1)
    );
    let b = cluster_manager(&cluster_url(&cluster, 1), SPLIT_LEASE).await;
    let b_task = new_holder_writes(
        b.clone(),
        k1.clone(),
        rec_b.clone(),
        fence.clone(),
        PROGRESS,
    );
    let b2_task = {
        let (b, k2, rec_b2) = (b.clone(), k2.clone(), rec_b2.clone());
        tokio::spawn(async move {
            let guard = hold(&b, &k2, &rec_b2, PROGRESS).await;
            (guard, Instant::now())
        })
    };
    let holder_b = tokio::time::timeout(PROGRESS, b_task)
        .await
        .expect("B is granted k1 on the promoted replica")
        .unwrap();
    let granted_b = holder_b.granted;
    let (guard_b2, granted_b2) = tokio::time::timeout(PROGRESS, b2_task)
        .await
        .expect("B2 is granted k2 once A2's lease ran out")
        .unwrap();
    blocking(|| cluster.resume(old)).unwrap();
    let woken = paused.elapsed();
    blocking(|| cluster.wait_until_ok(PROGRESS)).expect("the woken node rejoins");
    let old_follows = blocking(|| cluster.primary_of(old)).unwrap();
    let split = SplitBrain::end(writer, holder_b, &fence, PROGRESS).await;
    let reason_a2 = tokio::time::timeout(PROGRESS, kept2)
        .await
        .expect("A2 is told of its loss")
        .unwrap();
    let token_b2 = guard_b2.fencing_token();
    release(guard_b2, &k2, &rec_b2)
        .await
        .expect("B2's hold lived");

    let report = history.check();
    report.assert_ok();
    assert!(
        report.unprotected.iter().all(|o| o.first.key == k1),
        "only A's hold, which it could not know lost, overlaps:\n{report}"
    );
    let measured = split.measure(&report);
    eprintln!(
        "fault_redis_cluster (c: primary node {old} paused): {}; replica node {replica} promoted \
         {promoted:?} after the pause; B granted k1 {:?} and k2 {:?} after the pause (A2 told \
         {reason_a2:?}); old node woken at {woken:?}, then follows {old_follows:?}; token of \
         B2 {token_b2}",
        split.describe(&measured, SPLIT_LEASE),
        granted_b - paused,
        granted_b2 - paused,
    );
    split.assert_fenced(&measured, SPLIT_LEASE, &report);
    assert_eq!(
        old_follows,
        Some(replica),
        "the woken node follows the new primary"
    );
}

/// d. A slot migrated from its primary to another while a lock in it (H) is held and another
/// key of the same slot (C) is contended by three managers, with keys on every primary
/// contended too. The migration follows the Redis Cluster docs: `SETSLOT IMPORTING` on the
/// target, `SETSLOT MIGRATING` on the source, `MIGRATE ... KEYS` of every key of the slot,
/// `SETSLOT NODE` on the target, the source and the other primaries. Proves: no two believed
/// holders during and after (nothing excused); the hold of H is reported lost as `Failover`
/// (the source answers `-MOVED` once the slot is the target's) and not before the keys moved;
/// every acquire of C made during the migration is granted (after `-TRYAGAIN` / `-ASK`), and no
/// acquire failed; after it, H and C are granted with tokens above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_under_a_hold_never_overlaps_and_tokens_go_on() {
    let _turn = TURNS.lock().await;
    let cluster = start_cluster(1, NODE_TIMEOUT_MS);
    let managers = managers(&cluster, 3, LEASE).await;
    let m0 = &managers[0].1;
    let holder = cluster_manager(&cluster_url(&cluster, 1), LEASE).await;
    let spread = blocking(|| keys_per_primary(&cluster, m0, "k", 1));
    let held = blocking(|| keys_per_primary(&cluster, m0, "held", 1));
    let src = *held.keys().next().unwrap();
    let dst = *held.keys().nth(1).unwrap();
    let h = held[&src][0].clone();
    let slot = lock_slot(m0, &h);
    let c = key_in_slot(m0, "hot", slot);
    let (lh, lc) = (lock_key(m0, "lock", &h), lock_key(m0, "lock", &c));
    assert_eq!(blocking(|| cluster.slot(&lc)).unwrap(), slot);
    let mut keys: Vec<String> = spread.values().flatten().cloned().collect();
    keys.push(c.clone());
    let contention = Contention::start(&managers, &keys, false);
    let history = &contention.history;
    let rec_h = history.recorder("holder/H");
    let guard_h = hold(&holder, &h, &rec_h, PROGRESS).await;
    let token_h = guard_h.fencing_token();
    let (end_h, held_h) = watched(guard_h, h.clone(), rec_h);
    contention.crew.until_grants(0, 30, PROGRESS).await;
    let c_before = grants_after(history, &c, 0);
    assert!(c_before > 0, "C granted before the migration");

    let (src_id, dst_id) = (cluster.id(src).to_string(), cluster.id(dst).to_string());
    let slot_arg = slot.to_string();
    let dst_addr = cluster.addr(dst);
    let (dst_host, dst_port) = dst_addr.rsplit_once(':').unwrap();
    history.fault(&format!(
        "slot {slot} migrates from node {src} to node {dst}"
    ));
    let started_ns = now_ns();
    let started = Instant::now();
    blocking(|| {
        cluster.command(
            dst,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &src_id],
        )?;
        cluster.command(
            src,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &dst_id],
        )
    })
    .expect("the slot set migrating");
    // The load goes on with the slot migrating but its keys still on the source.
    contention.until_more_grants(20, PROGRESS).await;
    let mut moved = Vec::new();
    loop {
        let listed =
            blocking(|| cluster.command(src, &["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"]))
                .unwrap();
        let names: Vec<String> = listed
            .array()
            .unwrap_or(&[])
            .iter()
            .filter_map(|k| k.text())
            .collect();
        if names.is_empty() {
            break;
        }
        let mut args = vec!["MIGRATE", dst_host, dst_port, "", "0", "5000", "KEYS"];
        args.extend(names.iter().map(String::as_str));
        blocking(|| cluster.command(src, &args)).expect("MIGRATE");
        moved.extend(names);
    }
    let keys_moved = started.elapsed();
    // And with the keys on the target, the slot still the source's.
    contention.until_more_grants(20, PROGRESS).await;
    let kept_until_the_switch = !held_h.is_finished();
    blocking(|| {
        cluster.command(dst, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &dst_id])?;
        cluster.command(src, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &dst_id])?;
        for p in cluster.primaries()? {
            if p != src && p != dst {
                cluster.command(p, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &dst_id])?;
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .expect("the slot assigned to the target");
    let ended_ns = now_ns();
    let switched = started.elapsed();
    blocking(|| cluster.wait_until_ok(PROGRESS)).expect("the cluster agrees");
    assert_eq!(blocking(|| cluster.node_for_key(&lh)).unwrap(), dst);
    assert_eq!(blocking(|| cluster.node_for_key(&lc)).unwrap(), dst);
    let fate_h = outcomes(vec![(end_h, held_h)], 2 * LEASE).await[0];
    let told_h = started.elapsed();
    until_granted(history, &c, 3, ended_ns, started_ns).await;
    // H again, now on the target.
    let rec_h2 = history.recorder("m0/H");
    let again = hold(m0, &h, &rec_h2, PROGRESS).await;
    let token_h2 = again.fencing_token();
    release(again, &h, &rec_h2).await.unwrap();
    let history = contention.stop().await;

    let report = checked(&history);
    let failed = failed_acquires(&history);
    assert!(failed.is_empty(), "acquires failed: {failed:?}");
    let during: Vec<_> = report
        .holds
        .iter()
        .filter(|s| s.key == c && s.invoked_ns > started_ns && s.invoked_ns < ended_ns)
        .collect();
    let granted_during = during.iter().filter(|s| s.start_ns < ended_ns).count();
    assert!(
        !during.is_empty(),
        "acquires of C made during the migration: none\n{report}"
    );
    let across = assert_tokens_above_across(&report, started_ns);
    assert!(across.contains(&c) && across.contains(&h), "{across:?}");
    assert!(token_h2 > token_h, "{token_h2} > {token_h}");
    assert_eq!(
        fate_h,
        Some(LossReason::Failover),
        "the hold of H across the switch of its slot"
    );
    assert!(
        kept_until_the_switch,
        "the hold of H was lost before the slot switched owner"
    );
    let lost = losses_across(&report, started_ns);
    let moved_kinds: BTreeMap<String, usize> = moved.iter().fold(BTreeMap::new(), |mut m, k| {
        *m.entry(k.split(':').take(2).collect::<Vec<_>>().join(":"))
            .or_default() += 1;
        m
    });
    say(&format!(
        "fault_redis_cluster (d: slot {slot} node {src} -> {dst}): keys moved {moved_kinds:?} by \
         {keys_moved:?}, slot switched at {switched:?}; hold of H {fate_h:?}, told by \
         {told_h:?}; {} acquires of C invoked during the migration, all granted ({} before the \
         switch); holds lost across it {lost:?}; tokens of H {token_h} -> {token_h2}; tokens \
         above across it on {} keys; {}",
        during.len(),
        granted_during,
        across.len(),
        report.summary()
    ));
}

/// The grants of any of `keys` recorded after `since_ns` (and before `until_ns`) to workers
/// whose name starts with `prefix` (`among`) or does not (`!among`).
fn grants_of(
    history: &History,
    keys: &[String],
    (since_ns, until_ns): (u64, u64),
    prefix: &str,
    among: bool,
) -> usize {
    history
        .events()
        .iter()
        .filter(|e| {
            e.at_ns > since_ns
                && e.at_ns < until_ns
                && keys.contains(&e.key)
                && e.worker.starts_with(prefix) == among
                && matches!(e.op, Op::AcquireOk { .. })
        })
        .count()
}

/// Waits until the keys of every primary of `spread` are granted `n` times after `since_ns` to
/// workers whose name starts with `prefix` (`among`) or does not (`!among`); fails naming the
/// primaries short of it.
async fn until_granted_on_every_primary(
    history: &History,
    spread: &BTreeMap<usize, Vec<String>>,
    n: usize,
    since_ns: u64,
    prefix: &str,
    among: bool,
) {
    let deadline = tokio::time::Instant::now() + PROGRESS;
    loop {
        let counts: BTreeMap<usize, usize> = spread
            .iter()
            .map(|(&p, keys)| {
                (
                    p,
                    grants_of(history, keys, (since_ns, u64::MAX), prefix, among),
                )
            })
            .collect();
        if counts.values().all(|&c| c >= n) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {n} grants on every primary within {PROGRESS:?} (workers {}{prefix}*): \
             {counts:?}",
            if among { "" } else { "other than " }
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long the partition of test e lasts at least: two leases, so that the victim's requests
/// to the partitioned node time out (the reply timeout is the lease, at most 5 s) while it lasts.
const PARTITION: Duration = Duration::from_secs(6);

/// e. A Cluster node partitioned through the relay. Four managers contend on keys spread over
/// every primary (two per primary, and a read/write lock); one of them, the victim, reaches
/// every primary through a relay that the primary announces (`cluster-announce-port`: its
/// `CLUSTER SLOTS` names the relays), the others connect directly (before the announcement:
/// they keep the nodes' own ports). The victim also holds a key on primary X and one on
/// primary Y. X's relay is then blackholed for [`PARTITION`] (nothing passes, nothing is
/// reset: the victim can no longer reach X, everyone else can, and X stays primary: the
/// Cluster's bus is not cut), while another manager asks for the victim's key on X. Proves: no
/// two believed holders of any key at any moment (the checker, nothing excused), tokens
/// increasing in grant order and above every earlier one across the partition; the victim's
/// hold on X is reported lost before the other manager is granted its key (once the lease
/// ran out on X); the others are granted keys on every primary during the partition and lose
/// no hold; X still serves its slots; once healed, the victim is granted its key on X again
/// with a token above every earlier one, and its workers X's contended keys.
///
/// A partition says nothing to the victim: its renewal of the hold on X gets no answer, and
/// the hold is reported lost when its lease could have run out (`LeaseExpired`), before the
/// lease runs out on X; its attempts on X's keys time out (a break of X's connections:
/// `Disconnected` for what it holds on X by then).
///
/// Printed, not asserted: whether the victim's hold on Y survived the partition. With one
/// break epoch per manager, the break of X's connections lost every hold of the manager on
/// every primary; with per-node (per-slot) epochs only those on X.
///
/// Printed too: the grants per second on each primary before and during the partition, the
/// victim's and the others'. The victim's wake-ups on Y and Z slow down while X is cut off
/// (its hub serves every primary from one task, which waits on X's subscriptions and
/// connects), and with them the others' on those keys (a release hands the lock to the
/// victim, queued first, which comes for it late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_partitioned_through_the_relay_loses_that_managers_holds_on_it_before_others_get_them(
) {
    let _turn = TURNS.lock().await;
    let cluster = start_cluster(1, NODE_TIMEOUT_MS);
    // The others first: they learn the nodes' own ports, and never ask again (no connection
    // of theirs fails, no slot moves).
    let others = managers(&cluster, 3, LEASE).await;
    let m0 = &others[0].1;
    let m1 = others[1].1.clone();
    let spread = blocking(|| keys_per_primary(&cluster, m0, "k", 2));
    let own = blocking(|| keys_per_primary(&cluster, m0, "own", 1));
    let x = *spread.keys().next().unwrap();
    let y = *spread.keys().nth(1).unwrap();
    let (own_x, own_y) = (own[&x][0].clone(), own[&y][0].clone());
    let (relays, victim_url) = relayed_primaries(&cluster);
    let victim = cluster_manager(&victim_url, LEASE).await;
    let mut all = others.clone();
    all.push(("victim".to_string(), victim.clone()));
    let keys: Vec<String> = spread.values().flatten().cloned().collect();
    let contention = Contention::start(&all, &keys, true);
    let loaded_ns = now_ns();
    let history = &contention.history;
    let (rec_x, rec_y) = (
        history.recorder("victim/own-x"),
        history.recorder("victim/own-y"),
    );
    let guard_x = hold(&victim, &own_x, &rec_x, PROGRESS).await;
    let token_x = guard_x.fencing_token();
    let guard_y = hold(&victim, &own_y, &rec_y, PROGRESS).await;
    let (end_x, held_x) = watched(guard_x, own_x.clone(), rec_x);
    let (end_y, held_y) = watched(guard_y, own_y.clone(), rec_y);
    contention.crew.until_grants(0, 30, PROGRESS).await;
    until_granted_on_every_primary(history, &spread, 1, 0, "victim/", true).await;

    history.fault(&format!(
        "node {x}'s relay blackholed: the victim cut off from node {x}"
    ));
    let partitioned_ns = now_ns();
    let partitioned = tokio::time::Instant::now();
    relays[&x].blackhole();
    let rec_taker = history.recorder("m1/own-x");
    let taker = {
        let (own_x, rec_taker) = (own_x.clone(), rec_taker.clone());
        tokio::spawn(async move {
            let guard = hold(&m1, &own_x, &rec_taker, PROGRESS).await;
            (guard, partitioned.elapsed())
        })
    };
    let fate_x = outcomes(vec![(end_x, held_x)], PROGRESS).await[0];
    let (guard_taker, taken_after) = tokio::time::timeout(PROGRESS, taker)
        .await
        .expect("another manager is granted the victim's key on X")
        .unwrap();
    let token_taker = guard_taker.fencing_token();
    contention.until_more_grants(30, PROGRESS).await;
    until_granted_on_every_primary(history, &spread, 5, partitioned_ns, "victim/", false).await;
    tokio::time::sleep_until(partitioned + PARTITION).await;
    let still_primary = blocking(|| cluster.node_for_key(&lock_key(m0, "lock", &own_x))).unwrap();
    let role_x = blocking(|| cluster.role(x));

    history.fault(&format!("node {x}'s relay healed"));
    let healed_ns = now_ns();
    let healed = Instant::now();
    relays[&x].heal();
    release(guard_taker, &own_x, &rec_taker)
        .await
        .expect("the other manager's hold lived");
    let rec_again = history.recorder("victim/own-x-again");
    let again = hold(&victim, &own_x, &rec_again, PROGRESS).await;
    let token_again = again.fencing_token();
    let relocked = healed.elapsed();
    release(again, &own_x, &rec_again).await.unwrap();
    let on_x = BTreeMap::from([(x, spread[&x].clone())]);
    until_granted_on_every_primary(history, &on_x, 3, healed_ns, "victim/", true).await;
    let rejoined = healed.elapsed();
    // The hold on Y: lost by now (its reason), or released (it must still be held).
    let fate_y = outcomes(vec![(end_y, held_y)], Duration::ZERO).await[0];
    let history = contention.stop().await;

    let report = checked(&history);
    let across = assert_tokens_above_across(&report, partitioned_ns);
    for key in &spread[&x] {
        assert!(
            across.contains(key),
            "{key} granted on both sides: {across:?}"
        );
    }
    let span = |worker: &str| {
        report
            .holds
            .iter()
            .find(|h| h.worker == worker)
            .unwrap_or_else(|| panic!("{worker}'s hold recorded:\n{report}"))
    };
    let (lost_x, taken) = (span("victim/own-x"), span("m1/own-x"));
    let lost_x_ns = lost_x.end_ns.expect("the victim's hold on X ended");
    assert!(
        lost_x_ns < taken.start_ns,
        "the victim is told before the other manager is granted its key:\n{report}"
    );
    // A partition says nothing: the lease runs out unrenewed (LeaseExpired), unless a request
    // to X timed out first (a break: Disconnected).
    assert!(
        matches!(
            fate_x,
            Some(LossReason::Disconnected | LossReason::Failover | LossReason::LeaseExpired)
        ),
        "the victim's hold on X: {fate_x:?}"
    );
    assert!(
        token_x < token_taker && token_taker < token_again,
        "tokens of X's key: {token_x} < {token_taker} < {token_again}"
    );
    let before_again = report
        .holds
        .iter()
        .filter(|h| h.key == own_x && h.worker != "victim/own-x-again")
        .map(|h| h.token)
        .max()
        .unwrap();
    assert!(token_again.as_u128() > before_again);
    assert_eq!(still_primary, x, "X still serves its slots");
    assert_eq!(role_x.as_deref(), Some("master"), "X is still a primary");
    let victims: BTreeMap<String, usize> = report
        .holds
        .iter()
        .filter(|h| h.worker.starts_with("victim/"))
        .filter(|h| h.start_ns < healed_ns && h.end_ns.is_some_and(|e| e > partitioned_ns))
        .filter_map(|h| match &h.end {
            HoldEnd::Lost(reason) => Some(reason_name(reason)),
            _ => None,
        })
        .fold(BTreeMap::new(), |mut m, r| {
            *m.entry(r).or_default() += 1;
            m
        });
    // The victim reaches X only through its relay: nothing of X's is granted to it while the
    // relay is cut (a reply the relay holds at the cut arrives after the heal; one it passed
    // just before is recorded within a moment).
    let x_keys_all: Vec<String> = spread[&x].iter().chain([&own_x]).cloned().collect();
    let victim_on_x = grants_of(
        &history,
        &x_keys_all,
        (partitioned_ns + 100_000_000, healed_ns),
        "victim/",
        true,
    );
    assert_eq!(
        victim_on_x, 0,
        "the victim granted keys of X during the partition"
    );
    let others_lost: Vec<String> = report
        .holds
        .iter()
        .filter(|h| !h.worker.starts_with("victim/"))
        .filter(|h| matches!(h.end, HoldEnd::Lost(_)))
        .map(|h| h.to_string())
        .collect();
    assert!(
        others_lost.is_empty(),
        "the others lose nothing: {others_lost:?}"
    );
    let after = |ns: u64| Duration::from_nanos(ns.saturating_sub(partitioned_ns));
    // Grants per second on each primary's contended keys, to the victim (`among`) or to the
    // others, in a window.
    let rate = |window: (u64, u64), among: bool| -> BTreeMap<usize, u64> {
        let secs = (window.1 - window.0) as f64 / 1e9;
        spread
            .iter()
            .map(|(&p, keys)| {
                let n = grants_of(&history, keys, window, "victim/", among);
                (p, (n as f64 / secs).round() as u64)
            })
            .collect()
    };
    let (before, during) = ((loaded_ns, partitioned_ns), (partitioned_ns, healed_ns));
    let failed = failed_acquires(&history).len();
    let failed_releases: Vec<String> = history
        .events()
        .iter()
        .filter_map(|e| match &e.op {
            Op::ReleaseFailed { .. } => Some(format!(
                "{:.3} {} {}",
                after(e.at_ns).as_secs_f64(),
                e.worker,
                e.key
            )),
            _ => None,
        })
        .collect();
    let y_line = match fate_y {
        None => "kept".to_string(),
        Some(reason) => format!(
            "lost ({reason:?}) {:?} after the partition began",
            after(span("victim/own-y").end_ns.unwrap_or(0))
        ),
    };
    say(&format!(
        "fault_redis_cluster (e: node {x} partitioned from the victim through its relay for \
         {PARTITION:?}): the victim's hold on X lost {fate_x:?} {:?} after the partition began, \
         the other manager granted its key {:?} after it ({taken_after:?} after the partition \
         began); hold on the other primary (node {y}): {y_line}; the victim's holds lost across \
         the partition {victims:?}; grants per second per primary before it / during it: to the \
         others {:?} / {:?}, to the victim {:?} / {:?}; after the heal, the victim granted X's key again in \
         {relocked:?} (tokens {token_x} -> {token_taker} -> {token_again}), its workers X's \
         keys by {rejoined:?}; acquires failed {failed}; releases failed {failed_releases:?}; tokens above across the partition on \
         {} keys; {}",
        after(lost_x_ns),
        Duration::from_nanos(taken.start_ns - lost_x_ns),
        rate(before, false),
        rate(during, false),
        rate(before, true),
        rate(during, true),
        across.len(),
        report.summary()
    ));
    // A break reaches only the holds of the node it broke on (per-slot epochs): the victim's
    // hold on another primary outlives the partition of X.
    assert_eq!(fate_y, None, "the victim's hold on node {y} was lost");
}

/// f. A primary frozen (SIGSTOP) past the node timeout while three managers with different
/// settings (leases of 3, 4 and 6 s, the last without the local queue, each listing the nodes
/// from another one) contend on keys of every primary, beside workers whose acquires keep
/// timing out (250 ms) and leave their undo to the background; its replica promoted, then the
/// old primary woken at once (it answers what it was sent while frozen before it hears of the
/// promotion). Proves: no two believed holders at any moment (the checker, nothing excused:
/// every grant was replicated), every grant after the freeze above every earlier token of its
/// key, and the managers lock the frozen node's keys again on the promoted replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_woken_after_its_replica_took_over_never_overlaps() {
    let _turn = TURNS.lock().await;
    let cluster = start_cluster(1, NODE_TIMEOUT_MS);
    let mut managers = Vec::new();
    for (i, (secs, queue)) in [(3, true), (4, true), (6, false)].into_iter().enumerate() {
        let m = LockManager::builder(cluster_url(&cluster, 2 * i))
            .local_queue(queue)
            .redis(|r| r.lease(Duration::from_secs(secs)))
            .connect()
            .await
            .expect("connect to the Cluster");
        managers.push((format!("m{i}"), m));
    }
    let spread = blocking(|| keys_per_primary(&cluster, &managers[0].1, "k", 2));
    let node = *spread.keys().next().unwrap();
    let replica = blocking(|| replica_of(&cluster, node));
    let keys: Vec<String> = spread.values().flatten().cloned().collect();
    let mut contention = Contention::start(&managers, &keys, false);
    let impatient = crate::faults::Work {
        wait: Duration::from_millis(250),
        hold: Duration::from_millis(30),
        think: Duration::from_millis(20),
    };
    contention.add(&managers, &spread[&node], "impatient", impatient);
    contention.crew.until_grants(0, 30, PROGRESS).await;

    let probe = lock_key(&managers[0].1, "lock", &spread[&node][0]);
    contention
        .history
        .fault("SIGSTOP a primary past the node timeout");
    let frozen_ns = now_ns();
    let frozen = Instant::now();
    blocking(|| cluster.pause(node)).unwrap();
    eventually("the replica to take over", PROGRESS, || async {
        blocking(|| cluster.node_for_key(&probe)).ok() == Some(replica)
    })
    .await;
    let promoted = frozen.elapsed();
    blocking(|| cluster.resume(node)).unwrap();
    contention.history.fault("SIGCONT the old primary");
    blocking(|| cluster.wait_until_ok(PROGRESS)).expect("the woken node rejoins");
    let old_follows = blocking(|| cluster.primary_of(node)).unwrap();
    for key in &spread[&node] {
        until_granted(&contention.history, key, 5, now_ns(), frozen_ns).await;
    }
    let history = contention.stop().await;
    let report = checked(&history);
    let across = assert_tokens_above_across(&report, frozen_ns).len();
    assert!(
        across >= 2,
        "keys granted on both sides of the freeze: {across}\n{report}"
    );
    say(&format!(
        "fault_redis_cluster (f: primary node {node} frozen and woken): replica {replica} \
         promoted {promoted:?} after the freeze; the woken node follows {old_follows:?}; holds \
         lost across the freeze {:?}; tokens above across it on {across} keys; {}",
        losses_across(&report, frozen_ns),
        report.summary()
    ));
}
