//! The clock of a history: `CLOCK_MONOTONIC` nanoseconds, comparable between processes on one
//! machine, and the conversion from wall-clock milliseconds to it.

/// Nanoseconds on the system's monotonic clock (`CLOCK_MONOTONIC`): comparable between processes on
/// one machine, unaffected by changes of the wall clock. Every event of a [`History`](crate::History) is stamped with it.
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
