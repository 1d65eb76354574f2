//! What the checker finds: the holds it rebuilt, the violations, the unprotected windows, and the
//! counts, as a [`Report`].

use std::fmt;

use super::event::{Mode, NO_TOKEN};

/// How a hold ended.
///
/// # Examples
///
/// ```
/// use zklock_testkit::HoldEnd;
/// assert_ne!(HoldEnd::Released, HoldEnd::Crashed);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldEnd {
    /// The worker invoked the release.
    Released,
    /// The worker was told the hold was lost.
    Lost(String),
    /// The worker's process was killed.
    Crashed,
    /// It never ended.
    Open,
}

/// One hold of one key by one worker, rebuilt from a history.
///
/// # Examples
///
/// ```
/// use zklock_testkit::{History, Mode};
/// let history = History::new();
/// let w = history.recorder("w");
/// w.acquire_ok("k", Mode::Exclusive, 5);
/// let report = history.check();
/// assert_eq!(report.violations.len(), 1); // the hold never ended
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldSpan {
    /// Who held it.
    pub worker: String,
    /// Which lock.
    pub key: String,
    /// How.
    pub mode: Mode,
    /// The grant's fencing token.
    pub token: u128,
    /// When the acquire behind it was invoked.
    pub invoked_ns: u64,
    /// When the lock was granted (reported).
    pub start_ns: u64,
    /// When the worker stopped acting under it, if it did.
    pub end_ns: Option<u64>,
    /// How it ended.
    pub end: HoldEnd,
}

impl HoldSpan {
    pub(super) fn end_or_max(&self) -> u64 {
        self.end_ns.unwrap_or(u64::MAX)
    }
}

impl fmt::Display for HoldSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.token == NO_TOKEN {
            write!(
                f,
                "{} held {:?} ({:?}, no token) from {}",
                self.worker, self.key, self.mode, self.start_ns
            )?;
        } else {
            write!(
                f,
                "{} held {:?} ({:?}, token {}) from {}",
                self.worker, self.key, self.mode, self.token, self.start_ns
            )?;
        }
        match (self.end_ns, &self.end) {
            (Some(end), how) => write!(
                f,
                " to {end} ({:.3} ms, {how:?})",
                (end.saturating_sub(self.start_ns)) as f64 / 1e6
            ),
            (None, _) => write!(f, " and never let go"),
        }
    }
}

/// One run of a scheduled job, rebuilt from a history ([`Op::JobRan`](crate::Op::JobRan)).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use zklock_testkit::{History, Violation};
/// let history = History::new();
/// let (a, b) = (history.recorder("a"), history.recorder("b"));
/// a.job_ran("k", Duration::from_secs(2));
/// b.job_ran("k", Duration::from_secs(2));
/// match &history.check().violations[0] {
///     Violation::JobTooSoon { earlier, later } => {
///         assert_eq!((earlier.worker.as_str(), later.worker.as_str()), ("a", "b"));
///         assert_eq!(earlier.at_least_ms, 2_000);
///     }
///     v => panic!("{v}"),
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRun {
    /// Who ran it.
    pub worker: String,
    /// Which job.
    pub key: String,
    /// When its body started, in [`now_ns`](crate::now_ns) time: the latest its claim can have
    /// been made.
    pub at_ns: u64,
    /// When its worker asked for the job's lock (its `AcquireInvoked`), or its body's start if
    /// it recorded none: the earliest its claim can have been made.
    pub claimed_from_ns: u64,
    /// The window it was claimed with, in milliseconds.
    pub at_least_ms: u64,
}

impl JobRun {
    /// The earliest the run's window can end, in [`now_ns`](crate::now_ns) time: the window
    /// counts from the claim, which came after the run was asked for.
    pub(super) fn window_end_ns(&self) -> u64 {
        self.claimed_from_ns
            .saturating_add(self.at_least_ms.saturating_mul(1_000_000))
    }
}

impl fmt::Display for JobRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ran {:?} at {} (at_least {} ms)",
            self.worker, self.key, self.at_ns, self.at_least_ms
        )
    }
}

/// Two conflicting holds of one key at the same time.
///
/// # Examples
///
/// ```
/// use zklock_testkit::{History, Mode};
/// let history = History::new();
/// let (a, b) = (history.recorder("a"), history.recorder("b"));
/// a.acquire_ok("k", Mode::Exclusive, 1);
/// history.silent_fault("a", "SIGSTOP");
/// b.acquire_ok("k", Mode::Exclusive, 2);
/// b.release_invoked("k");
/// a.release_invoked("k");
/// let report = history.check();
/// assert!(report.is_ok());
/// assert_eq!(report.unprotected[0].first.worker, "a");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// The hold that started first.
    pub first: HoldSpan,
    /// The hold that started while the first went on.
    pub second: HoldSpan,
    /// How long both went on together.
    pub overlap_ns: u64,
    /// The silent fault that took the first hold away, when one did (see [`History::silent_fault`](crate::History::silent_fault)).
    pub silent_fault: Option<String>,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} overlaps {} for {:.3} ms",
            self.second,
            self.first,
            self.overlap_ns as f64 / 1e6
        )?;
        if let Some(fault) = &self.silent_fault {
            write!(f, " (after silent fault: {fault})")?;
        }
        Ok(())
    }
}

