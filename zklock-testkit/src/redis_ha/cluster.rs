//! A Redis Cluster on loopback.

use std::ffi::OsString;
use std::io;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{info_field, no_node, scheme, Node, NodeTls, RedisReply, POLL, PORT_ATTEMPTS};
use crate::certs::{Certs, ClientAuth};
use crate::daemon::{binary, on_free_ports};
use crate::install::tail;
use crate::ports::PortLease;
use crate::workdir;

/// The number of hash slots of a Redis Cluster.
const SLOTS: u32 = 16384;

/// Settings of a [`RedisCluster`].
#[derive(Clone, Debug)]
struct Options {
    primaries: usize,
    replicas: usize,
    node_timeout_ms: u32,
    startup_timeout: Duration,
    env: Vec<(OsString, OsString)>,
    tls: Option<(Certs, ClientAuth)>,
}

/// One node as a node of the cluster sees it, from a line of `CLUSTER NODES`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    id: String,
    port: u16,
    flags: Vec<String>,
    /// The primary's id, for a replica.
    primary: Option<String>,
    /// The slot ranges it serves, inclusive.
    slots: Vec<(u32, u32)>,
}

impl Seen {
    fn parse(line: &str) -> Option<Seen> {
        let mut fields = line.split_whitespace();
        let id = fields.next()?.to_string();
        // ip:port@cport[,hostname]
        let port = fields
            .next()?
            .split(['@', ','])
            .next()?
            .rsplit(':')
            .next()?;
        let flags = fields.next()?.split(',').map(str::to_string).collect();
        let primary = Some(fields.next()?)
            .filter(|p| *p != "-")
            .map(str::to_string);
        // ping-sent, pong-recv, config-epoch, link-state; then slots.
        let slots = fields
            .skip(4)
            .filter(|s| !s.starts_with('[')) // a slot being migrated or imported
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|a| (a, a)),
            })
            .collect();
        Some(Seen {
            id,
            port: port.parse().ok()?,
            flags,
            primary,
            slots,
        })
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// A primary in service: not held failed, and serving slots.
    fn serves(&self) -> bool {
        self.has("master") && !self.has("fail") && !self.slots.is_empty()
    }
}

/// What a node of the cluster is, as another node sees it (the part that every node's view of
/// a cluster at rest agrees on).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Topology {
    id: String,
    primary: bool,
    /// The primary's id, for a replica.
    follows: Option<String>,
    slots: Vec<(u32, u32)>,
    failed: bool,
}

impl Topology {
    fn of(seen: &Seen) -> Topology {
        Topology {
            id: seen.id.clone(),
            primary: seen.has("master"),
            follows: seen.primary.clone(),
            slots: seen.slots.clone(),
            failed: seen.has("fail"),
        }
    }
}

/// A Redis Cluster (3 primaries with a replica each by default) on free loopback ports with a
/// throwaway directory, made with `redis-cli --cluster create`.
///
/// Nodes are numbered from 0 in the order of their ports as given to `redis-cli`, which picks
/// the primaries and their replicas: ask [`primaries`](Self::primaries),
/// [`replicas`](Self::replicas) and [`primary_of`](Self::primary_of) rather than assume. Each
/// node has a client port and a cluster bus port (`cluster-port`), both claimed for the
/// cluster's life. `cluster-node-timeout` is 1 s by default: a killed primary is replaced by its
/// replica within a few seconds. Nodes keep nothing on disk but their cluster configuration
/// (`nodes.conf`): a killed node comes back empty, knowing the cluster.
///
/// Dropping it kills every node and removes the files; so does the death of the test process.
///
/// The binaries are `$ZKLOCK_REDIS_SERVER` and `$ZKLOCK_REDIS_CLI` if set, else
/// `/usr/bin/redis-server` and `/usr/bin/redis-cli` (Debian's `redis-server` and `redis-tools`),
/// else from `PATH`.
///
/// [`RedisClusterBuilder::tls`] starts every node in TLS mode, the cluster bus included.
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::RedisCluster;
///
/// let cluster = RedisCluster::start()?;
/// let owner = cluster.node_for_key("lock:orders")?;
/// cluster.command(owner, &["SET", "lock:orders", "me"])?;
/// let replica = cluster.replicas()?[0];
/// cluster.failover(replica)?;
/// assert!(cluster.primaries()?.contains(&replica));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    // Field order is drop order: processes, then ports, then files.
    nodes: Vec<Node>,
    /// Each node's cluster id (`CLUSTER MYID`), kept across restarts in `nodes.conf`.
    ids: Vec<String>,
    _leases: Vec<PortLease>,
    _dir: TempDir,
    opts: Options,
    /// TLS only, when set.
    tls: Option<NodeTls>,
}

