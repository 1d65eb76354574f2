//! A history of what lock clients did, and a checker for it, in the manner of Jepsen's lock workloads.
//!
//! Every worker records, with a monotonic timestamp, when it invoked an acquire and when it got the lock
//! (with the fencing token), when it invoked and finished a release, and when it was told its hold was
//! lost. Workers in other processes record to a file that the test then loads. The checker rebuilds
//! every hold of every key and fails on two conflicting holds that overlap, on a fencing token that
//! does not increase across successive holders, on a hold that never ends, and on two runs of a
//! scheduled job that start closer together than the job's `at_least` window.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Nanoseconds on the system's monotonic clock (`CLOCK_MONOTONIC`): comparable between processes on
/// one machine, unaffected by changes of the wall clock. Every event of a [`History`] is stamped with it.
///
/// # Examples
///
/// ```
/// let a = zklock_testkit::now_ns();
/// let b = zklock_testkit::now_ns();
/// assert!(b >= a);
/// ```
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The fencing token to record for a grant whose client gives none (a Curator peer, see
/// [`Recorder::record_at`]). The checker checks such holds for overlaps like any other, and leaves
/// them out of its token check: they neither need a larger token than the holds before them nor
/// bound the tokens of the holds after them.
///
/// # Examples
///
/// ```
/// use zklock_testkit::{History, Mode, NO_TOKEN};
/// let history = History::new();
/// let (zk, peer) = (history.recorder("zklock"), history.recorder("curator"));
/// zk.acquire_ok("k", Mode::Exclusive, 7);
/// zk.release_invoked("k");
/// peer.acquire_ok("k", Mode::Exclusive, NO_TOKEN);
/// peer.release_invoked("k");
/// zk.acquire_ok("k", Mode::Exclusive, 9);
/// zk.release_invoked("k");
/// assert!(history.check().is_ok());
/// ```
pub const NO_TOKEN: u128 = u128::MAX;

/// How much closer than its `at_least` window the checker lets two runs of a job start before it
/// reports [`Violation::JobTooSoon`]: 50 ms.
///
/// The window is enforced by the server's clock, at the server's time of each run's claim; the
/// history records each run when its body starts, on this machine's monotonic clock ([`now_ns`]).
/// The two differ by the time from the claim to the body's start (a reply in flight, a task
/// waiting for a busy core) and by the drift between the server's wall clock and the monotonic
/// one: tens of milliseconds on a loaded machine, never a window's worth. A run that starts a
/// tenth of a window early is still found for every window of a second or more.
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

/// Converts a wall-clock time in milliseconds since the Unix epoch (as Java's
/// `System.currentTimeMillis()` prints it, and [`now_epoch_ms`](crate::now_epoch_ms)) to [`now_ns`]
/// time, with the offset between the two clocks as it is now. Call it soon after the event: a step
/// of the wall clock in between moves the result by as much.
///
/// # Examples
///
/// ```
/// use zklock_testkit::{epoch_ms_to_ns, now_epoch_ms, now_ns};
/// let before = now_ns();
/// let at = epoch_ms_to_ns(now_epoch_ms() + 1);
/// let after = now_ns();
/// assert!(at + 2_000_000 >= before && at <= after + 2_000_000);
/// ```
pub fn epoch_ms_to_ns(ms: u64) -> u64 {
    let mono = now_ns() as i128;
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let at = ms as i128 * 1_000_000 + (mono - wall);
    at.clamp(0, u64::MAX as i128) as u64
}

/// How a lock is held: alone, or shared with other readers.
///
/// # Examples
///
/// ```
/// use zklock_testkit::Mode;
/// assert!(Mode::Exclusive.conflicts_with(Mode::Shared));
/// assert!(!Mode::Shared.conflicts_with(Mode::Shared));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// A mutex, or the write side of a read/write lock.
    Exclusive,
    /// The read side of a read/write lock.
    Shared,
}

impl Mode {
    /// Whether two holds in these modes may not overlap.
    ///
    /// # Examples
    ///
    /// ```
    /// use zklock_testkit::Mode;
    /// assert!(Mode::Exclusive.conflicts_with(Mode::Exclusive));
    /// ```
    pub fn conflicts_with(self, other: Mode) -> bool {
        self == Mode::Exclusive || other == Mode::Exclusive
    }

