//! 4. A failover to a replica that lacks a key's token counter, with the new primary's clock
//!    behind: tokens stay above the old ones while it is behind by less than the failover took.

use super::*;
use std::time::{SystemTime, UNIX_EPOCH};
use zklock_testkit::ServerClock;

/// Microseconds since the epoch on this machine's (the servers' real) wall clock.
fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
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
