//! A Redis primary with replicas, watched by Sentinels.

use std::ffi::OsString;
use std::io;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{
    addr_at, index_of, info_field, no_node, pair, pairs, scheme, Node, NodeTls, POLL, PORT_ATTEMPTS,
};
use crate::certs::{Certs, ClientAuth};
use crate::daemon::on_free_ports;
use crate::ports::PortLease;
use crate::workdir;

/// Settings of a [`RedisSentinel`].
#[derive(Clone, Debug)]
struct Options {
    master_name: String,
    replicas: usize,
    sentinels: usize,
    down_after_ms: u32,
    failover_timeout_ms: u32,
    startup_timeout: Duration,
    env: Vec<(OsString, OsString)>,
    tls: Option<(Certs, ClientAuth)>,
}

/// A Redis primary with replicas (2 by default) and Sentinels (3 by default) watching it under
/// a master name (`zklock` by default), on free loopback ports with a throwaway directory:
/// Redis's high availability without Cluster.
///
/// Data nodes are numbered from 0; node 0 is the first primary, the others replicate it. The
/// Sentinels' quorum is a majority of them. Failover is quick: a primary that does not answer
/// for [`down_after`](Self::down_after) (2 s by default) is down, and Sentinels give up on a
/// failover after [`failover_timeout`](Self::failover_timeout) (3 s by default; they try again
/// after twice that), so a killed primary is replaced within a few seconds. Nodes keep nothing
/// on disk: a killed node comes back empty and resyncs from the primary.
///
/// Dropping it kills every process and removes the files; so does the death of the test process
/// (a watchdog kills each process then).
///
/// The binaries are `$ZKLOCK_REDIS_SERVER` and `$ZKLOCK_REDIS_SENTINEL` if set, else
/// `/usr/bin/redis-server` and `/usr/bin/redis-sentinel` (Debian's `redis-server` and
/// `redis-sentinel` packages, which `scripts/setup` installs), else from `PATH`.
///
/// [`RedisSentinelBuilder::tls`] starts every node and Sentinel in TLS mode.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use zklock_testkit::RedisSentinel;
///
/// let mut redis = RedisSentinel::start()?;
/// println!("Sentinels at {:?}, master name {}", redis.sentinel_addrs(), redis.master_name());
/// let old = redis.kill_primary()?;
/// let new = redis.wait_for_new_primary(old, Duration::from_secs(20))?;
/// assert_ne!(new, old);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisSentinel {
    // Field order is drop order: processes, then ports, then files.
    nodes: Vec<Node>,
    sentinels: Vec<Node>,
    _leases: Vec<PortLease>,
    _dir: TempDir,
    opts: Options,
    /// TLS only, when set.
    tls: Option<NodeTls>,
}

/// Options for a [`RedisSentinel`]; made by [`RedisSentinel::builder`].
///
/// # Examples
///
/// ```no_run
/// let redis = zklock_testkit::RedisSentinel::builder()
///     .master_name("locks")
///     .down_after(2_000)
///     .start()?;
/// assert_eq!(redis.master_name(), "locks");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisSentinelBuilder {
    opts: Options,
}

