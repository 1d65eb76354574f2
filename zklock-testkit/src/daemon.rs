//! What every server the kit runs (ZooKeeper, Redis, PostgreSQL) has in common: free ports with
//! a retry when another program took one, its log and the part of it the current run wrote, the
//! supervised process (spawn, pause, resume, kill), waiting until it is ready (with the log's
//! tail when it exits or stays silent), and a restart that waits for its port to be free.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::install::tail;
use crate::ports::{self, PortLease};
use crate::process::Supervised;

/// Starts a server on `n` fresh loopback ports, up to `attempts` times while it fails with
/// [`io::ErrorKind::AddrInUse`] (a port no test claimed may still be taken by another program);
/// any other error ends the attempts.
pub(crate) fn on_free_ports<T>(
    n: usize,
    attempts: usize,
    what: &str,
    mut start: impl FnMut(Vec<PortLease>) -> io::Result<T>,
) -> io::Result<T> {
    let mut last_err = None;
    for _ in 0..attempts {
        match start(ports::reserve(n)?) {
            Ok(server) => return Ok(server),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other(format!("could not start {what}"))))
}

/// Restarts a stopped server with `start` (spawn and wait until ready), again every 250 ms for
/// up to 10 s while its port is still taken ([`io::ErrorKind::AddrInUse`]: a socket of the
/// previous run lingers).
pub(crate) fn restart<T>(mut start: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        match start() {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < give_up => {
                thread::sleep(Duration::from_millis(250));
            }
            other => return other,
        }
    }
}

/// A server's log file, and where the current run's part of it starts.
#[derive(Debug)]
pub(crate) struct Log {
    path: PathBuf,
    offset: u64,
}

impl Log {
    /// The log at `path` (nothing is created yet).
    pub(crate) fn new(path: PathBuf) -> Log {
        Log { path, offset: 0 }
    }

    /// The path of the log file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the log for a new run (created if missing, appended to), noting where the run's
    /// part starts; the file is for the server's stdout and stderr.
    pub(crate) fn start_run(&mut self) -> io::Result<File> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        self.offset = file.metadata()?.len();
        Ok(file)
    }

    /// The log written by the current (or last) run.
    pub(crate) fn since_start(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.path) {
            let _ = f.seek(SeekFrom::Start(self.offset));
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    }
}

/// How a server shows that it is ready, and what to say when it is not.
pub(crate) struct Readiness<'a> {
    /// The server's port, for the messages.
    pub(crate) port: u16,
    /// Its log.
    pub(crate) log: &'a Log,
    /// Lines of the log's tail in an error.
    pub(crate) tail_lines: usize,
    /// What it does once ready, for the timeout's message ("answer PING").
    pub(crate) ready_when: &'static str,
    /// Give up then.
    pub(crate) deadline: Instant,
    /// How often to probe.
    pub(crate) poll: Duration,
    /// Whether to kill a server that is not ready by the deadline.
    pub(crate) kill_on_timeout: bool,
}

/// One server process of the kit, while it runs; `name` names it in errors.
#[derive(Debug)]
pub(crate) struct Daemon {
    name: &'static str,
    /// The kind of error when it is asked to pause or resume while stopped.
    stopped: io::ErrorKind,
    process: Option<Supervised>,
}

impl Daemon {
    /// A stopped server called `name`.
    pub(crate) fn new(name: &'static str, stopped: io::ErrorKind) -> Daemon {
        Daemon {
            name,
            stopped,
            process: None,
        }
    }

