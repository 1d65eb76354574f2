//! Real etcd for tests: Debian's `etcd-server` (etcd 3.4) on free loopback ports with throwaway
//! data directories — one member ([`EtcdServer`]) or a cluster ([`EtcdCluster`]) whose members
//! are killed, restarted, paused (SIGSTOP) and resumed — and `etcdctl` (Debian's `etcd-client`)
//! run against them with `ETCDCTL_API=3`.
//!
//! Readiness and the leader are asked of the members' HTTP gateway on their client port
//! (`GET /health`, `POST /v3/maintenance/status`), without starting a program per probe; over
//! TLS when the members serve TLS to their clients (their peers speak plaintext).

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::certs::{Certs, ClientAuth, ServerCert, ServerTls};
use crate::daemon::{binary, on_free_ports, restart, Daemon, Log, Readiness};
use crate::install::tail;
use crate::ports::PortLease;
use crate::tls_probe;
use crate::workdir;

/// Ports tried before giving up (a port claimed by no test may still be taken by another program).
const PORT_ATTEMPTS: usize = 5;
/// How often readiness and leadership are polled.
const POLL: Duration = Duration::from_millis(25);
/// Timeout of one HTTP probe of a member.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// etcd's own default heartbeat interval, in milliseconds.
const DEFAULT_HEARTBEAT_MS: u32 = 100;
/// etcd's own default election timeout, in milliseconds.
const DEFAULT_ELECTION_MS: u32 = 1000;

/// Settings of every member of a cluster (or of the one server).
#[derive(Clone, Debug)]
struct Options {
    heartbeat_ms: u32,
    election_ms: u32,
    startup_timeout: Duration,
    extra: Vec<String>,
    tls: Option<(Certs, ClientAuth)>,
    server_cert: Option<ServerCert>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            heartbeat_ms: DEFAULT_HEARTBEAT_MS,
            election_ms: DEFAULT_ELECTION_MS,
            startup_timeout: Duration::from_secs(30),
            extra: Vec::new(),
            tls: None,
            server_cert: None,
        }
    }
}

/// The setters of the options every etcd the kit starts takes, for the builders of one server
/// and of a cluster: `$builder` is the expression that makes the builder, for the examples.
macro_rules! etcd_options {
    ($builder:literal) => {
        /// etcd's `--heartbeat-interval` in milliseconds (default 100, etcd's own).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("let etcd = ", $builder, ".heartbeat_interval(50).election_timeout(500).start()?;")]
        /// # drop(etcd);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn heartbeat_interval(mut self, ms: u32) -> Self {
            self.opts.heartbeat_ms = ms;
            self
        }

        /// etcd's `--election-timeout` in milliseconds (default 1000, etcd's own): a follower
        /// that hears nothing from the leader for between one and two of these campaigns.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("let etcd = ", $builder, ".election_timeout(2_000).start()?;")]
        /// # drop(etcd);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn election_timeout(mut self, ms: u32) -> Self {
            self.opts.election_ms = ms;
            self
        }

        /// How long to wait for the members it starts (or restarts) to be healthy (default 30 s).
        ///
        /// # Examples
        ///
        /// ```no_run
        /// use std::time::Duration;
        ///
        #[doc = concat!("let etcd = ", $builder, ".startup_timeout(Duration::from_secs(60)).start()?;")]
        /// # drop(etcd);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn startup_timeout(mut self, timeout: Duration) -> Self {
            self.opts.startup_timeout = timeout;
            self
        }

        /// Adds a command-line flag of `etcd` for every member (`--flag=value`), e.g.
        /// `--experimental-enable-lease-checkpoint=true` or `--pre-vote=true`, both off in
        /// etcd 3.4.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = concat!("let etcd = ", $builder, ".arg(\"--experimental-enable-lease-checkpoint=true\").start()?;")]
        /// # drop(etcd);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn arg(mut self, flag: impl Into<String>) -> Self {
            self.opts.extra.push(flag.into());
            self
        }

        /// Serves TLS to clients: `https://` client URLs with `--cert-file` and `--key-file`
        /// from [`Certs::server_cert_path`](crate::Certs::server_cert_path) (or the
        /// certificate [`server_cert`](Self::server_cert) picks) and, with
        /// [`ClientAuth::Required`](crate::ClientAuth::Required), `--trusted-ca-file`
        /// [`Certs::ca_path`](crate::Certs::ca_path) and `--client-cert-auth` (without, no
        /// client certificate is asked for or checked). Plaintext clients are
        /// refused; the members' peer traffic stays plaintext. The connect string becomes
        /// `etcds://...` and the client URLs `https://...`; the endpoints stay `127.0.0.1:PORT`.
        /// The kit's own probes and `etcdctl` runs speak TLS, presenting a certificate of the
        /// CA's (`etcdctl --cacert --cert --key`).
        ///
        /// With [`ClientAuth::Required`](crate::ClientAuth::Required) the server certificate
        /// cannot be the expired one: etcd's own gateway presents it to the server as a
        /// client certificate, and the server would refuse it.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// use zklock_testkit::{Certs, ClientAuth};
        ///
        /// let certs = Certs::mint()?;
        #[doc = concat!("let etcd = ", $builder, ".tls(&certs, ClientAuth::Required).start()?;")]
        /// assert!(etcd.url().starts_with("etcds://127.0.0.1:"));
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn tls(mut self, certs: &crate::Certs, client_auth: crate::ClientAuth) -> Self {
            self.opts.tls = Some((certs.clone(), client_auth));
            self
        }

        /// Which of the certificates given to [`tls`](Self::tls) the members present (the
        /// valid one unless told): the wrong name's or the expired one, which every verifying
        /// client must refuse.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// use zklock_testkit::{Certs, ClientAuth, ServerCert};
        ///
        /// let certs = Certs::mint()?;
        #[doc = concat!("let etcd = ", $builder, ".tls(&certs, ClientAuth::NotRequired).server_cert(ServerCert::WrongName).start()?;")]
        /// # drop(etcd);
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn server_cert(mut self, which: crate::ServerCert) -> Self {
            self.opts.server_cert = Some(which);
            self
        }
    };
}

