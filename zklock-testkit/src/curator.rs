//! A Curator client holding a lock, for interoperability tests.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::env::peers_dir;
use crate::process::Supervised;

/// How many lines of the peer's stderr are kept for error messages.
const STDERR_LINES: usize = 40;

/// A JVM running Apache Curator that takes a lock, holds it, releases it, and says when.
///
/// It runs this crate's `peers/run curator-hold CONNECT PATH MODE HOLD_MS COUNT` (the Java program
/// `peers/CuratorHold.java`), which prints
/// `acquired <epoch_ms>` and `released <epoch_ms>` for each of `COUNT` rounds; [`next_event`] reads
/// them. Compare its times with [`now_epoch_ms`](crate::now_epoch_ms) on the Rust side to prove that a
/// zklock lock and a Curator lock on the same path exclude each other.
///
/// The first run on a machine may install Curator with `apt-get` and compile the peer, so allow minutes
/// for the first event. Dropping the value kills the peer (its whole process group).
///
/// [`next_event`]: CuratorHold::next_event
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use zklock_testkit::{CuratorHold, ZkServer};
///
/// let server = ZkServer::start()?;
/// let mut peer = CuratorHold::spawn(&server.connect_string(), "/locks/job", "mutex", 500, 1)?;
/// let (event, at) = peer.next_event(Duration::from_secs(300))?;
/// assert_eq!(event, "acquired");
/// // ... a zklock acquire of /locks/job must not succeed before the peer's "released" ...
/// let (event, released_at) = peer.next_event(Duration::from_secs(10))?;
/// assert_eq!(event, "released");
/// assert!(released_at >= at + 500);
/// assert!(peer.wait()?.success());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct CuratorHold {
    process: Option<Supervised>,
    lines: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl CuratorHold {
    /// Starts the peer: it connects to `connect`, then `count` times takes the lock at `path` in `mode`,
    /// holds it `hold_ms` milliseconds, and releases it.
    ///
    /// `mode` is `mutex` (`InterProcessMutex`), `read` or `write` (`InterProcessReadWriteLock`),
    /// `semaphore:N` (a lease of `InterProcessSemaphoreV2` with `N` leases), `latch[:ID]` (a
    /// `LeaderLatch`, held while it leads) or `selector[:ID]` (a `LeaderSelector`, held while its
    /// `takeLeadership` runs); `ID` is the participant id, `curator` by default.
    ///
    /// # Errors
    ///
    /// When the script cannot be started.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// let peer = zklock_testkit::CuratorHold::spawn(&server.connect_string(), "/rw", "read", 100, 3)?;
    /// # drop(peer);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn spawn(
        connect: &str,
        path: &str,
        mode: &str,
        hold_ms: u64,
        count: u32,
    ) -> io::Result<CuratorHold> {
        let run = peers_dir().join("run");
        let mut cmd = Command::new("bash");
        cmd.arg(&run)
            .arg("curator-hold")
            .arg(connect)
            .arg(path)
            .arg(mode)
            .arg(hold_ms.to_string())
            .arg(count.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut process = Supervised::spawn(&mut cmd, true).map_err(|e| {
            io::Error::new(e.kind(), format!("could not run {}: {e}", run.display()))
        })?;
        let child = process.child_mut();
        let stdout = child.stdout.take();
        let stderr_pipe = child.stderr.take();

        let (tx, lines) = mpsc::channel();
        if let Some(out) = stdout {
            thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(err) = stderr_pipe {
            let keep = Arc::clone(&stderr);
            thread::spawn(move || {
                for line in BufReader::new(err).lines() {
                    let Ok(line) = line else { break };
                    let mut kept = keep.lock().unwrap_or_else(|e| e.into_inner());
                    if kept.len() == STDERR_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line);
                }
            });
        }
        Ok(CuratorHold {
            process: Some(process),
            lines,
            stderr,
        })
    }

    /// Waits up to `timeout` for the peer's next `acquired <ms>` or `released <ms>` line and returns
    /// `("acquired" | "released", epoch_ms)`. Other output is skipped.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::TimedOut`] after `timeout`, [`io::ErrorKind::UnexpectedEof`] when the peer exits
    /// first; both quote the peer's stderr.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let server = zklock_testkit::ZkServer::start()?;
    /// let mut peer = zklock_testkit::CuratorHold::spawn(&server.connect_string(), "/m", "mutex", 0, 1)?;
    /// let (event, _ms) = peer.next_event(Duration::from_secs(300))?;
    /// assert_eq!(event, "acquired");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn next_event(&mut self, timeout: Duration) -> io::Result<(String, u64)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(event) = parse_event(&line) {
                        return Ok(event);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "curator-hold printed no event within {timeout:?}; stderr:\n{}",
                            self.stderr_tail()
                        ),
                    ))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "curator-hold exited before its next event; stderr:\n{}",
                            self.stderr_tail()
                        ),
                    ))
                }
            }
        }
    }

    /// Waits for the peer to finish its rounds and exit.
    ///
    /// # Errors
    ///
    /// When waiting for the process fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// let peer = zklock_testkit::CuratorHold::spawn(&server.connect_string(), "/m", "mutex", 10, 2)?;
    /// assert!(peer.wait()?.success());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait(mut self) -> io::Result<ExitStatus> {
        match self.process.as_mut() {
            Some(p) => p.wait(),
            None => Err(io::Error::other("curator-hold was already reaped")),
        }
    }

    fn stderr_tail(&self) -> String {
        let kept = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for CuratorHold {
    fn drop(&mut self) {
        if let Some(mut p) = self.process.take() {
            let _ = p.kill();
        }
    }
}

fn parse_event(line: &str) -> Option<(String, u64)> {
    let mut words = line.split_whitespace();
    let event = words.next()?;
    let ms = words.next()?.parse().ok()?;
    match (event, words.next()) {
        ("acquired" | "released", None) => Some((event.to_string(), ms)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_event;

    #[test]
    fn parses_events() {
        assert_eq!(
            parse_event("acquired 1700000000123"),
            Some(("acquired".to_string(), 1_700_000_000_123))
        );
        assert_eq!(
            parse_event("released 5\n"),
            Some(("released".to_string(), 5))
        );
        assert_eq!(parse_event("SLF4J: no binding"), None);
        assert_eq!(parse_event("acquired soon"), None);
    }
}
