//! The adversary made systematic on PostgreSQL: every protocol — mutex acquire and release,
//! the hand-over to a waiter of another process, read and write locks, a job's claim with its
//! `at_least` window, a leader's election — run once per request boundary k, cut there, and
//! judged by the history checker. (Semaphores answer `Unsupported` on PostgreSQL: not here.)
//!
//! A victim process (a manager whose every connection goes through a [`Relay`]) runs the
//! protocol: take, hold a moment (stopping at once when told the hold is lost), release. The
//! relay lets the server receive the victim's k-th request (a chunk of bytes the client wrote,
//! counted over all its connections: PostgreSQL clients pipeline each round trip in one write)
//! and withholds the answer, then
//! - `Reset`: resets that connection (the client reconnects at once and carries on);
//! - `Cancel`: resets it and cuts the victim off, and the victim's future is dropped while it
//!   waits; the network comes back after;
//! - `Kill`: cuts the victim off for good without a reset, as a partition or a dead host: the
//!   server hears nothing, so only its `idle_session_timeout` (which zklock sets to the lease
//!   on every holding session) ends the victim's sessions. The victim lives on, cut off, and
//!   holds until told its hold is lost, while the other process waits for the lock; then it is
//!   killed.
//!
//! Then another process takes the same lock, within the lease (plus its own retries) of the
//! cut. The checker decides: no two believed holders at any moment (a hold counts from its
//! grant to its release or its reported loss), tokens strictly increasing in grant order. And
//! nothing stuck: no advisory lock of the key is left on the server once the victim is gone or
//! done, and after `Kill` no session of the victim is left at all.
//!
//! k runs over every request the protocol sends (counted on an uncut run). In CI each k gets
//! one kind of cut, rotating, and the last k also `Kill` (a partition while the victim holds:
//! the one that checks its loss deadline against the server's);
//! `ZKLOCK_CUTS=all cargo test --test cut_every_request_postgres` runs every kind at every k.

mod common;
mod cuts;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cuts::{run_job, sweep, take_hold_release, Cut, Protocol, HOLD, WAIT};
use tokio_postgres::NoTls;
use zklock::LockManager;
use zklock_testkit::{After, History, Mode, Op, PostgresServer, Relay};

/// The victim's and the other's lease: the server ends a holding session idle this long.
const LEASE: Duration = Duration::from_secs(3);
/// How long a cut-off victim is left waiting before its future is dropped (`Cancel`).
const STUCK: Duration = Duration::from_secs(1);

/// The classes of zklock's advisory locks (`zkLK`, `zkIN`, `zkWI`): the lock, a waiting
/// writer's intent, a waiter's registration.
const CLASSES: [i64; 3] = [0x7A6B_4C4B, 0x7A6B_494E, 0x7A6B_5749];

