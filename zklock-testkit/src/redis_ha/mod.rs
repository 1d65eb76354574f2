//! Replicated Redis for tests: a primary with replicas watched by Sentinels ([`RedisSentinel`])
//! and a Redis Cluster ([`RedisCluster`]), from Debian's `redis-server`, `redis-sentinel` and
//! `redis-cli`, on free loopback ports with throwaway directories; and the few commands the kit
//! sends them, in Redis's protocol ([`RedisReply`]).
//!
//! Every node runs without persistence (`--save ''`, `--appendonly no`), and replicas sync
//! without waiting (`--repl-diskless-sync-delay 0`; Redis waits 5 s by default to batch
//! replicas).
//!
//! In TLS mode ([`RedisSentinelBuilder::tls`], [`RedisClusterBuilder::tls`]) every process
//! listens on a TLS port only and speaks TLS to the others ([`NodeTls`]), and the kit's own
//! commands go over TLS too, presenting the kit's client certificate.

mod cluster;
mod sentinel;

use std::ffi::OsString;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use cluster::{RedisCluster, RedisClusterBuilder};
pub use sentinel::{RedisSentinel, RedisSentinelBuilder};

use crate::certs::{Certs, ClientAuth, ServerTls};
use crate::daemon::{binary, restart, Daemon, Log, Readiness};
use crate::tls_probe::{self, Probe};

/// Ports tried before giving up (a port claimed by no test may still be taken by another program).
const PORT_ATTEMPTS: usize = 5;
/// How often readiness and state are polled.
const POLL: Duration = Duration::from_millis(25);
/// Timeout of a probe (a `PING`, an `INFO`) while polling.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Timeout of a command a test sends (long enough for a `WAIT` of a few seconds).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// A reply in Redis's protocol (RESP2). Error replies are not values: the kit's commands return
/// them as an [`io::Error`] whose message is the server's (`MOVED 3999 127.0.0.1:PORT`, ...).
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::{RedisReply, RedisSentinel};
///
/// let redis = RedisSentinel::start()?;
/// let primary = redis.primary()?;
/// assert_eq!(redis.command(primary, &["SET", "k", "v"])?, RedisReply::Status("OK".into()));
/// assert_eq!(redis.command(primary, &["GET", "k"])?.text().as_deref(), Some("v"));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisReply {
    /// A status reply, `+OK`.
    Status(String),
    /// An integer reply, `:1`.
    Int(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// The null bulk string or array (`GET` of a missing key).
    Nil,
    /// An array of replies.
    Array(Vec<RedisReply>),
}

