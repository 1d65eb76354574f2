//! A standalone ZooKeeper server: Curator's `TestingServer`.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::certs::{Certs, ClientAuth, ServerCert, ServerTls};
use crate::daemon::on_free_ports;
use crate::install::{ensure_netty_installed, ensure_zookeeper_installed};
use crate::member::{Member, Options};
use crate::ports::PortLease;
use crate::tls::{self, TlsMaterial};
use crate::workdir;

/// How many fresh ports to try when the chosen one turns out to be taken.
const PORT_ATTEMPTS: usize = 5;
/// How long the TLS port may take to accept once the plaintext port serves.
const SECURE_PORT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`ZkServer::four_letter`] waits for an answer.
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(5);

/// A real, standalone ZooKeeper server on a free loopback port with a temporary data directory.
///
/// Each server is its own small JVM (Debian's ZooKeeper 3.8 jars) with its own port, claimed for the
/// server's whole life so that tests running in parallel — threads or processes — never collide. The
/// default tick is 200 ms, so sessions may be as short as 400 ms (`minSessionTimeout` = 2 ticks) and as long
/// as 60 s. Stopping, restarting (same port, same data), pausing (SIGSTOP) and resuming (SIGCONT) let tests
/// provoke connection loss and session expiry. Empty CONTAINER nodes (lock paths) are reaped every
/// 100 ms rather than every minute (see [`ZkServerBuilder::container_check_interval`]).
///
/// Dropping the server kills the JVM (paused or not) and removes its directory. Should the test process
/// die without dropping it, a watchdog kills the JVM anyway.
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::ZkServer;
///
/// let server = ZkServer::start()?;
/// let connect = server.connect_string(); // "127.0.0.1:PORT", for any ZooKeeper client
/// assert_eq!(server.four_letter("ruok")?, "imok");
/// # let _ = connect;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct ZkServer {
    // Field order is drop order: the process first, then the ports, then the files.
    member: Member,
    lease: PortLease,
    secure_lease: Option<PortLease>,
    tls: Option<std::sync::Arc<TlsMaterial>>,
    certs: Option<ServerTls>,
    _dir: TempDir,
}

/// Options for a [`ZkServer`]; made by [`ZkServer::builder`].
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::ZkServer;
///
/// let server = ZkServer::builder()
///     .tick_time(100) // sessions from 200 ms
///     .max_session_timeout(10_000)
///     .config("globalOutstandingLimit", "100")
///     .start()?;
/// # drop(server);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct ZkServerBuilder {
    opts: Options,
    tls: bool,
    certs: Option<(Certs, ClientAuth)>,
    server_cert: Option<ServerCert>,
}

impl ZkServerBuilder {
    crate::member::server_options!("zklock_testkit::ZkServer::builder()");

    /// Serves TLS too: a `secureClientPort` on another free loopback port, with a throwaway
    /// self-signed certificate for `127.0.0.1` and `localhost` (made with the JDK's `keytool`, once per
    /// process) and Netty's connection factory, which ZooKeeper needs for TLS. The plain port stays (for
    /// four-letter words and plain clients); clients trust [`ZkServer::tls_ca_pem`] and connect to
    /// [`ZkServer::secure_connect_string`]. Client certificates are not asked for (`ssl.clientAuth=none`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::builder().tls().start()?;
    /// let connect = server.secure_connect_string().unwrap();
    /// let ca_pem = server.tls_ca_pem().unwrap(); // what a TLS client trusts
    /// # let _ = (connect, ca_pem);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Serves TLS too, as [`tls`](Self::tls) does, but with `certs`: the secure port presents
    /// [`Certs::server_cert_path`] (or the certificate [`server_cert`](Self::server_cert)
    /// picks; ZooKeeper reads PEM files, `ssl.keyStore.type=PEM`) and trusts
    /// [`Certs::ca_path`] for client certificates (`ssl.trustStore.type=PEM`), which it
    /// requires with [`ClientAuth::Required`] (`ssl.clientAuth=need`; else `none`). The plain
    /// port stays, as with [`tls`](Self::tls); [`ZkServer::tls_ca_pem`] is the CA's.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{Certs, ClientAuth, ZkServer};
    ///
    /// let certs = Certs::mint()?;
    /// let server = ZkServer::builder().tls_with(&certs, ClientAuth::Required).start()?;
    /// let connect = server.secure_connect_string().unwrap();
    /// // A TLS client trusts certs.ca_path() and presents certs.client_cert_path().
    /// # let _ = connect;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls_with(mut self, certs: &Certs, client_auth: ClientAuth) -> Self {
        self.tls = true;
        self.certs = Some((certs.clone(), client_auth));
        self
    }

    /// Which of the certificates given to [`tls_with`](Self::tls_with) the secure port
    /// presents (the valid one unless told): the wrong name's or the expired one, which every
    /// verifying client must refuse.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{Certs, ClientAuth, ServerCert, ZkServer};
    ///
    /// let certs = Certs::mint()?;
    /// let server = ZkServer::builder()
    ///     .tls_with(&certs, ClientAuth::NotRequired)
    ///     .server_cert(ServerCert::Expired)
    ///     .start()?;
    /// # drop(server);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn server_cert(mut self, which: ServerCert) -> Self {
        self.server_cert = Some(which);
        self
    }

    /// Starts the server and waits until it serves.
    ///
    /// # Errors
    ///
    /// When ZooKeeper or Java is missing and cannot be installed, when no free port works, or when the
    /// server does not serve within the startup timeout — with the tail of the server's log;
    /// [`io::ErrorKind::InvalidInput`] when [`server_cert`](Self::server_cert) was given without
    /// [`tls_with`](Self::tls_with).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::builder().start()?;
    /// # drop(server);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<ZkServer> {
        ensure_zookeeper_installed()?;
        let certs = ServerTls::from_options(self.certs.clone(), self.server_cert)?;
        let material = match (&certs, self.tls) {
            (None, true) => Some(tls::material()?),
            (Some(_), _) => {
                ensure_netty_installed()?;
                None
            }
            (None, false) => None,
        };
        let ports_needed = if self.tls { 2 } else { 1 };
        on_free_ports(ports_needed, PORT_ATTEMPTS, "ZooKeeper", |mut leases| {
            let secure_lease = if self.tls { leases.pop() } else { None };
            let lease = leases.remove(0);
            let dir = workdir::create("server")?;
            let mut opts = self.opts.clone();
            let tls_lines = match (&material, &certs, &secure_lease) {
                (Some(material), _, Some(secure)) => material.config_lines(secure.port()),
                (None, Some(certs), Some(secure)) => {
                    pem_config_lines(certs, dir.path(), secure.port())?
                }
                _ => Vec::new(),
            };
            // Extra lines the caller gave still win over these.
            let mut lines = tls_lines;
            lines.append(&mut opts.extra);
            opts.extra = lines;
            let mut member = Member::create(dir.path().to_path_buf(), &opts, lease.port(), &[], 0)?;
            member.spawn()?;
            member.wait_serving(None)?;
            if let Some(secure) = &secure_lease {
                wait_accepting(secure.port())?;
            }
            Ok(ZkServer {
                member,
                lease,
                secure_lease,
                tls: material.clone(),
                certs: certs.clone(),
                _dir: dir,
            })
        })
    }
}

