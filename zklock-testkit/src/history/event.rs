//! One event of a history (who did what to which lock, when), and its line format for histories
//! recorded to a file by another process.

use super::clock::now_ns;

/// The fencing token to record for a grant whose client gives none (a Curator peer, see
/// [`Recorder::record_at`](crate::Recorder::record_at)). The checker checks such holds for overlaps like any other, and leaves
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

/// What happened, in one event of a [`History`](crate::History).
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
    /// [`Recorder::job_ran`](crate::Recorder::job_ran)).
    JobRan {
        /// The run's `at_least` window, in milliseconds.
        at_least_ms: u64,
    },
    /// A fault was injected. `silent` faults take the named worker's holds away in a way it cannot
    /// notice in time (its process is frozen, or its session is killed from outside); see
    /// [`History::silent_fault`](crate::History::silent_fault).
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

    /// The event as one line of text (no newline), as [`Recorder::to_file`](crate::Recorder::to_file) writes it.
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
