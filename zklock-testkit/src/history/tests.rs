//! The checker's rules, on hand-made histories.

use super::*;

fn ev(at: u64, worker: &str, key: &str, mode: Mode, op: Op) -> Event {
    Event {
        at_ns: at,
        worker: worker.into(),
        key: key.into(),
        mode,
        op,
    }
}

/// A silent fault (`what`) on `worker` at `at`: one the worker's holds do not hear of.
fn silent_fault(at: u64, worker: &str, what: &str) -> Event {
    ev(
        at,
        worker,
        "",
        Mode::Exclusive,
        Op::Fault {
            what: what.into(),
            silent: true,
        },
    )
}

fn hold(events: &mut Vec<Event>, worker: &str, mode: Mode, token: u128, from: u64, to: u64) {
    events.push(ev(from - 1, worker, "k", mode, Op::AcquireInvoked));
    events.push(ev(from, worker, "k", mode, Op::AcquireOk { token }));
    events.push(ev(to, worker, "k", mode, Op::ReleaseInvoked));
    events.push(ev(to + 1, worker, "k", mode, Op::ReleaseOk));
}

#[test]
fn sequential_holds_with_rising_tokens_pass() {
    let mut e = Vec::new();
    hold(&mut e, "a", Mode::Exclusive, 1, 10, 20);
    hold(&mut e, "b", Mode::Exclusive, 2, 30, 40);
    hold(&mut e, "a", Mode::Exclusive, 3, 50, 60);
    let r = check(&e);
    assert!(r.is_ok(), "{r}");
    assert_eq!(r.acquires, 3);
    assert_eq!(r.holds.len(), 3);
}

#[test]
fn overlapping_exclusive_holds_fail() {
    let mut e = Vec::new();
    hold(&mut e, "a", Mode::Exclusive, 1, 10, 30);
    hold(&mut e, "b", Mode::Exclusive, 2, 20, 40);
    let r = check(&e);
    assert_eq!(r.violations.len(), 1, "{r}");
    match &r.violations[0] {
        Violation::Overlap(o) => {
            assert_eq!(o.first.worker, "a");
            assert_eq!(o.overlap_ns, 10);
        }
        v => panic!("{v}"),
    }
}

#[test]
fn readers_share_but_not_with_writers() {
    let mut e = Vec::new();
    hold(&mut e, "r1", Mode::Shared, 1, 10, 40);
    hold(&mut e, "r2", Mode::Shared, 2, 20, 50);
    hold(&mut e, "w", Mode::Exclusive, 3, 45, 60);
    let r = check(&e);
    assert_eq!(r.violations.len(), 1, "{r}");
}

#[test]
fn shared_tokens_only_need_to_pass_writers() {
    let mut e = Vec::new();
    hold(&mut e, "w", Mode::Exclusive, 5, 10, 20);
    hold(&mut e, "r1", Mode::Shared, 7, 30, 50);
    hold(&mut e, "r2", Mode::Shared, 6, 35, 55); // local handoff order, still above the writer
    hold(&mut e, "w2", Mode::Exclusive, 8, 60, 70);
    assert!(check(&e).is_ok());
    let mut e = Vec::new();
    hold(&mut e, "w", Mode::Exclusive, 5, 10, 20);
    hold(&mut e, "r1", Mode::Shared, 4, 30, 50);
    assert!(!check(&e).is_ok());
}

#[test]
fn a_loss_report_ends_the_hold() {
    let mut e = Vec::new();
    e.push(ev(
        10,
        "a",
        "k",
        Mode::Exclusive,
        Op::AcquireOk { token: 1 },
    ));
    e.push(ev(
        15,
        "a",
        "k",
        Mode::Exclusive,
        Op::Lost {
            reason: "disconnected".into(),
        },
    ));
    hold(&mut e, "b", Mode::Exclusive, 2, 20, 30);
    e.push(ev(40, "a", "k", Mode::Exclusive, Op::ReleaseInvoked));
    let r = check(&e);
    assert!(r.is_ok(), "{r}");
    assert_eq!(r.losses, 1);
}

