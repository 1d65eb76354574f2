//! A real `redis-server` for tests and demos: Debian's `redis-server` on a free loopback port with a
//! throwaway directory, no persistence (or an append-only file fsynced at every write), plaintext
//! or TLS only; stopped, restarted, paused (SIGSTOP) and resumed like [`ZkServer`](crate::ZkServer).

use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::certs::{Certs, ClientAuth, ServerCert, ServerTls};
use crate::daemon::{on_free_ports, restart, Daemon, Log, Readiness};
use crate::ports::PortLease;
use crate::tls_probe;
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
/// [`RedisServer::builder`] starts it in TLS mode too ([`RedisServerBuilder::tls`]).
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
    // Field order is drop order: the process first, then the port, then the files.
    daemon: Daemon,
    lease: PortLease,
    log: Log,
    dir: tempfile::TempDir,
    durable: bool,
    /// Variables the server runs with (a [`ServerClock`](crate::ServerClock)'s).
    env: Vec<(OsString, OsString)>,
    /// TLS only, when set, and the kit's client configuration for its `PING`s.
    tls: Option<(ServerTls, tls_probe::Probe)>,
}

/// Options for a [`RedisServer`]; made by [`RedisServer::builder`].
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::{Certs, ClientAuth, RedisServer};
///
/// let certs = Certs::mint()?;
/// let redis = RedisServer::builder()
///     .durable()
///     .tls(&certs, ClientAuth::Required)
///     .start()?;
/// assert!(redis.url().starts_with("rediss://"));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisServerBuilder {
    durable: bool,
    env: Vec<(OsString, OsString)>,
    tls: Option<(Certs, ClientAuth)>,
    server_cert: Option<ServerCert>,
}

impl RedisServerBuilder {
    /// An append-only file written and fsynced before every reply, as
    /// [`RedisServer::start_durable`] starts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut redis = zklock_testkit::RedisServer::builder().durable().start()?;
    /// redis.restart()?; // same port, same data
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn durable(mut self) -> Self {
        self.durable = true;
        self
    }