    fn code(self) -> &'static str {
        match self {
            Mode::Exclusive => "X",
            Mode::Shared => "S",
        }
    }

    fn parse(s: &str) -> Option<Mode> {
        match s {
            "X" => Some(Mode::Exclusive),
            "S" => Some(Mode::Shared),
            _ => None,
        }
    }
}

/// What happened, in one event of a [`History`].
///
/// # Examples
///
/// ```
/// use zklock_testkit::Op;
/// let ok = Op::AcquireOk { token: 42 };
/// assert_ne!(ok, Op::AcquireInvoked);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// The worker asked for the lock.
    AcquireInvoked,
    /// The worker got the lock, with this fencing token.
    AcquireOk {
        /// The fencing token of the grant (e.g. `FencingToken::as_u128`).
        token: u128,
    },
    /// The acquire ended without the lock (timeout, error, cancellation).
    AcquireFailed {
        /// Why.
        error: String,
    },
    /// The worker stopped acting under the lock and asked to release it.
    ReleaseInvoked,
    /// The release was confirmed.
    ReleaseOk,
    /// The release failed (e.g. because the hold was already lost).
    ReleaseFailed {
        /// Why.
        error: String,
    },
    /// The worker was told that its hold is lost, and stopped acting under it.
    Lost {
        /// Why.
        reason: String,
    },
    /// The worker's process was killed: whatever it held, it no longer acts on.
    Crashed,
    /// A scheduled job's body started, under a run claimed with this `at_least` window: no other
    /// run of the job (the event's key) may start within the window (see
    /// [`Recorder::job_ran`]).
    JobRan {
        /// The run's `at_least` window, in milliseconds.
        at_least_ms: u64,
    },
    /// A fault was injected. `silent` faults take the named worker's holds away in a way it cannot
    /// notice in time (its process is frozen, or its session is killed from outside); see
    /// [`History::silent_fault`].
    Fault {
        /// What was done.
        what: String,
        /// Whether the worker could not notice in time.
        silent: bool,
    },
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::AcquireInvoked => "acquire",
            Op::AcquireOk { .. } => "acquire-ok",
            Op::AcquireFailed { .. } => "acquire-fail",
            Op::ReleaseInvoked => "release",
            Op::ReleaseOk => "release-ok",
            Op::ReleaseFailed { .. } => "release-fail",
            Op::Lost { .. } => "lost",
            Op::Crashed => "crashed",
            Op::JobRan { .. } => "job-ran",
            Op::Fault { silent: false, .. } => "fault",
            Op::Fault { silent: true, .. } => "silent-fault",
        }
    }

    fn arg(&self) -> String {
        match self {
            Op::AcquireOk { token } => token.to_string(),
            Op::JobRan { at_least_ms } => at_least_ms.to_string(),
            Op::AcquireFailed { error } | Op::ReleaseFailed { error } => error.clone(),
            Op::Lost { reason } => reason.clone(),
            Op::Fault { what, .. } => what.clone(),
            _ => String::new(),
        }
    }

    fn parse(name: &str, arg: String) -> Option<Op> {
        Some(match name {
            "acquire" => Op::AcquireInvoked,
            "acquire-ok" => Op::AcquireOk {
                token: arg.parse().ok()?,
            },
            "acquire-fail" => Op::AcquireFailed { error: arg },
            "release" => Op::ReleaseInvoked,
            "release-ok" => Op::ReleaseOk,
            "release-fail" => Op::ReleaseFailed { error: arg },
            "lost" => Op::Lost { reason: arg },
            "crashed" => Op::Crashed,
            "job-ran" => Op::JobRan {
                at_least_ms: arg.parse().ok()?,
            },
            "fault" => Op::Fault {
                what: arg,
                silent: false,
            },
            "silent-fault" => Op::Fault {
                what: arg,
                silent: true,
            },
            _ => return None,
        })
    }
}

/// One thing a worker did (or a fault the test injected), with its time.
///
/// # Examples
///
/// ```
/// use zklock_testkit::{Event, Mode, Op};
/// let e = Event::new("w1", "k", Mode::Exclusive, Op::AcquireInvoked);
/// assert_eq!(Event::parse_line(&e.to_line()).unwrap(), e);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// When, in [`now_ns`] time.
    pub at_ns: u64,
    /// Who: a worker's name (a task, a process); for a fault, the worker it hits, or empty.
    pub worker: String,
    /// Which lock (empty for crashes and faults).
    pub key: String,
    /// How it is held or asked for.
    pub mode: Mode,
    /// What happened.
    pub op: Op,
}

