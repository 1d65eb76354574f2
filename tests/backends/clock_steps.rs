//! A server's wall clock stepped back and forward (the test kit's `ServerClock`, a preload
//! library that offsets the server's `CLOCK_REALTIME`, as an NTP step or `date -s` does), on
//! real Redis and PostgreSQL servers. What each promise that rests on the server's clock does:
//!
//! - Tokens, floored at the server's clock on Redis and PostgreSQL: kept. A step back by an
//!   hour, or forward, and back again: every grant's token is above the one before, across
//!   processes (the floor is the key's last token + 1 whatever the clock says).
//! - Redis's lease, which the server expires by its own wall clock: not kept by the server. A
//!   step forward past the lease frees the key at once, and another process is granted it
//!   while the holder still counts its lease on its own monotonic clock. The holder learns it
//!   at its next renewal (within a third of the lease): the overlap is measured and bounded,
//!   and the fence refuses the old holder's write after the new holder's. A step back keeps
//!   the holder's lease (its renewals set a relative expiry).
//! - A job's `at_least` window, measured by the server's clock: a step forward shortens it
//!   by the step (the job may run again early), a step back lengthens it (PostgreSQL and
//!   ZooKeeper, whose run record's mtime is the server's wall clock).
//! - ZooKeeper's tokens (czxids) and sessions (timed by the server's elapsed time): kept. A
//!   hold outlives steps of an hour either way, past its session timeout.

use crate::common;

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use zklock::fence::{Fence, Outcome, RedisFence, RedisWrite};
use zklock::{FencingToken, LockManager, Ran};
use zklock_testkit::{PostgresServer, RedisServer, ServerClock, ZkServer};

const HOUR: Duration = Duration::from_secs(3600);

fn clock() -> ServerClock {
    ServerClock::new().expect("build the test kit's clock library (needs cc)")
}

/// Takes and releases `key` once on each manager in turn, after each of `steps`, and returns
/// the tokens in grant order.
async fn tokens_across_steps(
    managers: &[LockManager],
    clock: &ServerClock,
    steps: &[i64],
) -> Vec<FencingToken> {
    let mut tokens = Vec::new();
    for step in steps {
        match step.signum() {
            1 => clock.step_forward(Duration::from_secs(step.unsigned_abs())),
            -1 => clock.step_back(Duration::from_secs(step.unsigned_abs())),
            _ => {}
        }
        for m in managers {
            let g = m.lock("stepped").await.unwrap();
            tokens.push(g.fencing_token());
            g.release().await.unwrap();
        }
    }
    tokens
}

fn assert_increasing(tokens: &[FencingToken]) {
    for pair in tokens.windows(2) {
        assert!(pair[0] < pair[1], "a token did not increase: {tokens:?}");
    }
}

/// The hour-long steps every backend's tokens are checked across: on time, an hour back, an
/// hour forward of real time, an hour back again.
const STEPS: [i64; 4] = [0, -3600, 7200, -7200];

/// PostgreSQL's tokens keep increasing in grant order when its clock steps back an hour and
/// forward again, with two processes taking turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_tokens_increase_across_clock_steps() {
    let clock = clock();
    let pg = PostgresServer::start_with_clock(&clock).unwrap();
    let managers = [
        common::pg_manager(&pg.url()).await,
        common::pg_manager(&pg.url()).await,
    ];
    let tokens = tokens_across_steps(&managers, &clock, &STEPS).await;
    assert_increasing(&tokens);
    // The server's clock did move: the token taken an hour ahead is about an hour (in µs)
    // above the first.
    let ahead = tokens[4].grant() - tokens[0].grant();
    assert!(ahead > 3_000_000_000, "the clock did not move: {tokens:?}");
}

/// Redis's tokens keep increasing in grant order across the same steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_tokens_increase_across_clock_steps() {
    let clock = clock();
    let redis = RedisServer::start_with_clock(&clock).unwrap();
    let lease = Duration::from_secs(3);
    let manager = || {
        LockManager::builder(redis.url())
            .redis(|r| r.lease(lease))
            .connect()
    };
    let managers = [manager().await.unwrap(), manager().await.unwrap()];
    let tokens = tokens_across_steps(&managers, &clock, &STEPS).await;
    assert_increasing(&tokens);
    let ahead = tokens[4].grant() - tokens[0].grant();
    assert!(ahead > 3_000_000_000, "the clock did not move: {tokens:?}");
}