/// A TLS-serving cluster's settings and the kit's client configuration for its probes.
#[derive(Debug)]
struct Tls {
    server: ServerTls,
    probe: tls_probe::Probe,
}

impl Tls {
    /// The settings of the options `opts`, if they ask for TLS.
    fn of(opts: &Options) -> io::Result<Option<Arc<Tls>>> {
        let Some(server) = ServerTls::from_options(opts.tls.clone(), opts.server_cert)? else {
            return Ok(None);
        };
        if server.requires_client_cert() && server.cert == ServerCert::Expired {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "etcd cannot present the expired certificate and require client certificates: \
                 its gateway presents the server certificate as a client and would be refused",
            ));
        }
        let probe = tls_probe::client_config(&server.certs)?;
        Ok(Some(Arc::new(Tls { server, probe })))
    }
}

/// `https` for a TLS-serving cluster, else `http`.
fn scheme(tls: bool) -> &'static str {
    if tls {
        "https"
    } else {
        "http"
    }
}

/// One etcd process and its files, under its own directory: `data/`, `etcd.log`.
#[derive(Debug)]
struct Member {
    // The process first: it dies before its files go.
    daemon: Daemon,
    name: String,
    log: Log,
    data_dir: PathBuf,
    client_port: u16,
    peer_port: u16,
    initial_cluster: String,
    token: String,
    opts: Options,
    tls: Option<Arc<Tls>>,
}

