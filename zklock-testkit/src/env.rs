//! Where the project's peer programs are, and what time it is.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The folder of zklock's peer programs: this crate's `peers/`, in the repository.
///
/// It holds `run`, which runs Apache Curator and kazoo beside zklock (the bench's peers) and a Curator
/// client holding one lock ([`CuratorHold`](crate::CuratorHold)), installing what they need from
/// Debian's packages on first use. The path is this crate's directory as compiled in, so it works from
/// any checkout of the repository and needs nothing beside it.
///
/// # Examples
///
/// ```
/// let run = zklock_testkit::peers_dir().join("run");
/// assert!(run.is_file());
/// ```
pub fn peers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers")
}

/// Milliseconds since the Unix epoch, comparable with the times [`CuratorHold`](crate::CuratorHold)
/// reports.
///
/// # Examples
///
/// ```
/// let before = zklock_testkit::now_epoch_ms();
/// assert!(zklock_testkit::now_epoch_ms() >= before);
/// ```
pub fn now_epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
