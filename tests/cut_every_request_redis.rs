//! The adversary made systematic on Redis: every protocol — mutex acquire and release, the
//! FIFO hand-over to a waiter of another process, read and write locks, a semaphore lease, a
//! job's claim with its `at_least` window, a leader's election — run once per request
//! boundary k, cut there, and judged by the history checker.
//!
//! A victim process (a manager whose every connection, commands and pub/sub, goes through the
//! test kit's [`Relay`]) runs the protocol: take, hold a moment (stopping at once when told the
//! hold is lost), release. The relay lets the server receive the victim's k-th request (a chunk
//! of bytes the client wrote, counted over all its connections) and withholds the answer, then
//! - `Reset`: resets that connection (the client reconnects at once and carries on; a break of
//!   a connection is the loss of every hold granted before it);
//! - `Cancel`: resets it and cuts the victim off, and the victim's future is dropped while it
//!   waits; the network comes back after;
//! - `Kill`: cuts the victim off for good without a reset, as a partition or a dead host: the
//!   server hears nothing, and only the lease ends the victim's hold. The victim lives on, cut
//!   off, and holds until it is told its hold is lost, while the other process waits; then it
//!   is killed.
//!
//! Then another process takes the same lock. The checker decides: no two believed holders at
//! any moment (a hold counts from its grant to its release or its reported loss), tokens
//! strictly increasing in grant order; nothing stuck (the other process gets the lock within
//! the lease of the cut, and no holder key of the lock is left once everyone let go or its lease
//! ran out); a job's window never shrinks and at most one body runs within it.
//!
//! k runs over every request the protocol sends (counted on an uncut run). In CI each k gets
//! one kind of cut, rotating, and the last k also `Kill`;
//! `ZKLOCK_CUTS=all cargo test --test cut_every_request_redis` runs every kind at every k.

mod common;
mod cuts;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cuts::{run_job, sweep, take_hold_release, Cut, Protocol, HOLD, WAIT};
use zklock::LockManager;
use zklock_testkit::{After, History, Mode, Op, RedisServer, Relay};

/// The victim's and the other's lease.
const LEASE: Duration = Duration::from_secs(2);
/// How long a cut-off victim is left waiting before its future is dropped (`Cancel`).
const STUCK: Duration = Duration::from_secs(1);

async fn manager(url: &str, identity: &str) -> LockManager {
    LockManager::builder(url)
        .lease(LEASE)
        .identity(identity)
        .connect()
        .await
        .expect("connect to the test Redis")
}

/// A plain connection for looking at the server.
async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test Redis")
}

/// The lock path of `key` in `protocol` (where its holder keys live).
fn lock_path(m: &LockManager, protocol: Protocol, key: &str) -> String {
    match protocol {
        Protocol::Read | Protocol::Write => m.rwlock(key).unwrap().path().to_string(),
        Protocol::Semaphore => format!("{}/%SEM/{key}", m.namespace()),
        Protocol::Leader => m.leader_latch(key, "look").unwrap().path().to_string(),
        _ => m.path_of(key).unwrap(),
    }
}

/// The holder keys (exclusive, shared, a writer's intent) of the lock at `path` that exist.
async fn holder_keys(admin: &mut redis::aio::MultiplexedConnection, path: &str) -> Vec<String> {
    let mut left = vec![];
    for kind in ["lock", "shared", "intent"] {
        // A semaphore's leases and its gate share the semaphore's path on Redis.
        let name = format!("zklock:{kind}:{path}");
        let exists: bool = redis::cmd("EXISTS")
            .arg(&name)
            .query_async(admin)
            .await
            .unwrap();
        if exists {
            left.push(name);
        }
    }
    left
}

/// A job's recorded window end (server ms), if any.
async fn run_after(admin: &mut redis::aio::MultiplexedConnection, path: &str) -> Option<i64> {
    redis::cmd("GET")
        .arg(format!("zklock:run:{path}"))
        .query_async::<Option<i64>>(admin)
        .await
        .unwrap()
}

