//! A history of what lock clients did, and a checker for it, in the manner of Jepsen's lock workloads.
//!
//! Every worker records, with a monotonic timestamp, when it invoked an acquire and when it got the lock
//! (with the fencing token), when it invoked and finished a release, and when it was told its hold was
//! lost. Workers in other processes record to a file that the test then loads. The checker rebuilds
//! every hold of every key and fails on two conflicting holds that overlap, on a fencing token that
//! does not increase across successive holders, on a hold that never ends, and on two runs of a
//! scheduled job that start closer together than the job's `at_least` window.
//!
//! The parts: [`clock`] (the time events are stamped with), [`event`] (what one event says, and its
//! line format), [`recorder`] (one worker's writing end), [`check`](mod@check) (the checker) and
//! [`report`] (what it finds). [`History`] here collects the events of a run.

mod check;
mod clock;
mod event;
mod recorder;
mod report;

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;
use std::sync::{Arc, Mutex};

pub use check::{check, JOB_WINDOW_TOLERANCE};
pub use clock::{epoch_ms_to_ns, now_ns};
pub use event::{Event, Mode, Op, NO_TOKEN};
pub use recorder::Recorder;
pub use report::{HoldEnd, HoldSpan, JobRun, Overlap, Report, Violation};

/// The events of a test run, from every worker, and the faults injected; [`check`](Self::check)
/// judges them. Cheap to clone and shareable between tasks and threads.
///
/// # Examples
///
/// ```
/// use zklock_testkit::{History, Mode};
///
/// let history = History::new();
/// let (a, b) = (history.recorder("a"), history.recorder("b"));
/// a.acquire_invoked("k", Mode::Exclusive);
/// a.acquire_ok("k", Mode::Exclusive, 1);
/// b.acquire_invoked("k", Mode::Exclusive);
/// b.acquire_ok("k", Mode::Exclusive, 2); // while `a` still holds it
/// a.release_invoked("k");
/// b.release_invoked("k");
/// let report = history.check();
/// assert_eq!(report.violations.len(), 1);
/// ```
#[derive(Clone, Default)]
pub struct History {
    events: Arc<Mutex<Vec<Event>>>,
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("History")
            .field("events", &self.len())
            .finish()
    }
}

impl History {
    /// An empty history.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(zklock_testkit::History::new().is_empty());
    /// ```
    pub fn new() -> History {
        History::default()
    }

    /// A recorder for the worker `worker` (a task or a process; one hold per key at a time).
    ///
    /// # Examples
    ///
    /// ```
    /// let history = zklock_testkit::History::new();
    /// let w = history.recorder("task-3");
    /// assert_eq!(w.worker(), "task-3");
    /// ```
    pub fn recorder(&self, worker: &str) -> Recorder {
        Recorder::in_memory(worker, self.events.clone())
    }

    /// Adds an event.
    ///
    /// # Examples
    ///
    /// ```
    /// use zklock_testkit::{Event, History, Mode, Op};
    /// let history = History::new();
    /// history.push(Event::new("w", "k", Mode::Exclusive, Op::AcquireInvoked));
    /// assert_eq!(history.len(), 1);
    /// ```
    pub fn push(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
    }

    /// Notes a fault injected now (a server killed, a connection cut, ...). It is counted in the
    /// report; it excuses nothing: clients are expected to notice such faults in time.
    ///
    /// # Examples
    ///
    /// ```
    /// let history = zklock_testkit::History::new();
    /// history.fault("killed the leader");
    /// assert_eq!(history.check().faults, 1);
    /// ```
    pub fn fault(&self, what: &str) {
        self.push(Event::new(
            "",
            "",
            Mode::Exclusive,
            Op::Fault {
                what: what.to_string(),
                silent: false,
            },
        ));
    }

    /// Notes a fault injected now that takes `worker`'s holds away without it being able to notice
    /// in time: its process frozen with SIGSTOP, or its session expired from another handle. Another
    /// worker may then get the lock before `worker` learns of its loss — the window every lock service
    /// has, which only fencing tokens close. The checker reports such overlaps as
    /// [`Report::unprotected`] rather than as violations (their tokens must still increase).
    ///
    /// # Examples
    ///
    /// ```
    /// let history = zklock_testkit::History::new();
    /// history.silent_fault("worker-2", "SIGSTOP");
    /// assert_eq!(history.check().faults, 1);
    /// ```
    pub fn silent_fault(&self, worker: &str, what: &str) {
        self.push(Event::new(
            worker,
            "",
            Mode::Exclusive,
            Op::Fault {
                what: what.to_string(),
                silent: true,
            },
        ));
    }

    /// Notes that `worker`'s process was killed now: its holds end here.
    ///
    /// # Examples
    ///
    /// ```
    /// use zklock_testkit::{History, Mode};
    /// let history = History::new();
    /// let w = history.recorder("w");
    /// w.acquire_ok("k", Mode::Exclusive, 1);
    /// history.crashed("w");
    /// assert!(history.check().is_ok());
    /// ```
    pub fn crashed(&self, worker: &str) {
        self.push(Event::new(worker, "", Mode::Exclusive, Op::Crashed));
    }

    /// Merges the events of a file written by [`Recorder::to_file`]; returns how many were read.
    ///
    /// # Errors
    ///
    /// When the file cannot be read, or a line is not an event.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let history = zklock_testkit::History::new();
    /// let n = history.load(std::path::Path::new("/tmp/worker-1.history"))?;
    /// # let _ = n;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn load(&self, path: &Path) -> io::Result<usize> {
        let mut loaded = Vec::new();
        for (i, line) in BufReader::new(File::open(path)?).lines().enumerate() {
            let line = line?;
            if line.is_empty() {
                continue;
            }
            let event = Event::parse_line(&line).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}:{}: not an event: {line:?}", path.display(), i + 1),
                )
            })?;
            loaded.push(event);
        }
        let n = loaded.len();
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(loaded);
        Ok(n)
    }

    /// Every event so far, in time order.
    ///
    /// # Examples
    ///
    /// ```
    /// let history = zklock_testkit::History::new();
    /// history.fault("x");
    /// assert_eq!(history.events().len(), 1);
    /// ```
    pub fn events(&self) -> Vec<Event> {
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        events.sort_by_key(|e| e.at_ns);
        events
    }

    /// How many events were recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(zklock_testkit::History::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether nothing was recorded.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(zklock_testkit::History::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks the history; see [`check()`].
    ///
    /// # Examples
    ///
    /// ```
    /// let report = zklock_testkit::History::new().check();
    /// assert!(report.is_ok());
    /// ```
    pub fn check(&self) -> Report {
        check(&self.events())
    }
}

#[cfg(test)]
mod tests;
