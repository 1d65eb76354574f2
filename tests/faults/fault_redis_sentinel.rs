//! Faults of the Redis backend under Sentinel (`redis+sentinel://`), against the test kit's
//! primary with two replicas and three Sentinels on loopback, each judged by the history
//! checker (no two believed holders of a key at any moment, tokens strictly increasing in grant
//! order) and, where stale writes are the point, by the Redis fence on a plain Redis of its own
//! (it survives the lock store's failovers).
//!
//! 1. The primary killed (SIGKILL) while managers contend on a few keys and each holds one
//!    more: Sentinel promotes a replica; every hold of the killed primary is reported lost
//!    (`Failover` or `Disconnected`); every grant after the kill has a token above every
//!    earlier token of its key.
//! 2. A manual failover (`SENTINEL FAILOVER`) under the same load: the same, and the old
//!    holders are told `Failover`.
//! 3. Split brain: the primary frozen (SIGSTOP) past `down-after` and the failover, with a
//!    holder's lease that the replicas lack (not replicated); then woken, still a primary for
//!    a while. The overlap of believed holds is measured and reported, bounded by the lease;
//!    every write of the old holder after the new holder's first write is refused by the
//!    fence, whose token stays above every token of the old primary.
//! 4. A failover to a replica that lacks a key's token counter, with the new primary's clock
//!    behind (the kit's `ServerClock`): tokens stay above the old ones while the clock is
//!    behind by less than the time since the old primary's last grant (at least the
//!    failover's duration), and go back beyond it.
//!
//! The tests take turns (one Sentinel setup at a time): each one's timing (Sentinel's
//! `down-after`, leases) must not depend on how busy two cores are with another's servers.

use crate::common;
use crate::failover;
use crate::faults;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{eventually, say};
use failover::*;
use tokio::task::JoinHandle;
use zklock::{LockGuard, LockManager, LossReason};
use zklock_testkit::{now_ns, History, Recorder, RedisSentinel, Report, ServerClock};

/// The lease of the contending managers: renewed every second.
const LEASE: Duration = Duration::from_secs(3);
/// The bound of every wait for progress after a fault.
const PROGRESS: Duration = Duration::from_secs(30);

/// One Sentinel setup at a time in this binary.
static TURNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn sentinel_url(redis: &RedisSentinel) -> String {
    sentinel_url_from(redis, 0)
}

/// The Sentinel URL listing the Sentinels from the `first`-th on (as services configured each
/// in its own way would): each manager then asks, and listens to, another Sentinel first.
fn sentinel_url_from(redis: &RedisSentinel, first: usize) -> String {
    let mut addrs = redis.sentinel_addrs();
    let n = addrs.len();
    addrs.rotate_left(first % n);
    format!(
        "redis+sentinel://{}/{}",
        addrs.join(","),
        redis.master_name()
    )
}

async fn manager(url: &str, lease: Duration) -> LockManager {
    LockManager::builder(url)
        .redis(|r| r.lease(lease))
        .connect()
        .await
        .expect("connect through the Sentinels")
}

/// The backend's counter of `key`'s tokens and its exclusive key, as `m` names them.
fn redis_keys(m: &LockManager, key: &str) -> (String, String) {
    let path = m.path_of(key).expect("a valid key");
    (
        format!("zklock:fence:{path}"),
        format!("zklock:lock:{path}"),
    )
}

/// Microseconds since the epoch on this machine's (the servers' real) wall clock.
fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// On every replica of `redis` (every node but `primary`): waits until it has `key` (it was
/// replicated), then deletes it there, as a replication that had not carried the write yet
/// would leave it. Replicas refuse writes unless told otherwise (`replica-read-only no`).
async fn unreplicate(redis: &RedisSentinel, primary: usize, key: &str) {
    for i in (0..redis.len()).filter(|&i| i != primary) {
        eventually(
            &format!("node {i} to have {key} replicated"),
            Duration::from_secs(10),
            || async {
                blocking(|| redis.command(i, &["EXISTS", key]))
                    .unwrap()
                    .int()
                    == Some(1)
            },
        )
        .await;
        blocking(|| {
            redis.command(i, &["CONFIG", "SET", "replica-read-only", "no"])?;
            redis.command(i, &["DEL", key])
        })
        .expect("delete the key on a replica");
    }
}