/// A Redis holder keeps its lock across a step back of an hour (its renewals set a relative
/// expiry): after two leases it still holds, and another process's try is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_hold_survives_a_step_back() {
    let clock = clock();
    let redis = RedisServer::start_with_clock(&clock).unwrap();
    let lease = Duration::from_millis(900);
    let manager = || {
        LockManager::builder(redis.url())
            .redis(|r| r.lease(lease))
            .connect()
    };
    let (a, b) = (manager().await.unwrap(), manager().await.unwrap());
    let held = a.lock("back").await.unwrap();
    clock.step_back(HOUR);
    tokio::time::sleep(lease * 2).await;
    assert!(held.is_held());
    assert!(b.try_lock("back").await.unwrap().is_none());
    held.release().await.unwrap();
    assert!(b.try_lock("back").await.unwrap().is_some());
}

/// A step forward past the lease frees a Redis key at once: another process is granted it
/// while the holder still believes it holds. The holder learns it at its next renewal, within
/// a third of the lease (and a reply) of the other's grant; the other's token is above the
/// holder's, and the fence refuses the holder's write after the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_forward_past_the_redis_lease_is_an_overlap_the_fence_refuses() {
    let clock = clock();
    let redis = RedisServer::start_with_clock(&clock).unwrap();
    let lease = Duration::from_secs(3);
    let manager = || {
        LockManager::builder(redis.url())
            .redis(|r| r.lease(lease))
            .connect()
    };
    let (a, b) = (manager().await.unwrap(), manager().await.unwrap());
    let conn = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    let fence = RedisFence::new(conn.clone());
    let old = a.lock("forward").await.unwrap();
    clock.step_forward(lease * 2);
    let next = tokio::time::timeout(lease, b.lock("forward"))
        .await
        .expect("the key expired on the server: granted at once")
        .unwrap();
    let granted = Instant::now();
    assert!(next.fencing_token() > old.fencing_token());
    // The overlap: the old holder hears of it at its next renewal.
    tokio::time::timeout(lease / 3 + Duration::from_secs(1), old.lost())
        .await
        .expect("the old holder reports the loss within a renewal");
    let overlap = granted.elapsed();
    eprintln!("the old holder believed it held for {overlap:?} after the next grant");
    assert!(!old.is_held());
    // Its late write is refused by the fence once the new holder wrote.
    let write = |token, value: &'static str| {
        fence.fenced_write("stock", token, RedisWrite::set("stock", value))
    };
    assert!(matches!(
        write(next.fencing_token(), "new").await.unwrap(),
        Outcome::Accepted(_)
    ));
    assert!(matches!(
        write(old.fencing_token(), "stale").await.unwrap(),
        Outcome::Stale { .. }
    ));
    let stock: String = conn.clone().get("stock").await.unwrap();
    assert_eq!(stock, "new");
}

/// A job's `at_least` window is measured by the server's clock: a step forward past the
/// window lets the job run again before the window has passed in real time; a step back
/// keeps it from running for the length of the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_window_follows_the_postgres_clock() {
    let clock = clock();
    let pg = PostgresServer::start_with_clock(&clock).unwrap();
    let m = common::pg_manager(&pg.url()).await;
    let job = m.job("nightly").unwrap().at_least(Duration::from_secs(60));
    assert!(matches!(job.run(async {}).await.unwrap(), Ran::Ran(())));
    assert!(matches!(job.run(async {}).await.unwrap(), Ran::Skipped));
    clock.step_forward(Duration::from_secs(61));
    assert!(
        matches!(job.run(async {}).await.unwrap(), Ran::Ran(())),
        "the window ended by the server's clock"
    );
    // An hour back: the last run is an hour in the server's future, and the window with it.
    clock.step_back(HOUR);
    assert!(matches!(job.run(async {}).await.unwrap(), Ran::Skipped));
}