impl Member {
    /// Starts `etcd` (killing a running one first); no waiting.
    fn spawn(&mut self) -> io::Result<()> {
        let binary = binary("ZKLOCK_ETCD", "etcd");
        let log = self.log.start_run()?;
        let client = format!(
            "{}://127.0.0.1:{}",
            scheme(self.tls.is_some()),
            self.client_port
        );
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new(&binary);
        if let Some(tls) = &self.tls {
            let server = &tls.server;
            cmd.arg("--cert-file")
                .arg(server.cert_path())
                .arg("--key-file")
                .arg(server.key_path());
            // With a trusted CA, etcd checks every certificate a client presents, even
            // without --client-cert-auth: its own gateway's (the server certificate) too.
            if server.requires_client_cert() {
                cmd.arg("--trusted-ca-file")
                    .arg(server.certs.ca_path())
                    .arg("--client-cert-auth=true");
            }
        }
        cmd.arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            // Ignored once the data directory holds a member (a restart).
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            .arg(format!("--heartbeat-interval={}", self.opts.heartbeat_ms))
            .arg(format!("--election-timeout={}", self.opts.election_ms))
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(&self.opts.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // etcd takes every ETCD_* variable as a flag: none of the test's may leak in.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(name);
            }
        }
        self.daemon.spawn(
            &mut cmd,
            false,
            &binary,
            "install Debian's etcd-server package (scripts/setup does)",
        )
    }

    /// Waits until the member says it is healthy (`GET /health`: it has a leader and a quorum
    /// read went through), or fails with the log's tail; [`io::ErrorKind::AddrInUse`] when
    /// it exited because a port was taken.
    fn wait_healthy(&mut self, deadline: Instant) -> io::Result<()> {
        let port = self.client_port;
        let probe = self.tls.as_ref().map(|t| &t.probe);
        let ready = Readiness {
            port,
            log: &self.log,
            tail_lines: 20,
            ready_when: "report itself healthy (GET /health)",
            deadline,
            poll: POLL,
            kill_on_timeout: false,
        };
        let result = self.daemon.wait_ready(ready, |process| {
            Ok((!process.is_paused() && is_healthy(port, probe)).then_some(()))
        });
        // Go says "bind: address already in use", which the kit's check (a C server's
        // "Address already in use") misses.
        result.map_err(|e| {
            if e.kind() == io::ErrorKind::Other
                && self.log.since_start().contains("address already in use")
            {
                io::Error::new(io::ErrorKind::AddrInUse, e.to_string())
            } else {
                e
            }
        })
    }

    /// Starts the member again on its ports with its data and waits until it is healthy,
    /// again while its port is still taken.
    fn restart(&mut self) -> io::Result<()> {
        self.daemon.kill()?;
        let timeout = self.opts.startup_timeout;
        restart(|| {
            self.spawn()?;
            self.wait_healthy(Instant::now() + timeout)
        })
    }

    fn is_running(&self) -> bool {
        self.daemon.is_running()
    }

    fn is_paused(&self) -> bool {
        self.daemon.is_paused()
    }

    /// Its status, when it runs, is not paused and answers.
    fn status(&self) -> Option<Status> {
        if !self.is_running() || self.is_paused() {
            return None;
        }
        status(self.client_port, self.tls.as_ref().map(|t| &t.probe)).ok()
    }
}

/// What `/v3/maintenance/status` says: the member's id and the leader it follows (0: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Status {
    member_id: u64,
    leader: u64,
}

/// Whether the member on `port` answers `GET /health` with `"health":"true"`.
fn is_healthy(port: u16, tls: Option<&tls_probe::Probe>) -> bool {
    http(port, tls, "GET", "/health", "").is_ok_and(|body| body.contains(r#""health":"true""#))
}

fn status(port: u16, tls: Option<&tls_probe::Probe>) -> io::Result<Status> {
    let body = http(port, tls, "POST", "/v3/maintenance/status", "{}")?;
    let field = |key: &str| json_number(&body, key);
    match field("member_id") {
        Some(member_id) => Ok(Status {
            member_id,
            // A zero is left out of the JSON.
            leader: field("leader").unwrap_or(0),
        }),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("no member_id in the status of 127.0.0.1:{port}: {body}"),
        )),
    }
}

/// An HTTP/1.0 request (the server closes the connection after its answer, never chunked) to
/// the member on `port`, over TLS with `tls`; the body of a `200` answer.
fn http(
    port: u16,
    tls: Option<&tls_probe::Probe>,
    method: &str,
    path: &str,
    body: &str,
) -> io::Result<String> {
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = match tls {
        Some(config) => exchange(tls_probe::connect(config, port, PROBE_TIMEOUT)?, &request)?,
        None => {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
            stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
            stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
            exchange(stream, &request)?
        }
    };
    let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, format!("not HTTP: {answer:?}"))
    })?;
    if head.split_whitespace().nth(1) != Some("200") {
        return Err(io::Error::other(format!(
            "{method} {path} on 127.0.0.1:{port}: {}",
            head.lines().next().unwrap_or("")
        )));
    }
    Ok(body.to_string())
}

