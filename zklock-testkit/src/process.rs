//! Child processes that die with the test: killed on drop, and — should the test process itself be killed
//! outright — by a tiny watchdog shell that notices its stdin pipe close; and whether a pid is alive
//! (for sweeping up what dead test processes left).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Whether `pid` names a live process (this one included).
pub(crate) fn is_alive(pid: u32) -> bool {
    pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists()
}

/// A spawned child (optionally leading its own process group) with a watchdog.
#[derive(Debug)]
pub(crate) struct Supervised {
    child: Child,
    /// Kill the whole process group rather than just the child.
    group: bool,
    watchdog: Option<(Child, ChildStdin)>,
    paused: AtomicBool,
    reaped: bool,
}

impl Supervised {
    /// Spawns `cmd`; with `group`, the child leads a new process group and is killed with it.
    pub(crate) fn spawn(cmd: &mut Command, group: bool) -> io::Result<Supervised> {
        if group {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let child = cmd.spawn()?;
        let target = if group {
            format!("-{}", child.id())
        } else {
            child.id().to_string()
        };
        // Ignores the signals a terminal or harness sends the test's process group, waits for EOF on
        // stdin (the test process is gone, or dropped us), then kills the target.
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg("trap '' INT HUP TERM; read _; kill -9 $1 2>/dev/null")
            .arg("zklock-testkit-watchdog")
            .arg(&target)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
            .and_then(|mut w| match w.stdin.take() {
                Some(stdin) => Some((w, stdin)),
                None => {
                    let _ = w.kill();
                    let _ = w.wait();
                    None
                }
            });
        Ok(Supervised {
            child,
            group,
            watchdog,
            paused: AtomicBool::new(false),
            reaped: false,
        })
    }

    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The child's mutable handle, to take its pipes.
    pub(crate) fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// `Some(status)` once the child has exited.
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        let status = self.child.try_wait()?;
        if status.is_some() {
            self.reaped = true;
        }
        Ok(status)
    }

    /// SIGSTOP, and wait until every thread has stopped.
    ///
    /// `kill` returns before a multi-threaded process is frozen: the kernel wakes one thread to start the
    /// group stop, and on a busy machine the others (a JVM's selector and workers) may run, and answer
    /// clients, for milliseconds more.
    pub(crate) fn pause(&self) -> io::Result<()> {
        self.signal("STOP")?;
        self.paused.store(true, Ordering::SeqCst);
        self.wait_stopped(Duration::from_secs(10))
    }

    fn wait_stopped(&self, timeout: Duration) -> io::Result<()> {
        let tasks = PathBuf::from(format!("/proc/{}/task", self.id()));
        if !tasks.is_dir() {
            return Ok(()); // no procfs: nothing to check with
        }
        let deadline = Instant::now() + timeout;
        loop {
            let running = fs::read_dir(&tasks)?
                .flatten()
                .filter(|task| {
                    let stat = fs::read_to_string(task.path().join("stat")).unwrap_or_default();
                    let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                    // T: stopped; t: traced; Z/X: exiting. An empty stat: the thread is gone.
                    !(state.is_empty() || state.starts_with(['T', 't', 'Z', 'X']))
                })
                .count();
            if running == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "process {} still has {running} running threads {timeout:?} after SIGSTOP",
                        self.id()
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGCONT.
    pub(crate) fn resume(&self) -> io::Result<()> {
        self.signal("CONT")?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    fn signal(&self, sig: &str) -> io::Result<()> {
        if self.reaped {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("process {} has exited", self.id()),
            ));
        }
        let target = self.target();
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg("--")
            .arg(&target)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "kill -{sig} {target} failed: {status}"
            )))
        }
    }

    fn target(&self) -> String {
        if self.group {
            format!("-{}", self.child.id())
        } else {
            self.child.id().to_string()
        }
    }

    /// Waits for the child to exit by itself.
    pub(crate) fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait()?;
        self.reaped = true;
        if self.group {
            // Stragglers of the group (e.g. a log filter) go with it.
            let _ = self.signal_group_kill();
        }
        self.stop_watchdog();
        Ok(status)
    }

    /// SIGKILL (the whole group if it leads one), reap, and retire the watchdog. Idempotent.
    pub(crate) fn kill(&mut self) -> io::Result<()> {
        if !self.reaped {
            if self.is_paused() {
                let _ = self.signal("CONT");
            }
            if !self.group || self.signal_group_kill().is_err() {
                match self.child.kill() {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::InvalidInput => {} // already exited
                    Err(e) => return Err(e),
                }
            }
            self.child.wait()?;
            self.reaped = true;
            self.paused.store(false, Ordering::SeqCst);
        }
        self.stop_watchdog();
        Ok(())
    }

    fn signal_group_kill(&self) -> io::Result<()> {
        let status = Command::new("kill")
            .args(["-KILL", "--"])
            .arg(format!("-{}", self.child.id()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other("kill of process group failed"))
        }
    }

    fn stop_watchdog(&mut self) {
        // Kill the watchdog itself (not via EOF): the pid it would kill may be reused by now.
        if let Some((mut w, stdin)) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
            drop(stdin);
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}
