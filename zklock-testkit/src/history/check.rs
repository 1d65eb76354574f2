//! The checker: rebuilds every hold of every key from the events, then looks for conflicting
//! holds that overlap, fencing tokens that do not increase, holds that never end, and job runs
//! that start within an earlier run's window.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::event::{Event, Mode, Op, NO_TOKEN};
use super::report::{HoldEnd, HoldSpan, JobRun, Overlap, Report, Violation};

/// How much closer than its `at_least` window the checker lets two runs of a job start before it
/// reports [`Violation::JobTooSoon`]: 50 ms.
///
/// The window is enforced by the server's clock, at the server's time of each run's claim. The
/// history brackets each claim on this machine's monotonic clock ([`now_ns`](crate::now_ns)):
/// not before the run's worker asked for the job's lock (its `AcquireInvoked`, when recorded),
/// not after its body started ([`Recorder::job_ran`](crate::Recorder::job_ran)). A run is too
/// soon when its body started before the earliest end of an earlier run's window, by more than
/// this tolerance, which covers the drift between the server's wall clock and the monotonic
/// one. A run that starts a tenth of a window early is still found for every window of a second
/// or more.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use zklock_testkit::{History, JOB_WINDOW_TOLERANCE};
/// let history = History::new();
/// let (a, b) = (history.recorder("a"), history.recorder("b"));
/// a.job_ran("nightly", Duration::from_millis(200));
/// std::thread::sleep(Duration::from_millis(200) - JOB_WINDOW_TOLERANCE);
/// b.job_ran("nightly", Duration::from_millis(200)); // within the tolerance: not a violation
/// assert!(history.check().is_ok());
/// ```
pub const JOB_WINDOW_TOLERANCE: Duration = Duration::from_millis(50);

/// Checks a history (in any order; it is sorted by time first).
///
/// Holds are rebuilt per worker and key: a hold starts at `AcquireOk` and ends at the first
/// `ReleaseInvoked`, `Lost` or `Crashed` after it. Then, for every key:
///
/// - two conflicting holds (both exclusive, or one exclusive and one shared) must not overlap — unless a
///   silent fault hit the first holder between its acquire and the second grant, or hit the second
///   holder while its acquire was in flight (and it was told of the loss later), which is reported
///   as [`Report::unprotected`];
/// - every hold's fencing token must be larger than that of every earlier hold it conflicts with
///   (ordered by grant), except a hold granted while a silent fault hit its worker: the worker
///   records such a grant after the fault, later than its real place in the server's order;
/// - every hold must end;
/// - no run of a job ([`Op::JobRan`]) may start within the `at_least` window of an earlier run of
///   the same job, less [`JOB_WINDOW_TOLERANCE`]. Faults excuse nothing here: the window is kept
///   by the server, whatever happens to the clients.
///
/// # Examples
///
/// ```
/// use zklock_testkit::{check, Event, Mode, Op};
/// let events = vec![
///     Event::new("a", "k", Mode::Shared, Op::AcquireOk { token: 1 }),
///     Event::new("b", "k", Mode::Shared, Op::AcquireOk { token: 2 }),
///     Event::new("a", "k", Mode::Shared, Op::ReleaseInvoked),
///     Event::new("b", "k", Mode::Shared, Op::ReleaseInvoked),
/// ];
/// assert!(check(&events).is_ok()); // readers share
/// ```
pub fn check(events: &[Event]) -> Report {
    let mut events: Vec<&Event> = events.iter().collect();
    events.sort_by_key(|e| e.at_ns);
    let mut rebuild = Rebuild::default();
    for e in events {
        rebuild.apply(e);
    }
    let (mut report, mut holds, silent) = rebuild.finish();
    let mut by_key: BTreeMap<&str, Vec<&HoldSpan>> = BTreeMap::new();
    for h in &holds {
        by_key.entry(h.key.as_str()).or_default().push(h);
    }
    report.keys = by_key.len();
    for spans in by_key.values_mut() {
        spans.sort_by_key(|h| (h.start_ns, h.end_or_max()));
        find_overlaps(spans, &silent, &mut report);
        check_tokens(spans, &silent, &mut report);
    }
    holds.sort_by(|a, b| (&a.key, a.start_ns).cmp(&(&b.key, b.start_ns)));
    report.holds = holds;
    report
}