/// ZooKeeper takes no token and no session deadline from its wall clock: with the server's
/// clock stepped an hour forward, then back, a hold outlives twice its session timeout (no
/// other process gets in), and tokens keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_holds_and_tokens_ignore_clock_steps() {
    let clock = clock();
    let zk = ZkServer::builder().clock(&clock).start().unwrap();
    let session = Duration::from_secs(2);
    let manager = || {
        LockManager::builder(zk.connect_string())
            .zookeeper(|z| z.session_timeout(session))
            .connect()
    };
    let managers = [manager().await.unwrap(), manager().await.unwrap()];
    let held = managers[0].lock("held").await.unwrap();
    for step in [HOUR.as_secs() as i64, -2 * HOUR.as_secs() as i64] {
        match step.signum() {
            1 => clock.step_forward(Duration::from_secs(step.unsigned_abs())),
            _ => clock.step_back(Duration::from_secs(step.unsigned_abs())),
        }
        tokio::time::sleep(session * 2).await;
        assert!(held.is_held(), "the hold ended after a step of {step} s");
        assert!(managers[1].try_lock("held").await.unwrap().is_none());
    }
    held.release().await.unwrap();
    let tokens = tokens_across_steps(&managers, &clock, &STEPS).await;
    assert_increasing(&tokens);
}

/// On ZooKeeper a job's window is measured by the run record's mtime, the server's wall
/// clock: a step forward past the window lets the job run again, a step back holds it off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_window_follows_the_zookeeper_clock() {
    let clock = clock();
    let zk = ZkServer::builder().clock(&clock).start().unwrap();
    let m = LockManager::connect(zk.connect_string()).await.unwrap();
    let job = m.job("nightly").unwrap().at_least(Duration::from_secs(60));
    assert!(matches!(job.run(async {}).await.unwrap(), Ran::Ran(())));
    assert!(matches!(job.run(async {}).await.unwrap(), Ran::Skipped));
    clock.step_forward(Duration::from_secs(61));
    assert!(
        matches!(job.run(async {}).await.unwrap(), Ran::Ran(())),
        "the window ended by the server's clock"
    );
    clock.step_back(HOUR);
    assert!(matches!(job.run(async {}).await.unwrap(), Ran::Skipped));
}

/// A PostgreSQL holder across a step of its server's clock: a live holder's session answers a
/// check every lease/3, so the server does not end it for being idle, whichever way the clock
/// steps (the server's idle timer is relative; a step forward can make it fire at its next
/// check of its timers, ending a session that has been idle since its last check): either the
/// hold survives two leases and no other process gets in, or, if the server ended the session,
/// the holder reports the loss within a check of the other's grant, with a larger token
/// after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_hold_across_clock_steps_is_kept_or_lost_within_a_check() {
    let clock = clock();
    let pg = PostgresServer::start_with_clock(&clock).unwrap();
    let lease = Duration::from_millis(1500);
    let manager = || {
        LockManager::builder(pg.url())
            .postgres(|p| p.lease(lease))
            .connect()
    };
    let (a, b) = (manager().await.unwrap(), manager().await.unwrap());
    for (round, forward) in [true, false].into_iter().enumerate() {
        let key = format!("stepped-{round}");
        let held = a.lock(&key).await.unwrap();
        if forward {
            clock.step_forward(HOUR);
        } else {
            clock.step_back(HOUR);
        }
        match tokio::time::timeout(lease * 2, b.lock(&key)).await {
            Err(_) => {
                eprintln!("step forward={forward}: the hold was kept for two leases");
                assert!(held.is_held());
                held.release().await.unwrap();
            }
            Ok(next) => {
                let next = next.unwrap();
                let granted = Instant::now();
                eprintln!("step forward={forward}: the server ended the holder's session");
                assert!(next.fencing_token() > held.fencing_token());
                tokio::time::timeout(lease / 3 + Duration::from_secs(1), held.lost())
                    .await
                    .expect("the holder reports the loss within a check");
                eprintln!(
                    "  believed held for {:?} after the next grant",
                    granted.elapsed()
                );
                next.release().await.unwrap();
            }
        }
    }
}
