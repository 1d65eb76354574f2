//! The local table against the in-memory backend, no server: cancellation at each await point
//! of an acquire through the local queue, bounded runs of local handoffs, token order across
//! handoffs, and lost or stale holds that must not hold up or disturb the queue.
//!
//! A "process" is a [`LocalTable`] of its own on one shared [`MemoryBackend`]: two tables on
//! one backend contend as two processes do on one server.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use super::{acquire, Grant, LocalConfig, LocalTable};
use crate::backend::memory::MemoryBackend;
use crate::backend::{LockTarget, Lose};
use crate::metrics::{KeyLabel, Labels, Recipe};
use crate::types::error::{Error, Result};
use crate::types::loss::LossReason;
use crate::types::mode::{HoldMode, LockMode, Wait};
use crate::types::token::FencingToken;

const PATH: &str = "/zklock/locks/k";

fn target() -> LockTarget {
    LockTarget::lock("k".into(), PATH.into())
}

fn queued(max_local_handoffs: u32) -> LocalConfig {
    LocalConfig {
        local_queue: true,
        max_local_handoffs,
        linger: Duration::ZERO,
        tokens: true,
    }
}

fn within(ms: u64) -> Wait {
    let t = Duration::from_millis(ms);
    Wait::Until(tokio::time::Instant::now() + t, t)
}

/// An acquire of the mutex on [`PATH`] through `table`'s local queue, cut at its deadline as
/// the recipes cut it (the deadline is theirs: no layer below builds the timeout's error).
fn lock<'a>(
    backend: &'a MemoryBackend,
    table: &'a LocalTable,
    config: LocalConfig,
    target: &'a LockTarget,
    wait: Wait,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Option<Grant>>> + Send + 'a>> {
    let acquire = acquire(
        backend,
        table,
        config,
        target,
        LockMode::Exclusive,
        wait,
        &LABELS,
    );
    Box::pin(async move {
        match wait {
            Wait::Until(deadline, waited) => tokio::time::timeout_at(deadline, acquire)
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Timeout {
                        key: target.key.to_string(),
                        waited,
                    })
                }),
            _ => acquire.await,
        }
    })
}

/// The metrics' labels of [`PATH`]'s acquires.
static LABELS: once_cell::sync::Lazy<Labels> = once_cell::sync::Lazy::new(|| {
    Labels::new(
        Recipe::Mutex,
        crate::types::backend_kind::BackendKind::Memory,
        KeyLabel::None,
        "k",
    )
});

/// Polls `fut` once: true while it is still pending (in the queue, or at the backend).
async fn pends<F: Future + Unpin>(fut: &mut F) -> bool {
    futures::poll!(fut).is_pending()
}

/// Awaits an acquire that must complete soon with a grant.
async fn granted<F: Future<Output = Result<Option<Grant>>> + Unpin>(fut: F, what: &str) -> Grant {
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: the queue stalled"))
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
        .unwrap_or_else(|| panic!("{what}: not granted"))
}

/// The first holder of the mutex on [`PATH`] through `table`'s local queue, granted at once.
async fn first_holder(backend: &MemoryBackend, table: &LocalTable, t: &LockTarget) -> Grant {
    granted(lock(backend, table, queued(8), t, Wait::Forever), "first").await
}

/// `table`'s local lock of the mutex on [`PATH`], while anyone holds, acquires or waits for it.
fn local_lock(table: &LocalTable) -> Option<Arc<super::LocalLock>> {
    let map = table.map.lock().unwrap();
    map.locks
        .get(&(Arc::<str>::from(PATH), HoldMode::Exclusive))
        .and_then(std::sync::Weak::upgrade)
}

/// Whether `table` has nobody holding, acquiring or queued for [`PATH`].
fn idle(table: &LocalTable) -> bool {
    local_lock(table).is_none_or(|lock| {
        let state = lock.state();
        !state.busy && state.queue.is_empty()
    })
}