#[test]
fn a_loss_reported_after_the_release_ends_nothing() {
    let mut e = Vec::new();
    hold(&mut e, "a", Mode::Exclusive, 1, 10, 20);
    e.push(ev(
        25,
        "a",
        "k",
        Mode::Exclusive,
        Op::Lost {
            reason: "late".into(),
        },
    ));
    hold(&mut e, "a", Mode::Exclusive, 2, 30, 40);
    let r = check(&e);
    assert!(r.is_ok(), "{r}");
    assert_eq!(r.holds.len(), 2);
    assert_eq!(r.holds[1].invoked_ns, 29);
}

#[test]
fn silent_faults_explain_overlaps_but_not_tokens() {
    let mut e = Vec::new();
    hold(&mut e, "a", Mode::Exclusive, 1, 10, 100);
    e.push(silent_fault(15, "a", "SIGSTOP"));
    hold(&mut e, "b", Mode::Exclusive, 2, 50, 60);
    let r = check(&e);
    assert!(r.is_ok(), "{r}");
    assert_eq!(r.unprotected.len(), 1);
    // A fault on b does not explain a's overlap, nor a fault after the second grant.
    let mut e = Vec::new();
    hold(&mut e, "a", Mode::Exclusive, 1, 10, 100);
    e.push(silent_fault(55, "a", "late"));
    hold(&mut e, "b", Mode::Exclusive, 2, 50, 60);
    assert_eq!(check(&e).violations.len(), 1);
    // The token must still increase.
    let mut e = Vec::new();
    hold(&mut e, "a", Mode::Exclusive, 3, 10, 100);
    e.push(silent_fault(15, "a", "SIGSTOP"));
    hold(&mut e, "b", Mode::Exclusive, 2, 50, 60);
    let r = check(&e);
    assert!(matches!(
        r.violations.as_slice(),
        [Violation::TokenNotIncreasing { .. }]
    ));
}

#[test]
fn a_grant_recorded_after_a_silent_fault_on_its_own_worker_is_unprotected() {
    // b's acquire is in flight when its session is expired from another handle; a is granted
    // after the expiry (token 7); b records the grant it had from before (token 5) only
    // later, and is told of the loss at 40.
    let fault = |at| silent_fault(at, "b", "expired");
    let mut e = vec![
        ev(5, "b", "k", Mode::Exclusive, Op::AcquireInvoked),
        fault(8),
        ev(25, "b", "k", Mode::Exclusive, Op::AcquireOk { token: 5 }),
        ev(
            40,
            "b",
            "k",
            Mode::Exclusive,
            Op::Lost {
                reason: "expired".into(),
            },
        ),
    ];
    hold(&mut e, "a", Mode::Exclusive, 7, 20, 30);
    let r = check(&e);
    assert!(r.is_ok(), "{r}");
    assert_eq!(r.unprotected.len(), 1);
    // Not when b was not told (it released as if it had held all along) ...
    let mut e = vec![
        ev(5, "b", "k", Mode::Exclusive, Op::AcquireInvoked),
        fault(8),
        ev(25, "b", "k", Mode::Exclusive, Op::AcquireOk { token: 5 }),
        ev(40, "b", "k", Mode::Exclusive, Op::ReleaseInvoked),
    ];
    hold(&mut e, "a", Mode::Exclusive, 7, 20, 30);
    assert!(!check(&e).is_ok());
    // ... nor when the fault came before b's acquire.
    let mut e = vec![
        fault(3),
        ev(5, "b", "k", Mode::Exclusive, Op::AcquireInvoked),
        ev(25, "b", "k", Mode::Exclusive, Op::AcquireOk { token: 5 }),
        ev(
            40,
            "b",
            "k",
            Mode::Exclusive,
            Op::Lost {
                reason: "expired".into(),
            },
        ),
    ];
    hold(&mut e, "a", Mode::Exclusive, 7, 20, 30);
    assert!(!check(&e).is_ok());
}