/// A plain client for looking at the server.
async fn admin(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// zklock's advisory locks on the lock of `key` (any class): `(class, mode, application)`.
async fn pg_locks(admin: &tokio_postgres::Client, path: &str) -> Vec<(i64, String, String)> {
    admin
        .query(
            "SELECT l.classid::bigint, l.mode, coalesce(a.application_name, '') FROM pg_locks l \
             JOIN zklock_keys k ON l.objid::bigint = k.id \
             LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
             AND l.classid::bigint = ANY($1) AND k.path = $2",
            &[&CLASSES.to_vec(), &path],
        )
        .await
        .expect("query pg_locks")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// The sessions of the process whose identity is `identity`.
async fn sessions_of(admin: &tokio_postgres::Client, identity: &str) -> Vec<(i32, String)> {
    admin
        .query(
            "SELECT pid, coalesce(state, '') || ': ' || coalesce(query, '') FROM pg_stat_activity \
             WHERE application_name LIKE $1",
            &[&format!("% id={identity}")],
        )
        .await
        .expect("query pg_stat_activity")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// A job's recorded window end, in µs since the epoch (`None`: no run recorded).
async fn run_after(admin: &tokio_postgres::Client, path: &str) -> Option<i64> {
    admin
        .query_opt(
            "SELECT floor(extract(epoch FROM run_after) * 1000000)::bigint FROM zklock_keys \
             WHERE path = $1",
            &[&path],
        )
        .await
        .expect("query zklock_keys")
        .and_then(|r| r.get(0))
}

async fn manager(url: &str, identity: &str) -> LockManager {
    LockManager::builder(url)
        .lease(LEASE)
        .identity(identity)
        .connect()
        .await
        .expect("connect to the test PostgreSQL")
}

/// One run of `protocol` on `key`, by a victim behind a relay that cuts after its `k`-th
/// request (`None`: no cut); returns how many requests the victim sent.
async fn run_once(
    pg: &PostgresServer,
    protocol: Protocol,
    key: &str,
    cut: Option<(u64, Cut)>,
) -> u64 {
    let url = pg.url();
    let admin = admin(&url).await;
    let history = History::new();
    let other = manager(&url, &format!("other-{key}")).await;
    let relay = Relay::start(&format!("127.0.0.1:{}", pg.port())).unwrap();
    let victim_id = format!("victim-{key}");
    let victim = manager(&relay.url(&url), &victim_id).await;
    let path = other.path_of(key).unwrap();
    let bodies = Arc::new(AtomicUsize::new(0));
    // The listening connection starts in the background: let it settle, so k counts the
    // protocol's requests.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = relay.requests();

    // The hand-over: the other process holds first, and lets go once the victim waits.
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
        // Released once the victim registered as a waiter, or after a while if it never did.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while !pg_locks(&admin, &path)
                .await
                .iter()
                .any(|(class, _, _)| *class == CLASSES[2])
            {
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
    let fired = relay.stats().cuts;
    if std::env::var_os("ZKLOCK_CUTS_DEBUG").is_some() {
        eprintln!("{protocol:?} {cut:?}: sent {sent}, cuts fired {fired}");
    }
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
            let window = run_after(&admin, &path).await;
            run_job(&other, key, &other_rec, &bodies, Duration::ZERO).await;
            let now = run_after(&admin, &path).await;
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
    // Nothing left: every advisory lock of the key is gone once every process let go or its
    // sessions ended (the server ends a silent session after the lease).
    common::eventually(
        &format!("no advisory lock of {key} left ({protocol:?}, cut {cut:?})"),
        LEASE * 3,
        || async { pg_locks(&admin, &path).await.is_empty() },
    )
    .await;
    if how == Some(Cut::Kill) {
        let deadline = tokio::time::Instant::now() + LEASE * 3;
        loop {
            let left = sessions_of(&admin, &victim_id).await;
            if left.is_empty() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{protocol:?}, cut {cut:?}: sessions of the killed victim left after {:?}: {left:?}",
                LEASE * 3
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    sent
}

/// Sweeps `protocol` on a server of its own.
async fn sweep_postgres(protocol: Protocol, offset: usize) {
    let pg = PostgresServer::start().expect("start postgres (see the test kit's error)");
    // The last request of an uncut run is the release; a killed victim holds until told of
    // its loss, so its last request is one of its hold's liveness checks: always run it.
    sweep(protocol, offset, true, |key, cut| {
        let pg = &pg;
        async move { run_once(pg, protocol, &key, cut).await }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_cut_at_every_request() {
    sweep_postgres(Protocol::Mutex, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_cut_at_every_request() {
    sweep_postgres(Protocol::Handover, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_lock_cut_at_every_request() {
    sweep_postgres(Protocol::Read, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_lock_cut_at_every_request() {
    sweep_postgres(Protocol::Write, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_cut_at_every_request() {
    sweep_postgres(Protocol::Job, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cut_at_every_request() {
    sweep_postgres(Protocol::Leader, 2).await;
}