/// Sends `request` and reads the answer until the server closes the connection (a TLS server
/// that closes without saying so still gave its whole answer to an HTTP/1.0 request).
fn exchange(mut stream: impl Read + Write, request: &str) -> io::Result<String> {
    stream.write_all(request.as_bytes())?;
    stream.flush()?;
    let mut answer = Vec::new();
    match stream.take(1 << 20).read_to_end(&mut answer) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
        other => {
            other?;
        }
    }
    String::from_utf8(answer).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The number under `"key":` in a JSON text, quoted (as etcd's gateway writes 64-bit numbers)
/// or not; the first such key.
fn json_number(json: &str, key: &str) -> Option<u64> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let digits: String = json[at..]
        .trim_start_matches([' ', '"'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// Runs `etcdctl` (API 3) against `endpoints` (`127.0.0.1:PORT`), over TLS with `tls`, and
/// returns its standard output.
fn etcdctl(endpoints: &[String], tls: Option<&Tls>, args: &[&str]) -> io::Result<String> {
    let binary = binary("ZKLOCK_ETCDCTL", "etcdctl");
    let endpoints: Vec<String> = endpoints
        .iter()
        .map(|e| format!("{}://{e}", scheme(tls.is_some())))
        .collect();
    let mut cmd = Command::new(&binary);
    // etcdctl takes every ETCDCTL_* variable as a flag: only the API version is ours.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("ETCDCTL_") {
            cmd.env_remove(name);
        }
    }
    if let Some(tls) = tls {
        let kit = tls.server.certs.kit_identity();
        cmd.arg("--cacert")
            .arg(tls.server.certs.ca_path())
            .arg("--cert")
            .arg(&kit.cert_path)
            .arg("--key")
            .arg(&kit.key_path);
        if tls.server.cert != ServerCert::Valid {
            // The kit's own runs work against a server presenting a bad certificate too.
            cmd.arg("--insecure-skip-tls-verify");
        }
    }
    let out = cmd
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["--dial-timeout=2s", "--command-timeout=5s"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot run {} ({e}); install Debian's etcd-client package (scripts/setup does)",
                    binary.display()
                ),
            )
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(io::Error::other(format!(
            "etcdctl {} against {} failed ({}): {}{}",
            args.join(" "),
            endpoints.join(","),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr).trim_end()
        )))
    }
}

/// A cluster of real etcd members (3 is typical) on free loopback ports, with temporary data.
///
/// Members are numbered from 0 (etcd names them `m0`, `m1`, ...); each has a client and a peer
/// port, claimed for the cluster's life. The members run etcd's own timing unless told otherwise
/// ([`EtcdClusterBuilder`]): heartbeats every 100 ms, an election timeout of 1 s, so a lost
/// leader is replaced within about 1 to 3 s. Members can be killed (SIGKILL, data kept), restarted
/// on the same ports with their data, paused (SIGSTOP) and resumed (SIGCONT).
///
/// Dropping the cluster kills every member and removes the files; so does the death of the test
/// process (a watchdog kills each member then).
///
/// The binaries are `$ZKLOCK_ETCD` and `$ZKLOCK_ETCDCTL` if set, else `/usr/bin/etcd` and
/// `/usr/bin/etcdctl` (Debian's `etcd-server` and `etcd-client`, which `scripts/setup`
/// installs), else from `PATH`.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use zklock_testkit::EtcdCluster;
///
/// let mut etcd = EtcdCluster::start(3)?;
/// etcd.etcdctl(&["put", "k", "v"])?;
/// let leader = etcd.leader().expect("elected during start");
/// etcd.kill(leader)?;
/// let next = etcd.wait_for_leader(Duration::from_secs(10))?;
/// assert_ne!(next, leader);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct EtcdCluster {
    // Field order is drop order: processes, then ports, then files.
    members: Vec<Member>,
    _leases: Vec<PortLease>,
    _dir: TempDir,
    opts: Options,
    tls: Option<Arc<Tls>>,
}

/// Options for an [`EtcdCluster`]; made by [`EtcdCluster::builder`].
///
/// # Examples
///
/// ```no_run
/// let etcd = zklock_testkit::EtcdCluster::builder(3)
///     .heartbeat_interval(50)
///     .election_timeout(500)
///     .start()?;
/// # drop(etcd);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct EtcdClusterBuilder {
    size: usize,
    opts: Options,
}

impl EtcdClusterBuilder {
    etcd_options!("zklock_testkit::EtcdCluster::builder(3)");