/// The load of tests 1 and 2: the named managers contend on `a` and `b` (mutexes) and a
/// read/write lock, and each holds a key of its own (`own-<i>`) until told of its loss.
struct Load {
    /// Kept connected until the load is finished.
    _managers: Vec<(String, LockManager)>,
    contention: Contention,
    kept: Vec<JoinHandle<LossReason>>,
}

impl Load {
    /// Connects a manager to each URL, starts the load and waits for 30 grants.
    async fn start(urls: impl IntoIterator<Item = String>) -> Load {
        let mut managers = Vec::new();
        for (i, url) in urls.into_iter().enumerate() {
            managers.push((format!("m{i}"), manager(&url, LEASE).await));
        }
        let keys = ["a".to_string(), "b".to_string()];
        let contention = Contention::start(&managers, &keys, true);
        let mut kept = Vec::new();
        for (i, (_, m)) in managers.iter().enumerate() {
            let (key, rec) = (
                format!("own-{i}"),
                contention.history.recorder(&format!("m{i}/own")),
            );
            let guard = hold(m, &key, &rec, PROGRESS).await;
            kept.push(kept_until_lost(guard, key, rec));
        }
        contention.crew.until_grants(0, 30, PROGRESS).await;
        Load {
            _managers: managers,
            contention,
            kept,
        }
    }

    /// Stops the load; checks the history (nothing excused) and, across `fault_ns`, the tokens
    /// (above on at least two keys, `across` naming the fault) and the losses (`Failover` or
    /// `Disconnected`). Answers the report, the keys granted on both sides and the holds lost.
    async fn finish(self, fault_ns: u64, across: &str) -> (Report, usize, usize) {
        let history = self.contention.stop().await;
        let report = checked(&history);
        let keys = assert_tokens_above_across(&report, fault_ns).len();
        assert!(
            keys >= 2,
            "keys granted on both sides{across}: {keys}\n{report}"
        );
        let lost = assert_losses_across_among(
            &report,
            fault_ns,
            &[LossReason::Failover, LossReason::Disconnected],
        );
        (report, keys, lost.values().sum())
    }
}

/// 1. The primary killed with SIGKILL while three managers contend on a few keys (mutexes and
/// a read/write lock) and each also holds a key of its own. Proves: Sentinel's promotion of a
/// replica never gives two believed holders at once (the checker, with no window excused);
/// every hold of the killed primary is reported lost, as `Failover` or `Disconnected`; every
/// grant after the kill has a token above every earlier token of its key; and the managers
/// lock again on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_killed_mid_hold_loses_every_hold_and_tokens_stay_above() {
    let _turn = TURNS.lock().await;
    let mut redis = blocking(RedisSentinel::start).expect("start Redis with Sentinels");
    let mut load = Load::start([0, 0, 0].map(|first| sentinel_url_from(&redis, first))).await;

    load.contention.history.fault("SIGKILL the primary");
    let killed_ns = now_ns();
    let killed = Instant::now();
    let old = blocking(|| redis.kill_primary()).unwrap();
    let new = blocking(|| redis.wait_for_new_primary(old, PROGRESS)).unwrap();
    let promoted = killed.elapsed();
    let mut told = Vec::new();
    for k in std::mem::take(&mut load.kept) {
        let reason = tokio::time::timeout(PROGRESS, k)
            .await
            .expect("the hold of the killed primary is reported lost")
            .unwrap();
        assert!(
            matches!(reason, LossReason::Failover | LossReason::Disconnected),
            "{reason:?}"
        );
        told.push(reason);
    }
    load.contention.until_more_grants(30, PROGRESS).await;
    let recovered = killed.elapsed();
    let (report, across, lost) = load.finish(killed_ns, " of the kill").await;
    say(&format!(
        "fault_redis_sentinel (primary killed): node {old} -> {new} promoted {promoted:?} after \
         the kill, progress again by {recovered:?}; own holds told {told:?}; {lost} holds lost \
         across the kill; tokens above across it on {across} keys; {}",
        report.summary()
    ));
}

