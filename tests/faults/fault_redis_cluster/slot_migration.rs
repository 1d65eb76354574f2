//! d. A slot migrated (`CLUSTER SETSLOT IMPORTING/MIGRATING`, `MIGRATE`, `SETSLOT NODE`) while
//! a lock in it is held and another key of the slot is contended.

use super::*;

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

    history.fault(&format!(
        "slot {slot} migrates from node {src} to node {dst}"
    ));
    let started_ns = now_ns();
    let started = Instant::now();
    set_migrating(&cluster, slot, src, dst);
    // The load goes on with the slot migrating but its keys still on the source.
    contention.until_more_grants(20, PROGRESS).await;
    let moved = migrate_keys(&cluster, slot, src, dst);
    let keys_moved = started.elapsed();
    // And with the keys on the target, the slot still the source's.
    contention.until_more_grants(20, PROGRESS).await;
    let kept_until_the_switch = !held_h.is_finished();
    assign_slot(&cluster, slot, src, dst);
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
    let moved_kinds = kinds_of(&moved);
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

/// The migration's first step, as the Redis Cluster docs give it: `SETSLOT IMPORTING` on the
/// target `dst`, then `SETSLOT MIGRATING` on the source `src`.
fn set_migrating(cluster: &RedisCluster, slot: u16, src: usize, dst: usize) {
    let (src_id, dst_id) = (cluster.id(src).to_string(), cluster.id(dst).to_string());
    let slot_arg = slot.to_string();
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
}

/// `MIGRATE ... KEYS` of every key of `slot` from `src` to `dst`, a hundred at a time, until
/// none is left on the source: answers the keys moved.
fn migrate_keys(cluster: &RedisCluster, slot: u16, src: usize, dst: usize) -> Vec<String> {
    let slot_arg = slot.to_string();
    let dst_addr = cluster.addr(dst);
    let (dst_host, dst_port) = dst_addr.rsplit_once(':').unwrap();
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
    moved
}

/// The migration's last step: `SETSLOT NODE` of `slot` to `dst` on the target, the source and
/// the other primaries.
fn assign_slot(cluster: &RedisCluster, slot: u16, src: usize, dst: usize) {
    let dst_id = cluster.id(dst).to_string();
    let slot_arg = slot.to_string();
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
}

/// How many of `keys` are of each kind (their first two `:`-separated parts).
fn kinds_of(keys: &[String]) -> BTreeMap<String, usize> {
    keys.iter().fold(BTreeMap::new(), |mut m, k| {
        *m.entry(k.split(':').take(2).collect::<Vec<_>>().join(":"))
            .or_default() += 1;
        m
    })
}