    /// Starts every member and waits until each is healthy and they agree on a leader.
    ///
    /// # Errors
    ///
    /// When the size is 0, when `etcd` is missing, when no free ports work, or when the cluster
    /// does not form within the startup timeout — with the members' log tails;
    /// [`io::ErrorKind::InvalidInput`] when `server_cert` was given without `tls`, or is
    /// [`ServerCert::Expired`] with [`ClientAuth::Required`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::builder(5).start()?;
    /// assert_eq!(etcd.len(), 5);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<EtcdCluster> {
        let n = self.size;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an etcd cluster needs at least one member",
            ));
        }
        let tls = Tls::of(&self.opts)?;
        on_free_ports(2 * n, PORT_ATTEMPTS, "an etcd cluster", |leases| {
            let dir = workdir::create("etcd")?;
            let initial_cluster = (0..n)
                .map(|i| format!("m{i}=http://127.0.0.1:{}", leases[n + i].port()))
                .collect::<Vec<_>>()
                .join(",");
            // Unique per cluster, so that members of two clusters never take each other in.
            let token = dir
                .path()
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_else(|| "zklock-testkit".to_string());
            let members = (0..n)
                .map(|i| {
                    let root = dir.path().join(format!("m{i}"));
                    std::fs::create_dir_all(&root)?;
                    Ok(Member {
                        daemon: Daemon::new("etcd", io::ErrorKind::NotConnected),
                        name: format!("m{i}"),
                        log: Log::new(root.join("etcd.log")),
                        data_dir: root.join("data"),
                        client_port: leases[i].port(),
                        peer_port: leases[n + i].port(),
                        initial_cluster: initial_cluster.clone(),
                        token: token.clone(),
                        opts: self.opts.clone(),
                        tls: tls.clone(),
                    })
                })
                .collect::<io::Result<Vec<_>>>()?;
            let mut cluster = EtcdCluster {
                members,
                _leases: leases,
                _dir: dir,
                opts: self.opts.clone(),
                tls: tls.clone(),
            };
            for m in &mut cluster.members {
                m.spawn()?;
            }
            let deadline = Instant::now() + self.opts.startup_timeout;
            for m in &mut cluster.members {
                m.wait_healthy(deadline)?;
            }
            cluster
                .wait_for_leader(deadline.saturating_duration_since(Instant::now()))
                .map_err(|e| io::Error::new(e.kind(), format!("{e}\n{}", cluster.log_tails())))?;
            Ok(cluster)
        })
    }
}