/// A try through another table (another process): `Some` only when the backend lock is free.
async fn other_process_gets_it(backend: &MemoryBackend) -> bool {
    let table = LocalTable::default();
    let t = target();
    match lock(backend, &table, queued(8), &t, Wait::Never)
        .await
        .unwrap()
    {
        Some(grant) => {
            grant.release().await.unwrap();
            true
        }
        None => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Cancellation at each await point

#[tokio::test]
async fn a_waiter_cancelled_while_queued_does_not_stall_the_queue() {
    let backend = MemoryBackend::new();
    let table = LocalTable::default();
    let t = target();
    let first = first_holder(&backend, &table, &t).await;
    let mut second = lock(&backend, &table, queued(8), &t, Wait::Forever);
    let mut third = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut second).await && pends(&mut third).await);
    drop(second);
    let token = first.token;
    first.release().await.unwrap();
    let third = granted(third, "the waiter behind a cancelled one").await;
    assert!(third.token > token);
    assert_eq!(third.token.grant(), token.grant(), "handed on locally");
    assert!(!other_process_gets_it(&backend).await);
    third.release().await.unwrap();
    assert!(idle(&table));
    assert!(other_process_gets_it(&backend).await);
}

#[tokio::test]
async fn a_waiter_that_times_out_in_the_queue_returns_timeout_and_leaves_it_moving() {
    let backend = MemoryBackend::new();
    let table = LocalTable::default();
    let t = target();
    let first = first_holder(&backend, &table, &t).await;
    let mut bounded = lock(&backend, &table, queued(8), &t, within(50));
    assert!(pends(&mut bounded).await);
    let mut patient = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut patient).await);
    match bounded.await {
        Err(Error::Timeout { key, waited }) => {
            assert_eq!(key, "k");
            assert_eq!(waited, Duration::from_millis(50));
        }
        other => panic!("expected a timeout, got {:?}", other.map(|g| g.is_some())),
    }
    first.release().await.unwrap();
    granted(patient, "the waiter behind a timed-out one")
        .await
        .release()
        .await
        .unwrap();
    assert!(idle(&table));
}

/// Waiters that give up while one holder keeps the lock (a handler that waits 100 ms for a key
/// held for an hour) leave no place behind for longer than the queue takes to double: the
/// queue stays short, and the live waiters among them keep their order.
#[tokio::test]
async fn waiters_that_give_up_under_a_long_hold_do_not_grow_the_queue() {
    let backend = MemoryBackend::new();
    let table = LocalTable::default();
    let t = target();
    let first = first_holder(&backend, &table, &t).await;
    let mut early = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut early).await);
    let queue_len = || {
        let lock = local_lock(&table).expect("the lock is in the table while it is held");
        let len = lock.state().queue.len();
        len
    };
    let mut longest = 0;
    for _ in 0..10_000 {
        let mut gives_up = lock(&backend, &table, queued(8), &t, Wait::Forever);
        assert!(pends(&mut gives_up).await);
        drop(gives_up);
        longest = longest.max(queue_len());
    }
    let mut late = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut late).await);
    assert!(
        longest <= 2 * 2 + 64,
        "10,000 waiters gave up behind one holder, and the queue grew to {longest} places"
    );
    first.release().await.unwrap();
    let early = granted(early, "the waiter queued before the ones that gave up").await;
    assert!(pends(&mut late).await, "the later waiter waits its turn");
    early.release().await.unwrap();
    granted(late, "the waiter queued after the ones that gave up")
        .await
        .release()
        .await
        .unwrap();
    assert!(idle(&table));
}

/// The grant is handed to a waiter, which is dropped before it polls it: the grant sitting in
/// its channel goes to the next waiter.
#[tokio::test]
async fn a_waiter_cancelled_with_its_grant_in_flight_passes_the_grant_on() {
    let backend = MemoryBackend::new();
    let table = LocalTable::default();
    let t = target();
    let first = first_holder(&backend, &table, &t).await;
    let token = first.token;
    let mut second = lock(&backend, &table, queued(8), &t, Wait::Forever);
    let mut third = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut second).await && pends(&mut third).await);
    first.release().await.unwrap(); // handed to `second`, which never looks at it
    drop(second);
    let third = granted(third, "the waiter behind a cancelled taker").await;
    assert_eq!(third.token.grant(), token.grant(), "still the first hold");
    assert!(third.token > token);
    assert!(
        !other_process_gets_it(&backend).await,
        "one backend hold throughout"
    );
    third.release().await.unwrap();
    assert!(idle(&table));
    assert!(other_process_gets_it(&backend).await);
}