/// Options for a [`RedisCluster`]; made by [`RedisCluster::builder`].
///
/// # Examples
///
/// ```no_run
/// let cluster = zklock_testkit::RedisCluster::builder()
///     .replicas(2)
///     .node_timeout(2_000)
///     .start()?;
/// assert_eq!(cluster.len(), 9);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct RedisClusterBuilder {
    opts: Options,
}

impl RedisClusterBuilder {
    /// The number of primaries (default 3, the fewest `redis-cli` makes a cluster of).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::builder().primaries(4).start()?;
    /// assert_eq!(cluster.len(), 8);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn primaries(mut self, n: usize) -> Self {
        self.opts.primaries = n;
        self
    }

    /// The number of replicas of each primary (default 1).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::builder().replicas(0).start()?;
    /// assert_eq!(cluster.len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn replicas(mut self, n: usize) -> Self {
        self.opts.replicas = n;
        self
    }

    /// `cluster-node-timeout` in milliseconds (default 1000): how long a node may not answer
    /// before the others hold it failed, and its replica takes over if it was a primary.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::builder().node_timeout(5_000).start()?;
    /// # drop(cluster);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn node_timeout(mut self, ms: u32) -> Self {
        self.opts.node_timeout_ms = ms;
        self
    }

    /// How long to wait for the nodes to start and the cluster to form (default 30 s).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let cluster = zklock_testkit::RedisCluster::builder()
    ///     .startup_timeout(Duration::from_secs(60))
    ///     .start()?;
    /// # drop(cluster);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.opts.startup_timeout = timeout;
        self
    }

    /// Runs every node (and its restarts) on a wall clock that the test moves with `clock`:
    /// `TIME`, and the expiry of every key, follow it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let clock = zklock_testkit::ServerClock::new()?;
    /// let cluster = zklock_testkit::RedisCluster::builder().clock(&clock).start()?;
    /// # drop(cluster);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn clock(mut self, clock: &crate::ServerClock) -> Self {
        self.opts.env = clock.env();
        self
    }

    /// Serves TLS only, on every node: each listens on its TLS port alone (`port 0`, `tls-port
    /// PORT`) with [`Certs::server_cert_path`], trusts [`Certs::ca_path`] for client
    /// certificates, and asks its clients for one (`tls-auth-clients yes`,
    /// [`ClientAuth::Required`]) or not (`no`). Replication (`tls-replication yes`) and the
    /// cluster bus (`tls-cluster yes`) go over TLS too, each node presenting its server
    /// certificate, so the nodes announce their TLS ports: `CLUSTER SLOTS` and `-MOVED` name
    /// `127.0.0.1:PORT` as [`RedisCluster::addrs`] does. [`RedisCluster::url`] becomes
    /// `rediss+cluster://...`. The kit's own commands, and its `redis-cli --cluster create`,
    /// speak TLS, presenting a certificate of the CA's.
    ///
    /// A client trusts the CA and, when required, presents [`Certs::client_cert_path`] and its
    /// key: `redis-cli -c --tls --cacert CA --cert CERT --key KEY -p PORT`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{Certs, ClientAuth, RedisCluster};
    ///
    /// let certs = Certs::mint()?;
    /// let cluster = RedisCluster::builder().tls(&certs, ClientAuth::Required).start()?;
    /// assert!(cluster.is_tls());
    /// assert!(cluster.url().starts_with("rediss+cluster://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tls(mut self, certs: &Certs, client_auth: ClientAuth) -> Self {
        self.opts.tls = Some((certs.clone(), client_auth));
        self
    }

    /// Starts the nodes, makes the cluster with `redis-cli --cluster create`, and waits until
    /// every node reports `cluster_state:ok` with all 16384 slots served, the nodes agree on
    /// who serves what, and every replica is in sync.
    ///
    /// # Errors
    ///
    /// When there are fewer than 3 primaries, a binary is missing, no free ports work,
    /// `redis-cli` fails (with its output), or the cluster does not form within the startup
    /// timeout.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::builder().start()?;
    /// assert_eq!(cluster.primaries()?.len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<RedisCluster> {
        let opts = self.opts;
        if opts.primaries < 3 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "redis-cli makes a cluster of 3 primaries or more",
            ));
        }
        let n = opts.primaries * (opts.replicas + 1);
        let tls = NodeTls::of(opts.tls.clone())?;
        on_free_ports(2 * n, PORT_ATTEMPTS, "a Redis Cluster", |leases| {
            let deadline = Instant::now() + opts.startup_timeout;
            let dir = workdir::create("redis-cluster")?;
            let nodes = (0..n)
                .map(|i| {
                    let node_dir = dir.path().join(format!("node-{i}"));
                    let mut args: Vec<String> = vec![
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-config-file".into(),
                        node_dir.join("nodes.conf").display().to_string(),
                        "--cluster-node-timeout".into(),
                        opts.node_timeout_ms.to_string(),
                        // The bus port is claimed like the client port (its default, port +
                        // 10000, may be anyone's).
                        "--cluster-port".into(),
                        leases[n + i].port().to_string(),
                    ];
                    if tls.is_some() {
                        args.extend(["--tls-cluster".into(), "yes".into()]);
                    }
                    Node::server(node_dir, leases[i].port(), args, &opts.env, tls.as_ref())
                })
                .collect::<io::Result<Vec<_>>>()?;
            let mut cluster = RedisCluster {
                nodes,
                ids: Vec::new(),
                _leases: leases,
                _dir: dir,
                opts: opts.clone(),
                tls: tls.clone(),
            };
            for node in &mut cluster.nodes {
                node.spawn(&[])?;
            }
            for node in &mut cluster.nodes {
                node.wait_ready(deadline)?;
            }
            cluster.ids = cluster
                .nodes
                .iter()
                .map(|node| {
                    node.command(&["CLUSTER", "MYID"])?
                        .text()
                        .ok_or_else(|| io::Error::other("CLUSTER MYID: not a text"))
                })
                .collect::<io::Result<_>>()?;
            cluster.create()?;
            cluster.wait_until_ok(deadline.saturating_duration_since(Instant::now()))?;
            Ok(cluster)
        })
    }
}

