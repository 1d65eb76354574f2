//! A real `redis-server` for tests and demos: Debian's `redis-server` on a free loopback port with a
//! throwaway directory, no persistence (or an append-only file fsynced at every write); stopped, restarted, paused (SIGSTOP) and resumed like
//! [`ZkServer`](crate::ZkServer).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ports::{self, PortLease};
use crate::process::Supervised;
use crate::workdir;

/// How long a fresh server gets to answer `PING`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Ports tried before giving up (a port claimed by no test may still be taken by another program).
const PORT_ATTEMPTS: usize = 5;

/// A `redis-server` process on a free loopback port with a temporary working directory.
///
/// Started with `--save ''` and `--appendonly no` (nothing is written to disk; see
/// [`start_durable`](Self::start_durable) for a server that keeps its data across a restart), bound
/// to 127.0.0.1 only. Dropping it kills the server and removes the directory; so does the death of the test
/// process (a watchdog kills the server then).
///
/// The binary is `$ZKLOCK_REDIS_SERVER` if set, else `/usr/bin/redis-server` (Debian's `redis-server`
/// package, which `scripts/setup` installs), else `redis-server` from `PATH`.
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::RedisServer;
///
/// let redis = RedisServer::start()?;
/// println!("Redis at {}", redis.url()); // redis://127.0.0.1:PORT/
/// redis.pause()?; // clients' requests hang, leases run out on the server's clock
/// redis.resume()?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisServer {
    process: Option<Supervised>,
    lease: PortLease,
    dir: tempfile::TempDir,
    durable: bool,
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// When the binary is missing, or the server exits or stays silent during startup (the error
    /// carries the end of its log).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// assert!(redis.url().starts_with("redis://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start() -> io::Result<RedisServer> {
        Self::start_with(false)
    }

    /// As [`start`](Self::start), with an append-only file written and fsynced before every reply
    /// (`--appendonly yes --appendfsync always`): a [`restart`](Self::restart) keeps every write
    /// the server acknowledged, as a production server configured for durability does.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut redis = zklock_testkit::RedisServer::start_durable()?;
    /// redis.restart()?; // same port, same data
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_durable() -> io::Result<RedisServer> {
        Self::start_with(true)
    }

    fn start_with(durable: bool) -> io::Result<RedisServer> {
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let lease = ports::reserve(1)?.remove(0);
            let dir = workdir::create("redis")?;
            let mut server = RedisServer {
                process: None,
                lease,
                dir,
                durable,
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("could not start redis-server")))
    }

    /// The port it listens on (127.0.0.1).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// assert!(redis.port() > 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.lease.port()
    }

    /// `redis://127.0.0.1:PORT/`, for a Redis client or `LockManager::connect`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// let url = redis.url();
    /// # let _ = url;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port())
    }

    /// The server's log file.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// let log = std::fs::read_to_string(redis.log_path())?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The server's process id, while it runs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// assert!(redis.pid().is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(Supervised::id)
    }

    /// Kills the server (SIGKILL): connections break, and everything it held is gone (nothing is
    /// persisted), unless it was started [durable](Self::start_durable). Does nothing when already
    /// stopped.
    ///
    /// # Errors
    ///
    /// When the process cannot be killed or reaped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut redis = zklock_testkit::RedisServer::start()?;
    /// redis.stop()?;
    /// redis.restart()?; // same port, empty
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stop(&mut self) -> io::Result<()> {
        match self.process.take() {
            Some(mut p) => p.kill(),
            None => Ok(()),
        }
    }

    /// Starts the server again on the same port (stopping it first if it runs), empty (with its
    /// data, when [durable](Self::start_durable)), and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// When the server does not answer within the startup timeout, with the tail of its log.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut redis = zklock_testkit::RedisServer::start()?;
    /// let port = redis.port();
    /// redis.restart()?;
    /// assert_eq!(redis.port(), port);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&mut self) -> io::Result<()> {
        self.stop()?;
        self.spawn()
    }

    /// Freezes the server with SIGSTOP: connections stay open but nothing answers, as in a long
    /// pause or a partition. Redis expires keys by its own clock, so leases that ran out during the
    /// pause are gone once it is [`resume`](Self::resume)d.
    ///
    /// # Errors
    ///
    /// When the server is stopped or `kill -STOP` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// redis.pause()?;
    /// redis.resume()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause(&self) -> io::Result<()> {
        self.running()?.pause()
    }

    /// Lets a [`pause`](Self::pause)d server run again (SIGCONT).
    ///
    /// # Errors
    ///
    /// When the server is stopped or `kill -CONT` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// redis.pause()?;
    /// redis.resume()?;
    /// assert!(!redis.is_paused());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume(&self) -> io::Result<()> {
        self.running()?.resume()
    }

    /// Whether the server is paused.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// assert!(!redis.is_paused());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_paused(&self) -> bool {
        self.process.as_ref().is_some_and(Supervised::is_paused)
    }

    fn running(&self) -> io::Result<&Supervised> {
        self.process
            .as_ref()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "redis-server is stopped"))
    }

    fn spawn(&mut self) -> io::Result<()> {
        let binary = binary();
        let log = self.log_path();
        let _ = std::fs::remove_file(&log);
        let mut cmd = Command::new(&binary);
        cmd.arg("--port")
            .arg(self.port().to_string())
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args(if self.durable {
                ["--appendonly", "yes", "--appendfsync", "always"].as_slice()
            } else {
                ["--appendonly", "no"].as_slice()
            })
            .args(["--daemonize", "no", "--protected-mode", "yes"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let process = Supervised::spawn(&mut cmd, false).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot run {} ({e}); install Debian's redis-server package (scripts/setup does)",
                    binary.display()
                ),
            )
        })?;
        self.process = Some(process);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            let process = self.process.as_mut().expect("spawned");
            if let Some(status) = process.try_wait()? {
                let tail = self.log_tail();
                self.process = None;
                let kind = if tail.contains("Address already in use") {
                    io::ErrorKind::AddrInUse
                } else {
                    io::ErrorKind::Other
                };
                return Err(io::Error::new(
                    kind,
                    format!("redis-server exited during startup ({status}); its log:\n{tail}"),
                ));
            }
            if ping(self.port()).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let tail = self.log_tail();
                let _ = self.stop();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-server did not answer PING on port {} within {STARTUP_TIMEOUT:?}; its log:\n{tail}",
                        self.port()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ZKLOCK_REDIS_SERVER") {
        return PathBuf::from(path);
    }
    let debian = Path::new("/usr/bin/redis-server");
    if debian.exists() {
        debian.to_path_buf()
    } else {
        PathBuf::from("redis-server")
    }
}

/// Sends `PING` in Redis's inline protocol and expects `+PONG`.
fn ping(port: u16) -> io::Result<()> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.write_all(b"PING\r\n")?;
    let mut line = String::new();
    BufReader::new((&mut stream).take(64)).read_line(&mut line)?;
    if line.starts_with("+PONG") {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "unexpected reply to PING: {line:?}"
        )))
    }
}
