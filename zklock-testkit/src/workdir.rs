//! Temporary directories for servers, and the sweeping up of those that killed test processes left.

use std::fs;
use std::io;
use std::sync::Once;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::is_alive;

/// Every server directory's name starts with this.
const PREFIX: &str = "zklock-zk-";
/// The file in a server directory naming the process that owns it.
const OWNER: &str = "owner.pid";

/// A fresh directory `<tmp>/zklock-zk-<kind>-XXXXXX`, removed when dropped.
///
/// The first call in a process removes directories and port locks left by processes that are gone (a
/// test binary killed with SIGKILL cannot clean up; its servers are killed by their watchdogs).
pub(crate) fn create(kind: &str) -> io::Result<TempDir> {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(sweep);
    let dir = tempfile::Builder::new()
        .prefix(&format!("{PREFIX}{kind}-"))
        .tempdir()?;
    fs::write(dir.path().join(OWNER), std::process::id().to_string())?;
    Ok(dir)
}

fn sweep() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_ours = entry.file_name().to_string_lossy().starts_with(PREFIX);
        if !is_ours || !path.is_dir() {
            continue;
        }
        let owner = fs::read_to_string(path.join(OWNER))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if owner.is_some_and(|pid| !is_alive(pid)) {
            let _ = fs::remove_dir_all(&path);
        }
    }
    crate::ports::sweep(Duration::from_secs(60));
}
