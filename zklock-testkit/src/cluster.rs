//! An ensemble of ZooKeeper servers on loopback: Curator's `TestingCluster`.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::daemon::on_free_ports;
use crate::install::{ensure_zookeeper_installed, tail};
use crate::member::{Member, Options, QuorumPorts};
use crate::ports::PortLease;
use crate::workdir;

const PORT_ATTEMPTS: usize = 4;
const FOUR_LETTER_TIMEOUT: Duration = Duration::from_secs(5);

/// An ensemble of real ZooKeeper servers (3 is typical) on free loopback ports, with temporary data.
///
/// Members are numbered from 0 (their ZooKeeper `myid` is `i + 1`). Each is its own small JVM with a client,
/// a peer and an election port, all claimed for the cluster's life. Members can be stopped (SIGKILL, data
/// kept), restarted on the same ports, paused (SIGSTOP) and resumed (SIGCONT) to test failover, leader
/// loss and partitions. The tick is 200 ms by default, `syncLimit` 10 ticks: a follower notices a lost
/// leader in about 2 s. Empty CONTAINER nodes are reaped every 100 ms, as with a [`ZkServer`](crate::ZkServer)
/// (see [`ZkClusterBuilder::container_check_interval`]).
///
/// Dropping the cluster kills every member and removes the files.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use zklock_testkit::ZkCluster;
///
/// let mut cluster = ZkCluster::start(3)?;
/// let leader = cluster.leader().expect("an elected leader");
/// cluster.stop_member(leader)?;
/// cluster.wait_for_quorum(Duration::from_secs(30))?;
/// assert_ne!(cluster.leader(), Some(leader));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct ZkCluster {
    // Field order is drop order: processes, then ports, then files.
    members: Vec<Member>,
    _leases: Vec<PortLease>,
    _dir: TempDir,
}

/// Options for a [`ZkCluster`]; made by [`ZkCluster::builder`].
///
/// # Examples
///
/// ```no_run
/// let cluster = zklock_testkit::ZkCluster::builder(3)
///     .tick_time(100)
///     .config("syncLimit", "20")
///     .start()?;
/// # drop(cluster);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until `start` is called"]
pub struct ZkClusterBuilder {
    size: usize,
    opts: Options,
}

impl ZkClusterBuilder {
    crate::member::server_options!("zklock_testkit::ZkCluster::builder(3)");

    /// Starts every member and waits until all serve and a leader is elected.
    ///
    /// # Errors
    ///
    /// When the size is 0, when ZooKeeper or Java is missing and cannot be installed, when no free ports
    /// work, or when the ensemble does not form within the startup timeout — with the members' log tails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::builder(5).start()?;
    /// assert_eq!(cluster.len(), 5);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(self) -> io::Result<ZkCluster> {
        let n = self.size;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster needs at least one member",
            ));
        }
        ensure_zookeeper_installed()?;
        on_free_ports(3 * n, PORT_ATTEMPTS, "a ZooKeeper cluster", |leases| {
            let quorum: Vec<QuorumPorts> = (0..n)
                .map(|i| QuorumPorts {
                    peer: leases[n + 2 * i].port(),
                    election: leases[n + 2 * i + 1].port(),
                })
                .collect();
            let dir = workdir::create("cluster")?;
            let mut members = Vec::with_capacity(n);
            for (i, lease) in leases.iter().take(n).enumerate() {
                let root = dir.path().join(format!("member-{}", i + 1));
                members.push(Member::create(
                    root,
                    &self.opts,
                    lease.port(),
                    &quorum,
                    i + 1,
                )?);
            }
            for m in &mut members {
                m.spawn()?;
            }
            let mut cluster = ZkCluster {
                members,
                _leases: leases,
                _dir: dir,
            };
            cluster.wait_all_serving(self.opts.startup_timeout)?;
            Ok(cluster)
        })
    }
}