/// The task with the duty (acquiring the process's backend hold) is cancelled while it waits
/// at the backend: the duty goes to the next waiter, and the cancelled backend entry is gone.
#[tokio::test]
async fn the_duty_holder_cancelled_while_acquiring_passes_the_duty() {
    let backend = MemoryBackend::new();
    let (here, there) = (LocalTable::default(), LocalTable::default());
    let t = target();
    let other = granted(
        lock(&backend, &there, queued(8), &t, Wait::Forever),
        "other",
    )
    .await;
    let mut driver = lock(&backend, &here, queued(8), &t, Wait::Forever);
    assert!(pends(&mut driver).await, "waits at the backend");
    let mut next = lock(&backend, &here, queued(8), &t, Wait::Forever);
    assert!(pends(&mut next).await, "waits in the local queue");
    drop(driver);
    assert!(
        pends(&mut next).await,
        "took the duty, now waits at the backend"
    );
    let other_token = other.token;
    other.release().await.unwrap();
    let next = granted(next, "the duty's next holder").await;
    assert!(next.token > other_token);
    next.release().await.unwrap();
    assert!(idle(&here) && idle(&there));
    assert!(
        other_process_gets_it(&backend).await,
        "no entry left behind"
    );
}

/// The duty is passed to a waiter that is dropped before it polls it: the duty in its channel
/// goes on to the next waiter.
#[tokio::test]
async fn a_duty_in_flight_to_a_cancelled_waiter_is_passed_on() {
    let backend = MemoryBackend::new();
    let (here, there) = (LocalTable::default(), LocalTable::default());
    let t = target();
    let other = granted(
        lock(&backend, &there, queued(8), &t, Wait::Forever),
        "other",
    )
    .await;
    let mut driver = lock(&backend, &here, queued(8), &t, Wait::Forever);
    let mut second = lock(&backend, &here, queued(8), &t, Wait::Forever);
    let mut third = lock(&backend, &here, queued(8), &t, Wait::Forever);
    assert!(pends(&mut driver).await && pends(&mut second).await && pends(&mut third).await);
    drop(driver); // the duty goes to `second`'s channel
    drop(second); // ... and from there to `third`
    other.release().await.unwrap();
    granted(third, "the waiter behind a cancelled duty taker")
        .await
        .release()
        .await
        .unwrap();
    assert!(idle(&here));
    assert!(other_process_gets_it(&backend).await);
}

/// The duty holder's own backend wait runs out: a timeout for it, the duty for the next.
#[tokio::test]
async fn the_duty_holder_timing_out_at_the_backend_passes_the_duty() {
    let backend = MemoryBackend::new();
    let (here, there) = (LocalTable::default(), LocalTable::default());
    let t = target();
    let other = granted(
        lock(&backend, &there, queued(8), &t, Wait::Forever),
        "other",
    )
    .await;
    let mut driver = lock(&backend, &here, queued(8), &t, within(50));
    assert!(pends(&mut driver).await);
    let mut next = lock(&backend, &here, queued(8), &t, Wait::Forever);
    assert!(pends(&mut next).await);
    assert!(matches!(driver.await, Err(Error::Timeout { .. })));
    assert!(pends(&mut next).await);
    other.release().await.unwrap();
    granted(next, "after the duty holder timed out")
        .await
        .release()
        .await
        .unwrap();
    assert!(idle(&here));
}