impl RedisCluster {
    /// Starts a cluster of 3 primaries with a replica each, with default options, and waits
    /// until it serves every slot.
    ///
    /// # Errors
    ///
    /// See [`RedisClusterBuilder::start`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert_eq!(cluster.len(), 6);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start() -> io::Result<RedisCluster> {
        RedisCluster::builder().start()
    }

    /// Options for a cluster.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::builder().node_timeout(2_000).start()?;
    /// # drop(cluster);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder() -> RedisClusterBuilder {
        RedisClusterBuilder {
            opts: Options {
                primaries: 3,
                replicas: 1,
                node_timeout_ms: 1000,
                startup_timeout: Duration::from_secs(30),
                env: Vec::new(),
                tls: None,
            },
        }
    }

    /// `redis-cli --cluster create` on every node.
    fn create(&self) -> io::Result<()> {
        let cli = binary("ZKLOCK_REDIS_CLI", "redis-cli");
        let tls = self.tls.as_ref().map(NodeTls::cli_args);
        let out = Command::new(&cli)
            .args(tls.into_iter().flatten())
            .arg("--cluster")
            .arg("create")
            .args(self.addrs())
            .args(["--cluster-replicas", &self.opts.replicas.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot run {} ({e}); install Debian's redis-tools package (it comes \
                         with redis-server)",
                        cli.display()
                    ),
                )
            })?;
        let text = String::from_utf8_lossy(&out.stdout);
        if out.status.success() && text.contains("[OK] All 16384 slots covered") {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "redis-cli --cluster create failed ({}):\n{}\n{}",
                out.status,
                tail(&text, 20),
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// The number of nodes, running or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert_eq!(cluster.len(), 6);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always `false`: a cluster has nodes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert!(!cluster.is_empty());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every node's address, `127.0.0.1:PORT`, in node order (a cluster client's seeds).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert_eq!(cluster.addrs().len(), 6);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(Node::addr).collect()
    }

    /// Node `i`'s address, `127.0.0.1:PORT`.
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert!(cluster.addr(0).starts_with("127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn addr(&self, i: usize) -> String {
        self.nodes[i].addr()
    }

    /// Every node as a URL, `redis://127.0.0.1:PORT/` (the form cluster clients take);
    /// `rediss://127.0.0.1:PORT/` in TLS mode.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert!(cluster.urls()[0].starts_with("redis://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// zklock's URL of the cluster, every node a seed: `redis+cluster://<every node>`, or
    /// `rediss+cluster://...` in TLS mode ([`RedisClusterBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// let url = cluster.url(); // redis+cluster://127.0.0.1:P1,...,127.0.0.1:P6
    /// assert!(url.starts_with("redis+cluster://127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self) -> String {
        format!(
            "{}://{}",
            scheme("redis+cluster", self.is_tls()),
            self.addrs().join(",")
        )
    }

    /// Whether every node serves TLS only ([`RedisClusterBuilder::tls`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert!(!cluster.is_tls());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Node `i`'s cluster id (`CLUSTER MYID`), which it keeps across restarts.
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert_eq!(cluster.id(0).len(), 40);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    /// Node `i`'s process id, while it runs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert!(cluster.pid(0).is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes.get(i).and_then(|n| n.daemon.pid())
    }

    /// Node `i`'s log file.
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// let log = std::fs::read_to_string(cluster.log_path(0))?;
    /// # let _ = log;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn log_path(&self, i: usize) -> &std::path::Path {
        self.nodes[i].log.path()
    }

    /// `cluster-node-timeout`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert_eq!(cluster.node_timeout().as_millis(), 1000);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn node_timeout(&self) -> Duration {
        Duration::from_millis(self.opts.node_timeout_ms.into())
    }

    /// The cluster as the first node that runs and answers sees it (`CLUSTER NODES`).
    fn view(&self) -> io::Result<Vec<Seen>> {
        self.nodes
            .iter()
            .find_map(|n| self.view_of(n))
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no node answers"))
    }

    fn view_of(&self, node: &Node) -> Option<Vec<Seen>> {
        let text = node.probe_text(&["CLUSTER", "NODES"])?;
        Some(text.lines().filter_map(Seen::parse).collect())
    }

    fn index_of_id(&self, id: &str) -> Option<usize> {
        self.ids.iter().position(|i| i == id)
    }

    /// The primaries serving slots, as the first node that answers sees them (a primary that
    /// the cluster holds failed is not one), in node order.
    ///
    /// # Errors
    ///
    /// When no node answers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert_eq!(cluster.primaries()?.len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn primaries(&self) -> io::Result<Vec<usize>> {
        let view = self.view()?;
        Ok(self.indices(view.iter().filter(|s| s.serves())))
    }

    /// The replicas, as the first node that answers sees them (not those it holds failed), in
    /// node order.
    ///
    /// # Errors
    ///
    /// When no node answers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert_eq!(cluster.replicas()?.len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn replicas(&self) -> io::Result<Vec<usize>> {
        let view = self.view()?;
        Ok(self.indices(view.iter().filter(|s| s.has("slave") && !s.has("fail"))))
    }

    fn indices<'a>(&self, seen: impl Iterator<Item = &'a Seen>) -> Vec<usize> {
        let mut indices: Vec<usize> = seen.filter_map(|s| self.index_of_id(&s.id)).collect();
        indices.sort_unstable();
        indices
    }

    /// The primary that node `i` replicates, as the first node that answers sees it; `None`
    /// when `i` is a primary.
    ///
    /// # Errors
    ///
    /// When `i` is out of range or no node answers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// let replica = cluster.replicas()?[0];
    /// assert!(cluster.primary_of(replica)?.is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn primary_of(&self, i: usize) -> io::Result<Option<usize>> {
        self.node(i)?;
        let view = self.view()?;
        Ok(view
            .iter()
            .find(|s| s.id == self.ids[i])
            .and_then(|s| s.primary.as_deref())
            .and_then(|p| self.index_of_id(p)))
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`, hash tags `{...}` included).
    ///
    /// # Errors
    ///
    /// When no node answers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert_eq!(cluster.slot("{a}x")?, cluster.slot("{a}y")?);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn slot(&self, key: &str) -> io::Result<u16> {
        let reply = self
            .nodes
            .iter()
            .find_map(|n| n.probe(&["CLUSTER", "KEYSLOT", key]))
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no node answers"))?;
        reply
            .int()
            .and_then(|s| u16::try_from(s).ok())
            .ok_or_else(|| io::Error::other(format!("CLUSTER KEYSLOT: {reply:?}")))
    }

    /// The primary serving `key`'s slot, as the first node that answers sees it.
    ///
    /// # Errors
    ///
    /// When no node answers, or no primary in service serves the slot (its primary failed
    /// and no replica took over yet).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// let owner = cluster.node_for_key("k")?;
    /// cluster.command(owner, &["SET", "k", "v"])?; // no MOVED
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn node_for_key(&self, key: &str) -> io::Result<usize> {
        let slot = u32::from(self.slot(key)?);
        let view = self.view()?;
        view.iter()
            .filter(|s| s.serves())
            .find(|s| s.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .and_then(|s| self.index_of_id(&s.id))
            .ok_or_else(|| io::Error::other(format!("no primary in service serves slot {slot}")))
    }

    /// Waits until every node that runs and is not paused reports `cluster_state:ok` with all
    /// 16384 slots served, they all see the same cluster (primaries and their slots, replicas
    /// and their primaries, failed nodes), none is a primary without slots, and every replica
    /// among them is in sync with its primary.
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
    /// let mut cluster = zklock_testkit::RedisCluster::start()?;
    /// let primary = cluster.primaries()?[0];
    /// cluster.kill(primary)?; // its replica takes over
    /// cluster.wait_until_ok(Duration::from_secs(20))?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait_until_ok(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let since = Instant::now();
        loop {
            let complaint = match self.state() {
                Ok(()) => return Ok(()),
                Err(complaint) => complaint,
            };
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the Redis Cluster is not ok after {:.1?}: {complaint}",
                        since.elapsed()
                    ),
                ));
            }
            thread::sleep(POLL);
        }
    }

    /// `Ok` when the cluster is at rest (see [`wait_until_ok`](Self::wait_until_ok)), else what
    /// is not.
    fn state(&self) -> Result<(), String> {
        let mut agreed: Option<(usize, Vec<Topology>)> = None;
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.is_live() {
                continue;
            }
            let info = node
                .probe_text(&["CLUSTER", "INFO"])
                .ok_or(format!("node {i} does not answer"))?;
            let field = |k| info_field(&info, k);
            let all = SLOTS.to_string();
            if field("cluster_state").as_deref() != Some("ok")
                || field("cluster_slots_ok").as_deref() != Some(all.as_str())
            {
                return Err(format!(
                    "node {i} reports cluster_state {:?}, cluster_slots_ok {:?}",
                    field("cluster_state"),
                    field("cluster_slots_ok")
                ));
            }
            let view = self
                .view_of(node)
                .ok_or(format!("node {i} does not answer"))?;
            let mut topology: Vec<Topology> = view.iter().map(Topology::of).collect();
            topology.sort();
            match &agreed {
                None => agreed = Some((i, topology)),
                Some((first, theirs)) if *theirs != topology => {
                    return Err(format!(
                        "nodes {first} and {i} see the cluster differently (primaries, replicas, \
                         slots, failures)"
                    ))
                }
                Some(_) => {}
            }
            let me = view
                .iter()
                .find(|s| s.has("myself"))
                .ok_or(format!("node {i} does not list itself"))?;
            if me.has("master") && me.slots.is_empty() {
                // A former primary back from a failure, before it learns who took its slots.
                return Err(format!("node {i} is a primary serving no slots"));
            }
            if me.has("slave") {
                let replication = node
                    .probe_text(&["INFO", "replication"])
                    .ok_or(format!("node {i} does not answer"))?;
                if info_field(&replication, "master_link_status").as_deref() != Some("up") {
                    return Err(format!("replica {i} is not in sync with its primary"));
                }
            }
        }
        if agreed.is_none() {
            return Err("no node runs".into());
        }
        Ok(())
    }

    /// What node `i` says it is (`ROLE`): `master` or `slave`; `None` when it is killed,
    /// paused, silent or out of range.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// let replica = cluster.replicas()?[0];
    /// assert_eq!(cluster.role(replica).as_deref(), Some("slave"));
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

    /// Makes replica `replica` take over from its primary (`CLUSTER FAILOVER` on it: the
    /// primary stops taking writes until the replica has caught up, then they swap) and waits
    /// until every node sees it as a primary and the cluster is [ok](Self::wait_until_ok).
    ///
    /// # Errors
    ///
    /// When `replica` is out of range or not a replica, the node refuses, or the cluster is
    /// not ok within 10 node timeouts (at least 10 s).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// let replica = cluster.replicas()?[0];
    /// let old = cluster.primary_of(replica)?.unwrap();
    /// cluster.failover(replica)?;
    /// assert_eq!(cluster.primary_of(old)?, Some(replica));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn failover(&self, replica: usize) -> io::Result<()> {
        let node = self.node(replica)?;
        if self.role(replica).as_deref() != Some("slave") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("node {replica} is not a replica"),
            ));
        }
        node.command(&["CLUSTER", "FAILOVER"])?;
        let timeout = (10 * self.node_timeout()).max(Duration::from_secs(10));
        let deadline = Instant::now() + timeout;
        let id = &self.ids[replica];
        loop {
            let promoted = self.nodes.iter().filter(|n| n.is_live()).all(|n| {
                self.view_of(n)
                    .is_some_and(|v| v.iter().any(|s| s.id == *id && s.serves()))
            });
            if promoted {
                break;
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("not every node sees node {replica} as a primary within {timeout:?}"),
                ));
            }
            thread::sleep(POLL);
        }
        self.wait_until_ok(deadline.saturating_duration_since(Instant::now()))
    }

    /// Sends a command to node `i` and returns its reply (a key served elsewhere is refused
    /// with `MOVED slot addr`, as an error).
    ///
    /// # Errors
    ///
    /// When `i` is out of range, the node does not answer within 10 s, or it answers with an
    /// error (the error's message is the server's).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// let info = cluster.command(0, &["CLUSTER", "INFO"])?.text().unwrap();
    /// assert!(info.contains("cluster_state:ok"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn command(&self, i: usize, args: &[&str]) -> io::Result<RedisReply> {
        self.node(i)?.command(args)
    }

    /// Sends commands to node `i` one after the other on one connection and returns their
    /// replies — for `WAIT`, which waits for the replicas to have the writes of its own
    /// connection (on a fresh one it returns at once), or `READONLY` before reads on a replica.
    ///
    /// # Errors
    ///
    /// As [`command`](Self::command), at the first command that fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// let owner = cluster.node_for_key("k")?;
    /// let replies = cluster.commands(owner, &[&["SET", "k", "v"], &["WAIT", "1", "5000"]])?;
    /// assert_eq!(replies[1].int(), Some(1)); // its replica has it
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn commands(&self, i: usize, cmds: &[&[&str]]) -> io::Result<Vec<RedisReply>> {
        self.node(i)?.commands(cmds)
    }

    /// Kills node `i` (SIGKILL); it loses its data. A killed primary's replica takes over
    /// after [`node_timeout`](Self::node_timeout) and an election. Does nothing if it is killed
    /// already.
    ///
    /// # Errors
    ///
    /// When `i` is out of range or the process cannot be killed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut cluster = zklock_testkit::RedisCluster::start()?;
    /// cluster.kill(0)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kill(&mut self, i: usize) -> io::Result<()> {
        self.node_mut(i)?.daemon.kill()
    }

    /// Starts node `i` again on its ports (killing it first if it runs), empty but with its
    /// cluster configuration, and waits until it answers `PING`; it rejoins the cluster as it
    /// left it, and a former primary whose replica took over becomes that replica's replica.
    /// Call [`wait_until_ok`](Self::wait_until_ok) to wait for that.
    ///
    /// # Errors
    ///
    /// When `i` is out of range, or the node does not answer within the startup timeout (with
    /// its log's tail).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let mut cluster = zklock_testkit::RedisCluster::start()?;
    /// cluster.kill(0)?;
    /// cluster.restart(0)?;
    /// cluster.wait_until_ok(Duration::from_secs(20))?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart(&mut self, i: usize) -> io::Result<()> {
        let timeout = self.opts.startup_timeout;
        self.node_mut(i)?.restart(&[], timeout)
    }

    /// Freezes node `i` with SIGSTOP: its connections stay open but nothing answers. A paused
    /// primary is replaced by its replica after [`node_timeout`](Self::node_timeout).
    ///
    /// # Errors
    ///
    /// When `i` is out of range, the node is killed, or `kill -STOP` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// cluster.pause(1)?;
    /// cluster.resume(1)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause(&self, i: usize) -> io::Result<()> {
        let node = self.node(i)?;
        node.daemon.pause(node.port)
    }

    /// Lets a paused node run again (SIGCONT).
    ///
    /// # Errors
    ///
    /// When `i` is out of range, the node is killed, or `kill -CONT` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// cluster.pause(1)?;
    /// cluster.resume(1)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume(&self, i: usize) -> io::Result<()> {
        let node = self.node(i)?;
        node.daemon.resume(node.port)
    }

    /// Whether node `i` is paused (`false` when out of range).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::RedisCluster::start()?;
    /// assert!(!cluster.is_paused(0));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_paused(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| n.daemon.is_paused())
    }

    fn node(&self, i: usize) -> io::Result<&Node> {
        let n = self.nodes.len();
        self.nodes.get(i).ok_or_else(|| no_node("node", i, n))
    }

    fn node_mut(&mut self, i: usize) -> io::Result<&mut Node> {
        let n = self.nodes.len();
        self.nodes.get_mut(i).ok_or_else(|| no_node("node", i, n))
    }
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn cluster_nodes_lines_are_read() {
        let primary = "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host \
                       myself,master - 0 1426238317239 4 connected 0-5460 5461 [5462->-abc]";
        let seen = Seen::parse(primary).unwrap();
        assert_eq!(seen.port, 30004);
        assert!(seen.has("myself") && seen.has("master") && seen.serves());
        assert_eq!(seen.primary, None);
        assert_eq!(seen.slots, vec![(0, 5460), (5461, 5461)]);
        let replica = "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 slave,fail \
                       07c37dfeb235213a872192d90877d0cd55635b91 0 1426238316232 3 connected";
        let seen = Seen::parse(replica).unwrap();
        assert!(seen.has("fail") && !seen.serves());
        assert_eq!(
            seen.primary.as_deref(),
            Some("07c37dfeb235213a872192d90877d0cd55635b91")
        );
        assert!(seen.slots.is_empty());
    }
}