/// 2. A manual failover (`SENTINEL FAILOVER`) under the same contended load, every manager
/// listing the Sentinels in the same order (so all listen to the same one). Proves: no two
/// believed holders at any moment (the checker, nothing excused), although the old primary
/// stays a primary for a while after the switch; every hold going on at the failover is
/// reported lost, the held keys' as `Failover`; every later grant's token is above every
/// earlier token of its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_under_load_says_failover_and_never_overlaps() {
    manual_failover_under_load(false).await;
}

/// 2b. The same manual failover, each manager listing the Sentinels from another one (as
/// services configured each in its own way do), so each listens to another Sentinel. The
/// Sentinel that runs the failover announces `+switch-master` only once it has reconfigured
/// the replicas (a second or more after the promotion), the others as soon as they hear of
/// the new primary: a manager listening to the first keeps granting on the old primary, still
/// a primary, while the others grant on the new one. Proves the same as 2; it failed (7 to 13
/// pairs of believed holders per run) while a manager listened to one Sentinel at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_never_overlaps_whichever_sentinel_each_manager_listens_to() {
    manual_failover_under_load(true).await;
}

async fn manual_failover_under_load(each_its_own_sentinel: bool) {
    let _turn = TURNS.lock().await;
    let redis = blocking(RedisSentinel::start).expect("start Redis with Sentinels");
    let mut load = Load::start((0..3).map(|i| {
        let first = if each_its_own_sentinel { i } else { 0 };
        sentinel_url_from(&redis, first)
    }))
    .await;

    let old = redis.primary().unwrap();
    load.contention.history.fault("SENTINEL FAILOVER");
    let failover_ns = now_ns();
    let started = Instant::now();
    let new = blocking(|| redis.failover()).expect("a manual failover");
    let switched = started.elapsed();
    for k in std::mem::take(&mut load.kept) {
        let reason = tokio::time::timeout(PROGRESS, k)
            .await
            .expect("the old holder is told")
            .unwrap();
        assert_eq!(reason, LossReason::Failover);
    }
    let told = started.elapsed();
    let old_role = blocking(|| redis.role(old));
    load.contention.until_more_grants(30, PROGRESS).await;
    let recovered = started.elapsed();
    let (report, across, lost) = load.finish(failover_ns, "").await;
    say(&format!(
        "fault_redis_sentinel (manual failover{}): node {old} -> {new} in {switched:?}, old \
         holders told by {told:?} (the old node then says it is {old_role:?}), progress again \
         by {recovered:?}; {lost} holds lost across it; tokens above across it on {across} \
         keys; {}",
        if each_its_own_sentinel {
            ", each manager its own Sentinel"
        } else {
            ""
        },
        report.summary()
    ));
}