/// Where one worker stands on one key.
enum State {
    Idle,
    Acquiring {
        invoked_ns: u64,
    },
    Holding(HoldSpan),
    /// The hold ended by a loss report; a release may follow.
    Ended,
}

/// What one event does to a worker's state on a key: nothing more, a hold that ended, or
/// nonsense (the violation's text).
type Step = Result<Option<HoldSpan>, &'static str>;

impl State {
    /// The worker asked for the lock.
    fn invoke(&mut self, e: &Event) -> Step {
        if matches!(self, State::Holding(_)) {
            return Err("acquire invoked while holding the key");
        }
        *self = State::Acquiring {
            invoked_ns: e.at_ns,
        };
        Ok(None)
    }

    /// The worker got the lock with `token`: a hold starts (from its acquire, if one was seen).
    fn grant(&mut self, e: &Event, token: u128) -> Step {
        let invoked_ns = match self {
            State::Acquiring { invoked_ns } => *invoked_ns,
            State::Holding(_) => return Err("granted a key the worker already holds"),
            _ => e.at_ns,
        };
        *self = State::Holding(HoldSpan {
            worker: e.worker.clone(),
            key: e.key.clone(),
            mode: e.mode,
            token,
            invoked_ns,
            start_ns: e.at_ns,
            end_ns: None,
            end: HoldEnd::Open,
        });
        Ok(None)
    }

    /// The acquire ended without the lock.
    fn fail(&mut self) -> Step {
        if matches!(self, State::Holding(_)) {
            return Err("acquire failed while holding the key");
        }
        *self = State::Idle;
        Ok(None)
    }

    /// The worker stopped acting under the lock: the hold ends (after a loss, nothing does).
    fn release(&mut self, e: &Event) -> Step {
        match std::mem::replace(self, State::Idle) {
            State::Holding(span) => Ok(Some(span.ended(e.at_ns, HoldEnd::Released))),
            State::Ended => Ok(None),
            _ => Err("release invoked without a hold"),
        }
    }

    /// The worker was told the hold is lost: it ends. A loss reported after the release (or
    /// between holds) ends nothing.
    fn lose(&mut self, e: &Event, reason: &str) -> Step {
        if !matches!(self, State::Holding(_)) {
            return Ok(None);
        }
        match std::mem::replace(self, State::Ended) {
            State::Holding(span) => Ok(Some(span.ended(e.at_ns, HoldEnd::Lost(reason.into())))),
            _ => unreachable!("matched above"),
        }
    }
}

impl HoldSpan {
    /// This hold, ended at `at_ns` by `how`.
    fn ended(mut self, at_ns: u64, how: HoldEnd) -> HoldSpan {
        self.end_ns = Some(at_ns);
        self.end = how;
        self
    }
}

/// The silent faults of each worker (see [`History::silent_fault`](crate::History::silent_fault)):
/// when, and what.
#[derive(Default)]
struct SilentFaults<'a>(HashMap<&'a str, Vec<(u64, &'a str)>>);

impl SilentFaults<'_> {
    /// The first silent fault that hit `worker` from `from_ns` to `to_ns` (both included).
    fn hitting(&self, worker: &str, from_ns: u64, to_ns: u64) -> Option<&str> {
        self.0.get(worker).and_then(|faults| {
            faults
                .iter()
                .find(|(at, _)| *at >= from_ns && *at <= to_ns)
                .map(|(_, what)| *what)
        })
    }

    /// Whether `h` was granted while a silent fault was taking its worker's session away (the
    /// fault came between its acquire and its grant, and the worker was told of the loss
    /// later): the grant rests on what the server said before the fault, and the worker records
    /// it only after; its recorded start is later than its real place in the server's order.
    fn granted_in_fault(&self, h: &HoldSpan) -> bool {
        matches!(h.end, HoldEnd::Lost(_))
            && self.hitting(&h.worker, h.invoked_ns, h.start_ns).is_some()
    }
}

