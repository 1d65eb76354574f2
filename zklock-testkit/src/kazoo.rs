//! A kazoo (Python) client taking and releasing locks on command, for interoperability tests.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Write};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::env::peers_dir;
use crate::process::Supervised;

/// The Python that has Debian's `python3-kazoo` (not whichever `python3` comes first on `PATH`).
const PYTHON: &str = "/usr/bin/python3";

/// How many lines of the peer's stderr are kept for error messages.
const STDERR_LINES: usize = 40;

/// One line the peer printed: `acquired NAME MS`, `released NAME MS` or `error NAME MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KazooEvent {
    /// `acquired`, `released` or `error`.
    pub event: String,
    /// The lock object's name, as given to [`KazooPeer::acquire`].
    pub name: String,
    /// Milliseconds since the Unix epoch (0 for an error).
    pub at_ms: u64,
    /// An error's message (empty otherwise).
    pub message: String,
}

/// A Python process running kazoo (Debian's `python3-kazoo`) with one client session, which
/// takes and releases kazoo `Lock`s, `ReadLock`s and `WriteLock`s when told to.
///
/// It runs this crate's `peers/kazoo_hold.py CONNECT`: [`acquire`](Self::acquire) makes a new
/// kazoo lock object and acquires it in a thread of its own, [`release`](Self::release) releases
/// it, and [`next_event`](Self::next_event) reads what happened, with the peer's clock
/// (comparable with [`now_epoch_ms`](crate::now_epoch_ms)). `python3-kazoo` is installed with
/// `apt-get` on first use. Dropping the value kills the peer.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use zklock_testkit::{KazooPeer, ZkServer};
///
/// let server = ZkServer::start()?;
/// let mut kazoo = KazooPeer::spawn(&server.connect_string())?;
/// kazoo.acquire("a", "lock", "/locks/job", &["-lock-"])?;
/// let got = kazoo.next_event(Duration::from_secs(30))?;
/// assert_eq!((got.event.as_str(), got.name.as_str()), ("acquired", "a"));
/// kazoo.release("a")?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct KazooPeer {
    process: Option<Supervised>,
    stdin: ChildStdin,
    lines: Receiver<String>,
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl KazooPeer {
    /// Starts the peer on `connect` and waits (up to five minutes, an install included) until
    /// its session is up.
    ///
    /// # Errors
    ///
    /// When kazoo cannot be installed, the script cannot be started, or it never connects.
    pub fn spawn(connect: &str) -> io::Result<KazooPeer> {
        Self::spawn_with_session(connect, Duration::from_secs(10))
    }

    /// As [`spawn`](Self::spawn), with a kazoo session of `session` (the server may clamp it).
    ///
    /// # Errors
    ///
    /// As [`spawn`](Self::spawn).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let zk = zklock_testkit::ZkServer::start()?;
    /// let peer = zklock_testkit::KazooPeer::spawn_with_session(&zk.connect_string(), Duration::from_secs(2))?;
    /// # drop(peer);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn spawn_with_session(connect: &str, session: Duration) -> io::Result<KazooPeer> {
        ensure_kazoo_installed()?;
        let script = peers_dir().join("kazoo_hold.py");
        let mut cmd = Command::new(PYTHON);
        cmd.arg("-u")
            .arg(&script)
            .arg(connect)
            .arg(format!("{}", session.as_secs_f64()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut process = Supervised::spawn(&mut cmd, true).map_err(|e| {
            io::Error::new(e.kind(), format!("could not run {}: {e}", script.display()))
        })?;
        let child = process.child_mut();
        let stdin = child.stdin.take().expect("piped stdin");
        let lines = forward_lines(child.stdout.take());
        let stderr = keep_tail(child.stderr.take());
        let mut peer = KazooPeer {
            process: Some(process),
            stdin,
            lines,
            stderr,
        };
        peer.next_line(Duration::from_secs(300), |l| l == "ready")?;
        Ok(peer)
    }

    /// Makes the kazoo lock object `name` of `kind` (`lock`, `read` or `write`: kazoo's `Lock`,
    /// `ReadLock`, `WriteLock`) on `path` with `extra_lock_patterns`, and starts acquiring it
    /// (no timeout): [`next_event`](Self::next_event) tells when it is granted.
    ///
    /// # Errors
    ///
    /// When the peer cannot be written to.
    pub fn acquire(
        &mut self,
        name: &str,
        kind: &str,
        path: &str,
        extra_lock_patterns: &[&str],
    ) -> io::Result<()> {
        let patterns = extra_lock_patterns.join(",");
        self.send(&format!("acquire {name} {kind} {path} {patterns}"))
    }

    /// Releases the kazoo lock object `name`; a `released` event follows.
    ///
    /// # Errors
    ///
    /// When the peer cannot be written to.
    pub fn release(&mut self, name: &str) -> io::Result<()> {
        self.send(&format!("release {name}"))
    }

    /// Kills the peer (SIGKILL): its session lives on in the server until it expires, and
    /// its locks with it.
    ///
    /// # Errors
    ///
    /// When the process cannot be killed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let zk = zklock_testkit::ZkServer::start()?;
    /// let mut peer = zklock_testkit::KazooPeer::spawn(&zk.connect_string())?;
    /// peer.kill()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kill(&mut self) -> io::Result<()> {
        match self.process.as_mut() {
            Some(process) => process.kill(),
            None => Ok(()),
        }
    }

    /// Waits up to `timeout` for the peer's next event.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::TimedOut`] after `timeout`, [`io::ErrorKind::UnexpectedEof`] when the
    /// peer exits first; both quote the peer's stderr.
    pub fn next_event(&mut self, timeout: Duration) -> io::Result<KazooEvent> {
        let line = self.next_line(timeout, |l| parse_event(l).is_some())?;
        Ok(parse_event(&line).expect("an event line"))
    }

    /// Whether an event arrives within `within`: `None` when none does (what a waiting lock
    /// shows), the event otherwise.
    ///
    /// # Errors
    ///
    /// When the peer exited.
    pub fn event_within(&mut self, within: Duration) -> io::Result<Option<KazooEvent>> {
        match self.next_event(within) {
            Ok(event) => Ok(Some(event)),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn send(&mut self, line: &str) -> io::Result<()> {
        writeln!(self.stdin, "{line}")?;
        self.stdin.flush()
    }

    fn next_line(
        &mut self,
        timeout: Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> io::Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if wanted(&line) => return Ok(line),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(self.failure(io::ErrorKind::TimedOut, "printed nothing in time"))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.failure(io::ErrorKind::UnexpectedEof, "exited"))
                }
            }
        }
    }

    fn failure(&self, kind: io::ErrorKind, what: &str) -> io::Error {
        let kept = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        let tail = kept.iter().cloned().collect::<Vec<_>>().join("\n");
        io::Error::new(kind, format!("the kazoo peer {what}; stderr:\n{tail}"))
    }
}