/// One run of `protocol` on `key`, by a victim behind a relay that cuts after its `k`-th
/// request (`None`: no cut); returns how many requests the victim sent.
async fn run_once(
    redis_server: &RedisServer,
    protocol: Protocol,
    key: &str,
    cut: Option<(u64, Cut)>,
) -> u64 {
    let url = redis_server.url();
    let mut admin = admin(&url).await;
    let history = History::new();
    let other = manager(&url, &format!("other-{key}")).await;
    let relay = Relay::start(&format!("127.0.0.1:{}", redis_server.port())).unwrap();
    let victim = manager(&relay.url(&url), &format!("victim-{key}")).await;
    let path = lock_path(&other, protocol, key);
    let bodies = Arc::new(AtomicUsize::new(0));
    // The hub's pub/sub connection may start in the background: let it settle, so that k
    // counts the protocol's requests.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = relay.requests();

    // The hand-over: the other process holds first, and lets go once the victim queued.
    let first = if protocol == Protocol::Handover {
        let rec = history.recorder("first");
        rec.acquire_invoked(key, Mode::Exclusive);
        let g = other.lock(key).await.unwrap();
        rec.acquire_ok(key, Mode::Exclusive, g.fencing_token().as_u128());
        Some((g, rec))
    } else {
        None
    };
    if let Some((k, how)) = cut {
        let after = match how {
            Cut::Reset => After::Reset,
            Cut::Cancel => After::ResetAndBlackhole,
            Cut::Kill => After::Blackhole,
        };
        relay.cut_after_nth_request(k, after);
    }
    // Cut off for good, the victim holds until it is told its hold is lost.
    let hold = if cut.is_some_and(|(_, how)| how == Cut::Kill) {
        WAIT * 2
    } else {
        HOLD
    };
    let victim_rec = history.recorder("victim");
    let run = {
        let (victim, key, rec, bodies) = (
            victim.clone(),
            key.to_string(),
            victim_rec.clone(),
            bodies.clone(),
        );
        tokio::spawn(async move {
            if protocol == Protocol::Job {
                run_job(&victim, &key, &rec, &bodies, hold).await;
            } else {
                take_hold_release(protocol, &victim, &key, &rec, false, hold).await;
            }
            victim.flush().await;
        })
    };
    if let Some((g, rec)) = first {
        // Released once the victim queued, or after a while if it never did.
        let queue = format!("zklock:queue:{path}");
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                let queued: i64 = redis::cmd("ZCARD")
                    .arg(&queue)
                    .query_async(&mut admin)
                    .await
                    .unwrap();
                if queued > 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        rec.release_invoked(key);
        g.release().await.unwrap();
        rec.release_ok(key);
    }
    let how = cut.map(|(_, how)| how);
    let mut victim_run = None;
    match how {
        Some(Cut::Cancel) => {
            // Cut off, the victim waits for a reply that never comes: its future is dropped
            // wherever it waits.
            let abort = run.abort_handle();
            if let Ok(done) = tokio::time::timeout(STUCK, run).await {
                done.expect("the victim's task");
            }
            abort.abort();
        }
        // The victim lives on, cut off, while the other process takes the lock.
        Some(Cut::Kill) => victim_run = Some(run),
        _ => run.await.expect("the victim's task"),
    }
    if how == Some(Cut::Kill) {
        // The cut has fired (or the protocol sent fewer requests this time).
        common::eventually("the cut", Duration::from_secs(10), || async {
            !relay.cut_pending() || victim_run.as_ref().is_some_and(|r| r.is_finished())
        })
        .await;
    }
    let sent = relay.requests() - before;
    if how != Some(Cut::Kill) {
        relay.heal();
        victim.flush().await;
    }

    // Another process takes the lock: within the lease of the cut, and its own retries.
    let other_rec = history.recorder("other");
    tokio::time::timeout(WAIT + LEASE, async {
        take_hold_release(protocol, &other, key, &other_rec, true, Duration::ZERO).await;
        if protocol == Protocol::Job {
            // And the job, again: it runs only if the victim recorded no run.
            let window = run_after(&mut admin, &path).await;
            run_job(&other, key, &other_rec, &bodies, Duration::ZERO).await;
            let now = run_after(&mut admin, &path).await;
            assert!(
                now >= window,
                "{protocol:?}, cut {cut:?}: the at_least window shrank from {window:?} to {now:?}"
            );
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{protocol:?} stuck after a cut {cut:?}"));
    other.flush().await;

    if let Some(run) = victim_run {
        // Now the process dies: nothing of it runs, and nothing of it reaches the server.
        run.abort();
        let _ = run.await;
        history.crashed("victim");
        drop(victim);
        std::mem::forget(relay);
    } else {
        victim.flush().await;
    }
    let report = history.check();
    assert!(
        report.is_ok(),
        "{protocol:?}, cut {cut:?}: {}\n{:#?}",
        report.summary(),
        history.events()
    );
    assert!(
        history
            .events()
            .iter()
            .any(|e| e.worker == "other" && matches!(e.op, Op::AcquireOk { .. })),
        "{protocol:?}, cut {cut:?}: the other process never got the lock"
    );
    if protocol == Protocol::Job {
        let ran = bodies.load(Ordering::SeqCst);
        assert!(
            ran <= 1,
            "{protocol:?}, cut {cut:?}: {ran} runs within one at_least window"
        );
        if cut.is_none() {
            assert_eq!(ran, 1, "the uncut job ran once, and the other skipped it");
        }
    }
    // Nothing left: no holder key of the lock once every process let go or its lease ran out.
    let mut looking = admin.clone();
    common::eventually(
        &format!("no holder key of {key} left ({protocol:?}, cut {cut:?})"),
        LEASE * 3,
        || {
            let (mut conn, path) = (looking.clone(), path.clone());
            async move { holder_keys(&mut conn, &path).await.is_empty() }
        },
    )
    .await;
    let _ = &mut looking;
    sent
}

/// Sweeps `protocol` on a server of its own.
async fn sweep_redis(protocol: Protocol, offset: usize) {
    let server = RedisServer::start().expect("start redis-server (see the test kit's error)");
    sweep(protocol, offset, true, |key, cut| {
        let server = &server;
        async move { run_once(server, protocol, &key, cut).await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_cut_at_every_request() {
    sweep_redis(Protocol::Mutex, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_cut_at_every_request() {
    sweep_redis(Protocol::Handover, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_lock_cut_at_every_request() {
    sweep_redis(Protocol::Read, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_lock_cut_at_every_request() {
    sweep_redis(Protocol::Write, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_cut_at_every_request() {
    sweep_redis(Protocol::Semaphore, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_cut_at_every_request() {
    sweep_redis(Protocol::Job, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cut_at_every_request() {
    sweep_redis(Protocol::Leader, 0).await;
}