/// 3. Split brain. A holds a key on the primary; its lease is taken off the replicas (as a
/// write not yet replicated); the primary is frozen (SIGSTOP) past `down-after`; Sentinel
/// promotes a replica, where B is granted the key; the old primary is woken and is still a
/// primary that takes writes (until Sentinel demotes it, 8 to 20 s later). A cannot know that
/// its grant was not replicated: the overlap of A's and B's believed holds is measured and
/// reported (recorded as a silent fault for the checker), and must be bounded by A's lease.
/// Every write A makes through the fence once B has written is refused: B's token is above
/// every token of the old primary, read from the woken old primary itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_brain_overlap_is_bounded_by_the_lease_and_stale_writes_are_fenced() {
    let _turn = TURNS.lock().await;
    const SPLIT_LEASE: Duration = Duration::from_secs(6);
    const KEY: &str = "sku_7";
    let redis = blocking(RedisSentinel::start).expect("start Redis with Sentinels");
    let (_store, fence) = fence_store().await;
    let url = sentinel_url(&redis);
    let (a, b) = (
        manager(&url, SPLIT_LEASE).await,
        manager(&url, SPLIT_LEASE).await,
    );
    let history = History::new();
    let (rec_a, rec_b) = (history.recorder("A"), history.recorder("B"));
    let old = redis.primary().unwrap();
    let guard = hold(&a, KEY, &rec_a, PROGRESS).await;
    let token_a = guard.fencing_token();
    assert!(fenced_set(&fence, token_a, "A".into()).await.accepted);
    let (fence_key, lock_key) = redis_keys(&a, KEY);
    unreplicate(&redis, old, &lock_key).await;

    history.silent_fault("A", "SIGSTOP the primary; A's grant is not on the replicas");
    let paused = Instant::now();
    redis.pause(old).unwrap();
    let writer = writer_until_lost(guard, KEY.into(), rec_a.clone(), fence.clone());
    let b_task = new_holder_writes(
        b.clone(),
        KEY.into(),
        rec_b.clone(),
        fence.clone(),
        PROGRESS,
    );
    let new = blocking(|| redis.wait_for_new_primary(old, PROGRESS)).unwrap();
    let promoted = paused.elapsed();
    blocking(|| redis.resume(old)).unwrap();
    let woken = paused.elapsed();
    // The woken old primary: still a primary, taking writes, with its own last token of KEY.
    let old_role = blocking(|| redis.role(old));
    let takes_writes = blocking(|| redis.command(old, &["SET", "split-brain", "1"])).is_ok();
    let old_last: i64 = blocking(|| redis.command(old, &["GET", &fence_key]))
        .unwrap()
        .text()
        .and_then(|t| t.parse().ok())
        .expect("the old primary has the key's counter");

    let holder_b = tokio::time::timeout(PROGRESS, b_task)
        .await
        .expect("B is granted the key on the new primary")
        .unwrap();
    let granted_b = holder_b.granted;
    // Then A's late write with its token (refused) and B's second write (still accepted).
    let split = SplitBrain::end(writer, holder_b, &fence, PROGRESS).await;

    let report = history.check();
    report.assert_ok();
    let measured = split.measure(&report);
    eprintln!(
        "fault_redis_sentinel (split brain): {}; B granted {:?} after the pause (promotion seen \
         at {promoted:?}, old primary woken at {woken:?}, then says {old_role:?}, takes writes: \
         {takes_writes}); old primary's last token {old_last}; node {old} -> {new}",
        split.describe(&measured, SPLIT_LEASE),
        granted_b - paused,
    );
    split.assert_fenced(&measured, SPLIT_LEASE, &report);
    let token_b = split.token_b;
    assert!(
        token_b.grant() > old_last,
        "B's token {token_b} is above the old primary's last {old_last}"
    );
    assert_eq!(old_role.as_deref(), Some("master"), "a split brain");
    assert!(takes_writes, "the woken old primary takes writes");
}

/// `m` locks `key` for `rec`, recorded; the token must be the new primary's time on `clock`
/// (within 2 ms of the grant's, in µs).
async fn hold_on_the_clock(
    m: &LockManager,
    key: &str,
    rec: &Recorder,
    clock: &ServerClock,
) -> LockGuard {
    let before = now_us();
    let guard = hold(m, key, rec, PROGRESS).await;
    let after = now_us();
    let token = guard.fencing_token();
    let shift = clock.offset_ms() * 1000;
    assert!(
        (before + shift - 2_000..=after + shift + 2_000).contains(&token.grant()),
        "the token is the new primary's time: {token} not in {}..={}",
        before + shift,
        after + shift
    );
    guard
}