impl Drop for KazooPeer {
    fn drop(&mut self) {
        let _ = self.send("quit");
        if let Some(mut p) = self.process.take() {
            let _ = p.kill();
        }
    }
}

/// Installs Debian's `python3-kazoo` when `/usr/bin/python3` cannot import kazoo, under the
/// lock that `peers/run` and the other installers take.
fn ensure_kazoo_installed() -> io::Result<()> {
    let has = || {
        Command::new(PYTHON)
            .args(["-c", "import kazoo"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if has() {
        return Ok(());
    }
    let lock = std::env::temp_dir().join("zklock-peers-apt.lock");
    let script = "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                  -o DPkg::Lock::Timeout=600 python3-kazoo";
    let out = Command::new("flock")
        .arg(&lock)
        .args(["sh", "-c", script])
        .stdin(Stdio::null())
        .output()?;
    if has() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "kazoo is missing and installing python3-kazoo failed ({}); install it by hand \
             (apt-get install python3-kazoo):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

/// The lines of `out`, read on a thread of their own.
fn forward_lines(out: Option<std::process::ChildStdout>) -> Receiver<String> {
    let (tx, lines) = mpsc::channel();
    if let Some(out) = out {
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    lines
}

/// The last [`STDERR_LINES`] lines of `err`, kept as they come.
fn keep_tail(err: Option<std::process::ChildStderr>) -> Arc<Mutex<VecDeque<String>>> {
    let kept = Arc::new(Mutex::new(VecDeque::new()));
    if let Some(err) = err {
        let keep = Arc::clone(&kept);
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
    kept
}

/// `acquired NAME MS`, `released NAME MS` or `error NAME MESSAGE...`.
fn parse_event(line: &str) -> Option<KazooEvent> {
    let mut words = line.splitn(3, ' ');
    let (event, name, rest) = (words.next()?, words.next()?, words.next().unwrap_or(""));
    let (at_ms, message) = match event {
        "acquired" | "released" => (rest.trim().parse().ok()?, String::new()),
        "error" => (0, rest.to_string()),
        _ => return None,
    };
    Some(KazooEvent {
        event: event.to_string(),
        name: name.to_string(),
        at_ms,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::parse_event;

    #[test]
    fn parses_events() {
        let e = parse_event("acquired k1 1700000000123").unwrap();
        assert_eq!(
            (e.event.as_str(), e.name.as_str(), e.at_ms),
            ("acquired", "k1", 1_700_000_000_123)
        );
        let e = parse_event("error k2 NoNodeError((), {})").unwrap();
        assert_eq!(e.message, "NoNodeError((), {})");
        assert_eq!(parse_event("ready"), None);
        assert_eq!(parse_event("acquired k1 soon"), None);
    }
}