impl RedisSentinelBuilder {
    /// The name the Sentinels monitor the primary under (default `zklock`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::builder().master_name("locks").start()?;
    /// # drop(redis);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn master_name(mut self, name: impl Into<String>) -> Self {
        self.opts.master_name = name.into();
        self
    }

    /// The number of replicas (default 2).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::builder().replicas(1).start()?;
    /// assert_eq!(redis.len(), 2);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn replicas(mut self, n: usize) -> Self {
        self.opts.replicas = n;
        self
    }

    /// The number of Sentinels (default 3); their quorum is a majority.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::builder().sentinels(5).start()?;
    /// assert_eq!(redis.sentinel_addrs().len(), 5);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn sentinels(mut self, n: usize) -> Self {
        self.opts.sentinels = n;
        self
    }

    /// Sentinel's `down-after-milliseconds` (default 2000): how long a node may not answer
    /// before a Sentinel holds it down.
    ///
    /// Keep it well above 1000. When Sentinel switches to a new primary, it counts the new
    /// primary's silence from the switch, but reconnects at most once a second, counted from
    /// its last attempt on the old (dead) primary: the first answer can come more than 1 s
    /// after the switch. At 1000 a Sentinel may then hold the new primary down at once, reach
    /// the quorum with the other Sentinels' votes of the failover that just ended, and fail
    /// over a second time (to the node just restarted, say).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::builder().down_after(5_000).start()?;
    /// # drop(redis);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn down_after(mut self, ms: u32) -> Self {
        self.opts.down_after_ms = ms;
        self
    }

    /// Sentinel's `failover-timeout` (default 3000), in milliseconds.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::builder().failover_timeout(10_000).start()?;
    /// # drop(redis);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn failover_timeout(mut self, ms: u32) -> Self {
        self.opts.failover_timeout_ms = ms;
        self
    }

    /// How long to wait for the processes to start and the Sentinels to know every node and each
    /// other (default 30 s).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let redis = zklock_testkit::RedisSentinel::builder()
    ///     .startup_timeout(Duration::from_secs(60))
    ///     .start()?;
    /// # drop(redis);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.opts.startup_timeout = timeout;
        self
    }

    /// Runs every process (nodes and Sentinels, and their restarts) on a wall clock that the
    /// test moves with `clock`. Sentinel times itself by the wall clock: a step makes it enter
    /// TILT mode for 30 s, in which it does not act.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let clock = zklock_testkit::ServerClock::new()?;
    /// let redis = zklock_testkit::RedisSentinel::builder().clock(&clock).start()?;
    /// # drop(redis);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn clock(mut self, clock: &crate::ServerClock) -> Self {
        self.opts.env = clock.env();
        self
    }

    /// Serves TLS only, on every data node and Sentinel: each listens on its TLS port alone
    /// (`port 0`, `tls-port PORT`) with [`Certs::server_cert_path`], trusts [`Certs::ca_path`]
    /// for client certificates, and asks its clients for one (`tls-auth-clients yes`,
    /// [`ClientAuth::Required`]) or not (`no`). Replication and the Sentinels' links to the
    /// nodes and to each other go over TLS too (`tls-replication yes`), each process
    /// presenting its server certificate. Addresses stay `127.0.0.1:PORT` (the TLS ports);
    /// [`RedisSentinel::url`] becomes `rediss+sentinel://...`. The kit's own commands speak
    /// TLS, presenting a certificate of the CA's.
    ///
    /// A client trusts the CA and, when required, presents [`Certs::client_cert_path`] and its
    /// key, to the Sentinels and to the data nodes alike:
    /// `redis-cli --tls --cacert CA --cert CERT --key KEY -p PORT`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{Certs, ClientAuth, RedisSentinel};
    ///
    /// let certs = Certs::mint()?;
    /// let redis = RedisSentinel::builder().tls(&certs, ClientAuth::Required).start()?;
    /// assert!(redis.is_tls());
    /// assert!(redis.url().starts_with("rediss+sentinel://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls(mut self, certs: &Certs, client_auth: ClientAuth) -> Self {
        self.opts.tls = Some((certs.clone(), client_auth));
        self
    }

    /// Starts the nodes and the Sentinels, and waits until every replica is in sync with the
    /// primary and every Sentinel knows the primary, every replica and the other Sentinels.
    ///
    /// # Errors
    ///
    /// When there are no Sentinels, a binary is missing, no free ports work, or the setup does not
    /// settle within the startup timeout (saying what is missing).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::builder().start()?;
    /// assert_eq!(redis.primary()?, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<RedisSentinel> {
        let opts = self.opts;
        if opts.sentinels == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a Sentinel setup needs at least one Sentinel",
            ));
        }
        let n = opts.replicas + 1;
        let tls = NodeTls::of(opts.tls.clone())?;
        on_free_ports(
            n + opts.sentinels,
            PORT_ATTEMPTS,
            "Redis with Sentinels",
            |leases| {
                let deadline = Instant::now() + opts.startup_timeout;
                let dir = workdir::create("redis-sentinel")?;
                let primary = leases[0].port().to_string();
                let nodes = (0..n)
                    .map(|i| {
                        Node::server(
                            dir.path().join(format!("node-{i}")),
                            leases[i].port(),
                            Vec::new(),
                            &opts.env,
                            tls.as_ref(),
                        )
                    })
                    .collect::<io::Result<Vec<_>>>()?;
                let config = format!(
                    "sentinel monitor {name} 127.0.0.1 {primary} {quorum}\n\
                     sentinel down-after-milliseconds {name} {down}\n\
                     sentinel failover-timeout {name} {failover}\n\
                     sentinel parallel-syncs {name} 1\n",
                    name = opts.master_name,
                    quorum = opts.sentinels / 2 + 1,
                    down = opts.down_after_ms,
                    failover = opts.failover_timeout_ms,
                );
                let sentinels = (0..opts.sentinels)
                    .map(|j| {
                        Node::sentinel(
                            dir.path().join(format!("sentinel-{j}")),
                            leases[n + j].port(),
                            &config,
                            &opts.env,
                            tls.as_ref(),
                        )
                    })
                    .collect::<io::Result<Vec<_>>>()?;
                let mut redis = RedisSentinel {
                    nodes,
                    sentinels,
                    _leases: leases,
                    _dir: dir,
                    opts: opts.clone(),
                    tls: tls.clone(),
                };
                let replica_of = ["--replicaof".to_string(), "127.0.0.1".into(), primary];
                for (i, node) in redis.nodes.iter_mut().enumerate() {
                    node.spawn(if i == 0 { &[] } else { &replica_of })?;
                }
                for node in &mut redis.nodes {
                    node.wait_ready(deadline)?;
                }
                // Sentinels learn the replicas from the primary's INFO, which they ask for at
                // once and then every 10 s: the replicas must be attached before.
                redis.wait_for(deadline, "replicas in sync", |r| r.replicas_in_sync(0))?;
                for sentinel in &mut redis.sentinels {
                    sentinel.spawn(&[])?;
                }
                for sentinel in &mut redis.sentinels {
                    sentinel.wait_ready(deadline)?;
                }
                redis.wait_settled(deadline.saturating_duration_since(Instant::now()))?;
                Ok(redis)
            },
        )
    }
}