#[test]
fn untokened_holds_are_checked_for_overlaps_only() {
    let mut e = Vec::new();
    hold(&mut e, "a", Mode::Exclusive, 5, 10, 20);
    hold(&mut e, "peer", Mode::Exclusive, NO_TOKEN, 30, 40);
    hold(&mut e, "b", Mode::Exclusive, 6, 50, 60);
    hold(&mut e, "peer", Mode::Shared, NO_TOKEN, 70, 80);
    hold(&mut e, "c", Mode::Shared, 7, 75, 85);
    let r = check(&e);
    assert!(r.is_ok(), "{r}");
    assert!(r.holds[1].to_string().contains("no token"));
    let mut e = Vec::new();
    hold(&mut e, "a", Mode::Exclusive, 5, 10, 30);
    hold(&mut e, "peer", Mode::Exclusive, NO_TOKEN, 25, 40);
    assert!(matches!(
        check(&e).violations.as_slice(),
        [Violation::Overlap(_)]
    ));
}

#[test]
fn events_recorded_late_with_their_own_time_are_ordered() {
    let history = History::new();
    let (a, peer) = (history.recorder("a"), history.recorder("peer"));
    a.acquire_invoked("k", Mode::Exclusive);
    a.acquire_ok("k", Mode::Exclusive, 1);
    let start = now_ns();
    a.release_invoked("k");
    // The peer's hold, reported afterwards, began while `a` still held the key.
    peer.record_at(
        start,
        "k",
        Mode::Exclusive,
        Op::AcquireOk { token: NO_TOKEN },
    );
    peer.record_at(now_ns(), "k", Mode::Exclusive, Op::ReleaseInvoked);
    assert_eq!(history.check().violations.len(), 1);
}

#[test]
fn holds_must_end_and_crashes_end_them() {
    let e = vec![ev(
        10,
        "a",
        "k",
        Mode::Exclusive,
        Op::AcquireOk { token: 1 },
    )];
    assert!(matches!(
        check(&e).violations.as_slice(),
        [Violation::NeverEnded(_)]
    ));
    let e = vec![
        ev(10, "a", "k", Mode::Exclusive, Op::AcquireOk { token: 1 }),
        ev(20, "a", "", Mode::Exclusive, Op::Crashed),
    ];
    assert!(check(&e).is_ok());
}

#[test]
fn malformed_sequences_are_reported() {
    let e = vec![
        ev(10, "a", "k", Mode::Exclusive, Op::AcquireOk { token: 1 }),
        ev(20, "a", "k", Mode::Exclusive, Op::AcquireOk { token: 2 }),
        ev(30, "a", "k", Mode::Exclusive, Op::ReleaseInvoked),
        ev(40, "b", "k", Mode::Exclusive, Op::ReleaseInvoked),
    ];
    let r = check(&e);
    assert_eq!(
        r.violations
            .iter()
            .filter(|v| matches!(v, Violation::Malformed { .. }))
            .count(),
        2,
        "{r}"
    );
}

fn run(at_ms: u64, worker: &str, at_least_ms: u64) -> Event {
    ev(
        at_ms * 1_000_000,
        worker,
        "job",
        Mode::Exclusive,
        Op::JobRan { at_least_ms },
    )
}