impl RedisReply {
    /// A status or bulk reply as text (invalid UTF-8 replaced), else `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// use zklock_testkit::RedisReply;
    ///
    /// assert_eq!(RedisReply::Bulk(b"v".to_vec()).text().as_deref(), Some("v"));
    /// assert_eq!(RedisReply::Nil.text(), None);
    /// ```
    pub fn text(&self) -> Option<String> {
        match self {
            RedisReply::Status(s) => Some(s.clone()),
            RedisReply::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// An integer reply's value, else `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(zklock_testkit::RedisReply::Int(2).int(), Some(2));
    /// ```
    pub fn int(&self) -> Option<i64> {
        match self {
            RedisReply::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// An array reply's elements, else `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// use zklock_testkit::RedisReply;
    ///
    /// let reply = RedisReply::Array(vec![RedisReply::Int(1)]);
    /// assert_eq!(reply.array().map(<[_]>::len), Some(1));
    /// ```
    pub fn array(&self) -> Option<&[RedisReply]> {
        match self {
            RedisReply::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// How the processes of a deployment speak TLS: to their clients, to each other (replication,
/// Sentinels' links, the Cluster bus) and to the kit, whose commands present the kit's client
/// certificate.
#[derive(Clone, Debug)]
struct NodeTls {
    server: ServerTls,
    probe: Probe,
}

impl NodeTls {
    /// The settings of a builder given `tls` (its `tls` option), with the kit's client.
    fn of(tls: Option<(Certs, ClientAuth)>) -> io::Result<Option<NodeTls>> {
        let Some(server) = ServerTls::from_options(tls, None)? else {
            return Ok(None);
        };
        let probe = tls_probe::client_config(&server.certs)?;
        Ok(Some(NodeTls { server, probe }))
    }

    /// The directives, as `(name, value)`, that make a process listen on `port` with TLS only
    /// and speak TLS to the nodes it connects to (a replica to its primary, a Sentinel to the
    /// nodes and the other Sentinels), presenting its server certificate to them.
    fn directives(&self, port: u16) -> Vec<(&'static str, String)> {
        let path = |p: &std::path::Path| p.display().to_string();
        let auth = if self.server.requires_client_cert() {
            "yes"
        } else {
            "no"
        };
        vec![
            ("port", "0".into()),
            ("tls-port", port.to_string()),
            ("tls-cert-file", path(self.server.cert_path())),
            ("tls-key-file", path(self.server.key_path())),
            ("tls-ca-cert-file", path(self.server.certs.ca_path())),
            ("tls-auth-clients", auth.into()),
            ("tls-replication", "yes".into()),
        ]
    }

    /// `redis-cli`'s options to speak TLS to the nodes as the kit.
    fn cli_args(&self) -> Vec<OsString> {
        let kit = self.server.certs.kit_identity();
        vec![
            "--tls".into(),
            "--cacert".into(),
            self.server.certs.ca_path().into(),
            "--cert".into(),
            kit.cert_path.clone().into(),
            "--key".into(),
            kit.key_path.clone().into(),
        ]
    }
}

/// A connection the kit sends commands on, plaintext or TLS.
trait Stream: Read + Write {}

impl<T: Read + Write> Stream for T {}

/// Connects to `127.0.0.1:port`, over TLS with `tls`, each step within `timeout`.
fn open(port: u16, tls: Option<&Probe>, timeout: Duration) -> io::Result<Box<dyn Stream>> {
    Ok(match tls {
        Some(probe) => {
            // The handshake is a round trip or two more than a plaintext connect.
            let handshake = Duration::from_secs(2).min(timeout);
            let stream = tls_probe::connect(probe, port, handshake)?;
            stream.sock.set_read_timeout(Some(timeout))?;
            stream.sock.set_write_timeout(Some(timeout))?;
            Box::new(stream)
        }
        None => {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            let connect = Duration::from_millis(500).min(timeout);
            let stream = TcpStream::connect_timeout(&addr, connect)?;
            stream.set_read_timeout(Some(timeout))?;
            stream.set_write_timeout(Some(timeout))?;
            Box::new(stream)
        }
    })
}

/// Sends one command to `127.0.0.1:port` on a connection of its own and reads the reply.
fn command(
    port: u16,
    tls: Option<&Probe>,
    args: &[&str],
    timeout: Duration,
) -> io::Result<RedisReply> {
    let mut replies = commands(port, tls, &[args], timeout)?;
    Ok(replies.remove(0))
}

/// Sends commands to `127.0.0.1:port` one after the other on one connection of their own (as
/// `WAIT` needs: it waits for the replicas to have the connection's own writes), and reads
/// their replies; stops at the first error reply.
fn commands(
    port: u16,
    tls: Option<&Probe>,
    cmds: &[&[&str]],
    timeout: Duration,
) -> io::Result<Vec<RedisReply>> {
    // Each reply is read whole before the next command goes out: nothing is left buffered.
    let mut reader = BufReader::new(open(port, tls, timeout)?);
    let mut replies = Vec::with_capacity(cmds.len());
    for args in cmds {
        let mut request = format!("*{}\r\n", args.len()).into_bytes();
        for arg in *args {
            request.extend(format!("${}\r\n", arg.len()).as_bytes());
            request.extend(arg.as_bytes());
            request.extend(b"\r\n");
        }
        reader.get_mut().write_all(&request)?;
        replies.push(read_reply(&mut reader)?);
    }
    Ok(replies)
}

fn read_reply(r: &mut impl BufRead) -> io::Result<RedisReply> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("not RESP: {line:?}"));
    let rest = line.get(1..).ok_or_else(bad)?;
    let length = || rest.parse::<i64>().map_err(|_| bad());
    match line.as_bytes()[0] {
        b'+' => Ok(RedisReply::Status(rest.to_string())),
        b'-' => Err(io::Error::other(rest.to_string())),
        b':' => Ok(RedisReply::Int(length()?)),
        b'$' => match usize::try_from(length()?) {
            Err(_) => Ok(RedisReply::Nil),
            Ok(n) => {
                let mut bytes = vec![0; n + 2];
                r.read_exact(&mut bytes)?;
                bytes.truncate(n);
                Ok(RedisReply::Bulk(bytes))
            }
        },
        b'*' => match usize::try_from(length()?) {
            Err(_) => Ok(RedisReply::Nil),
            Ok(n) => (0..n)
                .map(|_| read_reply(r))
                .collect::<io::Result<_>>()
                .map(RedisReply::Array),
        },
        _ => Err(bad()),
    }
}

/// `key:value` lines of an `INFO` or `CLUSTER INFO` reply.
fn info_field(info: &str, key: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

/// A flat `[key, value, key, value, ...]` reply (`SENTINEL MASTER`) as pairs.
fn pairs(reply: &RedisReply) -> Vec<(String, String)> {
    let items = reply.array().unwrap_or(&[]);
    items
        .chunks(2)
        .filter_map(|kv| Some((kv.first()?.text()?, kv.get(1)?.text()?)))
        .collect()
}

fn pair<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// What a node runs.
#[derive(Debug)]
enum Program {
    /// `redis-server` with these arguments after the kit's own.
    Server(Vec<String>),
    /// `redis-sentinel` on this configuration file (which Sentinel rewrites as it learns).
    Sentinel(PathBuf),
}

/// One Redis process (a server or a Sentinel) and its directory, which holds its log.
#[derive(Debug)]
struct Node {
    // The process first: it dies before its files go.
    daemon: Daemon,
    port: u16,
    log: Log,
    dir: PathBuf,
    program: Program,
    env: Vec<(OsString, OsString)>,
    /// TLS only, when set.
    tls: Option<NodeTls>,
}

impl Node {
    /// A stopped `redis-server` on `port` working in `dir` (created).
    fn server(
        dir: PathBuf,
        port: u16,
        args: Vec<String>,
        env: &[(OsString, OsString)],
        tls: Option<&NodeTls>,
    ) -> io::Result<Node> {
        fs::create_dir_all(&dir)?;
        Ok(Node {
            daemon: Daemon::new("redis-server", io::ErrorKind::NotFound),
            port,
            log: Log::new(dir.join("redis.log")),
            dir,
            program: Program::Server(args),
            env: env.to_vec(),
            tls: tls.cloned(),
        })
    }

    /// A stopped Sentinel on `port` working in `dir` (created) with the configuration `config`
    /// (the kit adds the port, address and directory, and with `tls` the TLS directives).
    fn sentinel(
        dir: PathBuf,
        port: u16,
        config: &str,
        env: &[(OsString, OsString)],
        tls: Option<&NodeTls>,
    ) -> io::Result<Node> {
        fs::create_dir_all(&dir)?;
        let file = dir.join("sentinel.conf");
        let listen = match tls {
            None => format!("port {port}\n"),
            Some(tls) => tls
                .directives(port)
                .into_iter()
                .map(|(name, value)| format!("{name} {value}\n"))
                .collect(),
        };
        fs::write(
            &file,
            format!(
                "{listen}bind 127.0.0.1\ndaemonize no\ndir {}\n{config}",
                dir.display()
            ),
        )?;
        Ok(Node {
            daemon: Daemon::new("redis-sentinel", io::ErrorKind::NotFound),
            port,
            log: Log::new(dir.join("sentinel.log")),
            dir,
            program: Program::Sentinel(file),
            env: env.to_vec(),
            tls: tls.cloned(),
        })
    }

    /// Starts the process (killing a running one first), `extra` after its arguments; no
    /// waiting. It logs to its stdout, which goes to its log with its stderr.
    fn spawn(&mut self, extra: &[String]) -> io::Result<()> {
        let log = self.log.start_run()?;
        let (binary, hint, mut cmd) = match &self.program {
            Program::Server(args) => {
                let binary = binary("ZKLOCK_REDIS_SERVER", "redis-server");
                let mut cmd = Command::new(&binary);
                match &self.tls {
                    None => cmd.args(["--port", &self.port.to_string()]),
                    Some(tls) => cmd.args(tls.directives(self.port).into_iter().flat_map(
                        |(name, value)| [OsString::from(format!("--{name}")), value.into()],
                    )),
                };
                cmd.args(["--bind", "127.0.0.1", "--protected-mode", "yes"])
                    .args(["--daemonize", "no", "--save", "", "--appendonly", "no"])
                    .args(["--repl-diskless-sync-delay", "0"])
                    .arg("--dir")
                    .arg(&self.dir)
                    .args(args);
                (binary, "redis-server", cmd)
            }
            Program::Sentinel(config) => {
                let binary = binary("ZKLOCK_REDIS_SENTINEL", "redis-sentinel");
                let mut cmd = Command::new(&binary);
                cmd.arg(config);
                (binary, "redis-sentinel", cmd)
            }
        };
        cmd.args(extra)
            .current_dir(&self.dir)
            .envs(self.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        self.daemon.spawn(
            &mut cmd,
            false,
            &binary,
            &format!("install Debian's {hint} package (scripts/setup does)"),
        )
    }

    /// Waits until the process answers `PING`.
    fn wait_ready(&mut self, deadline: Instant) -> io::Result<()> {
        let port = self.port;
        let probe = self.probe_config().cloned();
        let ready = Readiness {
            port,
            log: &self.log,
            tail_lines: 20,
            ready_when: "answer PING",
            deadline,
            poll: POLL,
            kill_on_timeout: true,
        };
        self.daemon.wait_ready(ready, |process| {
            let pong = !process.is_paused()
                && command(port, probe.as_ref(), &["PING"], PROBE_TIMEOUT)
                    .is_ok_and(|r| r == RedisReply::Status("PONG".into()));
            Ok(pong.then_some(()))
        })
    }

    /// Starts it again on its port (killing it first) and waits until it answers `PING`,
    /// again while its port is still taken.
    fn restart(&mut self, extra: &[String], timeout: Duration) -> io::Result<()> {
        self.daemon.kill()?;
        restart(|| {
            self.spawn(extra)?;
            self.wait_ready(Instant::now() + timeout)
        })
    }

    fn is_live(&self) -> bool {
        self.daemon.is_running() && !self.daemon.is_paused()
    }

    /// The kit's TLS client configuration for this node, in TLS mode.
    fn probe_config(&self) -> Option<&Probe> {
        self.tls.as_ref().map(|tls| &tls.probe)
    }

    /// A command a test sends.
    fn command(&self, args: &[&str]) -> io::Result<RedisReply> {
        command(self.port, self.probe_config(), args, COMMAND_TIMEOUT)
    }

    /// Commands a test sends, on one connection.
    fn commands(&self, cmds: &[&[&str]]) -> io::Result<Vec<RedisReply>> {
        commands(self.port, self.probe_config(), cmds, COMMAND_TIMEOUT)
    }

    /// A command sent while polling: `None` when the node is killed, paused, or does not
    /// answer (or answers with an error).
    fn probe(&self, args: &[&str]) -> Option<RedisReply> {
        if !self.is_live() {
            return None;
        }
        command(self.port, self.probe_config(), args, PROBE_TIMEOUT).ok()
    }

    /// A probe's text (`INFO`, `CLUSTER INFO`, ...).
    fn probe_text(&self, args: &[&str]) -> Option<String> {
        self.probe(args)?.text()
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://ADDR/`, or `rediss://ADDR/` in TLS mode.
    fn url(&self) -> String {
        format!("{}://{}/", scheme("redis", self.tls.is_some()), self.addr())
    }
}

/// `base`, or its TLS form (`rediss`, `rediss+sentinel`, ...) when `tls`.
fn scheme(base: &str, tls: bool) -> String {
    match base.split_once('+') {
        Some((redis, rest)) if tls => format!("{redis}s+{rest}"),
        None if tls => format!("{base}s"),
        _ => base.to_string(),
    }
}

/// `127.0.0.1:PORT` of a `[ip, port, ...]` reply (`SENTINEL GET-MASTER-ADDR-BY-NAME`, `ROLE` of
/// a replica from its second element), from `at`.
fn addr_at(reply: &RedisReply, at: usize) -> Option<String> {
    let items = reply.array()?;
    let host = items.get(at)?.text()?;
    let port = match items.get(at + 1)? {
        RedisReply::Int(p) => p.to_string(),
        other => other.text()?,
    };
    Some(format!("{host}:{port}"))
}

/// Index of the node whose address is `addr`.
fn index_of(nodes: &[Node], addr: &str) -> Option<usize> {
    nodes.iter().position(|n| n.addr() == addr)
}

fn no_node(what: &str, i: usize, n: usize) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("no {what} {i} of {n}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<RedisReply> {
        read_reply(&mut BufReader::new(bytes))
    }

    #[test]
    fn replies_are_parsed() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), RedisReply::Status("OK".into()));
        assert_eq!(parse(b":-3\r\n").unwrap(), RedisReply::Int(-3));
        assert_eq!(parse(b"$-1\r\n").unwrap(), RedisReply::Nil);
        assert_eq!(
            parse(b"$4\r\na\r\nb\r\n").unwrap(),
            RedisReply::Bulk(b"a\r\nb".to_vec())
        );
        assert_eq!(
            parse(b"*2\r\n$9\r\n127.0.0.1\r\n:6379\r\n").unwrap(),
            RedisReply::Array(vec![
                RedisReply::Bulk(b"127.0.0.1".to_vec()),
                RedisReply::Int(6379)
            ])
        );
        let moved = parse(b"-MOVED 3999 127.0.0.1:7001\r\n").unwrap_err();
        assert_eq!(moved.to_string(), "MOVED 3999 127.0.0.1:7001");
        assert!(parse(b"").is_err());
        assert!(parse(b"?\r\n").is_err());
    }

    #[test]
    fn info_fields_and_pairs() {
        let info = "# Replication\r\nrole:slave\r\nmaster_link_status:up\r\n";
        assert_eq!(info_field(info, "role").as_deref(), Some("slave"));
        assert_eq!(
            info_field(info, "master_link_status").as_deref(),
            Some("up")
        );
        assert_eq!(info_field(info, "master"), None);
        let reply = RedisReply::Array(
            ["name", "zklock", "flags", "master"]
                .iter()
                .map(|s| RedisReply::Bulk(s.as_bytes().to_vec()))
                .collect(),
        );
        assert_eq!(pair(&pairs(&reply), "flags"), Some("master"));
    }
}
