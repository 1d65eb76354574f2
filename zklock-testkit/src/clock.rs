//! A server's wall clock that a test moves: [`ServerClock`], the kit's own preload library
//! (`preload/clockshift.c`), built with the machine's C compiler once per process.
//!
//! Debian's libfaketime moves PostgreSQL's clock but does not start `redis-server` (it
//! recurses in start-up, where jemalloc reads the clock before libfaketime is initialised).
//! The kit's library offsets only the wall clock (`CLOCK_REALTIME`, `gettimeofday`, `time`)
//! through direct system calls, so it starts every server, and leaves the monotonic clocks
//! alone, as a real step of the system clock (an NTP step, an operator's `date -s`) does.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crate::workdir;

/// The library's source, written next to the library it is built into.
const SOURCE: &str = include_str!("../preload/clockshift.c");

/// The variable that names the file holding the offset, in milliseconds.
const FILE_VAR: &str = "ZKLOCK_CLOCK_FILE";

/// The library, built once per process into a directory that lives as long as the process
/// (servers run as another user read it: the directory and file are world-readable).
fn library() -> io::Result<&'static Path> {
    static LIBRARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = LIBRARY.get_or_init(|| {
        let build = || -> io::Result<PathBuf> {
            let dir = workdir::create("clockshift")?.keep();
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
            let source = dir.join("clockshift.c");
            fs::write(&source, SOURCE)?;
            let library = dir.join("clockshift.so");
            let out = Command::new("cc")
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .arg(&library)
                .arg(&source)
                .output()
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "cannot run cc ({e}); install Debian's gcc to move a server's clock"
                        ),
                    )
                })?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "building the clock-shifting library failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
            fs::set_permissions(&library, fs::Permissions::from_mode(0o755))?;
            Ok(library)
        };
        build().map_err(|e| e.to_string())
    });
    match built {
        Ok(path) => Ok(path),
        Err(e) => Err(io::Error::other(e.clone())),
    }
}

/// The wall clock of the servers started with it, which a test steps back and forward; see
/// the module's docs. Start a server on it with
/// [`PostgresServer::start_with_clock`](crate::PostgresServer::start_with_clock) or
/// [`RedisServer::start_with_clock`](crate::RedisServer::start_with_clock).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// let clock = zklock_testkit::ServerClock::new()?;
/// let pg = zklock_testkit::PostgresServer::start_with_clock(&clock)?;
/// clock.step_back(Duration::from_secs(3600)); // the server's clock_timestamp() is an hour behind
/// assert_eq!(clock.offset_ms(), -3_600_000);
/// # let _ = pg;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct ServerClock {
    dir: tempfile::TempDir,
    offset_ms: AtomicI64,
}

impl ServerClock {
    /// A clock on time (offset zero), building the library if this process has not yet.
    ///
    /// # Errors
    ///
    /// When the C compiler is missing or fails, or the offset file cannot be written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let clock = zklock_testkit::ServerClock::new()?;
    /// assert_eq!(clock.offset_ms(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new() -> io::Result<ServerClock> {
        library()?;
        let dir = workdir::create("clock")?;
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
        let clock = ServerClock {
            dir,
            offset_ms: AtomicI64::new(0),
        };
        clock.write(0)?;
        Ok(clock)
    }

    /// Steps the servers' wall clock forward by `by` (at once, as an NTP step does).
    ///
    /// # Panics
    ///
    /// When the offset file cannot be written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let clock = zklock_testkit::ServerClock::new()?;
    /// clock.step_forward(Duration::from_secs(30));
    /// assert_eq!(clock.offset_ms(), 30_000);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn step_forward(&self, by: Duration) {
        self.step(i64::try_from(by.as_millis()).expect("a step of under 2^63 ms"));
    }

    /// Steps the servers' wall clock back by `by`.
    ///
    /// # Panics
    ///
    /// When the offset file cannot be written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let clock = zklock_testkit::ServerClock::new()?;
    /// clock.step_back(Duration::from_secs(30));
    /// assert_eq!(clock.offset_ms(), -30_000);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn step_back(&self, by: Duration) {
        self.step(-i64::try_from(by.as_millis()).expect("a step of under 2^63 ms"));
    }

    /// How far the servers' wall clock is from the real one now, in milliseconds.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let clock = zklock_testkit::ServerClock::new()?;
    /// assert_eq!(clock.offset_ms(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::SeqCst)
    }

    fn step(&self, by_ms: i64) {
        let now = self.offset_ms.fetch_add(by_ms, Ordering::SeqCst) + by_ms;
        self.write(now).expect("write the clock's offset file");
        // The servers read the file again at most every millisecond.
        std::thread::sleep(Duration::from_millis(5));
    }

    /// Writes the offset whole (a new file renamed over the old one).
    fn write(&self, offset_ms: i64) -> io::Result<()> {
        let next = self.dir.path().join("offset.next");
        fs::write(&next, format!("{offset_ms}\n"))?;
        fs::set_permissions(&next, fs::Permissions::from_mode(0o644))?;
        fs::rename(&next, self.file())
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("offset")
    }

    /// The environment that starts a process on this clock.
    pub(crate) fn env(&self) -> Vec<(OsString, OsString)> {
        let library = library().expect("built in new()");
        vec![
            ("LD_PRELOAD".into(), library.as_os_str().to_owned()),
            (FILE_VAR.into(), self.file().into_os_string()),
        ]
    }
}