impl EtcdCluster {
    /// Starts an `n`-member cluster with default options and waits until every member is
    /// healthy and a leader is elected.
    ///
    /// # Errors
    ///
    /// See [`EtcdClusterBuilder::start`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert!(etcd.leader().is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(n: usize) -> io::Result<EtcdCluster> {
        EtcdCluster::builder(n).start()
    }

    /// Options for an `n`-member cluster.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::builder(3).election_timeout(500).start()?;
    /// # drop(etcd);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder(n: usize) -> EtcdClusterBuilder {
        EtcdClusterBuilder {
            size: n,
            opts: Options::default(),
        }
    }

    /// The number of members, running or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert_eq!(etcd.len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always `false`: a cluster has at least one member.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(1)?;
    /// assert!(!etcd.is_empty());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client address, `127.0.0.1:PORT`, in member order (an etcd client's
    /// endpoints), without a scheme in TLS mode too ([`client_urls`](Self::client_urls) has
    /// one).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert_eq!(etcd.endpoints().len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s client address, `127.0.0.1:PORT`.
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert!(etcd.endpoint(0).starts_with("127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.port(i))
    }

    /// Every member's client URL, `http://127.0.0.1:PORT` (the form `etcd` and most clients
    /// print and take); `https://127.0.0.1:PORT` when it serves TLS
    /// ([`EtcdClusterBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert!(etcd.client_urls()[0].starts_with("http://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn client_urls(&self) -> Vec<String> {
        self.endpoints()
            .into_iter()
            .map(|e| format!("{}://{e}", scheme(self.is_tls())))
            .collect()
    }

    /// `etcd://127.0.0.1:P0,127.0.0.1:P1,...`: every member in one connect string;
    /// `etcds://...` when it serves TLS ([`EtcdClusterBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert_eq!(etcd.url().matches("127.0.0.1:").count(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self) -> String {
        let scheme = if self.is_tls() { "etcds" } else { "etcd" };
        format!("{scheme}://{}", self.endpoints().join(","))
    }

    /// Whether the members serve TLS to their clients ([`EtcdClusterBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert!(!etcd.is_tls());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Member `i`'s client port.
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert_ne!(etcd.port(0), etcd.port(1));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Member `i`'s peer (raft) port.
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert_ne!(etcd.peer_port(0), etcd.port(0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn peer_port(&self, i: usize) -> u16 {
        self.members[i].peer_port
    }

    /// Member `i`'s process id, or `None` while it is killed (or `i` is out of range).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// etcd.kill(1)?;
    /// assert_eq!(etcd.pid(1), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.get(i).and_then(|m| m.daemon.pid())
    }

    /// Member `i`'s data directory (`--data-dir`).
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(1)?;
    /// assert!(etcd.data_dir(0).join("member").is_dir());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.members[i].data_dir
    }

    /// Member `i`'s log file (etcd's structured log, every run of it).
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// let log = std::fs::read_to_string(etcd.log_path(0))?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn log_path(&self, i: usize) -> &Path {
        self.members[i].log.path()
    }

    /// The members' heartbeat interval.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert_eq!(etcd.heartbeat_interval().as_millis(), 100);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.opts.heartbeat_ms.into())
    }

    /// The members' election timeout: a follower that hears nothing from the leader for
    /// between one and two of these campaigns.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert_eq!(etcd.election_timeout().as_millis(), 1000);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn election_timeout(&self) -> Duration {
        Duration::from_millis(self.opts.election_ms.into())
    }

    /// The member that leads now, as a majority of the cluster's members see it: it reports
    /// itself as leader and more than half of all members report it as theirs. Killed and
    /// paused members are not asked (and do not count towards the majority).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert!(etcd.leader().is_some_and(|i| i < 3));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn leader(&self) -> Option<usize> {
        let statuses: Vec<Option<Status>> = self.members.iter().map(Member::status).collect();
        self.leader_of(&statuses)
    }

    fn leader_of(&self, statuses: &[Option<Status>]) -> Option<usize> {
        statuses.iter().enumerate().find_map(|(i, s)| {
            let s = (*s)?;
            let followers = statuses
                .iter()
                .flatten()
                .filter(|o| o.leader == s.member_id)
                .count();
            (s.leader == s.member_id && followers > self.len() / 2).then_some(i)
        })
    }

    /// Waits until a leader is elected and every member that runs and is not paused follows
    /// it; returns the leader.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::TimedOut`] when that does not happen within `timeout`, saying what
    /// each member reports.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let mut etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// let old = etcd.leader().unwrap();
    /// etcd.kill(old)?;
    /// let new = etcd.wait_for_leader(Duration::from_secs(10))?;
    /// assert_ne!(new, old);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait_for_leader(&self, timeout: Duration) -> io::Result<usize> {
        let deadline = Instant::now() + timeout;
        loop {
            let statuses: Vec<Option<Status>> = self.members.iter().map(Member::status).collect();
            if let Some(leader) = self.leader_of(&statuses) {
                let id = statuses[leader].map(|s| s.member_id);
                let all_follow =
                    self.members.iter().zip(&statuses).all(|(m, s)| {
                        !m.is_running() || m.is_paused() || s.map(|s| s.leader) == id
                    });
                if all_follow {
                    return Ok(leader);
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no leader that every live member follows within {timeout:?}; members \
                         report {}",
                        self.describe(&statuses)
                    ),
                ));
            }
            thread::sleep(POLL);
        }
    }

    fn describe(&self, statuses: &[Option<Status>]) -> String {
        self.members
            .iter()
            .zip(statuses)
            .enumerate()
            .map(|(i, (m, s))| {
                let state = match s {
                    _ if !m.is_running() => "killed".to_string(),
                    _ if m.is_paused() => "paused".to_string(),
                    None => "no answer".to_string(),
                    Some(s) if s.leader == 0 => format!("id {:x}, no leader", s.member_id),
                    Some(s) => format!("id {:x}, leader {:x}", s.member_id, s.leader),
                };
                format!("{i}: {state}")
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn log_tails(&self) -> String {
        self.members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("--- member {i}:\n{}", tail(&m.log.since_start(), 10)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Kills member `i` (SIGKILL, like a crash), keeping its data. Does nothing if it is killed
    /// already.
    ///
    /// # Errors
    ///
    /// When `i` is out of range or the process cannot be killed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// etcd.kill(0)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kill(&mut self, i: usize) -> io::Result<()> {
        self.member_mut(i)?.daemon.kill()
    }

    /// Starts member `i` again on its ports with its data (killing it first if it runs) and
    /// waits until it is healthy — which needs a quorum of members running.
    ///
    /// # Errors
    ///
    /// When `i` is out of range, or the member is not healthy within the startup timeout (with
    /// its log's tail).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// etcd.kill(0)?;
    /// etcd.restart(0)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&mut self, i: usize) -> io::Result<()> {
        self.member_mut(i)?.restart()
    }

    /// Freezes member `i` with SIGSTOP: its connections stay open but nothing answers, as in a
    /// partition or a long pause. A paused leader is replaced after an election timeout.
    ///
    /// # Errors
    ///
    /// When `i` is out of range, the member is killed, or `kill -STOP` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// etcd.pause(1)?;
    /// etcd.resume(1)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause(&self, i: usize) -> io::Result<()> {
        let m = self.member(i)?;
        m.daemon.pause(m.client_port)
    }

    /// Lets a paused member run again (SIGCONT).
    ///
    /// # Errors
    ///
    /// When `i` is out of range, the member is killed, or `kill -CONT` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// etcd.pause(1)?;
    /// etcd.resume(1)?;
    /// assert!(!etcd.is_paused(1));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume(&self, i: usize) -> io::Result<()> {
        let m = self.member(i)?;
        m.daemon.resume(m.client_port)
    }

    /// Whether member `i` is paused (`false` when out of range).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// assert!(!etcd.is_paused(0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_paused(&self, i: usize) -> bool {
        self.members.get(i).is_some_and(Member::is_paused)
    }

    /// Runs `etcdctl` (`ETCDCTL_API=3`) with `args` against every member that runs and is not
    /// paused, and returns its standard output.
    ///
    /// # Errors
    ///
    /// When `etcdctl` is missing or fails (with what it printed).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// etcd.etcdctl(&["put", "greeting", "hello"])?;
    /// assert_eq!(etcd.etcdctl(&["get", "greeting", "--print-value-only"])?.trim(), "hello");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn etcdctl(&self, args: &[&str]) -> io::Result<String> {
        let live: Vec<String> = (0..self.len())
            .filter(|&i| self.members[i].is_running() && !self.members[i].is_paused())
            .map(|i| self.endpoint(i))
            .collect();
        if live.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "every etcd member is killed or paused",
            ));
        }
        etcdctl(&live, self.tls.as_deref(), args)
    }

    /// Runs `etcdctl` (`ETCDCTL_API=3`) with `args` against member `i` alone, and returns its
    /// standard output.
    ///
    /// # Errors
    ///
    /// When `i` is out of range, or `etcdctl` is missing or fails (with what it printed).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdCluster::start(3)?;
    /// etcd.member_etcdctl(0, &["put", "k", "v"])?;
    /// assert_eq!(etcd.member_etcdctl(2, &["get", "k", "--print-value-only"])?.trim(), "v");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_etcdctl(&self, i: usize, args: &[&str]) -> io::Result<String> {
        self.member(i)?;
        etcdctl(&[self.endpoint(i)], self.tls.as_deref(), args)
    }

    fn member(&self, i: usize) -> io::Result<&Member> {
        let n = self.len();
        self.members.get(i).ok_or_else(|| no_member(i, n))
    }

    fn member_mut(&mut self, i: usize) -> io::Result<&mut Member> {
        let n = self.len();
        self.members.get_mut(i).ok_or_else(|| no_member(i, n))
    }
}