impl Event {
    /// An event stamped now.
    ///
    /// # Examples
    ///
    /// ```
    /// use zklock_testkit::{Event, Mode, Op};
    /// let e = Event::new("w1", "k", Mode::Shared, Op::ReleaseInvoked);
    /// assert!(e.at_ns > 0);
    /// ```
    pub fn new(worker: &str, key: &str, mode: Mode, op: Op) -> Event {
        Event {
            at_ns: now_ns(),
            worker: worker.to_string(),
            key: key.to_string(),
            mode,
            op,
        }
    }

    /// The event as one line of text (no newline), as [`Recorder::to_file`] writes it.
    ///
    /// # Examples
    ///
    /// ```
    /// use zklock_testkit::{Event, Mode, Op};
    /// let line = Event::new("w", "a\tb", Mode::Exclusive, Op::AcquireOk { token: 7 }).to_line();
    /// assert!(!line.contains('\n'));
    /// ```
    pub fn to_line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            self.at_ns,
            escape(&self.worker),
            escape(&self.key),
            self.mode.code(),
            self.op.name(),
            escape(&self.op.arg())
        )
    }

    /// Parses a line written by [`to_line`](Self::to_line).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(zklock_testkit::Event::parse_line("not an event").is_none());
    /// ```
    pub fn parse_line(line: &str) -> Option<Event> {
        let mut fields = line.split('\t');
        let at_ns = fields.next()?.parse().ok()?;
        let worker = unescape(fields.next()?);
        let key = unescape(fields.next()?);
        let mode = Mode::parse(fields.next()?)?;
        let name = fields.next()?;
        let arg = unescape(fields.next().unwrap_or(""));
        if fields.next().is_some() {
            return None;
        }
        Some(Event {
            at_ns,
            worker,
            key,
            mode,
            op: Op::parse(name, arg)?,
        })
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[derive(Clone)]
enum Sink {
    Memory(Arc<Mutex<Vec<Event>>>),
    File(Arc<Mutex<File>>),
}

/// Records one worker's events, into a [`History`] in this process or into a file that the test loads
/// with [`History::load`]. Cheap to clone.
///
/// Record each step as it happens: `acquire_invoked` just before asking for the lock, `acquire_ok` as
/// soon as it is granted, `release_invoked` when the critical section is over (before the release), and
/// `lost` as soon as the hold is reported lost (the worker must then stop acting under it).
///
/// # Examples
///
/// ```
/// use zklock_testkit::{History, Mode};
///
/// let history = History::new();
/// let w = history.recorder("worker-1");
/// w.acquire_invoked("stock", Mode::Exclusive);
/// w.acquire_ok("stock", Mode::Exclusive, 100);
/// w.release_invoked("stock");
/// w.release_ok("stock");
/// assert!(history.check().is_ok());
/// ```
#[derive(Clone)]
pub struct Recorder {
    worker: Arc<str>,
    sink: Sink,
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("worker", &self.worker)
            .finish()
    }
}