impl ZkServer {
    /// Starts a server with default options on a free port and waits until it serves.
    ///
    /// # Errors
    ///
    /// See [`ZkServerBuilder::start`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// # drop(server);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start() -> io::Result<ZkServer> {
        ZkServerBuilder::default().start()
    }

    /// Options for a server: tick time, session timeout bounds, extra `zoo.cfg` lines.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::builder().tick_time(100).start()?;
    /// # drop(server);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder() -> ZkServerBuilder {
        ZkServerBuilder::default()
    }

    /// `"127.0.0.1:PORT"`, for a ZooKeeper client.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// assert!(server.connect_string().starts_with("127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// The client port; the same across [`restart`](Self::restart)s.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// assert_ne!(server.port(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.lease.port()
    }

    /// The TLS client port, when the server was built with [`ZkServerBuilder::tls`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::builder().tls().start()?;
    /// assert_ne!(server.secure_port(), Some(server.port()));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn secure_port(&self) -> Option<u16> {
        self.secure_lease.as_ref().map(PortLease::port)
    }

    /// `"127.0.0.1:SECURE_PORT"`, for a TLS client, when the server was built with
    /// [`ZkServerBuilder::tls`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::builder().tls().start()?;
    /// assert!(server.secure_connect_string().unwrap().starts_with("127.0.0.1:"));
    /// assert_eq!(zklock_testkit::ZkServer::start()?.secure_connect_string(), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn secure_connect_string(&self) -> Option<String> {
        self.secure_port().map(|p| format!("127.0.0.1:{p}"))
    }

    /// The PEM certificate a TLS client must trust to talk to this server (its self-signed
    /// certificate), when the server was built with [`ZkServerBuilder::tls`]; the CA's
    /// ([`Certs::ca_pem`]) with [`ZkServerBuilder::tls_with`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::builder().tls().start()?;
    /// assert!(server.tls_ca_pem().unwrap().contains("BEGIN CERTIFICATE"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls_ca_pem(&self) -> Option<&str> {
        match (&self.tls, &self.certs) {
            (Some(material), _) => Some(material.ca_pem()),
            (None, Some(certs)) => Some(certs.certs.ca_pem()),
            (None, None) => None,
        }
    }

    /// The JVM's process id, or `None` while stopped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut server = zklock_testkit::ZkServer::start()?;
    /// assert!(server.pid().is_some());
    /// server.stop()?;
    /// assert_eq!(server.pid(), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.member.pid()
    }

    /// The server's data directory (snapshots and transaction logs); kept across stop and restart,
    /// removed on drop.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// assert!(server.data_dir().join("version-2").exists());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn data_dir(&self) -> &Path {
        self.member.data_dir()
    }

    /// The server's log file (stdout and stderr of the JVM, across restarts).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// let log = std::fs::read_to_string(server.log_path())?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn log_path(&self) -> &Path {
        self.member.log_path()
    }

    /// Kills the JVM (SIGKILL, like a crash) and keeps the data directory. Clients see the connection drop;
    /// their sessions survive if the server is [`restart`](Self::restart)ed within their timeout. Does
    /// nothing when already stopped.
    ///
    /// # Errors
    ///
    /// When the process cannot be killed or reaped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut server = zklock_testkit::ZkServer::start()?;
    /// server.stop()?;
    /// assert!(server.four_letter("ruok").is_err());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stop(&mut self) -> io::Result<()> {
        self.member.stop()
    }

    /// Starts the server again on the same port with the same data (stopping it first if it runs) and
    /// waits until it serves.
    ///
    /// # Errors
    ///
    /// When the server does not serve within the startup timeout, with the tail of its log.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut server = zklock_testkit::ZkServer::start()?;
    /// let port = server.port();
    /// server.stop()?;
    /// server.restart()?;
    /// assert_eq!(server.port(), port);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&mut self) -> io::Result<()> {
        self.member.restart()?;
        match self.secure_port() {
            Some(port) => wait_accepting(port),
            None => Ok(()),
        }
    }

    /// Freezes the JVM with SIGSTOP: connections stay open but nothing answers, as with a long GC pause or
    /// a partition. Sessions time out on the server once it is [`resume`](Self::resume)d.
    ///
    /// # Errors
    ///
    /// When the server is stopped or `kill -STOP` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// server.pause()?;
    /// // ... clients time out ...
    /// server.resume()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause(&self) -> io::Result<()> {
        self.member.pause()
    }

    /// Lets a [`pause`](Self::pause)d JVM run again (SIGCONT).
    ///
    /// # Errors
    ///
    /// When the server is stopped or `kill -CONT` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// server.pause()?;
    /// server.resume()?;
    /// assert_eq!(server.four_letter("ruok")?, "imok");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume(&self) -> io::Result<()> {
        self.member.resume()
    }

    /// Whether the server is paused.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// assert!(!server.is_paused());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_paused(&self) -> bool {
        self.member.is_paused()
    }

    /// Sends a four-letter admin command (`ruok`, `srvr`, `stat`, `conf`, `cons`, `dump`, `wchc`, `mntr`,
    /// ...) and returns the answer, waiting at most 5 s.
    ///
    /// # Errors
    ///
    /// When `cmd` is not four lowercase letters, or the server cannot be reached or does not answer in time
    /// (e.g. stopped or paused).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// let mntr = server.four_letter("mntr")?;
    /// assert!(mntr.contains("zk_znode_count"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn four_letter(&self, cmd: &str) -> io::Result<String> {
        self.four_letter_timeout(cmd, FOUR_LETTER_TIMEOUT)
    }

    /// [`four_letter`](Self::four_letter) with a timeout of your choosing.
    ///
    /// # Errors
    ///
    /// As for [`four_letter`](Self::four_letter).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let server = zklock_testkit::ZkServer::start()?;
    /// server.pause()?;
    /// assert!(server.four_letter_timeout("ruok", Duration::from_millis(200)).is_err());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn four_letter_timeout(&self, cmd: &str, timeout: Duration) -> io::Result<String> {
        self.member.four_letter(cmd, timeout)
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        // Kill the JVM before the port lease and the directory go (field order does the rest).
        let _ = self.member.stop();
    }
}

