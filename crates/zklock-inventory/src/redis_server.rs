//! A real `redis-server` for the demo and its test: free loopback port, temporary directory,
//! no persistence, stopped on drop.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh server gets to answer `PING`.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Ports tried before giving up (another process may take a port between our probe and Redis's bind).
const PORT_ATTEMPTS: usize = 5;

/// A `redis-server` process on a free loopback port with a temporary working directory.
///
/// Started with `--save ''` and `--appendonly no` (nothing is written to disk), bound to
/// 127.0.0.1 only. Dropping it kills the server and removes the directory.
///
/// The binary is `$ZKLOCK_REDIS_SERVER` if set, else `/usr/bin/redis-server` (Debian's
/// `redis-server` package), else `redis-server` from `PATH`.
///
/// # Examples
///
/// ```no_run
/// let redis = zklock_inventory::redis_server::RedisServer::start()?;
/// println!("Redis at {}", redis.url());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server and waits until it answers `PING`.
    ///
    /// # Errors
    /// When the binary is missing, or the server exits or stays silent during startup (the
    /// error carries the end of its log).
    pub fn start() -> io::Result<RedisServer> {
        let binary = binary();
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let dir = tempfile::Builder::new()
                .prefix("zklock-inventory-redis-")
                .tempdir()?;
            let log = dir.path().join("redis.log");
            let child = Command::new(&binary)
                .arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--daemonize", "no", "--protected-mode", "yes"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "cannot run {} ({e}); install Debian's redis-server package (scripts/setup does)",
                            binary.display()
                        ),
                    )
                })?;
            let mut server = RedisServer { child, port, dir };
            match server.wait_ready() {
                Ok(()) => return Ok(server),
                Err(e) => {
                    let in_use = server.log_tail().contains("Address already in use");
                    drop(server);
                    if !in_use {
                        return Err(e);
                    }
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("could not start redis-server")))
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`, for a Redis client.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "redis-server exited during startup ({status}); its log:\n{}",
                    self.log_tail()
                )));
            }
            if ping(self.port).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "redis-server did not answer PING on port {} within {STARTUP_TIMEOUT:?}; its log:\n{}",
                        self.port,
                        self.log_tail()
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

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// A port the kernel just handed out on 127.0.0.1 (free at this moment).
fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
    Ok(listener.local_addr()?.port())
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
