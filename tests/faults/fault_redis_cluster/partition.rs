//! e. A primary partitioned from one manager through the relay its primary announces: that
//! manager's holds on it are reported lost before others get them; the others lose nothing.

use super::*;
use zklock::FencingToken;
use zklock_testkit::Relay;

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
    let scene = Scene::start(&cluster).await;
    let Scene {
        others,
        victim,
        relays,
        spread,
        x,
        y,
        ..
    } = &scene;
    let (x, y, m0) = (*x, *y, &others[0].1);
    let (own_x, own_y) = (scene.own[&x].clone(), scene.own[&y].clone());
    let contention = Contention::start(&scene.all(), &scene.keys(), true);
    let loaded_ns = now_ns();
    let history = &contention.history;
    let (rec_x, rec_y) = (
        history.recorder("victim/own-x"),
        history.recorder("victim/own-y"),
    );
    let guard_x = hold(victim, &own_x, &rec_x, PROGRESS).await;
    let token_x = guard_x.fencing_token();
    let guard_y = hold(victim, &own_y, &rec_y, PROGRESS).await;
    let (end_x, held_x) = watched(guard_x, own_x.clone(), rec_x);
    let (end_y, held_y) = watched(guard_y, own_y.clone(), rec_y);
    contention.crew.until_grants(0, 30, PROGRESS).await;
    until_granted_on_every_primary(history, spread, 1, 0, "victim/", true).await;

    history.fault(&format!(
        "node {x}'s relay blackholed: the victim cut off from node {x}"
    ));
    let partitioned_ns = now_ns();
    let partitioned = tokio::time::Instant::now();
    relays[&x].blackhole();
    let rec_taker = history.recorder("m1/own-x");
    let taker = takes_after(others[1].1.clone(), &own_x, &rec_taker, partitioned);
    let fate_x = outcomes(vec![(end_x, held_x)], PROGRESS).await[0];
    let (guard_taker, taken_after) = tokio::time::timeout(PROGRESS, taker)
        .await
        .expect("another manager is granted the victim's key on X")
        .unwrap();
    let token_taker = guard_taker.fencing_token();
    contention.until_more_grants(30, PROGRESS).await;
    until_granted_on_every_primary(history, spread, 5, partitioned_ns, "victim/", false).await;
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
    let again = hold(victim, &own_x, &rec_again, PROGRESS).await;
    let token_again = again.fencing_token();
    let relocked = healed.elapsed();
    release(again, &own_x, &rec_again).await.unwrap();
    let on_x = BTreeMap::from([(x, spread[&x].clone())]);
    until_granted_on_every_primary(history, &on_x, 3, healed_ns, "victim/", true).await;
    let rejoined = healed.elapsed();
    // The hold on Y: lost by now (its reason), or released (it must still be held).
    let fate_y = outcomes(vec![(end_y, held_y)], Duration::ZERO).await[0];
    let history = contention.stop().await;

    let seen = Seen {
        x,
        y,
        own_x,
        windows_ns: (loaded_ns, partitioned_ns, healed_ns),
        fates: (fate_x, fate_y),
        tokens: (token_x, token_taker, token_again),
        still_primary,
        role_x,
        taken_after,
        relocked,
        rejoined,
    };
    seen.check(&history, spread);
}

/// The setup of test e: three managers that connect to the nodes' own ports, and the victim,
/// which reaches every primary through a relay; keys contended on every primary (`spread`),
/// and a key of the victim's own on each (`own`). X and Y are the first two primaries.
struct Scene {
    others: Vec<(String, LockManager)>,
    victim: LockManager,
    relays: BTreeMap<usize, Relay>,
    spread: BTreeMap<usize, Vec<String>>,
    own: BTreeMap<usize, String>,
    x: usize,
    y: usize,
}

impl Scene {
    async fn start(cluster: &RedisCluster) -> Scene {
        // The others first: they learn the nodes' own ports, and never ask again (no connection
        // of theirs fails, no slot moves).
        let others = managers(cluster, 3, LEASE).await;
        let m0 = &others[0].1;
        let spread = blocking(|| keys_per_primary(cluster, m0, "k", 2));
        let own = blocking(|| keys_per_primary(cluster, m0, "own", 1));
        let x = *spread.keys().next().unwrap();
        let y = *spread.keys().nth(1).unwrap();
        let own = own
            .into_iter()
            .map(|(p, keys)| (p, keys[0].clone()))
            .collect();
        let (relays, victim_url) = relayed_primaries(cluster);
        let victim = cluster_manager(&victim_url, LEASE).await;
        Scene {
            others,
            victim,
            relays,
            spread,
            own,
            x,
            y,
        }
    }

    /// Every manager, the victim last.
    fn all(&self) -> Vec<(String, LockManager)> {
        let mut all = self.others.clone();
        all.push(("victim".to_string(), self.victim.clone()));
        all
    }

    /// The contended keys of every primary.
    fn keys(&self) -> Vec<String> {
        self.spread.values().flatten().cloned().collect()
    }
}

/// `m` locks `key` once it is free, recorded: answers the guard and how long after `since` it
/// was granted.
fn takes_after(
    m: LockManager,
    key: &str,
    rec: &Recorder,
    since: tokio::time::Instant,
) -> JoinHandle<(LockGuard, Duration)> {
    let (key, rec) = (key.to_string(), rec.clone());
    tokio::spawn(async move {
        let guard = hold(&m, &key, &rec, PROGRESS).await;
        (guard, since.elapsed())
    })
}