/// Waits until the TLS port accepts connections. ZooKeeper opens it after the plaintext port,
/// which already answers `ruok`: a client that came at once was refused.
fn wait_accepting(port: u16) -> io::Result<()> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + SECURE_PORT_TIMEOUT;
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("ZooKeeper's TLS port {port} accepts no connection within {SECURE_PORT_TIMEOUT:?} of its plaintext port serving: {e}"),
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The `zoo.cfg` lines that make a server serve TLS on `secure_port` with `tls`'s PEM files:
/// the key and certificate in one file (as ZooKeeper's PEM key store wants them), written in
/// `dir`.
fn pem_config_lines(
    tls: &ServerTls,
    dir: &Path,
    secure_port: u16,
) -> io::Result<Vec<(String, String)>> {
    let keystore = dir.join("keystore.pem");
    let mut pem = std::fs::read_to_string(tls.key_path())?;
    pem.push_str(&std::fs::read_to_string(tls.cert_path())?);
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&keystore)?
            .write_all(pem.as_bytes())?;
    }
    let client_auth = if tls.requires_client_cert() {
        "need"
    } else {
        "none"
    };
    Ok([
        ("secureClientPort", secure_port.to_string()),
        ("secureClientPortAddress", "127.0.0.1".to_string()),
        (
            "serverCnxnFactory",
            "org.apache.zookeeper.server.NettyServerCnxnFactory".to_string(),
        ),
        ("ssl.keyStore.location", keystore.display().to_string()),
        ("ssl.keyStore.type", "PEM".to_string()),
        (
            "ssl.trustStore.location",
            tls.certs.ca_path().display().to_string(),
        ),
        ("ssl.trustStore.type", "PEM".to_string()),
        ("ssl.clientAuth", client_auth.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect())
}