    /// The wall clock of `clock`, as [`RedisServer::start_with_clock`] starts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let clock = zklock_testkit::ServerClock::new()?;
    /// let redis = zklock_testkit::RedisServer::builder().clock(&clock).start()?;
    /// # drop(redis);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn clock(mut self, clock: &crate::ServerClock) -> Self {
        self.env = clock.env();
        self
    }

    /// Serves TLS only: `--port 0 --tls-port PORT` with [`Certs::server_cert_path`] (or the
    /// certificate [`server_cert`](Self::server_cert) picks), trusting [`Certs::ca_path`] for
    /// client certificates, and `--tls-auth-clients yes` ([`ClientAuth::Required`], Redis's
    /// default) or `no`. [`RedisServer::url`] becomes `rediss://127.0.0.1:PORT/`; a plaintext
    /// client gets its connection closed. The kit's own `PING`s speak TLS, presenting a
    /// certificate of the CA's.
    ///
    /// A client connects with the CA and, when required, [`Certs::client_cert_path`] and its
    /// key: `redis-cli --tls --cacert CA --cert CERT --key KEY -p PORT`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{Certs, ClientAuth, RedisServer};
    ///
    /// let certs = Certs::mint()?;
    /// let redis = RedisServer::builder().tls(&certs, ClientAuth::NotRequired).start()?;
    /// assert_eq!(redis.url(), format!("rediss://127.0.0.1:{}/", redis.port()));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls(mut self, certs: &Certs, client_auth: ClientAuth) -> Self {
        self.tls = Some((certs.clone(), client_auth));
        self
    }

    /// Which of the certificates given to [`tls`](Self::tls) the server presents (the valid one
    /// unless told): the wrong name's or the expired one, which every verifying client must
    /// refuse.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{Certs, ClientAuth, RedisServer, ServerCert};
    ///
    /// let certs = Certs::mint()?;
    /// let redis = RedisServer::builder()
    ///     .tls(&certs, ClientAuth::NotRequired)
    ///     .server_cert(ServerCert::Expired)
    ///     .start()?;
    /// # drop(redis);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn server_cert(mut self, which: ServerCert) -> Self {
        self.server_cert = Some(which);
        self
    }

    /// Starts the server and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start`]; [`io::ErrorKind::InvalidInput`] when
    /// [`server_cert`](Self::server_cert) was given without [`tls`](Self::tls).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::builder().start()?;
    /// assert!(redis.url().starts_with("redis://"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<RedisServer> {
        let tls = match ServerTls::from_options(self.tls, self.server_cert)? {
            Some(tls) => {
                let probe = tls_probe::client_config(&tls.certs)?;
                Some((tls, probe))
            }
            None => None,
        };
        on_free_ports(1, PORT_ATTEMPTS, "redis-server", |mut leases| {
            let dir = workdir::create("redis")?;
            let mut server = RedisServer {
                daemon: Daemon::new("redis-server", io::ErrorKind::NotFound),
                lease: leases.remove(0),
                log: Log::new(dir.path().join("redis.log")),
                dir,
                durable: self.durable,
                env: self.env.clone(),
                tls: tls.clone(),
            };
            server.spawn()?;
            Ok(server)
        })
    }
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
        RedisServer::builder().start()
    }

    /// Options for a server: durability, a moved clock, TLS.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::builder().durable().start()?;
    /// # drop(redis);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
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
        RedisServer::builder().durable().start()
    }

    /// As [`start`](Self::start), on a wall clock that the test moves with `clock` (its
    /// restarts too): `TIME`, and the expiry of every key, follow it.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// let clock = zklock_testkit::ServerClock::new()?;
    /// let redis = zklock_testkit::RedisServer::start_with_clock(&clock)?;
    /// clock.step_forward(Duration::from_secs(60)); // keys with less than 60 s to live expire
    /// # let _ = redis;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_with_clock(clock: &crate::ServerClock) -> io::Result<RedisServer> {
        RedisServer::builder().clock(clock).start()
    }

    /// The port it listens on (127.0.0.1): its TLS port in TLS mode (it has no other then).
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

    /// `redis://127.0.0.1:PORT/`, for a Redis client or `LockManager::connect`;
    /// `rediss://127.0.0.1:PORT/` in TLS mode ([`RedisServerBuilder::tls`]).
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
        let scheme = if self.is_tls() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}/", self.port())
    }

    /// Whether it serves TLS only ([`RedisServerBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// assert!(!redis.is_tls());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
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
        self.log.path().to_path_buf()
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
        self.daemon.pid()
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
        self.daemon.kill()
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
        restart(|| self.spawn())
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
        self.daemon.pause(self.port())
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
        self.daemon.resume(self.port())
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
        self.daemon.is_paused()
    }

    /// Starts `redis-server` (killing a running one first) and waits until it answers `PING`.
    fn spawn(&mut self) -> io::Result<()> {
        let binary = crate::daemon::binary("ZKLOCK_REDIS_SERVER", "redis-server");
        // redis-server appends to its log file itself.
        drop(self.log.start_run()?);
        let mut cmd = Command::new(&binary);
        match &self.tls {
            None => cmd.arg("--port").arg(self.port().to_string()),
            Some((tls, _)) => cmd
                .args(["--port", "0", "--tls-port"])
                .arg(self.port().to_string())
                .arg("--tls-cert-file")
                .arg(tls.cert_path())
                .arg("--tls-key-file")
                .arg(tls.key_path())
                .arg("--tls-ca-cert-file")
                .arg(tls.certs.ca_path())
                .arg("--tls-auth-clients")
                .arg(if tls.requires_client_cert() {
                    "yes"
                } else {
                    "no"
                }),
        };
        cmd.args(["--bind", "127.0.0.1", "--save", ""])
            .args(if self.durable {
                ["--appendonly", "yes", "--appendfsync", "always"].as_slice()
            } else {
                ["--appendonly", "no"].as_slice()
            })
            .args(["--daemonize", "no", "--protected-mode", "yes"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log.path())
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.daemon.spawn(
            &mut cmd,
            false,
            &binary,
            "install Debian's redis-server package (scripts/setup does)",
        )?;
        let port = self.port();
        let ready = Readiness {
            port,
            log: &self.log,
            tail_lines: 20,
            ready_when: "answer PING",
            deadline: Instant::now() + STARTUP_TIMEOUT,
            poll: Duration::from_millis(25),
            kill_on_timeout: true,
        };
        let probe = self.tls.as_ref().map(|(_, probe)| probe.clone());
        self.daemon
            .wait_ready(ready, |_| Ok(ping(port, probe.as_ref()).ok()))
    }
}

/// Sends `PING` in Redis's inline protocol and expects `+PONG`, over TLS with `tls`.
fn ping(port: u16, tls: Option<&tls_probe::Probe>) -> io::Result<()> {
    match tls {
        Some(config) => ping_on(tls_probe::connect(config, port, Duration::from_secs(1))?),
        None => {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
            stream.set_read_timeout(Some(Duration::from_secs(1)))?;
            ping_on(stream)
        }
    }
}

fn ping_on(mut stream: impl Read + Write) -> io::Result<()> {
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