/// 4. Tokens across a failover to a replica that lacks a key's token counter (taken off the
/// replicas, as a write not replicated would leave them), on a clock the test moves (the kit's
/// `ServerClock`; every node and Sentinel shares it, so the step comes after the failover: the
/// new primary's clock is then behind the clock the old tokens were read from). A grant on the
/// new primary rests on its clock alone (its token is its time in µs). Proves the margin: the
/// token is above the old one while the clock is behind by less than the time since the old
/// primary's last grant of the key (at least the failover's duration), and below it once the
/// clock is behind by more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_after_a_failover_stay_above_while_the_new_clock_is_behind_by_less_than_the_failover(
) {
    let _turn = TURNS.lock().await;
    let clock = ServerClock::new().expect("a server clock (cc)");
    let redis = blocking(|| RedisSentinel::builder().clock(&clock).start())
        .expect("start Redis with Sentinels on the test's clock");
    // The kit asks the first Sentinel for the failover; this manager lists (and listens to)
    // the second first, which announces the new primary at once (see test 2b for the first).
    let m = manager(&sentinel_url_from(&redis, 1), LEASE).await;
    let old = redis.primary().unwrap();
    let rec = History::new().recorder("m");
    let (inside, outside) = ("inside", "outside");
    let mut old_tokens = Vec::new();
    for key in [inside, outside] {
        let guard = hold(&m, key, &rec, PROGRESS).await;
        old_tokens.push(guard.fencing_token());
        release(guard, key, &rec).await.unwrap();
        unreplicate(&redis, old, &redis_keys(&m, key).0).await;
    }
    let started = Instant::now();
    let new = blocking(|| redis.failover()).expect("a manual failover");
    let failover = started.elapsed();

    // Behind by half the time since the old grant: the new token is still above.
    let margin_us = now_us() - old_tokens[0].grant();
    let behind_inside = Duration::from_micros((margin_us / 2) as u64);
    clock.step_back(behind_inside);
    let guard = hold_on_the_clock(&m, inside, &rec, &clock).await;
    let token_inside = guard.fencing_token();
    let lock_key = redis_keys(&m, inside).1;
    assert_eq!(
        blocking(|| redis.command(new, &["EXISTS", &lock_key]))
            .unwrap()
            .int(),
        Some(1),
        "granted on the new primary"
    );
    release(guard, inside, &rec).await.unwrap();
    assert!(
        token_inside > old_tokens[0],
        "behind by {behind_inside:?} < {:?}: {token_inside} > {}",
        Duration::from_micros(margin_us as u64),
        old_tokens[0]
    );

    // Behind by a second more than the time since the old grant: the token goes back.
    let margin_us = now_us() - old_tokens[1].grant();
    let behind_outside = Duration::from_micros(margin_us as u64) + Duration::from_secs(1);
    clock.step_back(behind_outside.saturating_sub(behind_inside));
    let guard = hold_on_the_clock(&m, outside, &rec, &clock).await;
    let token_outside = guard.fencing_token();
    release(guard, outside, &rec).await.unwrap();
    assert!(
        token_outside < old_tokens[1],
        "behind by {behind_outside:?}, more than {:?}: the token goes back ({token_outside} < {})",
        Duration::from_micros(margin_us as u64),
        old_tokens[1]
    );
    // Once the new primary has the counter again, tokens increase whatever its clock does.
    let guard = hold(&m, outside, &rec, PROGRESS).await;
    let next = guard.fencing_token();
    release(guard, outside, &rec).await.unwrap();
    assert!(next > token_outside, "{next} > {token_outside}");
    say(&format!(
        "fault_redis_sentinel (clock behind): node {old} -> {new} in {failover:?}; behind by \
         {behind_inside:?}: token {token_inside} above {} by {} µs; behind by \
         {behind_outside:?}: token {token_outside} below {} by {} µs",
        old_tokens[0],
        token_inside.grant() - old_tokens[0].grant(),
        old_tokens[1],
        old_tokens[1].grant() - token_outside.grant()
    ));
}