/// Something a correct lock never does.
///
/// # Examples
///
/// ```
/// use zklock_testkit::{History, Mode, Violation};
/// let history = History::new();
/// let (a, b) = (history.recorder("a"), history.recorder("b"));
/// a.acquire_ok("k", Mode::Exclusive, 9);
/// a.release_invoked("k");
/// b.acquire_ok("k", Mode::Exclusive, 3);
/// b.release_invoked("k");
/// let report = history.check();
/// assert!(matches!(report.violations[0], Violation::TokenNotIncreasing { .. }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Two conflicting holds of one key overlapped, and no silent fault explains it.
    Overlap(Overlap),
    /// A later holder's fencing token is not larger than an earlier conflicting holder's.
    TokenNotIncreasing {
        /// The earlier hold with the larger (or equal) token.
        earlier: HoldSpan,
        /// The later hold.
        later: HoldSpan,
    },
    /// A hold that was never released, reported lost, or ended by a crash.
    NeverEnded(HoldSpan),
    /// A run of a job started within an earlier run's `at_least` window (by more than
    /// [`JOB_WINDOW_TOLERANCE`](crate::JOB_WINDOW_TOLERANCE)).
    JobTooSoon {
        /// The earlier run, whose window the later one started in.
        earlier: JobRun,
        /// The run that started too soon.
        later: JobRun,
    },
    /// Events that make no sense in that order (e.g. a second grant of a key the worker holds).
    Malformed {
        /// Whose events.
        worker: String,
        /// Which key.
        key: String,
        /// When.
        at_ns: u64,
        /// What is wrong.
        what: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap(o) => write!(f, "two holders: {o}"),
            Violation::TokenNotIncreasing { earlier, later } => {
                write!(f, "token did not increase: {later} came after {earlier}")
            }
            Violation::NeverEnded(h) => write!(f, "hold never ended: {h}"),
            Violation::JobTooSoon { earlier, later } => write!(
                f,
                "job ran within an earlier run's at_least window: {later}, {:.3} ms after {earlier}",
                later.at_ns.saturating_sub(earlier.at_ns) as f64 / 1e6
            ),
            Violation::Malformed {
                worker,
                key,
                at_ns,
                what,
            } => write!(
                f,
                "malformed history of {worker} on {key:?} at {at_ns}: {what}"
            ),
        }
    }
}

/// What [`check`](crate::check) found.
///
/// # Examples
///
/// ```
/// let report = zklock_testkit::History::new().check();
/// assert_eq!(report.acquires, 0);
/// println!("{}", report.summary());
/// report.assert_ok();
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Acquires invoked.
    pub acquires_invoked: usize,
    /// Acquires that got the lock (holds).
    pub acquires: usize,
    /// Acquires that ended without it.
    pub acquire_failures: usize,
    /// Releases invoked.
    pub releases: usize,
    /// Releases that failed.
    pub release_failures: usize,
    /// Holds reported lost.
    pub losses: usize,
    /// Workers killed.
    pub crashes: usize,
    /// Faults injected (silent or not).
    pub faults: usize,
    /// Distinct keys held.
    pub keys: usize,
    /// Runs of scheduled jobs ([`Op::JobRan`](crate::Op::JobRan)).
    pub job_runs: usize,
    /// What a correct lock never does; empty when the history is correct.
    pub violations: Vec<Violation>,
    /// Overlaps after a silent fault hit the first holder: the window only fencing closes.
    pub unprotected: Vec<Overlap>,
    /// The holds, by key and start.
    pub holds: Vec<HoldSpan>,
}

impl Report {
    /// Whether there is no violation.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(zklock_testkit::History::new().check().is_ok());
    /// ```
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Panics, listing the violations, when there are any.
    ///
    /// # Panics
    ///
    /// When [`violations`](Self::violations) is not empty.
    ///
    /// # Examples
    ///
    /// ```
    /// zklock_testkit::History::new().check().assert_ok();
    /// ```
    #[track_caller]
    pub fn assert_ok(&self) {
        assert!(
            self.is_ok(),
            "the history checker found violations:\n{self}"
        );
    }

    /// One line: counts of operations, faults, violations and unprotected windows.
    ///
    /// # Examples
    ///
    /// ```
    /// let line = zklock_testkit::History::new().check().summary();
    /// assert!(line.contains("violations=0"));
    /// ```
    pub fn summary(&self) -> String {
        format!(
            "acquires={} failed_acquires={} releases={} failed_releases={} losses={} crashes={} \
             faults={} keys={} job_runs={} violations={} unprotected={}",
            self.acquires,
            self.acquire_failures,
            self.releases,
            self.release_failures,
            self.losses,
            self.crashes,
            self.faults,
            self.keys,
            self.job_runs,
            self.violations.len(),
            self.unprotected.len()
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary())?;
        const SHOWN: usize = 20;
        for v in self.violations.iter().take(SHOWN) {
            writeln!(f, "  violation: {v}")?;
        }
        if self.violations.len() > SHOWN {
            writeln!(f, "  ... and {} more", self.violations.len() - SHOWN)?;
        }
        for o in self.unprotected.iter().take(SHOWN) {
            writeln!(f, "  unprotected: {o}")?;
        }
        Ok(())
    }
}