impl RedisSentinel {
    /// Starts a primary with 2 replicas and 3 Sentinels with default options, and waits until
    /// the setup settles.
    ///
    /// # Errors
    ///
    /// See [`RedisSentinelBuilder::start`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert_eq!(redis.len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start() -> io::Result<RedisSentinel> {
        RedisSentinel::builder().start()
    }

    /// Options for a Sentinel setup.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::builder().replicas(1).start()?;
    /// # drop(redis);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder() -> RedisSentinelBuilder {
        RedisSentinelBuilder {
            opts: Options {
                master_name: "zklock".into(),
                replicas: 2,
                sentinels: 3,
                down_after_ms: 2000,
                failover_timeout_ms: 3000,
                startup_timeout: Duration::from_secs(30),
                env: Vec::new(),
                tls: None,
            },
        }
    }

    /// The name the Sentinels monitor the primary under.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert_eq!(redis.master_name(), "zklock");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn master_name(&self) -> &str {
        &self.opts.master_name
    }

    /// Sentinel's `down-after-milliseconds`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert_eq!(redis.down_after().as_millis(), 2000);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn down_after(&self) -> Duration {
        Duration::from_millis(self.opts.down_after_ms.into())
    }

    /// Sentinel's `failover-timeout`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert_eq!(redis.failover_timeout().as_millis(), 3000);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn failover_timeout(&self) -> Duration {
        Duration::from_millis(self.opts.failover_timeout_ms.into())
    }

    /// The number of data nodes (the primary and its replicas), running or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert_eq!(redis.len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always `false`: there is at least the primary.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert!(!redis.is_empty());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every Sentinel's address, `127.0.0.1:PORT`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert_eq!(redis.sentinel_addrs().len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels.iter().map(Node::addr).collect()
    }

    /// Every Sentinel as a URL, `redis://127.0.0.1:PORT/` (the form Redis clients take for the
    /// Sentinels to ask); `rediss://127.0.0.1:PORT/` in TLS mode.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert!(redis.sentinel_urls()[0].starts_with("redis://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Node::url).collect()
    }

    /// zklock's URL of the setup: `redis+sentinel://<every Sentinel>/<master name>`, or
    /// `rediss+sentinel://...` in TLS mode ([`RedisSentinelBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// let url = redis.url(); // redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/zklock
    /// assert!(url.ends_with("/zklock"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self) -> String {
        format!(
            "{}://{}/{}",
            scheme("redis+sentinel", self.is_tls()),
            self.sentinel_addrs().join(","),
            self.opts.master_name
        )
    }

    /// Whether every node and Sentinel serves TLS only ([`RedisSentinelBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert!(!redis.is_tls());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Data node `i`'s address, `127.0.0.1:PORT`.
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert!(redis.node_addr(0).starts_with("127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn node_addr(&self, i: usize) -> String {
        self.nodes[i].addr()
    }

    /// Every data node's address, in node order.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert_eq!(redis.node_addrs().len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn node_addrs(&self) -> Vec<String> {
        self.nodes.iter().map(Node::addr).collect()
    }

    /// Data node `i`'s process id, while it runs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert!(redis.pid(0).is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes.get(i).and_then(|n| n.daemon.pid())
    }

    /// Data node `i`'s log file.
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// let log = std::fs::read_to_string(redis.log_path(0))?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn log_path(&self, i: usize) -> &std::path::Path {
        self.nodes[i].log.path()
    }

    /// Sentinel `j`'s log file (`+sdown`, `+odown`, `+switch-master`, ... events).
    ///
    /// # Panics
    ///
    /// When `j` is not a Sentinel's number.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// let log = std::fs::read_to_string(redis.sentinel_log_path(0))?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn sentinel_log_path(&self, j: usize) -> &std::path::Path {
        self.sentinels[j].log.path()
    }

    /// The node that is the primary, as the first Sentinel that runs and answers reports it.
    ///
    /// # Errors
    ///
    /// When no Sentinel answers, or the address one reports is none of the nodes'.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert_eq!(redis.primary()?, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn primary(&self) -> io::Result<usize> {
        let addr = self.primary_addr()?;
        index_of(&self.nodes, &addr).ok_or_else(|| {
            io::Error::other(format!(
                "the Sentinels report a primary {addr} that is no node"
            ))
        })
    }

    /// The primary's address, `127.0.0.1:PORT`, as the first Sentinel that runs and answers
    /// reports it (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    ///
    /// # Errors
    ///
    /// When no Sentinel answers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert_eq!(redis.primary_addr()?, redis.node_addr(0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn primary_addr(&self) -> io::Result<String> {
        self.reported_primaries()
            .into_iter()
            .flatten()
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no Sentinel answers"))
    }

    /// What each Sentinel reports as the primary's address (`None`: killed, paused or silent).
    fn reported_primaries(&self) -> Vec<Option<String>> {
        let ask = [
            "SENTINEL",
            "GET-MASTER-ADDR-BY-NAME",
            self.opts.master_name.as_str(),
        ];
        self.sentinels
            .iter()
            .map(|s| addr_at(&s.probe(&ask)?, 0))
            .collect()
    }

    /// Kills the primary (SIGKILL) and returns its number; the Sentinels elect a new one after
    /// [`down_after`](Self::down_after) and an agreement (see
    /// [`wait_for_new_primary`](Self::wait_for_new_primary)).
    ///
    /// # Errors
    ///
    /// As [`primary`](Self::primary), or when the process cannot be killed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let mut redis = zklock_testkit::RedisSentinel::start()?;
    /// let old = redis.kill_primary()?;
    /// let new = redis.wait_for_new_primary(old, Duration::from_secs(20))?;
    /// # let _ = new;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kill_primary(&mut self) -> io::Result<usize> {
        let primary = self.primary()?;
        self.kill(primary)?;
        Ok(primary)
    }

    /// Waits until every Sentinel that runs reports the same primary, other than node `old`,
    /// and that node says it is a primary (`ROLE`); returns it.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::TimedOut`] when that does not happen within `timeout`, with what each
    /// Sentinel reports.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// redis.pause(0)?; // the primary, frozen
    /// let new = redis.wait_for_new_primary(0, Duration::from_secs(20))?;
    /// assert_ne!(new, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait_for_new_primary(&self, old: usize, timeout: Duration) -> io::Result<usize> {
        let deadline = Instant::now() + timeout;
        let old_addr = self.nodes.get(old).map(Node::addr);
        loop {
            let reported = self.reported_primaries();
            // Every live Sentinel answers, with the same address, not the old one's.
            let answers: Vec<Option<&String>> = self
                .sentinels
                .iter()
                .zip(&reported)
                .filter(|(s, _)| s.is_live())
                .map(|(_, r)| r.as_ref())
                .collect();
            let agreed = match answers.first() {
                Some(&Some(first))
                    if answers.iter().all(|a| *a == Some(first))
                        && Some(first) != old_addr.as_ref() =>
                {
                    Some(first)
                }
                _ => None,
            };
            if let Some(i) = agreed.and_then(|a| index_of(&self.nodes, a)) {
                if self.role(i).as_deref() == Some("master") {
                    return Ok(i);
                }
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the Sentinels did not agree on a primary other than node {old} within \
                         {timeout:?}; they report {reported:?}"
                    ),
                ));
            }
            thread::sleep(POLL);
        }
    }

    /// Asks a Sentinel for a failover (`SENTINEL FAILOVER`, which needs no agreement) and waits
    /// until every Sentinel reports the new primary; returns it.
    ///
    /// # Errors
    ///
    /// When no Sentinel answers, the Sentinel refuses (`NOGOODSLAVE`, `INPROGRESS`), or the
    /// new primary is not reported everywhere within 10 failover timeouts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// let new = redis.failover()?;
    /// assert_ne!(new, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn failover(&self) -> io::Result<usize> {
        let old = self.primary()?;
        let sentinel = self
            .sentinels
            .iter()
            .find(|s| s.is_live())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no Sentinel runs"))?;
        sentinel.command(&["SENTINEL", "FAILOVER", &self.opts.master_name])?;
        self.wait_for_new_primary(old, 10 * self.failover_timeout())
    }

    /// Waits until the setup is at rest: every Sentinel that runs reports the same primary,
    /// which says it is one, holds it up, and knows the other Sentinels and every node that
    /// runs as a replica in service; and every such node replicates the primary with its link
    /// up (as its own `INFO` says).
    ///
    /// A former primary that kept running through a failover (paused and resumed, or failed
    /// over on request) still takes writes as a primary until a Sentinel turns it into a
    /// replica: Sentinel waits until it has reported itself a primary for 8 s, and asks it
    /// every 10 s, so this takes 8 to 20 s. A restarted one ([`restart`](Self::restart)) is a
    /// replica at once.
    ///
    /// Returns the primary.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::TimedOut`] when that does not happen within `timeout`, saying what is
    /// missing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let mut redis = zklock_testkit::RedisSentinel::start()?;
    /// let old = redis.kill_primary()?;
    /// redis.wait_for_new_primary(old, Duration::from_secs(20))?;
    /// redis.restart(old)?; // a replica of the new primary
    /// let primary = redis.wait_settled(Duration::from_secs(20))?;
    /// assert_ne!(primary, old);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait_settled(&self, timeout: Duration) -> io::Result<usize> {
        let deadline = Instant::now() + timeout;
        self.wait_for(deadline, "settled", RedisSentinel::settled)
    }

    /// Polls `check` until it is `Ok`, or fails at the deadline with its last complaint.
    fn wait_for<T>(
        &self,
        deadline: Instant,
        what: &str,
        check: impl Fn(&RedisSentinel) -> Result<T, String>,
    ) -> io::Result<T> {
        let since = Instant::now();
        loop {
            let complaint = match check(self) {
                Ok(answer) => return Ok(answer),
                Err(complaint) => complaint,
            };
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "Redis with Sentinels not {what} after {:.1?}: {complaint}",
                        since.elapsed()
                    ),
                ));
            }
            thread::sleep(POLL);
        }
    }

    /// The primary when at rest (see [`wait_settled`](Self::wait_settled)), else what is not.
    fn settled(&self) -> Result<usize, String> {
        let reported = self.reported_primaries();
        let mut addrs = self
            .sentinels
            .iter()
            .zip(&reported)
            .filter(|(s, _)| s.is_live());
        let Some((_, Some(addr))) = addrs.next() else {
            return Err("the first live Sentinel reports no primary".into());
        };
        if let Some((_, other)) = addrs.find(|(_, a)| a.as_ref() != Some(addr)) {
            return Err(format!("Sentinels disagree: {addr} and {other:?}"));
        }
        let primary = index_of(&self.nodes, addr).ok_or(format!("{addr} is no node"))?;
        if self.role(primary).as_deref() != Some("master") {
            return Err(format!("the reported primary {primary} is not one (yet)"));
        }
        self.replicas_in_sync(primary)?;
        let name = self.opts.master_name.as_str();
        for (j, s) in self.sentinels.iter().enumerate() {
            if !s.is_live() {
                continue;
            }
            let master = s
                .probe(&["SENTINEL", "MASTER", name])
                .map(|r| pairs(&r))
                .ok_or(format!("Sentinel {j} does not answer"))?;
            let others = (self.sentinels.len() - 1).to_string();
            if pair(&master, "flags") != Some("master")
                || pair(&master, "num-other-sentinels") != Some(others.as_str())
            {
                return Err(format!(
                    "Sentinel {j} sees the primary as {:?} with {:?} other Sentinels",
                    pair(&master, "flags"),
                    pair(&master, "num-other-sentinels")
                ));
            }
            let known = s
                .probe(&["SENTINEL", "REPLICAS", name])
                .ok_or(format!("Sentinel {j} does not answer"))?;
            let known: Vec<Vec<(String, String)>> =
                known.array().unwrap_or(&[]).iter().map(pairs).collect();
            for (i, node) in self.nodes.iter().enumerate() {
                if i == primary || !node.daemon.is_running() {
                    continue;
                }
                // Its flags, not its cached role and link, which Sentinel refreshes only with
                // its INFO of the replica, every 10 s: the node's own INFO tells those.
                let flags = known
                    .iter()
                    .find(|r| pair(r, "name") == Some(node.addr().as_str()))
                    .and_then(|r| pair(r, "flags"));
                if flags != Some("slave") {
                    return Err(format!(
                        "Sentinel {j} does not know node {i} as a replica in service yet (flags \
                         {flags:?})"
                    ));
                }
            }
        }
        Ok(primary)
    }

    /// `Ok` when every running node but `primary` replicates it with its link up.
    fn replicas_in_sync(&self, primary: usize) -> Result<(), String> {
        let port = self.nodes[primary].port.to_string();
        for (i, node) in self.nodes.iter().enumerate() {
            if i == primary || !node.daemon.is_running() {
                continue;
            }
            let info = node
                .probe_text(&["INFO", "replication"])
                .ok_or(format!("node {i} does not answer"))?;
            let field = |k| info_field(&info, k);
            if field("role").as_deref() != Some("slave")
                || field("master_port").as_deref() != Some(port.as_str())
                || field("master_link_status").as_deref() != Some("up")
            {
                return Err(format!(
                    "node {i} is not an attached replica of node {primary} (role {:?}, master \
                     port {:?}, link {:?})",
                    field("role"),
                    field("master_port"),
                    field("master_link_status")
                ));
            }
        }
        Ok(())
    }

    /// What node `i` says it is (`ROLE`): `master` or `slave`; `None` when it is killed,
    /// paused, silent or out of range.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert_eq!(redis.role(0).as_deref(), Some("master"));
    /// assert_eq!(redis.role(1).as_deref(), Some("slave"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn role(&self, i: usize) -> Option<String> {
        self.nodes
            .get(i)?
            .probe(&["ROLE"])?
            .array()?
            .first()?
            .text()
    }

    /// Sends a command to data node `i` on a connection of its own and returns its reply.
    ///
    /// # Errors
    ///
    /// When `i` is out of range, the node does not answer within 10 s, or it answers with an
    /// error (the error's message is the server's).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// let p = redis.primary()?;
    /// redis.command(p, &["SET", "k", "v"])?;
    /// assert_eq!(redis.command(p, &["GET", "k"])?.text().as_deref(), Some("v"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn command(&self, i: usize, args: &[&str]) -> io::Result<super::RedisReply> {
        self.node(i)?.command(args)
    }

    /// Sends commands to data node `i` one after the other on one connection and returns their
    /// replies — for `WAIT`, which waits for the replicas to have the writes of its own
    /// connection (on a fresh one it returns at once).
    ///
    /// # Errors
    ///
    /// As [`command`](Self::command), at the first command that fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// let p = redis.primary()?;
    /// let replies = redis.commands(p, &[&["SET", "k", "v"], &["WAIT", "2", "5000"]])?;
    /// assert_eq!(replies[1].int(), Some(2)); // both replicas have it
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn commands(&self, i: usize, cmds: &[&[&str]]) -> io::Result<Vec<super::RedisReply>> {
        self.node(i)?.commands(cmds)
    }

    /// Sends a command to Sentinel `j` (`SENTINEL MASTERS`, ...) and returns its reply.
    ///
    /// # Errors
    ///
    /// When `j` is out of range, the Sentinel does not answer within 10 s, or it answers with
    /// an error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// let masters = redis.sentinel_command(0, &["SENTINEL", "MASTERS"])?;
    /// assert_eq!(masters.array().map(<[_]>::len), Some(1));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn sentinel_command(&self, j: usize, args: &[&str]) -> io::Result<super::RedisReply> {
        self.sentinel(j)?.command(args)
    }

    /// Kills data node `i` (SIGKILL); it loses its data. Does nothing if it is killed already.
    ///
    /// # Errors
    ///
    /// When `i` is out of range or the process cannot be killed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut redis = zklock_testkit::RedisSentinel::start()?;
    /// redis.kill(2)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kill(&mut self, i: usize) -> io::Result<()> {
        self.node_mut(i)?.daemon.kill()
    }

    /// Starts data node `i` again on its port, empty (killing it first if it runs), as a
    /// replica of the primary the Sentinels report — or as a primary when they report node `i`
    /// itself (say, killed and restarted before a failover: it comes back empty, and its
    /// replicas copy the emptiness, as with a real Redis) or no Sentinel answers — and waits
    /// until it answers `PING`.
    ///
    /// # Errors
    ///
    /// When `i` is out of range, or the node does not answer within the startup timeout (with
    /// its log's tail).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut redis = zklock_testkit::RedisSentinel::start()?;
    /// redis.kill(2)?;
    /// redis.restart(2)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&mut self, i: usize) -> io::Result<()> {
        self.node(i)?;
        let primary = self.primary().ok().filter(|&p| p != i);
        let extra: Vec<String> = match primary {
            Some(p) => vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                self.nodes[p].port.to_string(),
            ],
            None => Vec::new(),
        };
        let timeout = self.opts.startup_timeout;
        self.nodes[i].restart(&extra, timeout)
    }

    /// Freezes data node `i` with SIGSTOP: its connections stay open but nothing answers. A
    /// paused primary is failed over after [`down_after`](Self::down_after).
    ///
    /// # Errors
    ///
    /// When `i` is out of range, the node is killed, or `kill -STOP` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// redis.pause(1)?;
    /// redis.resume(1)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause(&self, i: usize) -> io::Result<()> {
        let node = self.node(i)?;
        node.daemon.pause(node.port)
    }

    /// Lets a paused data node run again (SIGCONT). A former primary that was failed over in
    /// the meantime is turned into a replica by the Sentinels.
    ///
    /// # Errors
    ///
    /// When `i` is out of range, the node is killed, or `kill -CONT` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// redis.pause(1)?;
    /// redis.resume(1)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume(&self, i: usize) -> io::Result<()> {
        let node = self.node(i)?;
        node.daemon.resume(node.port)
    }

    /// Whether data node `i` is paused (`false` when out of range).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisSentinel::start()?;
    /// assert!(!redis.is_paused(0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_paused(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| n.daemon.is_paused())
    }

    /// Kills Sentinel `j` (SIGKILL). Does nothing if it is killed already.
    ///
    /// # Errors
    ///
    /// When `j` is out of range or the process cannot be killed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut redis = zklock_testkit::RedisSentinel::start()?;
    /// redis.kill_sentinel(0)?;
    /// assert!(redis.primary().is_ok()); // the others answer
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kill_sentinel(&mut self, j: usize) -> io::Result<()> {
        self.sentinel_mut(j)?.daemon.kill()
    }

    /// Starts Sentinel `j` again on its port with what it had learnt (its configuration file,
    /// which Sentinel rewrites), and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// When `j` is out of range, or the Sentinel does not answer within the startup timeout.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut redis = zklock_testkit::RedisSentinel::start()?;
    /// redis.kill_sentinel(0)?;
    /// redis.restart_sentinel(0)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart_sentinel(&mut self, j: usize) -> io::Result<()> {
        let timeout = self.opts.startup_timeout;
        self.sentinel_mut(j)?.restart(&[], timeout)
    }

    fn node(&self, i: usize) -> io::Result<&Node> {
        let n = self.nodes.len();
        self.nodes.get(i).ok_or_else(|| no_node("node", i, n))
    }

    fn node_mut(&mut self, i: usize) -> io::Result<&mut Node> {
        let n = self.nodes.len();
        self.nodes.get_mut(i).ok_or_else(|| no_node("node", i, n))
    }

    fn sentinel(&self, j: usize) -> io::Result<&Node> {
        let n = self.sentinels.len();
        self.sentinels
            .get(j)
            .ok_or_else(|| no_node("Sentinel", j, n))
    }

    fn sentinel_mut(&mut self, j: usize) -> io::Result<&mut Node> {
        let n = self.sentinels.len();
        self.sentinels
            .get_mut(j)
            .ok_or_else(|| no_node("Sentinel", j, n))
    }
}