/// The first pass of the checker: the events in time order rebuild each worker's holds, count
/// what happened, collect the silent faults, and check the job windows.
#[derive(Default)]
struct Rebuild<'a> {
    report: Report,
    states: HashMap<(&'a str, &'a str), State>,
    holds: Vec<HoldSpan>,
    silent: SilentFaults<'a>,
    /// Per job: the run whose window reaches furthest so far.
    job_windows: HashMap<&'a str, JobRun>,
}

impl<'a> Rebuild<'a> {
    /// Takes the next event (in time order).
    fn apply(&mut self, e: &'a Event) {
        match &e.op {
            Op::Fault { what, silent } => self.fault(e, what, *silent),
            Op::JobRan { at_least_ms } => self.job_ran(e, *at_least_ms),
            Op::Crashed => self.crashed(e),
            _ => self.step(e),
        }
    }

    /// A fault: counted; a silent one that names a worker is kept for the overlap check.
    fn fault(&mut self, e: &'a Event, what: &'a str, silent: bool) {
        self.report.faults += 1;
        if silent && !e.worker.is_empty() {
            self.silent
                .0
                .entry(e.worker.as_str())
                .or_default()
                .push((e.at_ns, what));
        }
    }

    /// A job run: a violation when it starts (by more than the tolerance) within the window of
    /// the run whose window reaches furthest; then the furthest window moves on if this one
    /// reaches further.
    fn job_ran(&mut self, e: &'a Event, at_least_ms: u64) {
        self.report.job_runs += 1;
        let tolerance_ns = JOB_WINDOW_TOLERANCE.as_nanos() as u64;
        // The claim was made between the run's ask for the lock and its body's start: a run is
        // too soon only if it started before the earliest end of an earlier window.
        let claimed_from_ns = match self.states.get(&(e.worker.as_str(), e.key.as_str())) {
            Some(State::Holding(h)) => h.invoked_ns.min(e.at_ns),
            Some(State::Acquiring { invoked_ns }) => (*invoked_ns).min(e.at_ns),
            _ => e.at_ns,
        };
        let run = JobRun {
            worker: e.worker.clone(),
            key: e.key.clone(),
            at_ns: e.at_ns,
            claimed_from_ns,
            at_least_ms,
        };
        match self.job_windows.get(e.key.as_str()) {
            Some(earlier) if run.at_ns.saturating_add(tolerance_ns) < earlier.window_end_ns() => {
                self.report.violations.push(Violation::JobTooSoon {
                    earlier: earlier.clone(),
                    later: run.clone(),
                });
                if run.window_end_ns() > earlier.window_end_ns() {
                    self.job_windows.insert(e.key.as_str(), run);
                }
            }
            Some(earlier) if earlier.window_end_ns() >= run.window_end_ns() => {}
            _ => {
                self.job_windows.insert(e.key.as_str(), run);
            }
        }
    }

    /// A worker's process was killed: each of its holds ends.
    fn crashed(&mut self, e: &Event) {
        self.report.crashes += 1;
        for ((worker, _), state) in self.states.iter_mut() {
            if *worker != e.worker {
                continue;
            }
            if let State::Holding(span) = std::mem::replace(state, State::Idle) {
                self.holds.push(span.ended(e.at_ns, HoldEnd::Crashed));
            }
        }
    }