impl Recorder {
    /// A recorder appending to the file at `path` (created if missing), one line per event, for a
    /// worker in another process. Each event is written at once, so a worker killed later loses
    /// nothing it recorded.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened for appending.
    ///
    /// # Examples
    ///
    /// ```
    /// use zklock_testkit::{History, Mode, Recorder};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("worker-7.history");
    /// let w = Recorder::to_file(&path, "worker-7")?;
    /// w.acquire_invoked("k", Mode::Exclusive);
    /// let history = History::new();
    /// assert_eq!(history.load(&path)?, 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn to_file(path: &Path, worker: &str) -> io::Result<Recorder> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Recorder {
            worker: worker.into(),
            sink: Sink::File(Arc::new(Mutex::new(file))),
        })
    }

    /// The worker's name.
    ///
    /// # Examples
    ///
    /// ```
    /// let w = zklock_testkit::History::new().recorder("w1");
    /// assert_eq!(w.worker(), "w1");
    /// ```
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// Records `op` on `key` now.
    ///
    /// # Panics
    ///
    /// When writing to the history file fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use zklock_testkit::{History, Mode, Op};
    /// let history = History::new();
    /// history.recorder("w").record("k", Mode::Exclusive, Op::AcquireInvoked);
    /// assert_eq!(history.len(), 1);
    /// ```
    pub fn record(&self, key: &str, mode: Mode, op: Op) {
        self.record_at(now_ns(), key, mode, op);
    }

    /// Records `op` on `key` as having happened at `at_ns` ([`now_ns`] time) rather than now: for
    /// what another process saw and reported with its own timestamps, such as a Curator peer's
    /// `acquired <epoch_ms>` lines (convert them with [`epoch_ms_to_ns`]). The checker orders events
    /// by time, so they may be recorded late and out of order. A peer that gives no fencing token
    /// records its grants with [`NO_TOKEN`].
    ///
    /// Stamp such events inside the hold they report, never outside it: a grant no earlier than the
    /// peer's acquire returned, a release no later than it began to let go. Then an overlap the
    /// checker finds is one that happened.
    ///
    /// # Panics
    ///
    /// When writing to the history file fails.
    ///
    /// # Examples
    ///
    /// ```
    /// use zklock_testkit::{epoch_ms_to_ns, now_epoch_ms, History, Mode, Op, NO_TOKEN};
    /// let history = History::new();
    /// let peer = history.recorder("curator-1");
    /// // As the peer printed them: "acquired <ms>", "released <ms>".
    /// let (acquired_ms, released_ms) = (now_epoch_ms() - 30, now_epoch_ms() - 5);
    /// // Rounded inwards: the printed milliseconds are truncated.
    /// let start = epoch_ms_to_ns(acquired_ms + 1);
    /// peer.record_at(start - 1, "k", Mode::Exclusive, Op::AcquireInvoked);
    /// peer.record_at(start, "k", Mode::Exclusive, Op::AcquireOk { token: NO_TOKEN });
    /// peer.record_at(epoch_ms_to_ns(released_ms), "k", Mode::Exclusive, Op::ReleaseInvoked);
    /// assert!(history.check().is_ok());
    /// ```
    pub fn record_at(&self, at_ns: u64, key: &str, mode: Mode, op: Op) {
        let mut event = Event::new(&self.worker, key, mode, op);
        event.at_ns = at_ns;
        match &self.sink {
            Sink::Memory(events) => events.lock().unwrap_or_else(|e| e.into_inner()).push(event),
            Sink::File(file) => {
                let mut line = event.to_line();
                line.push('\n');
                file.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .write_all(line.as_bytes())
                    .expect("append to the history file");
            }
        }
    }

    /// The worker is about to ask for the lock on `key`.
    ///
    /// # Examples
    ///
    /// ```
    /// # let w = zklock_testkit::History::new().recorder("w");
    /// w.acquire_invoked("k", zklock_testkit::Mode::Exclusive);
    /// ```
    pub fn acquire_invoked(&self, key: &str, mode: Mode) {
        self.record(key, mode, Op::AcquireInvoked);
    }

    /// The worker got the lock on `key`, with fencing token `token`.
    ///
    /// # Examples
    ///
    /// ```
    /// # let w = zklock_testkit::History::new().recorder("w");
    /// w.acquire_ok("k", zklock_testkit::Mode::Shared, 17);
    /// ```
    pub fn acquire_ok(&self, key: &str, mode: Mode, token: u128) {
        self.record(key, mode, Op::AcquireOk { token });
    }

    /// The acquire of `key` ended without the lock.
    ///
    /// # Examples
    ///
    /// ```
    /// # let w = zklock_testkit::History::new().recorder("w");
    /// w.acquire_failed("k", zklock_testkit::Mode::Exclusive, "timed out");
    /// ```
    pub fn acquire_failed(&self, key: &str, mode: Mode, error: impl fmt::Display) {
        self.record(
            key,
            mode,
            Op::AcquireFailed {
                error: error.to_string(),
            },
        );
    }

    /// The worker stopped acting under the lock on `key` and is about to release it.
    ///
    /// # Examples
    ///
    /// ```
    /// # let w = zklock_testkit::History::new().recorder("w");
    /// w.release_invoked("k");
    /// ```
    pub fn release_invoked(&self, key: &str) {
        self.record(key, Mode::Exclusive, Op::ReleaseInvoked);
    }

    /// The release of `key` was confirmed.
    ///
    /// # Examples
    ///
    /// ```
    /// # let w = zklock_testkit::History::new().recorder("w");
    /// w.release_ok("k");
    /// ```
    pub fn release_ok(&self, key: &str) {
        self.record(key, Mode::Exclusive, Op::ReleaseOk);
    }

    /// The release of `key` failed.
    ///
    /// # Examples
    ///
    /// ```
    /// # let w = zklock_testkit::History::new().recorder("w");
    /// w.release_failed("k", "lock lost");
    /// ```
    pub fn release_failed(&self, key: &str, error: impl fmt::Display) {
        self.record(
            key,
            Mode::Exclusive,
            Op::ReleaseFailed {
                error: error.to_string(),
            },
        );
    }

    /// A run of the scheduled job `key`, claimed with the window `at_least`, started its body now:
    /// record it as the body's first step. The checker fails when another run of `key` starts
    /// within `at_least` of this one (less [`JOB_WINDOW_TOLERANCE`]). A job's lock is a lock like
    /// any other: record its grant, loss and release as well, under the same key, for the
    /// checker to judge its holders.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use zklock_testkit::{History, Violation};
    /// let history = History::new();
    /// let (a, b) = (history.recorder("a"), history.recorder("b"));
    /// a.job_ran("nightly", Duration::from_secs(60));
    /// b.job_ran("nightly", Duration::from_secs(60)); // a minute too early
    /// let report = history.check();
    /// assert!(matches!(report.violations[0], Violation::JobTooSoon { .. }));
    /// assert_eq!(report.job_runs, 2);
    /// ```
    pub fn job_ran(&self, key: &str, at_least: Duration) {
        self.record(
            key,
            Mode::Exclusive,
            Op::JobRan {
                at_least_ms: at_least.as_millis().min(u64::MAX as u128) as u64,
            },
        );
    }

    /// The worker was told its hold on `key` is lost, and stopped acting under it.
    ///
    /// # Examples
    ///
    /// ```
    /// # let w = zklock_testkit::History::new().recorder("w");
    /// w.lost("k", "session expired");
    /// ```
    pub fn lost(&self, key: &str, reason: impl fmt::Display) {
        self.record(
            key,
            Mode::Exclusive,
            Op::Lost {
                reason: reason.to_string(),
            },
        );
    }
}

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
        Recorder {
            worker: worker.into(),
            sink: Sink::Memory(self.events.clone()),
        }
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

    /// Checks the history; see [`check`].
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
    fn end_or_max(&self) -> u64 {
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

/// One run of a scheduled job, rebuilt from a history ([`Op::JobRan`]).
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
    /// When its body started, in [`now_ns`] time.
    pub at_ns: u64,
    /// The window it was claimed with, in milliseconds.
    pub at_least_ms: u64,
}