/// A try never queues: `None` at once while a local task holds, and a try that took the duty
/// and found the backend taken leaves the local lock idle.
#[tokio::test]
async fn tries_never_queue_and_never_leave_the_local_lock_busy() {
    let backend = MemoryBackend::new();
    let (here, there) = (LocalTable::default(), LocalTable::default());
    let t = target();
    let held = granted(lock(&backend, &here, queued(8), &t, Wait::Forever), "held").await;
    assert!(lock(&backend, &here, queued(8), &t, Wait::Never)
        .await
        .unwrap()
        .is_none());
    held.release().await.unwrap();
    assert!(idle(&here));

    let other = granted(
        lock(&backend, &there, queued(8), &t, Wait::Forever),
        "other",
    )
    .await;
    assert!(lock(&backend, &here, queued(8), &t, Wait::Never)
        .await
        .unwrap()
        .is_none());
    assert!(idle(&here), "the failed try gave the duty back");
    other.release().await.unwrap();
    let mine = lock(&backend, &here, queued(8), &t, Wait::Never)
        .await
        .unwrap()
        .expect("free now");
    mine.release().await.unwrap();
}

/// Cancelled at random points while two processes contend, with short runs of handoffs: never
/// two holders, no waiter stalls, and everything idle at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cancellations_never_stall_the_queue_nor_break_exclusion() {
    let backend = Arc::new(MemoryBackend::new());
    let tables = [
        Arc::new(LocalTable::default()),
        Arc::new(LocalTable::default()),
    ];
    let inside = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let mut tasks = vec![];
    for i in 0..8u64 {
        let (backend, table) = (backend.clone(), tables[i as usize % 2].clone());
        let (inside, max) = (inside.clone(), max.clone());
        tasks.push(tokio::spawn(async move {
            let t = target();
            let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (i + 1);
            for _ in 0..40 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let steady = i < 2;
                let after = Duration::from_micros(seed % 2000);
                let acquiring = lock(&backend, &table, queued(2), &t, Wait::Forever);
                let grant = if steady {
                    Some(granted(acquiring, "a steady task").await)
                } else {
                    tokio::time::timeout(after, acquiring)
                        .await
                        .ok()
                        .map(|g| g.unwrap().unwrap())
                };
                if let Some(grant) = grant {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    if seed.is_multiple_of(2) {
                        grant.release().await.unwrap();
                    } else {
                        drop(grant);
                    }
                }
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("stalled")
            .unwrap();
    }
    assert_eq!(max.load(Ordering::SeqCst), 1, "two holders at once");
    assert!(tables.iter().all(|t| idle(t)));
    assert!(other_process_gets_it(&backend).await);
}

// ---------------------------------------------------------------------------------------------
// Handoff bounds and token order

/// After `max_local_handoffs` local handoffs the hold goes back to the backend, where another
/// process waits: it gets its turn before the rest of the local queue.
#[tokio::test]
async fn after_max_local_handoffs_another_process_gets_its_turn() {
    let backend = MemoryBackend::new();
    let (here, there) = (LocalTable::default(), LocalTable::default());
    let t = target();
    let g0 = granted(lock(&backend, &here, queued(2), &t, Wait::Forever), "g0").await;
    let mut w1 = lock(&backend, &here, queued(2), &t, Wait::Forever);
    let mut w2 = lock(&backend, &here, queued(2), &t, Wait::Forever);
    let mut w3 = lock(&backend, &here, queued(2), &t, Wait::Forever);
    let mut w4 = lock(&backend, &here, queued(2), &t, Wait::Forever);
    for w in [&mut w1, &mut w2, &mut w3, &mut w4] {
        assert!(pends(w).await);
    }
    let mut elsewhere = lock(&backend, &there, queued(2), &t, Wait::Forever);
    assert!(pends(&mut elsewhere).await, "another process waits");

    let mut tokens = vec![g0.token];
    g0.release().await.unwrap();
    let g1 = granted(w1, "first handoff").await;
    tokens.push(g1.token);
    assert!(pends(&mut elsewhere).await);
    g1.release().await.unwrap();
    let g2 = granted(w2, "second handoff").await;
    tokens.push(g2.token);
    assert_eq!(
        tokens.iter().map(FencingToken::local).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    assert!(pends(&mut elsewhere).await);
    g2.release().await.unwrap(); // the run is over: the hold goes back to the backend
    let x = granted(elsewhere, "the other process's turn").await;
    tokens.push(x.token);
    assert!(pends(&mut w3).await, "the rest of the local queue waits");
    assert!(pends(&mut w4).await);
    x.release().await.unwrap();
    let g3 = granted(w3, "the local queue again, on a new hold").await;
    tokens.push(g3.token);
    g3.release().await.unwrap();
    let g4 = granted(w4, "handed on").await;
    tokens.push(g4.token);
    g4.release().await.unwrap();
    let locals: Vec<u32> = tokens.iter().map(FencingToken::local).collect();
    assert_eq!(locals, [0, 1, 2, 0, 0, 1], "{tokens:?}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert!(idle(&here) && idle(&there));
}

/// With `max_local_handoffs = 0` nothing is handed on: every local waiter takes a hold of its
/// own, behind the other process.
#[tokio::test]
async fn no_local_handoffs_when_the_bound_is_zero() {
    let backend = MemoryBackend::new();
    let (here, there) = (LocalTable::default(), LocalTable::default());
    let t = target();
    let g0 = granted(lock(&backend, &here, queued(0), &t, Wait::Forever), "g0").await;
    let mut w1 = lock(&backend, &here, queued(0), &t, Wait::Forever);
    assert!(pends(&mut w1).await);
    let mut elsewhere = lock(&backend, &there, queued(0), &t, Wait::Forever);
    assert!(pends(&mut elsewhere).await);
    g0.release().await.unwrap();
    let x = granted(elsewhere, "the other process first").await;
    assert!(pends(&mut w1).await);
    x.release().await.unwrap();
    let g1 = granted(w1, "then the local waiter").await;
    assert_eq!(g1.token.local(), 0);
    g1.release().await.unwrap();
}

/// Tokens strictly increase in grant order across local handoffs and new holds, two processes
/// contending; the local part counts handoffs on one hold, up to the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_local_handoffs_and_processes() {
    let backend = Arc::new(MemoryBackend::new());
    let tables = [
        Arc::new(LocalTable::default()),
        Arc::new(LocalTable::default()),
    ];
    let tokens = Arc::new(StdMutex::new(Vec::new()));
    let mut tasks = vec![];
    for i in 0..12 {
        let (backend, table, tokens) = (backend.clone(), tables[i % 2].clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let t = target();
            for _ in 0..6 {
                let g = granted(lock(&backend, &table, queued(3), &t, Wait::Forever), "g").await;
                tokens.lock().unwrap().push(g.token);
                tokio::task::yield_now().await;
                g.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 72);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens out of order: {tokens:?}"
    );
    assert!(tokens.iter().all(|t| t.local() <= 3), "{tokens:?}");
    assert!(tokens.iter().any(|t| t.local() > 0), "some handoffs");
    // A local part follows its predecessor on the same hold.
    for w in tokens.windows(2) {
        if w[1].local() > 0 {
            assert_eq!(w[1].grant(), w[0].grant(), "{w:?}");
            assert_eq!(w[1].local(), w[0].local() + 1, "{w:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lost and stale holds

/// A hold lost at the backend and kept by user code holds up none of the local waiters: the
/// next takes a hold of its own, with a larger token. The lost grant's late release says it was
/// lost and disturbs nobody.
#[tokio::test]
async fn a_lost_hold_kept_by_user_code_does_not_hold_up_local_waiters() {
    let backend = MemoryBackend::new();
    let table = LocalTable::default();
    let t = target();
    let kept = granted(lock(&backend, &table, queued(8), &t, Wait::Forever), "kept").await;
    let mut second = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut second).await);

    backend.lose(PATH, LossReason::SessionExpired);
    assert_eq!(kept.loss_reason(), Some(LossReason::SessionExpired));
    let second = granted(second, "the waiter behind a lost hold").await;
    assert!(second.token > kept.token);
    assert_eq!(second.token.local(), 0, "a hold of its own");
    assert_eq!(second.loss_reason(), None);

    let mut third = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut third).await, "`second` holds");
    // The stale release: an error for its caller, nothing for the queue.
    let released = kept.release().await;
    assert!(
        matches!(released, Err(Error::LockLost { .. })),
        "{released:?}"
    );
    assert!(
        pends(&mut third).await,
        "the stale release handed nothing on"
    );
    assert_eq!(second.loss_reason(), None);
    assert!(
        !other_process_gets_it(&backend).await,
        "`second` still holds"
    );
    let token = second.token;
    second.release().await.unwrap();
    let third = granted(third, "handed on by the real holder").await;
    assert_eq!(third.token.grant(), token.grant());
    assert_eq!(third.token.local(), 1);
    third.release().await.unwrap();
    assert!(idle(&table));
}

/// The same when the lost hold was handed on locally (a shared backend hold), and its stale
/// grant is dropped rather than released.
#[tokio::test]
async fn a_stale_handed_on_grant_dropped_after_the_queue_moved_on_disturbs_nobody() {
    let backend = MemoryBackend::new();
    let table = LocalTable::default();
    let t = target();
    let g1 = granted(lock(&backend, &table, queued(8), &t, Wait::Forever), "g1").await;
    let mut w2 = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut w2).await);
    g1.release().await.unwrap();
    let g2 = granted(w2, "handed on").await;
    assert_eq!(g2.token.local(), 1);

    let mut w3 = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut w3).await);
    backend.lose(PATH, LossReason::NodeDeleted);
    let g3 = granted(w3, "the waiter behind a lost handed-on hold").await;
    assert!(g3.token > g2.token);
    let mut w4 = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut w4).await);
    drop(g2); // stale: the queue moved on without it
    assert!(pends(&mut w4).await, "the stale drop handed nothing on");
    assert_eq!(g3.loss_reason(), None);
    assert!(!other_process_gets_it(&backend).await);
    g3.release().await.unwrap();
    granted(w4, "handed on by the real holder")
        .await
        .release()
        .await
        .unwrap();
    assert!(idle(&table));
}