    /// Spawns `cmd` (leading its own process group with `group`), killing a running process
    /// first. When `program` cannot be run, the error says so and what to do (`hint`).
    pub(crate) fn spawn(
        &mut self,
        cmd: &mut Command,
        group: bool,
        program: &Path,
        hint: &str,
    ) -> io::Result<()> {
        self.kill()?;
        let process = Supervised::spawn(cmd, group).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot run {} ({e}); {hint}", program.display()),
            )
        })?;
        self.process = Some(process);
        Ok(())
    }

    /// The process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Supervised::id)
    }

    /// Whether it runs (paused or not).
    pub(crate) fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// Whether it is paused (SIGSTOP).
    pub(crate) fn is_paused(&self) -> bool {
        self.process.as_ref().is_some_and(Supervised::is_paused)
    }

    /// The running process, or an error saying the server is stopped.
    pub(crate) fn running(&self, port: u16) -> io::Result<&Supervised> {
        self.process.as_ref().ok_or_else(|| {
            io::Error::new(
                self.stopped,
                format!("{} on port {port} is stopped", self.name),
            )
        })
    }

    /// Freezes it with SIGSTOP.
    pub(crate) fn pause(&self, port: u16) -> io::Result<()> {
        self.running(port)?.pause()
    }

    /// Lets it run again with SIGCONT.
    pub(crate) fn resume(&self, port: u16) -> io::Result<()> {
        self.running(port)?.resume()
    }

    /// SIGKILLs it (even when paused) and reaps it. Does nothing when it is not running.
    pub(crate) fn kill(&mut self) -> io::Result<()> {
        match self.process.take() {
            Some(mut p) => p.kill(),
            None => Ok(()),
        }
    }

    /// The process, taken out (the server counts as stopped), for a stop of its own.
    pub(crate) fn take(&mut self) -> Option<Supervised> {
        self.process.take()
    }

    /// Waits until `probe` says the server is ready and returns what it said. Fails early when
    /// the process exits — with [`io::ErrorKind::AddrInUse`] when its log says it could not bind
    /// a port — and with [`io::ErrorKind::TimedOut`] at the deadline; both with the log's tail.
    pub(crate) fn wait_ready<T>(
        &mut self,
        ready: Readiness<'_>,
        mut probe: impl FnMut(&Supervised) -> io::Result<Option<T>>,
    ) -> io::Result<T> {
        let since = Instant::now();
        loop {
            let process = self.process.as_mut().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("{} is stopped", self.name),
                )
            })?;
            if let Some(status) = process.try_wait()? {
                self.process = None;
                return Err(self.exited(&ready, status));
            }
            if let Some(answer) = probe(process)? {
                return Ok(answer);
            }
            if Instant::now() >= ready.deadline {
                let err = self.timed_out(&ready, since.elapsed());
                if ready.kill_on_timeout {
                    let _ = self.kill();
                }
                return Err(err);
            }
            thread::sleep(ready.poll);
        }
    }

    /// The error for a server that exited while starting.
    fn exited(&self, ready: &Readiness<'_>, status: std::process::ExitStatus) -> io::Error {
        let log = ready.log.since_start();
        let kind = if log.contains("Address already in use") {
            io::ErrorKind::AddrInUse
        } else {
            io::ErrorKind::Other
        };
        io::Error::new(
            kind,
            format!(
                "{} on port {} exited during startup ({status}); log {}:\n{}",
                self.name,
                ready.port,
                ready.log.path().display(),
                tail(&log, ready.tail_lines)
            ),
        )
    }

    /// The error for a server that was not ready after `waited`.
    fn timed_out(&self, ready: &Readiness<'_>, waited: Duration) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "{} on port {} (pid {:?}) did not {} within {waited:.1?}; log {}:\n{}",
                self.name,
                ready.port,
                self.pid(),
                ready.ready_when,
                ready.log.path().display(),
                tail(&ready.log.since_start(), ready.tail_lines)
            ),
        )
    }
}

/// `$var` if set, else Debian's `/usr/bin/<name>`, else `name` from `PATH`.
pub(crate) fn binary(var: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return PathBuf::from(path);
    }
    let debian = Path::new("/usr/bin").join(name);
    if debian.exists() {
        debian
    } else {
        PathBuf::from(name)
    }
}