impl JobRun {
    /// The end of the run's window, in [`now_ns`] time.
    fn window_end_ns(&self) -> u64 {
        self.at_ns
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
    /// The silent fault that took the first hold away, when one did (see [`History::silent_fault`]).
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
    /// [`JOB_WINDOW_TOLERANCE`]).
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

/// What [`check`] found.
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
    /// Runs of scheduled jobs ([`Op::JobRan`]).
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
    let mut report = Report::default();
    let mut states: HashMap<(&str, &str), State> = HashMap::new();
    let mut holds: Vec<HoldSpan> = Vec::new();
    let mut silent: HashMap<&str, Vec<(u64, &str)>> = HashMap::new();
    // Per job: the run whose window reaches furthest so far.
    let mut job_windows: HashMap<&str, JobRun> = HashMap::new();
    let tolerance_ns = JOB_WINDOW_TOLERANCE.as_nanos() as u64;
    for e in &events {
        let malformed = |what: &str| Violation::Malformed {
            worker: e.worker.clone(),
            key: e.key.clone(),
            at_ns: e.at_ns,
            what: what.to_string(),
        };
        match &e.op {
            Op::Fault { what, silent: s } => {
                report.faults += 1;
                if *s && !e.worker.is_empty() {
                    silent
                        .entry(e.worker.as_str())
                        .or_default()
                        .push((e.at_ns, what.as_str()));
                }
                continue;
            }
            Op::JobRan { at_least_ms } => {
                report.job_runs += 1;
                let run = JobRun {
                    worker: e.worker.clone(),
                    key: e.key.clone(),
                    at_ns: e.at_ns,
                    at_least_ms: *at_least_ms,
                };
                match job_windows.get(e.key.as_str()) {
                    Some(earlier)
                        if run.at_ns.saturating_add(tolerance_ns) < earlier.window_end_ns() =>
                    {
                        report.violations.push(Violation::JobTooSoon {
                            earlier: earlier.clone(),
                            later: run.clone(),
                        });
                        if run.window_end_ns() > earlier.window_end_ns() {
                            job_windows.insert(e.key.as_str(), run);
                        }
                    }
                    Some(earlier) if earlier.window_end_ns() >= run.window_end_ns() => {}
                    _ => {
                        job_windows.insert(e.key.as_str(), run);
                    }
                }
                continue;
            }
            Op::Crashed => {
                report.crashes += 1;
                for ((worker, _), state) in states.iter_mut() {
                    if *worker != e.worker {
                        continue;
                    }
                    if let State::Holding(mut span) = std::mem::replace(state, State::Idle) {
                        span.end_ns = Some(e.at_ns);
                        span.end = HoldEnd::Crashed;
                        holds.push(span);
                    }
                }
                continue;
            }
            _ => {}
        }
        let state = states
            .entry((e.worker.as_str(), e.key.as_str()))
            .or_insert(State::Idle);
        match &e.op {
            Op::AcquireInvoked => {
                report.acquires_invoked += 1;
                if matches!(state, State::Holding(_)) {
                    report
                        .violations
                        .push(malformed("acquire invoked while holding the key"));
                } else {
                    *state = State::Acquiring {
                        invoked_ns: e.at_ns,
                    };
                }
            }
            Op::AcquireOk { token } => {
                report.acquires += 1;
                let invoked_ns = match state {
                    State::Acquiring { invoked_ns } => *invoked_ns,
                    State::Holding(_) => {
                        report
                            .violations
                            .push(malformed("granted a key the worker already holds"));
                        continue;
                    }
                    _ => e.at_ns,
                };
                *state = State::Holding(HoldSpan {
                    worker: e.worker.clone(),
                    key: e.key.clone(),
                    mode: e.mode,
                    token: *token,
                    invoked_ns,
                    start_ns: e.at_ns,
                    end_ns: None,
                    end: HoldEnd::Open,
                });
            }
            Op::AcquireFailed { .. } => {
                report.acquire_failures += 1;
                if matches!(state, State::Holding(_)) {
                    report
                        .violations
                        .push(malformed("acquire failed while holding the key"));
                } else {
                    *state = State::Idle;
                }
            }
            Op::ReleaseInvoked => {
                report.releases += 1;
                match std::mem::replace(state, State::Idle) {
                    State::Holding(mut span) => {
                        span.end_ns = Some(e.at_ns);
                        span.end = HoldEnd::Released;
                        holds.push(span);
                    }
                    State::Ended => {}
                    _ => report
                        .violations
                        .push(malformed("release invoked without a hold")),
                }
            }
            Op::ReleaseOk => {}
            Op::ReleaseFailed { .. } => report.release_failures += 1,
            Op::Lost { reason } => {
                report.losses += 1;
                // A loss reported after the release (or between holds) ends nothing.
                if matches!(state, State::Holding(_)) {
                    if let State::Holding(mut span) = std::mem::replace(state, State::Ended) {
                        span.end_ns = Some(e.at_ns);
                        span.end = HoldEnd::Lost(reason.clone());
                        holds.push(span);
                    }
                }
            }
            Op::Fault { .. } | Op::Crashed | Op::JobRan { .. } => unreachable!("handled above"),
        }
    }
    for state in states.into_values() {
        if let State::Holding(span) = state {
            report.violations.push(Violation::NeverEnded(span.clone()));
            holds.push(span);
        }
    }

    // A hold granted while a silent fault was taking its worker's session away (the fault came
    // between its acquire and its grant, and the worker was told of the loss later): the grant
    // rests on what the server said before the fault, and the worker records it only after; its
    // recorded start is later than its real place in the server's order.
    let granted_in_fault = |h: &HoldSpan| {
        matches!(h.end, HoldEnd::Lost(_))
            && silent.get(h.worker.as_str()).is_some_and(|faults| {
                faults
                    .iter()
                    .any(|(at, _)| *at >= h.invoked_ns && *at <= h.start_ns)
            })
    };
    let mut by_key: BTreeMap<&str, Vec<&HoldSpan>> = BTreeMap::new();
    for h in &holds {
        by_key.entry(h.key.as_str()).or_default().push(h);
    }
    report.keys = by_key.len();
    for spans in by_key.values_mut() {
        spans.sort_by_key(|h| (h.start_ns, h.end_or_max()));
        // Overlaps: sweep by start, keeping the holds still going on.
        let mut active: Vec<&HoldSpan> = Vec::new();
        for &second in spans.iter() {
            active.retain(|first| first.end_or_max() > second.start_ns);
            for &first in &active {
                if !first.mode.conflicts_with(second.mode) {
                    continue;
                }
                let overlap_ns = first.end_or_max().min(second.end_or_max()) - second.start_ns;
                let fault = silent
                    .get(first.worker.as_str())
                    .and_then(|faults| {
                        faults
                            .iter()
                            .find(|(at, _)| *at >= first.invoked_ns && *at <= second.start_ns)
                    })
                    .map(|(_, what)| what.to_string())
                    .or_else(|| {
                        granted_in_fault(second)
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
        // Tokens: larger than every earlier conflicting hold's.
        let mut max_any: Option<&HoldSpan> = None;
        let mut max_exclusive: Option<&HoldSpan> = None;
        // A hold granted in a silent fault has no reliable place in this order (see above).
        for &h in spans
            .iter()
            .filter(|h| h.token != NO_TOKEN && !granted_in_fault(h))
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
    holds.sort_by(|a, b| (&a.key, a.start_ns).cmp(&(&b.key, b.start_ns)));
    report.holds = holds;
    report
}

#[cfg(test)]
mod tests {
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
        e.push(ev(
            15,
            "a",
            "",
            Mode::Exclusive,
            Op::Fault {
                what: "SIGSTOP".into(),
                silent: true,
            },
        ));
        hold(&mut e, "b", Mode::Exclusive, 2, 50, 60);
        let r = check(&e);
        assert!(r.is_ok(), "{r}");
        assert_eq!(r.unprotected.len(), 1);
        // A fault on b does not explain a's overlap, nor a fault after the second grant.
        let mut e = Vec::new();
        hold(&mut e, "a", Mode::Exclusive, 1, 10, 100);
        e.push(ev(
            55,
            "a",
            "",
            Mode::Exclusive,
            Op::Fault {
                what: "late".into(),
                silent: true,
            },
        ));
        hold(&mut e, "b", Mode::Exclusive, 2, 50, 60);
        assert_eq!(check(&e).violations.len(), 1);
        // The token must still increase.
        let mut e = Vec::new();
        hold(&mut e, "a", Mode::Exclusive, 3, 10, 100);
        e.push(ev(
            15,
            "a",
            "",
            Mode::Exclusive,
            Op::Fault {
                what: "SIGSTOP".into(),
                silent: true,
            },
        ));
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
        let fault = |at| {
            ev(
                at,
                "b",
                "",
                Mode::Exclusive,
                Op::Fault {
                    what: "expired".into(),
                    silent: true,
                },
            )
        };
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

    #[test]
    fn lines_round_trip_with_hostile_text() {
        let e = ev(
            7,
            "w\t1",
            "a\\b\nc",
            Mode::Shared,
            Op::AcquireFailed {
                error: "x\ty\\".into(),
            },
        );
        assert_eq!(Event::parse_line(&e.to_line()), Some(e));
        let f = ev(
            8,
            "",
            "",
            Mode::Exclusive,
            Op::Fault {
                what: "kill".into(),
                silent: true,
            },
        );
        assert_eq!(Event::parse_line(&f.to_line()), Some(f));
        let j = ev(
            9,
            "w",
            "job\t1",
            Mode::Exclusive,
            Op::JobRan { at_least_ms: 2_000 },
        );
        assert!(j.to_line().contains("\tjob-ran\t2000"), "{}", j.to_line());
        assert_eq!(Event::parse_line(&j.to_line()), Some(j));
        assert!(Event::parse_line("9\tw\tk\tX\tjob-ran\tsoon").is_none());
    }
}