fn no_member(i: usize, n: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("no member {i} in an etcd cluster of {n}"),
    )
}

/// One etcd on free loopback ports with a temporary data directory: an [`EtcdCluster`] of one
/// member, with a single server's vocabulary (stop, restart, pause and resume it, like
/// [`RedisServer`](crate::RedisServer)).
///
/// Dropping it kills the server and removes the directory; so does the death of the test
/// process.
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::EtcdServer;
///
/// let mut etcd = EtcdServer::start()?;
/// println!("etcd at {}", etcd.endpoint()); // 127.0.0.1:PORT
/// etcd.etcdctl(&["put", "k", "v"])?;
/// etcd.stop()?; // clients see the connection refused
/// etcd.restart()?; // same port, same data
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct EtcdServer {
    cluster: EtcdCluster,
}

/// Options for an [`EtcdServer`]; made by [`EtcdServer::builder`].
///
/// # Examples
///
/// ```no_run
/// let etcd = zklock_testkit::EtcdServer::builder()
///     .arg("--experimental-enable-lease-checkpoint=true")
///     .start()?;
/// # drop(etcd);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct EtcdServerBuilder {
    opts: Options,
}

impl EtcdServerBuilder {
    etcd_options!("zklock_testkit::EtcdServer::builder()");

    /// Starts the server and waits until it is healthy.
    ///
    /// # Errors
    ///
    /// As [`EtcdClusterBuilder::start`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::builder().start()?;
    /// # drop(etcd);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<EtcdServer> {
        let cluster = EtcdClusterBuilder {
            size: 1,
            opts: self.opts,
        }
        .start()?;
        Ok(EtcdServer { cluster })
    }
}