#[test]
fn a_job_run_within_the_window_is_a_violation() {
    let tolerance_ms = JOB_WINDOW_TOLERANCE.as_millis() as u64;
    let e = vec![
        run(1_000, "a", 2_000),
        run(3_000 - tolerance_ms - 1, "b", 2_000),
    ];
    let r = check(&e);
    match r.violations.as_slice() {
        [Violation::JobTooSoon { earlier, later }] => {
            assert_eq!((earlier.worker.as_str(), later.worker.as_str()), ("a", "b"));
            assert!(r.violations[0].to_string().contains("at_least"), "{r}");
        }
        v => panic!("{v:?}"),
    }
    assert_eq!(r.job_runs, 2);
    // The longest window counts, not only the last run's: c starts 2.5 s after a's 5 s window
    // began, past b's 1 s window.
    let e = vec![
        run(1_000, "a", 5_000),
        run(6_000, "b", 1_000),
        run(8_500, "c", 1_000),
    ];
    assert!(check(&e).is_ok());
    let e = vec![
        run(1_000, "a", 5_000),
        run(1_500, "b", 100),
        run(3_500, "c", 1_000),
    ];
    let r = check(&e);
    assert_eq!(r.violations.len(), 2, "{r}");
    // Another job's runs are no concern of this one's window.
    let mut e = vec![run(1_000, "a", 2_000)];
    e.push(ev(
        1_500_000_000,
        "b",
        "other job",
        Mode::Exclusive,
        Op::JobRan { at_least_ms: 2_000 },
    ));
    assert!(check(&e).is_ok());
}

#[test]
fn job_runs_apart_or_within_the_tolerance_pass() {
    let tolerance_ms = JOB_WINDOW_TOLERANCE.as_millis() as u64;
    let e = vec![
        run(1_000, "a", 2_000),
        run(3_000, "b", 2_000),
        run(5_000 - tolerance_ms, "a", 2_000),
        run(9_000, "c", 0),
        run(9_000, "a", 0),
    ];
    let r = check(&e);
    assert!(r.is_ok(), "{r}");
    assert_eq!(r.job_runs, 5);
    // A run's event is no hold: it neither starts nor ends one of its worker's.
    let mut e = Vec::new();
    hold(&mut e, "a", Mode::Exclusive, 1, 10, 20);
    e.push(ev(
        15,
        "a",
        "k",
        Mode::Exclusive,
        Op::JobRan { at_least_ms: 1 },
    ));
    assert!(check(&e).is_ok());
}

/// A job's events as the soak records them: the ask for its lock at `asked_ms`, the grant and
/// the body's start at `body_ms`, the release 5 ms later.
fn job_run(e: &mut Vec<Event>, worker: &str, asked_ms: u64, body_ms: u64, at_least_ms: u64) {
    let ms = 1_000_000;
    let x = Mode::Exclusive;
    e.push(ev(asked_ms * ms, worker, "job", x, Op::AcquireInvoked));
    let token = u128::from(body_ms);
    e.push(ev(body_ms * ms, worker, "job", x, Op::AcquireOk { token }));
    e.push(ev(
        body_ms * ms + 1,
        worker,
        "job",
        x,
        Op::JobRan { at_least_ms },
    ));
    e.push(ev((body_ms + 5) * ms, worker, "job", x, Op::ReleaseInvoked));
    e.push(ev((body_ms + 5) * ms + 1, worker, "job", x, Op::ReleaseOk));
}

/// The window counts from the claim, which came between the run's ask and its body: a run
/// whose body started late (a busy core between its claim and its body) is judged from its
/// ask, and the next run, whose body started on time, is not "too soon". A run that starts
/// before even the ask's window ended still is.
#[test]
fn a_job_window_counts_from_the_ask_at_the_earliest() {
    // a asked at 1.000 s, its claim then; its body started 80 ms later. b claimed 2 s after
    // a's claim and started at once: 1.92 s after a's body, yet not too soon.
    let mut e = Vec::new();
    job_run(&mut e, "a", 1_000, 1_080, 2_000);
    job_run(&mut e, "b", 2_990, 3_000, 2_000);
    e.sort_by_key(|e| e.at_ns);
    let r = check(&e);
    assert!(r.is_ok(), "{r}");
    // c's body starts 1.5 s after a's ask: too soon, whatever the bracket.
    let mut e = Vec::new();
    job_run(&mut e, "a", 1_000, 1_080, 2_000);
    job_run(&mut e, "c", 2_400, 2_500, 2_000);
    e.sort_by_key(|e| e.at_ns);
    let r = check(&e);
    assert!(
        matches!(r.violations.as_slice(), [Violation::JobTooSoon { .. }]),
        "{r}"
    );
}