/// 5. The primary frozen (SIGSTOP) past `down-after` while managers with different leases and
/// settings contend, some of their acquires cut short by a timeout of a few hundred ms, then
/// woken as soon as the Sentinels name the promoted replica: the old primary still says
/// `master` and takes writes until the Sentinels turn it into a replica, seconds later.
/// Meanwhile, requests sent while it was frozen were opening connections to it (the Sentinels
/// named it when they were asked), and those connections come up when it wakes. Proves that a
/// manager that has acted on the failover never grants on the woken old primary, whenever its
/// connection to it was opened: no two believed holders at any moment (the checker, nothing
/// excused), every later grant's token above every earlier token of its key, any hold going on
/// at the freeze lost as `Failover` or `Disconnected`. It failed (overlaps of believed holders on every key, tokens
/// out of grant order) while a connection opened to the frozen primary before the failover was
/// taken into use once it answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_primary_woken_after_the_failover_grants_nothing() {
    let _turn = TURNS.lock().await;
    let redis = blocking(RedisSentinel::start).expect("start Redis with Sentinels");
    let mut managers = Vec::new();
    // Leases of 3, 4 and 6 s (each request's reply waited on for up to its lease, at most
    // 5 s), the last without the local queue; each lists the Sentinels from another one.
    for (i, (lease, queue)) in [(3, true), (4, true), (6, false)].into_iter().enumerate() {
        let m = LockManager::builder(sentinel_url_from(&redis, i))
            .local_queue(queue)
            .redis(|r| r.lease(Duration::from_secs(lease)))
            .connect()
            .await
            .expect("connect through the Sentinels");
        managers.push((format!("m{i}"), m));
    }
    let keys = ["a".to_string(), "b".to_string()];
    let mut contention = Contention::start(&managers, &keys, false);
    // Acquires that keep timing out, and leave their undo to the background.
    let impatient = faults::Work {
        wait: Duration::from_millis(250),
        hold: Duration::from_millis(30),
        think: Duration::from_millis(20),
    };
    contention.add(&managers, &keys, "impatient", impatient);
    contention.crew.until_grants(0, 30, PROGRESS).await;

    let old = redis.primary().unwrap();
    contention
        .history
        .fault("SIGSTOP the primary past down-after");
    let frozen_ns = now_ns();
    let frozen = Instant::now();
    redis.pause(old).unwrap();
    let new = blocking(|| redis.wait_for_new_primary(old, PROGRESS)).unwrap();
    let promoted = frozen.elapsed();
    blocking(|| redis.resume(old)).unwrap();
    contention.history.fault("SIGCONT the old primary");
    // The load goes on while the woken old primary says it is a primary, and a while after.
    let woken = Instant::now();
    let mut master_for = Duration::ZERO;
    while woken.elapsed() < Duration::from_secs(15) {
        if blocking(|| redis.role(old)).as_deref() == Some("master") {
            master_for = woken.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    contention.until_more_grants(30, PROGRESS).await;
    let history = contention.stop().await;
    let report = checked(&history);
    let across = assert_tokens_above_across(&report, frozen_ns).len();
    assert!(
        across >= 2,
        "keys granted on both sides of the freeze: {across}\n{report}"
    );
    let lost = assert_losses_across_among(
        &report,
        frozen_ns,
        &[LossReason::Failover, LossReason::Disconnected],
    );
    say(&format!(
        "fault_redis_sentinel (frozen primary woken): node {old} -> {new} promoted {promoted:?} \
         after the freeze; the woken old primary said master for {master_for:?}; holds lost \
         across the freeze {lost:?}; tokens above across it on {across} keys; {}",
        report.summary()
    ));
    assert!(
        master_for > Duration::ZERO,
        "the woken old primary was a primary for a while (else this test proves nothing)"
    );
}