impl EtcdServer {
    /// Starts a server with default options and waits until it is healthy.
    ///
    /// # Errors
    ///
    /// When `etcd` is missing, no free ports work, or the server exits or is not healthy
    /// within 30 s (with its log's tail).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// assert!(etcd.url().starts_with("etcd://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start() -> io::Result<EtcdServer> {
        EtcdServer::builder().start()
    }

    /// Options for a server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::builder().election_timeout(500).start()?;
    /// # drop(etcd);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder() -> EtcdServerBuilder {
        EtcdServerBuilder {
            opts: Options::default(),
        }
    }

    /// Its client address, `127.0.0.1:PORT`, without a scheme in TLS mode too
    /// ([`client_url`](Self::client_url) has one).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// assert_eq!(etcd.endpoint(), format!("127.0.0.1:{}", etcd.port()));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoint(&self) -> String {
        self.cluster.endpoint(0)
    }

    /// `[endpoint()]`, for code that takes a cluster's endpoints.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// assert_eq!(etcd.endpoints(), vec![etcd.endpoint()]);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn endpoints(&self) -> Vec<String> {
        self.cluster.endpoints()
    }

    /// Its client URL, `http://127.0.0.1:PORT`; `https://127.0.0.1:PORT` when it serves TLS
    /// ([`EtcdServerBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// assert!(etcd.client_url().starts_with("http://"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn client_url(&self) -> String {
        self.cluster.client_urls().remove(0)
    }

    /// `etcd://127.0.0.1:PORT`; `etcds://127.0.0.1:PORT` when it serves TLS
    /// ([`EtcdServerBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// assert_eq!(etcd.url(), format!("etcd://{}", etcd.endpoint()));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self) -> String {
        self.cluster.url()
    }

    /// Whether it serves TLS to its clients ([`EtcdServerBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// assert!(!etcd.is_tls());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_tls(&self) -> bool {
        self.cluster.is_tls()
    }

    /// The client port.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// assert!(etcd.port() > 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.cluster.port(0)
    }

    /// The server's process id, while it runs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// assert!(etcd.pid().is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self) -> Option<u32> {
        self.cluster.pid(0)
    }

    /// The data directory.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// assert!(etcd.data_dir().is_dir());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn data_dir(&self) -> &Path {
        self.cluster.data_dir(0)
    }

    /// The server's log file.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// let log = std::fs::read_to_string(etcd.log_path())?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn log_path(&self) -> &Path {
        self.cluster.log_path(0)
    }

    /// Kills the server (SIGKILL, as in a crash), keeping its data. Does nothing when already
    /// stopped.
    ///
    /// # Errors
    ///
    /// When the process cannot be killed or reaped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut etcd = zklock_testkit::EtcdServer::start()?;
    /// etcd.stop()?;
    /// etcd.restart()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stop(&mut self) -> io::Result<()> {
        self.cluster.kill(0)
    }

    /// Starts the server again on the same port with its data (stopping it first if it runs)
    /// and waits until it is healthy.
    ///
    /// # Errors
    ///
    /// When it is not healthy within the startup timeout, with its log's tail.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut etcd = zklock_testkit::EtcdServer::start()?;
    /// etcd.etcdctl(&["put", "k", "v"])?;
    /// etcd.restart()?;
    /// assert_eq!(etcd.etcdctl(&["get", "k", "--print-value-only"])?.trim(), "v");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&mut self) -> io::Result<()> {
        self.cluster.restart(0)
    }

    /// Freezes the server with SIGSTOP: connections stay open but nothing answers.
    ///
    /// # Errors
    ///
    /// When the server is stopped or `kill -STOP` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// etcd.pause()?;
    /// etcd.resume()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause(&self) -> io::Result<()> {
        self.cluster.pause(0)
    }

    /// Lets a paused server run again (SIGCONT).
    ///
    /// # Errors
    ///
    /// When the server is stopped or `kill -CONT` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// etcd.pause()?;
    /// etcd.resume()?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume(&self) -> io::Result<()> {
        self.cluster.resume(0)
    }

    /// Whether the server is paused.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// assert!(!etcd.is_paused());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_paused(&self) -> bool {
        self.cluster.is_paused(0)
    }

    /// Runs `etcdctl` (`ETCDCTL_API=3`) with `args` against the server and returns its
    /// standard output.
    ///
    /// # Errors
    ///
    /// When `etcdctl` is missing or fails (with what it printed).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let etcd = zklock_testkit::EtcdServer::start()?;
    /// etcd.etcdctl(&["put", "k", "v"])?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn etcdctl(&self, args: &[&str]) -> io::Result<String> {
        self.cluster.member_etcdctl(0, args)
    }
}

#[cfg(test)]
mod tests {
    use super::json_number;

    #[test]
    fn numbers_are_read_quoted_or_not() {
        let gateway =
            r#"{"header":{"cluster_id":"14","member_id":"1141","raft_term":"2"},"leader":"1141"}"#;
        assert_eq!(json_number(gateway, "member_id"), Some(1141));
        assert_eq!(json_number(gateway, "leader"), Some(1141));
        let etcdctl = r#"[{"Status":{"header":{"member_id":77},"leader":5}}]"#;
        assert_eq!(json_number(etcdctl, "member_id"), Some(77));
        assert_eq!(json_number(etcdctl, "leader"), Some(5));
        assert_eq!(json_number(etcdctl, "revision"), None);
    }
}