impl ZkCluster {
    /// Starts an `n`-member ensemble with default options and waits until every member serves and a
    /// leader is elected.
    ///
    /// # Errors
    ///
    /// See [`ZkClusterBuilder::start`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::start(3)?;
    /// assert!(cluster.leader().is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(n: usize) -> io::Result<ZkCluster> {
        ZkCluster::builder(n).start()
    }

    /// Options for an `n`-member ensemble.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::builder(3).tick_time(100).start()?;
    /// # drop(cluster);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn builder(n: usize) -> ZkClusterBuilder {
        ZkClusterBuilder {
            size: n,
            opts: Options::default(),
        }
    }

    /// `"127.0.0.1:p1,127.0.0.1:p2,..."`: every member's client address, for a ZooKeeper client.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::start(3)?;
    /// assert_eq!(cluster.connect_string().split(',').count(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn connect_string(&self) -> String {
        (0..self.len())
            .map(|i| self.member_connect_string(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `"127.0.0.1:PORT"` of member `i` alone.
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::start(3)?;
    /// let only_the_first = cluster.member_connect_string(0);
    /// # let _ = only_the_first;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_connect_string(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.member_port(i))
    }

    /// The client port of member `i`.
    ///
    /// # Panics
    ///
    /// When `i >= self.len()`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::start(3)?;
    /// assert_ne!(cluster.member_port(0), cluster.member_port(1));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_port(&self, i: usize) -> u16 {
        self.members[i].client_port()
    }

    /// The JVM process id of member `i`, or `None` while it is stopped (or `i` is out of range).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut cluster = zklock_testkit::ZkCluster::start(3)?;
    /// cluster.stop_member(1)?;
    /// assert_eq!(cluster.member_pid(1), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_pid(&self, i: usize) -> Option<u32> {
        self.members.get(i).and_then(Member::pid)
    }

    /// The number of members, running or not.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::start(3)?;
    /// assert_eq!(cluster.len(), 3);
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
    /// let cluster = zklock_testkit::ZkCluster::start(1)?;
    /// assert!(!cluster.is_empty());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The member that reports `Mode: leader` to `srvr` right now, if any. Stopped and paused members are
    /// not asked.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::start(3)?;
    /// let leader = cluster.leader().expect("elected during start");
    /// assert!(leader < 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.mode().as_deref() == Some("leader"))
    }

    /// What member `i` reports as its `Mode:` (`leader`, `follower`, ...), or `None` when it is stopped,
    /// paused, out of range, or not serving (e.g. without a quorum).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::start(3)?;
    /// let leader = cluster.leader().unwrap();
    /// assert_eq!(cluster.member_mode(leader).as_deref(), Some("leader"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_mode(&self, i: usize) -> Option<String> {
        self.members.get(i).and_then(Member::mode)
    }

    /// Sends a four-letter admin command to member `i` and returns the answer, waiting at most 5 s.
    ///
    /// # Errors
    ///
    /// When `i` is out of range, `cmd` is not a four-letter word, or the member does not answer.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::start(3)?;
    /// assert_eq!(cluster.member_four_letter(2, "ruok")?, "imok");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn member_four_letter(&self, i: usize, cmd: &str) -> io::Result<String> {
        self.member(i)?.four_letter(cmd, FOUR_LETTER_TIMEOUT)
    }

    /// Kills member `i` (SIGKILL, like a crash), keeping its data. Does nothing if it is stopped already.
    ///
    /// # Errors
    ///
    /// When `i` is out of range or the process cannot be killed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut cluster = zklock_testkit::ZkCluster::start(3)?;
    /// cluster.stop_member(0)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stop_member(&mut self, i: usize) -> io::Result<()> {
        self.member_mut(i)?.stop()
    }

    /// Starts member `i` again on its ports with its data (stopping it first if it runs) and waits until it
    /// serves as leader or follower — which needs a quorum of members running.
    ///
    /// # Errors
    ///
    /// When `i` is out of range, or the member does not serve within the startup timeout (with its log's
    /// tail).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut cluster = zklock_testkit::ZkCluster::start(3)?;
    /// cluster.stop_member(0)?;
    /// cluster.restart_member(0)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn restart_member(&mut self, i: usize) -> io::Result<()> {
        self.member_mut(i)?.restart()
    }

    /// Freezes member `i` with SIGSTOP: its connections stay open but nothing answers, as in a partition
    /// or a long GC pause.
    ///
    /// # Errors
    ///
    /// When `i` is out of range, the member is stopped, or `kill -STOP` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::start(3)?;
    /// cluster.pause_member(1)?;
    /// cluster.resume_member(1)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pause_member(&self, i: usize) -> io::Result<()> {
        self.member(i)?.pause()
    }

    /// Lets a paused member run again (SIGCONT).
    ///
    /// # Errors
    ///
    /// When `i` is out of range, the member is stopped, or `kill -CONT` fails.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = zklock_testkit::ZkCluster::start(3)?;
    /// cluster.pause_member(1)?;
    /// cluster.resume_member(1)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn resume_member(&self, i: usize) -> io::Result<()> {
        self.member(i)?.resume()
    }

    /// Waits until a leader is elected, a majority of the ensemble serves, and every member that runs and
    /// is not paused serves as leader or follower.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::TimedOut`] when that does not happen within `timeout`, saying what each member
    /// reports.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let mut cluster = zklock_testkit::ZkCluster::start(3)?;
    /// let leader = cluster.leader().unwrap();
    /// cluster.stop_member(leader)?;
    /// cluster.wait_for_quorum(Duration::from_secs(30))?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn wait_for_quorum(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let modes = self.modes();
            if self.has_quorum(&modes) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no quorum within {timeout:?}; members report {}",
                        self.describe(&modes)
                    ),
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn modes(&self) -> Vec<Option<String>> {
        self.members.iter().map(Member::mode).collect()
    }

    fn has_quorum(&self, modes: &[Option<String>]) -> bool {
        let serving = |m: &Option<String>| {
            matches!(
                m.as_deref(),
                Some("leader" | "follower" | "observer" | "standalone")
            )
        };
        let leaders = modes
            .iter()
            .filter(|m| matches!(m.as_deref(), Some("leader" | "standalone")))
            .count();
        let all_live_serve = self
            .members
            .iter()
            .zip(modes)
            .all(|(member, mode)| !member.is_running() || member.is_paused() || serving(mode));
        let majority = modes.iter().filter(|m| serving(m)).count() > self.len() / 2;
        leaders == 1 && all_live_serve && majority
    }

    fn describe(&self, modes: &[Option<String>]) -> String {
        self.members
            .iter()
            .zip(modes)
            .enumerate()
            .map(|(i, (member, mode))| {
                let state = if !member.is_running() {
                    "stopped".to_string()
                } else if member.is_paused() {
                    "paused".to_string()
                } else {
                    mode.clone().unwrap_or_else(|| "not serving".to_string())
                };
                format!("{i}: {state}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn wait_all_serving(&mut self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        for m in &mut self.members {
            m.wait_serving(Some(deadline))?;
        }
        self.wait_for_quorum(deadline.saturating_duration_since(Instant::now()))
            .map_err(|e| {
                let logs: Vec<String> = self
                    .members
                    .iter()
                    .enumerate()
                    .map(|(i, m)| format!("--- member {i}:\n{}", tail(&m.log_since_start(), 10)))
                    .collect();
                io::Error::new(e.kind(), format!("{e}\n{}", logs.join("\n")))
            })
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
        format!("no member {i} in a cluster of {n}"),
    )
}

impl Drop for ZkCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.stop();
        }
    }
}