/// What test e saw, for its checks: X (partitioned from the victim) and Y, the victim's key on
/// X, when the load began, the partition began and it healed, the fates of the victim's holds
/// on X and Y, the tokens of X's key (the victim's, the other manager's, the victim's again).
struct Seen {
    x: usize,
    y: usize,
    own_x: String,
    windows_ns: (u64, u64, u64),
    fates: (Option<LossReason>, Option<LossReason>),
    tokens: (FencingToken, FencingToken, FencingToken),
    still_primary: usize,
    role_x: Option<String>,
    taken_after: Duration,
    relocked: Duration,
    rejoined: Duration,
}

impl Seen {
    /// The checks of test e, and what it prints.
    fn check(&self, history: &History, spread: &BTreeMap<usize, Vec<String>>) {
        let Seen { x, own_x, .. } = self;
        let (_, partitioned_ns, healed_ns) = self.windows_ns;
        let (fate_x, fate_y) = self.fates;
        let (token_x, token_taker, token_again) = self.tokens;
        let report = checked(history);
        let across = assert_tokens_above_across(&report, partitioned_ns);
        for key in &spread[x] {
            assert!(
                across.contains(key),
                "{key} granted on both sides: {across:?}"
            );
        }
        let (lost_x, taken) = (
            span_of(&report, "victim/own-x"),
            span_of(&report, "m1/own-x"),
        );
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
            .filter(|h| h.key == *own_x && h.worker != "victim/own-x-again")
            .map(|h| h.token)
            .max()
            .unwrap();
        assert!(token_again.as_u128() > before_again);
        assert_eq!(self.still_primary, *x, "X still serves its slots");
        assert_eq!(
            self.role_x.as_deref(),
            Some("master"),
            "X is still a primary"
        );
        // The victim reaches X only through its relay: nothing of X's is granted to it while the
        // relay is cut (a reply the relay holds at the cut arrives after the heal; one it passed
        // just before is recorded within a moment).
        let x_keys_all: Vec<String> = spread[x].iter().chain([own_x]).cloned().collect();
        let victim_on_x = grants_of(
            history,
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
        self.say(history, &report, spread, across.len());
        // A break reaches only the holds of the node it broke on (per-slot epochs): the victim's
        // hold on another primary outlives the partition of X.
        assert_eq!(
            fate_y, None,
            "the victim's hold on node {} was lost",
            self.y
        );
    }

    /// Prints what the checks do not assert: the victim's losses and the grant rates on each
    /// primary before and during the partition.
    fn say(
        &self,
        history: &History,
        report: &zklock_testkit::Report,
        spread: &BTreeMap<usize, Vec<String>>,
        across: usize,
    ) {
        let Seen {
            x,
            y,
            taken_after,
            relocked,
            rejoined,
            ..
        } = self;
        let (loaded_ns, partitioned_ns, healed_ns) = self.windows_ns;
        let (fate_x, fate_y) = self.fates;
        let (token_x, token_taker, token_again) = self.tokens;
        let (lost_x, taken) = (span_of(report, "victim/own-x"), span_of(report, "m1/own-x"));
        let lost_x_ns = lost_x.end_ns.expect("the victim's hold on X ended");
        let victims = losses_of_victim(report, partitioned_ns, healed_ns);
        let after = |ns: u64| Duration::from_nanos(ns.saturating_sub(partitioned_ns));
        // Grants per second on each primary's contended keys, to the victim (`among`) or to the
        // others, in a window.
        let rate = |window: (u64, u64), among: bool| -> BTreeMap<usize, u64> {
            let secs = (window.1 - window.0) as f64 / 1e9;
            spread
                .iter()
                .map(|(&p, keys)| {
                    let n = grants_of(history, keys, window, "victim/", among);
                    (p, (n as f64 / secs).round() as u64)
                })
                .collect()
        };
        let (before, during) = ((loaded_ns, partitioned_ns), (partitioned_ns, healed_ns));
        let failed = failed_acquires(history).len();
        let failed_releases = failed_releases(history, partitioned_ns);
        let y_line = match fate_y {
            None => "kept".to_string(),
            Some(reason) => format!(
                "lost ({reason:?}) {:?} after the partition began",
                after(span_of(report, "victim/own-y").end_ns.unwrap_or(0))
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
            across,
            report.summary()
        ));
    }
}

/// The one hold of `worker` in `report`.
fn span_of<'r>(report: &'r zklock_testkit::Report, worker: &str) -> &'r zklock_testkit::HoldSpan {
    report
        .holds
        .iter()
        .find(|h| h.worker == worker)
        .unwrap_or_else(|| panic!("{worker}'s hold recorded:\n{report}"))
}

/// The victim's holds lost across the partition (held at some moment between its start and
/// its heal), counted by reason.
fn losses_of_victim(
    report: &zklock_testkit::Report,
    partitioned_ns: u64,
    healed_ns: u64,
) -> BTreeMap<String, usize> {
    report
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
        })
}

/// The releases that failed, each as `<seconds after the partition began> <worker> <key>`.
fn failed_releases(history: &History, partitioned_ns: u64) -> Vec<String> {
    let after = |ns: u64| Duration::from_nanos(ns.saturating_sub(partitioned_ns));
    history
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
        .collect()
}