/// A grant handed on locally whose hold is lost before the taker looks at it: the taker does
/// not rely on it, and takes a hold of its own.
#[tokio::test]
async fn a_handed_on_grant_lost_in_flight_is_not_relied_on() {
    let backend = MemoryBackend::new();
    let table = LocalTable::default();
    let t = target();
    let g1 = granted(lock(&backend, &table, queued(8), &t, Wait::Forever), "g1").await;
    let token = g1.token;
    let mut w2 = lock(&backend, &table, queued(8), &t, Wait::Forever);
    assert!(pends(&mut w2).await);
    g1.release().await.unwrap(); // handed to w2, not yet looked at
    backend.lose(PATH, LossReason::NodeDeleted);
    let g2 = granted(w2, "a taker of a lost grant").await;
    assert_eq!(
        g2.loss_reason(),
        None,
        "a hold of its own, not the lost one"
    );
    assert!(g2.token > token && g2.token.local() == 0);
    g2.release().await.unwrap();
    assert!(idle(&table));
}

/// A try from another task of the process, while a lost hold is kept by user code: the lock is
/// free at the backend, and the lost hold must not keep the try out any more than it keeps out
/// a waiter.
#[tokio::test]
async fn a_lost_hold_kept_by_user_code_does_not_keep_tries_out() {
    let backend = MemoryBackend::new();
    let table = LocalTable::default();
    let t = target();
    let kept = granted(lock(&backend, &table, queued(8), &t, Wait::Forever), "kept").await;
    backend.lose(PATH, LossReason::SessionExpired);
    assert!(other_process_gets_it(&backend).await, "free at the backend");
    let tried = lock(&backend, &table, queued(8), &t, Wait::Never)
        .await
        .unwrap();
    assert!(
        tried.is_some(),
        "a try in the holder's process is refused while the lost hold is kept"
    );
    drop(tried);
    drop(kept);
}
