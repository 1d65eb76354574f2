//! Where the project's shared folder is, and what time it is.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The project's shared folder (`shared/`, beside the repository checkout), which holds `peers/run`.
///
/// `ZKLOCK_SHARED` when set; otherwise the first `shared/` holding `peers/run` found walking up from this
/// crate's directory (as compiled in), e.g. `/work/shared` for a checkout at `/work/main`.
///
/// # Errors
///
/// [`io::ErrorKind::NotFound`] when `ZKLOCK_SHARED` names no directory, or no such folder is found.
///
/// # Examples
///
/// ```no_run
/// let run = zklock_testkit::shared_dir()?.join("peers/run");
/// assert!(run.exists());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn shared_dir() -> io::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("ZKLOCK_SHARED") {
        let dir = PathBuf::from(dir);
        return if dir.is_dir() {
            Ok(dir)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("ZKLOCK_SHARED={} is not a directory", dir.display()),
            ))
        };
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut starts = vec![manifest.to_path_buf()];
    if let Ok(real) = manifest.canonicalize() {
        starts.push(real);
    }
    starts
        .iter()
        .flat_map(|start| start.ancestors())
        .map(|dir| dir.join("shared"))
        .find(|shared| shared.join("peers").join("run").is_file())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "no shared/peers/run above {}; set ZKLOCK_SHARED to the shared folder",
                    manifest.display()
                ),
            )
        })
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