    /// An event of one worker on one key: counted, and applied to its state there.
    fn step(&mut self, e: &'a Event) {
        let state = self
            .states
            .entry((e.worker.as_str(), e.key.as_str()))
            .or_insert(State::Idle);
        let report = &mut self.report;
        let step = match &e.op {
            Op::AcquireInvoked => {
                report.acquires_invoked += 1;
                state.invoke(e)
            }
            Op::AcquireOk { token } => {
                report.acquires += 1;
                state.grant(e, *token)
            }
            Op::AcquireFailed { .. } => {
                report.acquire_failures += 1;
                state.fail()
            }
            Op::ReleaseInvoked => {
                report.releases += 1;
                state.release(e)
            }
            Op::ReleaseOk => Ok(None),
            Op::ReleaseFailed { .. } => {
                report.release_failures += 1;
                Ok(None)
            }
            Op::Lost { reason } => {
                report.losses += 1;
                state.lose(e, reason)
            }
            Op::Fault { .. } | Op::Crashed | Op::JobRan { .. } => unreachable!("see apply"),
        };
        match step {
            Ok(Some(ended)) => self.holds.push(ended),
            Ok(None) => {}
            Err(what) => report.violations.push(Violation::Malformed {
                worker: e.worker.clone(),
                key: e.key.clone(),
                at_ns: e.at_ns,
                what: what.to_string(),
            }),
        }
    }

    /// The counts, every hold (a hold still going on is a violation, and kept), and the silent
    /// faults.
    fn finish(mut self) -> (Report, Vec<HoldSpan>, SilentFaults<'a>) {
        for state in self.states.into_values() {
            if let State::Holding(span) = state {
                self.report
                    .violations
                    .push(Violation::NeverEnded(span.clone()));
                self.holds.push(span);
            }
        }
        (self.report, self.holds, self.silent)
    }
}

/// Conflicting holds of one key (`spans`, by start) that overlap: a violation, or an unprotected
/// window when a silent fault explains it. A sweep by start, keeping the holds still going on.
fn find_overlaps(spans: &[&HoldSpan], silent: &SilentFaults<'_>, report: &mut Report) {
    let mut active: Vec<&HoldSpan> = Vec::new();
    for &second in spans {
        active.retain(|first| first.end_or_max() > second.start_ns);
        for &first in &active {
            if !first.mode.conflicts_with(second.mode) {
                continue;
            }
            let overlap_ns = first.end_or_max().min(second.end_or_max()) - second.start_ns;
            let fault = silent
                .hitting(&first.worker, first.invoked_ns, second.start_ns)
                .map(str::to_string)
                .or_else(|| {
                    silent
                        .granted_in_fault(second)
                        .then(|| format!("{} (its acquire was in flight)", second.worker))
                });
            let overlap = Overlap {
                first: first.clone(),
                second: second.clone(),
                overlap_ns,
                silent_fault: fault,
            };
            if overlap.silent_fault.is_some() {
                report.unprotected.push(overlap);
            } else {
                report.violations.push(Violation::Overlap(overlap));
            }
        }
        active.push(second);
    }
}

/// Each hold of one key (`spans`, by start) must have a larger token than every earlier hold it
/// conflicts with. Holds without a token, and holds granted in a silent fault (they have no
/// reliable place in this order), are left out.
fn check_tokens(spans: &[&HoldSpan], silent: &SilentFaults<'_>, report: &mut Report) {
    let mut max_any: Option<&HoldSpan> = None;
    let mut max_exclusive: Option<&HoldSpan> = None;
    for &h in spans
        .iter()
        .filter(|h| h.token != NO_TOKEN && !silent.granted_in_fault(h))
    {
        let bound = match h.mode {
            Mode::Exclusive => max_any,
            Mode::Shared => max_exclusive,
        };
        if let Some(earlier) = bound.filter(|b| b.token >= h.token) {
            report.violations.push(Violation::TokenNotIncreasing {
                earlier: earlier.clone(),
                later: h.clone(),
            });
        }
        if max_any.is_none_or(|m| h.token > m.token) {
            max_any = Some(h);
        }
        if h.mode == Mode::Exclusive && max_exclusive.is_none_or(|m| h.token > m.token) {
            max_exclusive = Some(h);
        }
    }
}
