//! The writing side of a history: one worker's [`Recorder`], appending its events to a history in
//! this process or to a file another process loads.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::clock::now_ns;
use super::event::{Event, Mode, Op};

/// Where a recorder's events go.
#[derive(Clone)]
enum Sink {
    Memory(Arc<Mutex<Vec<Event>>>),
    File(Arc<Mutex<File>>),
}

/// Records one worker's events, into a [`History`](crate::History) in this process or into a file that the test loads
/// with [`History::load`](crate::History::load). Cheap to clone.
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
    /// A recorder appending to the events of a [`History`](crate::History) in this process.
    pub(super) fn in_memory(worker: &str, events: Arc<Mutex<Vec<Event>>>) -> Recorder {
        Recorder {
            worker: worker.into(),
            sink: Sink::Memory(events),
        }
    }

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
    /// `acquired <epoch_ms>` lines (convert them with [`epoch_ms_to_ns`](crate::epoch_ms_to_ns)). The checker orders events
    /// by time, so they may be recorded late and out of order. A peer that gives no fencing token
    /// records its grants with [`NO_TOKEN`](crate::NO_TOKEN).
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
    /// within `at_least` of this one (less [`JOB_WINDOW_TOLERANCE`](crate::JOB_WINDOW_TOLERANCE)). A job's lock is a lock like
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
